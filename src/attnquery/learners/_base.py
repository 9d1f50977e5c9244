"""Shared pieces of every learner: scikit-learn style parameters, parameter checks, the query
ledger every fit asks its oracle through, and the check of a fitted estimate."""

from __future__ import annotations

import contextlib
import inspect
import numbers

import numpy as np

from ..errors import ConfigError, ModelMismatchError
from ..oracles import Oracle
from ..rng import as_rng

__all__ = ["BaseLearner", "QueryLedger", "check_scalar", "check_bool", "check_oracle",
           "check_budget", "chunk_slices", "check_answers", "check_signs", "check_queries",
           "check_verify_param", "DEFAULT_VERIFY", "ROUNDING_RTOL", "output_error_bound"]

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


def _describe(kind: str, min_val, max_val, closed: str) -> str:
    """``an integer >= 1``, ``a number in (0, 1]``, ... for :func:`check_scalar`'s message."""
    lo_in, hi_in = closed in ("both", "left"), closed in ("both", "right")
    if min_val is not None and max_val is not None:
        return (f"{kind} in {'[' if lo_in else '('}{min_val:g}, {max_val:g}"
                f"{']' if hi_in else ')'}")
    if min_val is not None:
        return f"{kind} {'>=' if lo_in else '>'} {min_val:g}"
    if max_val is not None:
        return f"{kind} {'<=' if hi_in else '<'} {max_val:g}"
    return kind


def check_scalar(x, name: str, target_type: type | tuple = numbers.Real, *, min_val=None,
                 max_val=None, include_boundaries: str = "both", allow_none: bool = False,
                 exc: type[Exception] = ConfigError, what: str | None = None):
    """Check one scalar parameter and return it (``int`` or ``float``; ``None`` if allowed).

    The learners' single parameter check (in the manner of scikit-learn's ``check_scalar``):
    ``x`` must be an instance of ``target_type`` (``numbers.Integral`` or ``numbers.Real``;
    ``bool`` is never a number), finite, and within ``[min_val, max_val]``, whose ends are
    included as ``include_boundaries`` says.

    Parameters
    ----------
    x : object
        The value to check.
    name : str
        The parameter's name, first word of the error message.
    target_type : type or tuple of types
        ``numbers.Integral`` for a count, ``numbers.Real`` (the default) for a number.
    min_val, max_val : float, optional
        Bounds (``None``: unbounded on that side).
    include_boundaries : {"both", "left", "right", "neither"}
        Which of the bounds are allowed values.
    allow_none : bool
        Accept ``None`` (returned as is).
    exc : Exception type
        Raised on a bad value (default :class:`ConfigError`; a theorem's assumption parameter
        raises :class:`~attnquery.learners.noisy.AssumptionParameterError`).
    what : str, optional
        What the value must be, in place of the description built from the bounds (the
        message is ``"{name} must be {what}; got {x!r}"``).

    Returns
    -------
    int, float or None

    Raises
    ------
    ConfigError (or ``exc``)
        The message names the parameter, what it must be, and the value given.
    """
    if x is None and allow_none:
        return None
    integral = target_type is numbers.Integral or (
        isinstance(target_type, tuple) and all(t is numbers.Integral for t in target_type))
    if what is None:
        what = _describe("an integer" if integral else "a number", min_val, max_val,
                         include_boundaries)
        if allow_none:
            what += " or None"
    ok = isinstance(x, target_type) and not isinstance(x, bool | np.bool_)
    if ok:
        ok = bool(np.isfinite(x))
    if ok and min_val is not None:
        ok = x >= min_val if include_boundaries in ("both", "left") else x > min_val
    if ok and max_val is not None:
        ok = x <= max_val if include_boundaries in ("both", "right") else x < max_val
    if not ok:
        raise exc(f"{name} must be {what}; got {x!r}")
    return int(x) if integral else float(x)


def check_bool(x, name: str) -> bool:
    """Check a True/False parameter; return it as ``bool``."""
    if not isinstance(x, bool | np.bool_):
        raise ConfigError(f"{name} must be True or False; got {x!r}")
    return bool(x)


