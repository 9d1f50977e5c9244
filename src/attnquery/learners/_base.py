"""Shared pieces of every learner: scikit-learn style parameters and oracle checks."""

from __future__ import annotations

import inspect

import numpy as np

from ..errors import ConfigError, ModelMismatchError
from ..oracles import Oracle
from ..rng import as_rng

__all__ = ["BaseLearner", "check_oracle", "check_budget", "chunk_slices", "check_answers",
           "check_signs", "check_queries", "check_verify_param", "DEFAULT_VERIFY", "ROUNDING_RTOL",
           "output_error_bound"]

#: check queries a learner spends after fitting, unless told otherwise (``verify=0`` turns it off)
DEFAULT_VERIFY = 8
#: relative disagreement of the check queries that float64 rounding explains, for the learners
#: that are exact in float64 (exact, sketch, polished nuclear-norm): the default study's exact
#: grid and the 72 MiniLM heads stay below 1.1e-11 (Gaussian probes at d = 512; 6e-14 with
#: the default basis probes), answers rounded to float32 (relative error 6e-8) give more than
#: 2e-7 (``python -m attnquery.bench probes``)
ROUNDING_RTOL = 1e-9
#: what a failed check may mean, unless a learner says better
MISMATCH_HINT = ("the box may have several heads, biases, noise or lower precision than "
                 "float64")


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
                    atol=0.0, what: str = "a single attention head",
                    token_scale: float = 1.0, n0: int | None = None, lengths=(2, 4),
                    signs: bool = False, hint: str | None = None) -> None:
        """Spend ``self.verify`` check queries and raise when the estimate disagrees.

        Sets ``verify_error_`` and ``n_verify_queries_`` (see :func:`check_answers`; with
        ``signs``, :func:`check_signs`), also when the check fails; with ``n0`` (the oracle's
        count when ``fit`` began) it also sets ``n_queries_``, so that the count includes the
        check queries whatever the outcome. A learner calls this last in ``fit``, with the
        tolerances of its own error model.
        """
        n = check_verify_param(getattr(self, "verify", DEFAULT_VERIFY))
        check = check_signs if signs else check_answers
        self.verify_error_, self.n_verify_queries_ = float("nan"), 0
        try:
            self.verify_error_, self.n_verify_queries_ = check(
                oracle, predict, rng, n, rtol=rtol, atol=atol, what=what,
                token_scale=token_scale, lengths=lengths, hint=hint)
        except ModelMismatchError as exc:
            self.verify_error_, self.n_verify_queries_ = float(exc.error), int(exc.n_checks)
            raise
        finally:
            if n0 is not None:
                self.n_queries_ = int(oracle.n_queries - n0)

    def _rng(self) -> np.random.Generator:
        return as_rng(getattr(self, "random_state", None))


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


def output_error_bound(X: np.ndarray, v_hat: np.ndarray, err_W, err_v) -> np.ndarray:
    """Largest ``|f_hat(X) - f(X)|`` for a head estimate with entrywise errors at most ``err_W``
    in W and ``err_v`` in v (arrays (d, d) and (d,), or numbers), per query of X (B, N, d).

    With ``delta_i = x_i^T (W_hat - W) x_N``, bounded by ``b_i = |x_i|^T err_W |x_N|``:
    ``f_hat - f = sum_i alpha_hat_i x_i^T (v_hat - v) + sum_i (alpha_hat_i - alpha_i) x_i^T v``,
    and ``||alpha_hat - alpha||_1 <= min(2, max_i delta_i - min_i delta_i)`` (the softmax's
    Jacobian ``diag(alpha) - alpha alpha^T``), where the range is at most the sum of the two
    largest ``b_i`` (0 for one token). So the bound is ``max_i |x_i|^T err_v + min(2, b_(1) +
    b_(2)) max_i (|x_i^T v_hat| + |x_i|^T err_v)``.
    """
    d = X.shape[-1]
    A = np.abs(X)
    ev = np.broadcast_to(np.asarray(err_v, dtype=float), (d,))
    eW = np.broadcast_to(np.asarray(err_W, dtype=float), (d, d))
    xv_err = A @ ev  # (B, N)
    b = np.einsum("bnd,bd->bn", A, A[:, -1, :] @ eW.T)
    top = -np.sort(-b, axis=1)[:, :2]
    spread = top.sum(axis=1) if X.shape[1] > 1 else np.zeros(X.shape[0])
    xv = np.abs(X @ v_hat) + xv_err
    return xv_err.max(axis=1) + np.minimum(2.0, spread) * xv.max(axis=1)


