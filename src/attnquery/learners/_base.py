"""Shared pieces of every learner: scikit-learn style parameters and oracle checks."""

from __future__ import annotations

import inspect

import numpy as np

from ..errors import ConfigError
from ..oracles import Oracle

__all__ = ["BaseLearner", "check_oracle", "check_budget", "chunk_slices", "check_answers",
           "check_verify_param", "DEFAULT_VERIFY"]

#: check queries a learner spends after fitting, unless told otherwise (``verify=0`` turns it off)
DEFAULT_VERIFY = 8


class BaseLearner:
    """Parameters live in ``__init__``; ``fit(oracle)`` returns self; fitted attributes end in _."""

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

    def _verify_fit(self, oracle, predict, rng: np.random.Generator, rtol: float,
                    atol: float = 0.0, what: str = "a single attention head",
                    token_scale: float = 1.0) -> None:
        """Spend ``self.verify`` check queries and raise when the estimate disagrees.

        Sets ``verify_error_`` and ``n_verify_queries_`` (see :func:`check_answers`); a learner
        calls this last in ``fit``, with the tolerances of its own error model.
        """
        n = check_verify_param(getattr(self, "verify", DEFAULT_VERIFY))
        self.verify_error_, self.n_verify_queries_ = check_answers(
            oracle, predict, rng, n, rtol=rtol, atol=atol, what=what, token_scale=token_scale)

    def _rng(self) -> np.random.Generator:
        rs = getattr(self, "random_state", None)
        if isinstance(rs, np.random.Generator):
            return rs
        return np.random.default_rng(rs)


def check_oracle(oracle, kinds: tuple[str, ...] | None = None) -> int:
    """Check that ``oracle`` has the oracle interface (callable, ``d``, ``n_queries``).

    Any object with that interface is accepted, so a user's own oracle class works too.
    Returns ``d``.
    """
    if not callable(oracle) or not hasattr(oracle, "d") or not hasattr(oracle, "n_queries"):
        raise ConfigError(
            "fit() needs an oracle (an object with __call__, d and n_queries, such as "
            f"attnquery.oracles.ValueOracle); got {type(oracle).__name__}"
        )
    kind = getattr(oracle, "kind", "value")
    if kinds is not None and kind not in kinds:
        raise ConfigError(f"this learner needs a {' or '.join(kinds)} oracle; got a {kind} oracle")
    d = oracle.d
    if not isinstance(d, int | np.integer) or d < 1:
        raise ConfigError(f"oracle.d must be a positive integer; got {d!r}")
    return int(d)


def check_budget(oracle, n: int, what: str) -> None:
    """Ask the oracle whether ``n`` queries fit its budget (if it has one) before spending them."""
    if isinstance(oracle, Oracle):
        oracle.check_budget(n, what)
    else:
        remaining = getattr(oracle, "remaining", None)
        if remaining is not None and n > remaining:
            from ..errors import BudgetExceededError

            raise BudgetExceededError(f"{what} needs {n} queries; {remaining} remain")


def chunk_slices(n: int, size: int):
    """Yield slices covering range(n) in chunks of at most ``size`` (size >= 1)."""
    size = max(int(size), 1)
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def check_verify_param(n) -> int:
    """The ``verify`` parameter as a count of check queries (a non-negative integer)."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ConfigError(
            f"verify must be a non-negative integer (0 turns the check off); got {n!r}")
    return int(n)


def check_answers(oracle, predict, rng: np.random.Generator, n_checks: int, rtol: float,
                  atol: float = 0.0, what: str = "a single attention head",
                  token_scale: float = 1.0, lengths=(2, 4)) -> tuple[float, int]:
    """Compare the oracle with an estimate on ``n_checks`` fresh random queries.

    The check queries have i.i.d. Gaussian tokens of norm about ``token_scale`` and
    ``lengths`` tokens (the batch is split evenly between the lengths). The estimate passes when
    ``max |y - y_hat| <= atol + rtol * max |y|``, where ``y`` are the oracle's answers and
    ``y_hat = predict(X)``.

    Returns
    -------
    error : float
        ``max |y - y_hat| / max |y|`` (NaN when ``n_checks`` is 0; the absolute disagreement
        when every answer is 0).
    n_queries : int
        Check queries counted by the oracle.

    Raises
    ------
    ModelMismatchError
        When the estimate fails the test.
    """
    from ..errors import ModelMismatchError

    if n_checks == 0:
        return float("nan"), 0
    d = int(oracle.d)
    check_budget(oracle, n_checks, "the check of the estimate")
    n0 = oracle.n_queries
    lengths = [int(n) for n in lengths]
    sizes = [n_checks // len(lengths) + (i < n_checks % len(lengths))
             for i in range(len(lengths))]
    ys, yhats = [], []
    for n_tok, size in zip(lengths, sizes, strict=True):
        if size == 0:
            continue
        X = rng.standard_normal((size, n_tok, d)) * (token_scale / np.sqrt(d))
        ys.append(np.asarray(oracle(X), dtype=float))
        yhats.append(np.asarray(predict(X), dtype=float))
    y, yhat = np.concatenate(ys), np.concatenate(yhats)
    n_used = int(oracle.n_queries - n0)
    diff = float(np.max(np.abs(y - yhat)))
    scale = float(np.max(np.abs(y)))
    error = diff / scale if scale > 0 else diff
    allowed = atol + rtol * scale
    if not diff <= allowed:  # also catches NaN
        allowed_rel = allowed / scale if scale > 0 else allowed
        raise ModelMismatchError(
            f"answers differ from {what} by {error:.3g} (relative) on {n_checks} check queries, "
            f"where at most {allowed_rel:.3g} is expected; the box may have several heads, "
            "biases, noise or lower precision than float64",
            error=error, allowed=allowed_rel, n_checks=n_checks)
    return error, n_used