class QueryLedger:
    """The queries of one ``fit``: asked through it, checked against the budget, counted per
    stage.

    Every learner asks its oracle through one ledger per call to ``fit``. The ledger counts
    what the oracle counts (``oracle.n_queries``), never a formula, and attributes every query
    to the stage that was current when the oracle counted it, so queries asked by helpers that
    take an oracle (:class:`~attnquery.learners._probes.Prober`, a nested learner,
    :meth:`BaseLearner._verify_fit`) are counted too, as long as they are asked inside
    ``with ledger.stage(name):``. Stages nest: an inner stage's queries are counted once, in
    the inner stage.

    The ledger is itself a value oracle (``__call__``, ``d``, ``n_queries``, ``kind``,
    ``remaining``, ``check_budget``): a helper given the ledger in place of the oracle asks in
    the current stage, with the budget checked per batch.

    Parameters
    ----------
    oracle : oracle
        Any object with the oracle interface (see :func:`check_oracle`).
    stages : sequence of str
        The stage names, in the order the learner runs them; each appears in :meth:`counts`
        (with 0 when the fit asked nothing in it). A stage not listed is added when used.
    what : str
        Names the learner in budget messages (``"{what}'s {stage} stage needs n queries"``).

    Attributes
    ----------
    n0 : int
        The oracle's count when the ledger was opened.
    n_requeried : int
        Queries the learner asked again (a saturated probe at a smaller scale); learners add
        to it, :attr:`BaseLearner.n_requeried_` reports it.

    Examples
    --------
    A learner's ``fit`` opens a ledger through :meth:`BaseLearner._open_ledger`, which sets
    ``n_queries_by_stage_`` when the fit ends, also when it raises::

        with self._open_ledger(oracle, ("v", "W", "verify")) as ledger:
            with ledger.stage("v"):
                v = read_v(ledger, d)
            y = ledger.ask(X, "W")            # one batch, budget-checked, counted under "W"
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, rng, rtol=..., n0=ledger.n0)
    """

    def __init__(self, oracle, stages=(), what: str = "the learner"):
        self.oracle = oracle
        self.what = what
        self.n0 = int(oracle.n_queries)
        self.n_requeried = 0
        self._counts = dict.fromkeys(stages, 0)
        self._current: str | None = None
        self._mark = self.n0

    # -- the oracle interface --------------------------------------------------------------------
    @property
    def d(self) -> int:
        return int(self.oracle.d)

    @property
    def n_queries(self) -> int:
        """The oracle's count now (as the oracle reports it, not since the ledger opened)."""
        return int(self.oracle.n_queries)

    @property
    def remaining(self):
        """Queries the oracle's budget has left (None without a budget)."""
        return getattr(self.oracle, "remaining", None)

    @property
    def kind(self) -> str:
        """The wrapped oracle's kind (``"value"`` unless it says otherwise)."""
        return getattr(self.oracle, "kind", "value")

    def check_budget(self, n: int, what: str = "this step") -> None:
        """Raise :class:`~attnquery.errors.BudgetExceededError` before spending ``n`` queries
        the budget cannot pay for (:func:`check_budget`)."""
        check_budget(self.oracle, n, what)

    def __call__(self, X) -> np.ndarray:
        """Ask the batch ``X`` in the current stage (see :meth:`ask`)."""
        return self.ask(X)

    # -- asking and counting ---------------------------------------------------------------------
    def ask(self, X, stage: str | None = None) -> np.ndarray:
        """Ask the batch ``X`` (B, N, d) in ``stage`` (default: the current one), after checking
        that the budget pays for its B queries; returns the answers as float (B,)."""
        stage = self._current if stage is None else stage
        X = np.asarray(X)
        self.check_budget(X.shape[0], f"{self.what}'s {stage or 'fit'} stage")
        with self.stage(stage):
            return np.asarray(self.oracle(X), dtype=float)

    def _flush(self) -> None:
        now = int(self.oracle.n_queries)
        if now != self._mark:
            key = self._current if self._current is not None else "other"
            self._counts[key] = self._counts.get(key, 0) + now - self._mark
        self._mark = now

    @contextlib.contextmanager
    def stage(self, name: str | None):
        """Count every query the oracle counts inside the block under ``name`` (``None``: the
        current stage)."""
        if name is None:
            yield self
            return
        self._flush()
        outer, self._current = self._current, name
        self._counts.setdefault(name, 0)
        try:
            yield self
        finally:
            self._flush()
            self._current = outer

    @property
    def total(self) -> int:
        """Queries the oracle counted since the ledger opened."""
        return int(self.oracle.n_queries - self.n0)

    def counts(self) -> dict:
        """Queries per stage so far, in the order of ``stages`` (a new dict)."""
        self._flush()
        return {k: int(v) for k, v in self._counts.items()}


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

    @contextlib.contextmanager
    def _open_ledger(self, oracle, stages=(), what: str | None = None):
        """Open the :class:`QueryLedger` of one ``fit``; when the block ends (also by an
        exception) set ``n_queries_by_stage_`` (a dict stage -> queries) from it."""
        ledger = QueryLedger(oracle, stages, what or type(self).__name__)
        try:
            yield ledger
        finally:
            self.n_queries_by_stage_ = ledger.counts()

    def _stage_count(self, stage: str) -> int:
        """``n_queries_by_stage_[stage]``, for the per-stage attributes derived from it."""
        stages = getattr(self, "n_queries_by_stage_", None)
        if stages is None:
            raise AttributeError("the per-stage query counts are available after fit()")
        return int(stages.get(stage, 0))


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
    if isinstance(oracle, QueryLedger):
        oracle = oracle.oracle
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