def check_queries(rng: np.random.Generator, d: int, n_checks: int, token_scale: float = 1.0,
                  lengths=(2, 4)) -> list[np.ndarray]:
    """Fresh random check queries: i.i.d. Gaussian tokens of norm about ``token_scale``, the
    ``n_checks`` queries split evenly between the sequence lengths ``lengths`` (one batch per
    length)."""
    lengths = [int(n) for n in lengths]
    sizes = [n_checks // len(lengths) + (i < n_checks % len(lengths))
             for i in range(len(lengths))]
    return [rng.standard_normal((size, n_tok, d)) * (token_scale / np.sqrt(d))
            for n_tok, size in zip(lengths, sizes, strict=True) if size > 0]


def _allowance(atol, X: np.ndarray) -> np.ndarray:
    """Absolute allowance per query: ``atol`` itself, or ``atol(X)`` when it is callable."""
    if callable(atol):
        return np.asarray(atol(X), dtype=float).reshape(X.shape[0])
    return np.full(X.shape[0], float(atol))


def _ask_checks(oracle, predict, rng, n_checks, atol, token_scale, lengths):
    d = int(oracle.d)
    check_budget(oracle, n_checks, "the check of the estimate")
    n0 = oracle.n_queries
    ys, yhats, allow = [], [], []
    for X in check_queries(rng, d, n_checks, token_scale, lengths):
        ys.append(np.asarray(oracle(X), dtype=float))
        yhats.append(np.asarray(predict(X), dtype=float))
        allow.append(_allowance(atol, X))
    return (np.concatenate(ys), np.concatenate(yhats), np.concatenate(allow),
            int(oracle.n_queries - n0))


def check_answers(oracle, predict, rng: np.random.Generator, n_checks: int, rtol: float,
                  atol=0.0, what: str = "a single attention head",
                  token_scale: float = 1.0, lengths=(2, 4),
                  hint: str | None = None) -> tuple[float, int]:
    """Compare the oracle with an estimate on ``n_checks`` fresh random queries.

    The check queries come from :func:`check_queries`. The estimate passes when
    ``|y - y_hat| <= atol + rtol * max |y|`` on every query, where ``y`` are the oracle's
    answers and ``y_hat = predict(X)``; ``atol`` is a number or a function of the queries
    ``X (B, N, d)`` giving each query's own allowance (B,). ``hint`` (what the disagreement may
    mean) ends the error message.

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
    if n_checks == 0:
        return float("nan"), 0
    y, yhat, allow, n_used = _ask_checks(oracle, predict, rng, n_checks, atol, token_scale,
                                         lengths)
    diffs = np.abs(y - yhat)
    diff = float(np.max(diffs))
    scale = float(np.max(np.abs(y)))
    error = diff / scale if scale > 0 else diff
    allowed = allow + rtol * scale
    bad = ~(diffs <= allowed)  # NaN included
    if bad.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            k = int(np.argmax(np.where(bad, np.nan_to_num(diffs / allowed, nan=np.inf), -1.0)))
        unit = scale if scale > 0 else 1.0
        seen, allowed_rel = float(diffs[k] / unit), float(allowed[k] / unit)
        raise ModelMismatchError(
            f"answers differ from {what} by {error:.3g} (relative) on {n_checks} check "
            f"queries, {int(bad.sum())} of them by more than expected (the farthest by "
            f"{seen:.3g} where at most {allowed_rel:.3g} is expected); {hint or MISMATCH_HINT}",
            error=error, allowed=allowed_rel, n_checks=n_used)
    return error, n_used


def check_signs(oracle, predict, rng: np.random.Generator, n_checks: int, rtol: float = 0.0,
                atol=0.0, what: str = "a single attention head", token_scale: float = 1.0,
                lengths=(2, 4), hint: str | None = None) -> tuple[float, int]:
    """Compare a membership oracle's signs with an estimate's on ``n_checks`` fresh queries.

    ``predict(X)`` gives the estimate's values; a query where the estimate says
    ``f(X) > 0`` and the oracle answers 0 (or the reverse) is a disagreement unless
    ``|predict(X)| <= atol + rtol * max |predict(X)|`` (the estimate's own uncertainty there;
    ``atol`` a number or a function of the queries, as in :func:`check_answers`).

    Returns
    -------
    error : float
        The fraction of check queries whose signs disagree beyond the estimate's uncertainty.
    n_queries : int
        Check queries counted by the oracle.

    Raises
    ------
    ModelMismatchError
        When any sign disagrees beyond the estimate's uncertainty.
    """
    if n_checks == 0:
        return float("nan"), 0
    ans, yhat, allow, n_used = _ask_checks(oracle, predict, rng, n_checks, atol, token_scale,
                                           lengths)
    sure = ~(np.abs(yhat) <= allow + rtol * float(np.max(np.abs(yhat))))  # NaN: never sure
    wrong = sure & ((ans > 0.5) != (yhat > 0))
    error = float(np.mean(wrong))
    if wrong.any():
        raise ModelMismatchError(
            f"membership answers differ from {what} on {int(wrong.sum())} of {n_checks} check "
            f"queries where the estimate's sign is certain; {hint or MISMATCH_HINT}",
            error=error, allowed=0.0, n_checks=n_used)
    return error, n_used
