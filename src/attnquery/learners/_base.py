"""Shared pieces of every learner: scikit-learn style parameters, parameter checks, the query
ledger every fit asks its oracle through, and the learners' way into the check of a fitted
estimate (:mod:`._check`, re-exported here with the noise judgement of :mod:`._noise`)."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import numbers
import warnings

import numpy as np

from ..errors import (
    ConfigError,
    ModelMismatchError,
    NotFittedError,
    VacuousCheckWarning,
)
from ..oracles._base import CappedOracle
from ..rng import as_rng
from ._check import (
    CHECK_LENGTH,
    CHECK_LENGTHS,
    ROUNDING_RTOL,
    _run_check,
    check_answers,
    check_length_param,
    check_lengths,
    check_plan,
    check_queries,
    check_signs,
    output_error_bound,
    pair_token_scale,
)
from ._ledger import ForwardingOracle, QueryLedger, check_budget, check_oracle
from ._noise import NOISE_FORMAT_FACTOR, NOISE_MODES, check_noise_mode, judge_noise
from ._params import (
    DEPRECATED,
    Interval,
    check_scalar,
    validate_parameter_constraints,
)

__all__ = ["BaseLearner", "QueryLedger", "check_is_fitted", "clone", "FITTED_METHODS",
           "check_scalar", "check_oracle",
           "check_budget", "chunk_slices", "check_answers", "check_signs", "check_queries",
           "check_plan", "check_verify_param", "check_length_param", "DEFAULT_VERIFY",
           "MAX_VERIFY", "VERIFY_PARAM", "BLOCK_BYTES_PARAM", "CHECK_LENGTH_PARAM",
           "CHECK_LENGTHS", "CHECK_LENGTH", "check_lengths", "ROUNDING_RTOL", "pair_token_scale",
           "output_error_bound", "NOISE_FORMAT_FACTOR", "NOISE_MODES",
           "check_noise_mode", "judge_noise", "renamed_parameter", "ForwardingOracle",
           "N_QUERIES_PARAM", "CappedOracle"]

DEFAULT_VERIFY = 8
"""Check queries a learner spends after fitting, unless told otherwise (``verify=0`` turns it
off): with the position-free learners' lengths (:func:`check_lengths`, ``check_length`` 4096), 6
fresh queries of 2, 4, 8, 32, 64 and 4,096 tokens and prefix-permuted copies of the two longest,
the 4,096- and 64-token ones (see :func:`check_plan`)."""
MAX_VERIFY = 10_000
"""The most check queries a learner spends: 10,000 queries of 2 to 128 tokens at d = 384 hold
about 1 GiB of float64 tokens."""
#: the constraint of ``block_bytes``, the memory bound on one batch of queries
BLOCK_BYTES_PARAM = Interval(numbers.Integral, 1, None, closed="left")
VERIFY_PARAM = Interval(numbers.Integral, 0, MAX_VERIFY, closed="both",
                        note="0 turns the check off")
"""The ``verify`` parameter's constraint (every learner's,
:attr:`BaseLearner._parameter_constraints`)."""
#: the ``check_length`` parameter's constraint (the position-free learners')
CHECK_LENGTH_PARAM = Interval(numbers.Integral, 1, None, closed="left",
                              note="the tokens of the longest check queries")
N_QUERIES_PARAM = Interval(numbers.Integral, 1, None, closed="left",
                           note="the most queries the whole fit asks, the check's included")
"""The ``n_queries`` parameter's constraint (every learner's: the whole fit's cap, check
queries included; None, the default of most, sets none)."""
FITTED_METHODS = ("predict", "predict_sign", "transform", "score")
"""The methods that need a fitted learner: :class:`BaseLearner` makes each one a subclass
defines call :func:`check_is_fitted` first."""
#: fitted attributes a ``fit`` sets also when it fails (the query counts and the check's
#: outcome, the route taken): on their own they do not make a learner fitted
_BOOKKEEPING = frozenset({"n_queries_", "n_queries_by_stage_", "verify_error_",
                          "n_verify_queries_", "verify_vacuous_", "route_"})


def check_is_fitted(estimator, attributes=None) -> None:
    """Raise :class:`~attnquery.errors.NotFittedError` unless ``estimator`` has been fitted.

    Parameters
    ----------
    estimator : BaseLearner
        The learner.
    attributes : str or sequence of str, optional
        Fitted attributes that must all be set. Without them (scikit-learn's rule) the learner
        is fitted when it has any attribute ending in ``_`` but for the query counts and the
        check's outcome, which a ``fit`` that failed sets too.

    Raises
    ------
    NotFittedError
        If it is not fitted (a ``ValueError`` and an ``AttributeError`` as well).
    """
    names = vars(estimator)
    if attributes is not None:
        wanted = [attributes] if isinstance(attributes, str) else list(attributes)
        fitted = all(a in names for a in wanted)
    else:
        fitted = any(k.endswith("_") and not k.startswith("_") and k not in _BOOKKEEPING
                     for k in names)
    if not fitted:
        raise NotFittedError(f"this {type(estimator).__name__} is not fitted yet: call "
                             "fit(oracle) before using its estimate")


def clone(estimator):
    """A new, unfitted learner with the same parameters as ``estimator`` (scikit-learn's
    ``clone``): learners among the parameters are cloned, other values deep-copied, so the
    copy shares nothing with the original (a seed ``Generator`` is copied in its state)."""
    if not isinstance(estimator, BaseLearner):
        raise ConfigError(f"clone() takes a learner; got {type(estimator).__name__}")
    params = {k: clone(v) if isinstance(v, BaseLearner) else copy.deepcopy(v)
              for k, v in estimator.get_params().items()}
    return type(estimator)(**params)


def _needs_fit(method):
    """``method`` calling :func:`check_is_fitted` first."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        check_is_fitted(self)
        return method(self, *args, **kwargs)

    checked.checks_fitted = True
    return checked


def _capped_fit(fit):
    """``fit`` asking its oracle through a :class:`~attnquery.oracles.CappedOracle` of the
    learner's ``n_queries`` (when it is set): the one place the whole fit's cap is held."""

    @functools.wraps(fit)
    def capped(self, oracle, *args, **kwargs):
        cap = getattr(self, "n_queries", None)
        if cap is None or (isinstance(cap, str) and cap == DEPRECATED) or \
                getattr(self, "_capping", False) or not hasattr(oracle, "n_queries"):
            return fit(self, oracle, *args, **kwargs)
        with warnings.catch_warnings():  # fit validates again, and warns then
            warnings.simplefilter("ignore")
            self.validate_params()  # a bad parameter is refused by its own name first
        validate_parameter_constraints({"n_queries": [N_QUERIES_PARAM, None]},
                                       {"n_queries": cap})  # a plug-in's, undeclared
        least = self._least_queries(oracle)
        if cap < least:
            raise ConfigError(
                f"n_queries={cap} is below the {least} queries every fit of "
                f"{type(self).__name__} asks at the least ({self._least_reason(oracle)})")
        self._capping = True
        try:
            return fit(self, CappedOracle(oracle, cap), *args, **kwargs)
        finally:
            del self._capping

    capped.caps_queries = True
    return capped



class BaseLearner:
    """The base class of every learner: parameters live in ``__init__``; ``fit(oracle)``
    returns self; fitted attributes end in ``_``.

    Each learner declares the values its parameters may take in ``_parameter_constraints``
    (parameter name -> list of constraints, any one of which admits a value; the vocabulary
    is :mod:`attnquery.learners.base`'s :class:`Interval`, :class:`Options`, ...), extending
    this class's dict, and its rules that join several parameters in :meth:`_validate_extra`.
    Its ``fit`` calls :meth:`validate_params` first, so a bad value raises
    :class:`~attnquery.errors.ConfigError` before any query; it asks its oracle through
    :meth:`open_ledger`, draws its queries from :meth:`make_rng` and checks its estimate last
    with :meth:`verify_fit`. ``_parameter_errors`` maps a parameter to the ConfigError subclass
    its bad value raises, where that is more specific.

    ``n_queries``, every registered learner's parameter, is the whole fit's cap (the check
    queries included; None: none). A subclass's ``fit`` given it asks its oracle through a
    :class:`~attnquery.oracles.CappedOracle` of that cap (this class wraps every ``fit``), so
    its ledger, its planning checks and every batch see the cap: a plan that does not fit is
    refused before the first query, and no batch beyond the cap is asked
    (:class:`~attnquery.errors.BudgetExceededError` naming ``n_queries``). A cap below
    :meth:`_least_queries` is a :class:`~attnquery.errors.ConfigError` before any query.

    The methods of :data:`FITTED_METHODS` (``predict``, ...) that a subclass defines call
    :func:`check_is_fitted` first: before ``fit`` they raise
    :class:`~attnquery.errors.NotFittedError`. ``_validate_params``, ``_verify_fit``, ``_rng``
    and ``_open_ledger`` are older names of the same methods.
    """

    #: parameter name -> list of constraints (see :mod:`attnquery.learners._params`)
    _parameter_constraints: dict = {
        "verify": [VERIFY_PARAM],
        "random_state": ["random_state"],
    }
    #: parameter name -> the ConfigError subclass its bad value raises (default ConfigError)
    _parameter_errors: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fit = cls.__dict__.get("fit")
        if inspect.isfunction(fit) and not getattr(fit, "caps_queries", False):
            cls.fit = _capped_fit(fit)  # n_queries: the whole fit's cap, held by the oracle
        for name in FITTED_METHODS:  # predict before fit: NotFittedError, not 'v_'
            method = cls.__dict__.get(name)
            if inspect.isfunction(method) and not getattr(method, "checks_fitted", False):
                setattr(cls, name, _needs_fit(method))

    @classmethod
    def parameter_constraints(cls) -> dict:
        """Each parameter's constraints in words (:func:`~attnquery.learners._params.
        describe_constraints`), in the order of ``__init__``: ``{"verify": "an integer in
        [0, 10000] (0 turns the check off)", ...}``."""
        from ._params import describe_constraints

        names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        return {n: describe_constraints(cls._parameter_constraints[n]) for n in names
                if n in cls._parameter_constraints}

    def validate_params(self) -> None:
        """Check every declared parameter, then :meth:`_validate_extra`; raise
        :class:`~attnquery.errors.ConfigError` naming the parameter, what it may be and the
        value given. Asks no query: ``fit`` calls it first."""
        validate_parameter_constraints(type(self)._parameter_constraints, self.get_params(),
                                       errors=type(self)._parameter_errors)
        self._validate_extra()

    _validate_params = validate_params  # the name the built-in learners call

    def _least_queries(self, oracle) -> int:
        """The fewest queries any fit of this learner asks on ``oracle`` (read before the
        first query): a cap ``n_queries`` below it is refused by name. The default is
        ``verify`` check queries and one query besides; a learner that knows more of its plan
        says so (and :meth:`_least_reason` why)."""
        return check_verify_param(getattr(self, "verify", DEFAULT_VERIFY)) + 1

    def _least_reason(self, oracle) -> str:
        """:meth:`_least_queries` in words, for its refusal."""
        return (f"verify={check_verify_param(getattr(self, 'verify', DEFAULT_VERIFY))} check "
                "queries and at least one more")

    def _validate_extra(self) -> None:
        """Rules joining several parameters (each declared parameter already has a valid
        value); a learner with such rules overrides this and raises ConfigError."""

    def get_params(self) -> dict:
        """The constructor parameters, as given."""
        names = [
            p for p in inspect.signature(type(self).__init__).parameters if p != "self"
        ]
        return {n: getattr(self, n) for n in names}

    def set_params(self, **params):
        """Set constructor parameters (scikit-learn convention); returns self."""
        valid = self.get_params()
        for k, val in params.items():
            if k not in valid:
                raise ConfigError(
                    f"{type(self).__name__} has no parameter {k!r}; valid: {sorted(valid)}"
                )
            setattr(self, k, val)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def verify_fit(self, oracle, predict, rng: np.random.Generator, rtol: float,
                    atol=0.0, what: str = "a single attention head",
                    token_scale: float = 1.0, n0: int | None = None, lengths=CHECK_LENGTHS,
                    signs: bool = False, hint: str | None = None,
                    pair_atol: float | None = None, permuted: bool = True,
                    n_checks: int | None = None, check_length: int | None = None,
                    pair_scale: float = 1.0) -> None:
        """Spend ``self.verify`` (or ``n_checks``) check queries and raise when the estimate
        disagrees.

        The queries are :func:`check_queries`'s: fresh random ones with lengths spread over
        ``lengths`` and prefix-permuted copies of the longest. A position-free learner passes
        its ``check_length``: the lengths are then :func:`check_lengths` ``(check_length,
        lengths)``, ``lengths`` with its longest replaced by ``check_length`` (without it,
        ``lengths`` as given: a rotary learner's own ``verify_lengths``).
        Sets ``verify_error_`` and ``n_verify_queries_`` (see :func:`check_answers`; with
        ``signs``, :func:`check_signs`), also when the check fails; with ``n0`` (the oracle's
        count when ``fit`` began) it also sets ``n_queries_``, so that the count includes the
        check queries whatever the outcome. Sets ``verify_vacuous_``: True when the comparison
        with the estimate could not have failed (on no query of two tokens or more was the
        allowed disagreement below the estimate's own answer; only the order of the tokens was
        tested), with a :class:`~attnquery.errors.VacuousCheckWarning`. A learner calls this
        last in ``fit``, with the tolerances of its own error model; ``pair_atol`` is the
        allowed difference between the box's answers on a query and on its prefix-permuted
        copy when the answers' own error is known (twice a tolerance tau), tighter than the
        estimate's allowance (the default). ``permuted=False`` asks no permuted copies (a
        learner of a position-dependent model, such as rotary heads). ``pair_scale``: the token
        scale of the permuted pairs (:func:`~attnquery.learners._check.pair_token_scale`; 1,
        the default, that of the other check queries).
        """
        n = check_verify_param(getattr(self, "verify", DEFAULT_VERIFY) if n_checks is None
                               else n_checks)
        self.verify_error_, self.n_verify_queries_ = float("nan"), 0
        self.verify_vacuous_ = False
        if check_length is not None:
            lengths = check_lengths(check_length, lengths)
        try:
            res = _run_check(oracle, predict, rng, n, rtol=rtol, atol=atol, what=what,
                             token_scale=token_scale, lengths=lengths, hint=hint, signs=signs,
                             pair_atol=pair_atol, permuted=permuted, pair_scale=pair_scale)
        except ModelMismatchError as exc:
            self.verify_error_, self.n_verify_queries_ = float(exc.error), int(exc.n_checks)
            raise
        finally:
            if n0 is not None:
                self.n_queries_ = int(oracle.n_queries - n0)
        self.verify_error_, self.n_verify_queries_ = res.error, res.n_queries
        self.verify_vacuous_ = bool(res.n_queries > 0 and res.n_informative == 0)
        if self.verify_vacuous_:
            warnings.warn(
                f"{type(self).__name__}'s check of its estimate could not fail (only the "
                "order of the tokens was tested): on every one of its check queries of two "
                f"tokens or more (of {res.n_queries} in all) the allowed disagreement "
                f"({res.allowed_rel:.3g} relative, at the least) is at least the estimate's "
                f"own answer, so a box far from {what} would pass too "
                "(verify_vacuous_ = True): the error model is too loose for a check (a smaller "
                "tau, or more accurate answers, make it one)",
                VacuousCheckWarning, stacklevel=3)

    _verify_fit = verify_fit  # the name the built-in learners call

    def make_rng(self) -> np.random.Generator:
        """The random generator of one ``fit``, from the parameter ``random_state`` (None, a
        seed or a ``Generator``, :func:`attnquery.rng.as_rng`)."""
        return as_rng(getattr(self, "random_state", None))

    _rng = make_rng  # the name the built-in learners call

    @contextlib.contextmanager
    def open_ledger(self, oracle, stages=(), what: str | None = None, cap: int | None = None,
                     reserve: int = 0):
        """Open the :class:`QueryLedger` of one ``fit`` (with the learner's own budget ``cap``
        and a ``reserve`` for its last stages, if any); when the block ends (also by an
        exception) set ``n_queries_by_stage_`` (a dict stage -> queries) from it."""
        ledger = QueryLedger(oracle, stages, what or type(self).__name__, cap=cap,
                             reserve=reserve)
        try:
            yield ledger
        finally:
            self.n_queries_by_stage_ = ledger.counts()

    _open_ledger = open_ledger  # the name the built-in learners call

    def _stage_count(self, stage: str) -> int:
        """``n_queries_by_stage_[stage]``, for the per-stage attributes derived from it."""
        stages = getattr(self, "n_queries_by_stage_", None)
        if stages is None:
            raise AttributeError("the per-stage query counts are available after fit()")
        return int(stages.get(stage, 0))


def renamed_parameter(learner, old: str, new: str, *, warn: bool = True):
    """The value a learner was given under the deprecated name ``old`` of its parameter
    ``new`` (scikit-learn's pattern), or None when ``old`` has its default
    :data:`~attnquery.learners._params.DEPRECATED`.

    Given, it warns with a :class:`FutureWarning` naming ``new`` (unless ``warn=False``: the
    learner's plan, read before ``fit``, warns once in ``fit``); given beside ``new`` (not
    None), it is a :class:`~attnquery.errors.ConfigError`. A learner calls this in its
    ``_validate_extra``, so both happen before any query.
    """
    value = getattr(learner, old)
    if isinstance(value, str) and value == DEPRECATED:
        return None
    if getattr(learner, new) is not None:
        raise ConfigError(f"{old} and {new} are both given; {old} is the old name of {new} "
                          f"(deprecated): give {new} only")
    if warn:
        warnings.warn(f"{type(learner).__name__}'s {old} is deprecated and will be removed in "
                      f"a future release: pass {new}={value!r} instead (the fit's query "
                      "budget, the name every learner's budget has)", FutureWarning,
                      stacklevel=6)  # fit, its n_queries wrapper, the caller
    return value


def chunk_slices(n: int, size: int):
    """Yield slices covering range(n) in chunks of at most ``size`` (size >= 1)."""
    size = max(int(size), 1)
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def check_verify_param(n) -> int:
    """The ``verify`` parameter as a count of check queries (:data:`VERIFY_PARAM`)."""
    validate_parameter_constraints({"verify": [VERIFY_PARAM]}, {"verify": n})
    return int(n)
