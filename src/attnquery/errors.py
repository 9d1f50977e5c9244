"""Exception types raised by attnquery.

Every error the library raises on purpose derives from :class:`AttnQueryError`, so a caller can
catch the library's documented failures without also catching programming errors.
"""

from __future__ import annotations

__all__ = [
    "AttnQueryError",
    "NotIdentifiableError",
    "BudgetExceededError",
    "QueryError",
    "AnswerError",
    "OracleFailure",
    "ConfigError",
    "NotFittedError",
    "ModelError",
    "AssumptionViolation",
    "ModelMismatchError",
    "SearchLimitError",
    "UndefinedEstimate",
    "VacuousCheckWarning",
    "NoiseAboveFormatWarning",
]


class AttnQueryError(Exception):
    """Base class of every error attnquery raises on purpose."""


class NotIdentifiableError(AttnQueryError):
    """The parameters asked for are not determined by the oracle's answers.

    Raised, for example, when v = 0 (every answer is 0, so W is not identifiable), or when two heads
    of a multi-head model share W (only their merged head is identifiable).
    """


class BudgetExceededError(AttnQueryError):
    """An oracle's query budget would be exceeded (raised before the queries are spent)."""


class QueryError(AttnQueryError, ValueError):
    """A query sent to an oracle is malformed (shape, dtype, length N < 1, non-finite values)."""


class AnswerError(AttnQueryError, ValueError):
    """The black box behind an oracle answered with something unusable (shape, NaN, inf)."""


class OracleFailure(AttnQueryError, RuntimeError):
    """The black box behind an oracle raised an exception while answering."""


class ConfigError(AttnQueryError, ValueError):
    """A study configuration or a learner parameter is invalid."""


class NotFittedError(ConfigError, AttributeError):
    """A fitted estimate was asked for (``predict``, say) before ``fit`` ran.

    Like scikit-learn's ``NotFittedError`` it is also a ``ValueError`` and an
    ``AttributeError``, so code written for either keeps catching it; it is a
    :class:`ConfigError` too (a misuse of the learner), as the vector learners raised before.
    Raised by :func:`attnquery.learners.base.check_is_fitted`, which every learner's
    ``predict`` calls.
    """


class ModelError(AttnQueryError, ValueError):
    """A ground-truth model was given inconsistent or invalid parameters."""


class AssumptionViolation(AttnQueryError):
    """The oracle's answers contradict an assumption the learner was given (e.g. a norm bound)."""


class ModelMismatchError(AssumptionViolation):
    """The oracle's answers disagree with the learner's estimate beyond the learner's error model.

    Raised after fitting, when fresh check queries show that the black box is not what the learner
    assumes (several heads, biases, noise or lower precision than the learner allows for). The
    attributes ``error`` (relative disagreement), ``allowed`` and ``n_checks`` say what was seen.
    Also raised before the check when the answers are values of a narrow format but carry more
    noise than its rounding explains (:func:`attnquery.learners._base.judge_noise`): ``error``
    is then that relative noise, ``allowed`` the most the format allows, ``n_checks`` 0.
    """

    def __init__(self, message: str, error: float = float("nan"), allowed: float = float("nan"),
                 n_checks: int = 0):
        super().__init__(message)
        self.error = error
        self.allowed = allowed
        self.n_checks = n_checks


class SearchLimitError(AttnQueryError):
    """An adaptive loop (doubling, line search, retries) reached its cap in queries or rounds."""


class UndefinedEstimate(AttnQueryError):
    """An estimate is undefined: non-finite entries, or the unclipped baseline of Theorem 6.1's
    learner applied sigma^{-1} to a weight estimate outside (0, 1)."""


class VacuousCheckWarning(UserWarning):
    """A learner's check of its estimate could not have failed: on every check query the
    disagreement its error model allows was at least the estimate's own answer (a loose
    tolerance tau, say), so the returned estimate is unverified. The learner sets
    ``verify_vacuous_ = True``; the study records it in the row (``verify_vacuous``)."""


class NoiseAboveFormatWarning(UserWarning):
    """The answers are values of a narrow format (float32, float16, bfloat16) but carry more
    noise than that format's rounding explains, and the learner was told to expect it
    (``noise="measured"``): it goes on with the noise it measured, which a box that is not what
    the learner assumes inflates as well, so its check is only as sharp as that noise. The
    learner sets ``noise_above_format_ = True``. Without ``noise="measured"`` the learner raises
    :class:`ModelMismatchError` instead (docs/served.md, "Noise judged against the format")."""
