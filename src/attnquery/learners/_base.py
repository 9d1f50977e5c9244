"""Shared pieces of every learner: scikit-learn style parameters, parameter checks, the query
ledger every fit asks its oracle through, and the check of a fitted estimate."""

from __future__ import annotations

import contextlib
import inspect
import numbers
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import (
    BudgetExceededError,
    ConfigError,
    ModelMismatchError,
    NoiseAboveFormatWarning,
    VacuousCheckWarning,
)
from ..oracles import Oracle
from ..precision import rounding_floor
from ..rng import as_rng
from ._params import DEPRECATED, Interval, make_constraint, validate_parameter_constraints

__all__ = ["BaseLearner", "QueryLedger", "check_scalar", "check_oracle",
           "check_budget", "chunk_slices", "check_answers", "check_signs", "check_queries",
           "check_plan", "check_verify_param", "check_length_param", "DEFAULT_VERIFY",
           "MAX_VERIFY", "VERIFY_PARAM", "BLOCK_BYTES_PARAM", "CHECK_LENGTH_PARAM",
           "CHECK_LENGTHS", "CHECK_LENGTH", "check_lengths", "ROUNDING_RTOL",
           "output_error_bound", "NOISE_FORMAT_FACTOR", "NOISE_MODES",
           "check_noise_mode", "judge_noise", "renamed_parameter", "ForwardingOracle"]

#: check queries a learner spends after fitting, unless told otherwise (``verify=0`` turns it off):
#: with the position-free learners' lengths (:func:`check_lengths`, ``check_length`` 4096), 6
#: fresh queries of 2, 4, 8, 32, 64 and 4,096 tokens and prefix-permuted copies of the two
#: longest, the 4,096- and 64-token ones (see :func:`check_plan`)
DEFAULT_VERIFY = 8
#: the most check queries a learner spends: 10,000 queries of 2 to 128 tokens at d = 384 hold
#: about 1 GiB of float64 tokens
MAX_VERIFY = 10_000
#: the constraint of ``block_bytes``, the memory bound on one batch of queries
BLOCK_BYTES_PARAM = Interval(numbers.Integral, 1, None, closed="left")
#: the ``verify`` parameter's constraint (every learner's, :attr:`BaseLearner.
#: _parameter_constraints`)
VERIFY_PARAM = Interval(numbers.Integral, 0, MAX_VERIFY, closed="both",
                        note="0 turns the check off")
#: sequence lengths of the fresh check queries (:func:`check_plan` spreads them over these, the
#: shortest and the longest always included): long sequences are where a windowed or
#: position-dependent box differs from a head (a 4-token window is exact on 2 and 4 tokens)
CHECK_LENGTHS = (2, 4, 8, 16, 32, 64, 128)
#: the longest check query of the position-free learners, unless their ``check_length`` says
#: otherwise (:func:`check_lengths`): a box that behaves like a head on every input of up to
#: this many tokens (a sliding window this wide or wider, a logit scaling that starts beyond
#: it) passes the check
CHECK_LENGTH = 4096
#: the ``check_length`` parameter's constraint (the position-free learners')
CHECK_LENGTH_PARAM = Interval(numbers.Integral, 1, None, closed="left",
                              note="the tokens of the longest check queries")
#: one check query in PERMUTED_SHARE is a copy of a fresh one with its first N - 1 tokens
#: permuted, which a position-free box must answer alike
PERMUTED_SHARE = 4
#: relative disagreement of the check queries that float64 rounding explains, for the learners
#: that are exact in float64 (exact, sketch, polished nuclear-norm): the default study's exact
#: grid and the 72 MiniLM heads stay below 1.1e-11 (Gaussian probes at d = 512; 6e-14 with
#: the default basis probes), answers rounded to float32 (relative error 6e-8) give more than
#: 2e-7 (``python -m attnquery.bench probes``)
ROUNDING_RTOL = 1e-9
#: what a failed check may mean, unless a learner says better
MISMATCH_HINT = ("the box may have several heads, biases, noise or lower precision than "
                 "float64")


def check_scalar(x, name: str, target_type: type | tuple = numbers.Real, *, min_val=None,
                 max_val=None, include_boundaries: str = "both", allow_none: bool = False,
                 exc: type[Exception] = ConfigError, what: str | None = None):
    """Check one scalar parameter and return it (``int`` or ``float``; ``None`` if allowed).

    One value checked against one :class:`~attnquery.learners._params.Interval` (in the
    manner of scikit-learn's ``check_scalar``), for the checks that need more than a learner's
    declared constraints (a bound that depends on d) and for functions outside the learners:
    ``x`` must be an instance of ``target_type`` (``numbers.Integral`` or ``numbers.Real``;
    ``bool`` is never a number), finite (an integer at most int64, a number a float holds),
    and within ``[min_val, max_val]``, whose ends are included as ``include_boundaries``
    says.

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
    if isinstance(target_type, tuple):
        integral = all(t is numbers.Integral for t in target_type)
        target_type = numbers.Integral if integral else numbers.Real
    integral = target_type is numbers.Integral
    allowed = [Interval(target_type, min_val, max_val, closed=include_boundaries)]
    if allow_none:
        allowed.append(None)
    if what is not None:
        if not any(make_constraint(c).is_satisfied_by(x) for c in allowed):
            raise exc(f"{name} must be {what}; got {x!r}")
    else:
        validate_parameter_constraints({name: allowed}, {name: x}, errors={name: exc})
    return int(x) if integral else float(x)


class ForwardingOracle:
    """Base of an oracle that wraps another one query for query (one of its queries is one of
    the wrapped oracle's): the kind, the count and the budget are the wrapped oracle's
    (``_inner``).

    ``remaining`` and ``check_budget`` reach the wrapped oracle's budget, which
    :func:`check_budget` (and a :class:`QueryLedger` around the wrapper) reads; the wrapper
    keeps no budget of its own. The :class:`QueryLedger` is one, whose ``check_budget`` adds
    the fit's own cap.
    """

    @property
    def d(self) -> int:
        return int(self._inner.d)

    @property
    def kind(self) -> str:
        """The wrapped oracle's kind (``"value"`` unless it says otherwise)."""
        return getattr(self._inner, "kind", "value")

    @property
    def n_queries(self) -> int:
        """The wrapped oracle's count now."""
        return int(self._inner.n_queries)

    @property
    def remaining(self):
        """The wrapped oracle's ``remaining`` (None without a budget)."""
        return getattr(self._inner, "remaining", None)

    def check_budget(self, n: int, what: str = "this step") -> None:
        """The wrapped oracle's check (:func:`check_budget`)."""
        check_budget(self._inner, n, what)


class QueryLedger(ForwardingOracle):
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
    cap : int, optional
        The learner's own query budget for this fit (its ``n_queries`` parameter), counted
        from the oracle's count when the ledger opens; the oracle's budget, if any, applies
        too. This is the one budget mechanism of the learners: :meth:`left` says what is left,
        :meth:`need` refuses a step that does not fit before it is asked.
    reserve : int
        Queries kept back for the last stages (the check): :meth:`left` and :meth:`need`
        leave them out unless called with ``reserved=True``; :meth:`ask` may spend them.

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

    def __init__(self, oracle, stages=(), what: str = "the learner", cap: int | None = None,
                 reserve: int = 0):
        self.oracle = oracle
        self.what = what
        self.cap = None if cap is None else int(cap)
        self.reserve = int(reserve)
        self.n0 = int(oracle.n_queries)
        self.n_requeried = 0
        self._counts = dict.fromkeys(stages, 0)
        self._current: str | None = None
        self._mark = self.n0

    # -- the oracle interface (d, n_queries, kind, remaining: the oracle's) ---------------------
    @property
    def _inner(self):
        return self.oracle

    def check_budget(self, n: int, what: str = "this step") -> None:
        """Raise :class:`~attnquery.errors.BudgetExceededError` before spending ``n`` queries
        the budget cannot pay for: the fit's cap (the reserve included) and the oracle's
        budget (:func:`check_budget`)."""
        self.need(n, what, reserved=True)

    # -- the one budget --------------------------------------------------------------------------
    def left(self, *, reserved: bool = False) -> int | None:
        """Queries this fit may still ask: the least of what its ``cap`` and the oracle's
        budget leave, less the ``reserve`` kept for later stages (with ``reserved=True``, the
        reserve included: what the stages it is kept for may spend). None when neither the
        cap nor the oracle bounds the fit."""
        bounds = []
        if self.cap is not None:
            bounds.append(self.cap - self.total)
        remaining = self.remaining
        if remaining is not None:
            bounds.append(int(remaining))
        if not bounds:
            return None
        return min(bounds) - (0 if reserved else self.reserve)

    def need(self, n: int, what: str, *, reserved: bool = False, refusal=None) -> None:
        """Raise :class:`~attnquery.errors.BudgetExceededError`, naming ``what``, when ``n``
        more queries do not fit in :meth:`left` (before any of them is asked).

        A learner plans with it (``ledger.need(m, "the W pass")``); :meth:`ask` checks every
        batch with ``reserved=True``, so the stages the reserve is kept for can spend it.
        ``refusal``, a function ``(n, spent, cap) -> exception``, gives the error raised when
        the fit's own ``cap`` refuses, where a learner words its own (the FFN learner's cap
        ends its search with a :class:`~attnquery.errors.SearchLimitError`)."""
        n = int(n)
        keep = 0 if reserved else self.reserve
        if self.cap is not None and n + keep > self.cap - self.total:
            if refusal is not None:
                raise refusal(n, self.total, self.cap)
            kept = f", {keep} kept for later stages" if keep else ""
            raise BudgetExceededError(
                f"{what} needs {n} queries but only {max(self.cap - self.total - keep, 0)} of "
                f"{self.what}'s budget of {self.cap} remain ({self.total} spent{kept})")
        remaining = self.remaining
        if keep and remaining is not None and n + keep > remaining:
            raise BudgetExceededError(
                f"{what} needs {n} queries but only {max(int(remaining) - keep, 0)} of the "
                f"oracle's budget remain ({keep} kept for later stages)")
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
    """Parameters live in ``__init__``; ``fit(oracle)`` returns self; fitted attributes end in _.

    Each learner declares the values its parameters may take in ``_parameter_constraints``
    (parameter name -> list of constraints, any one of which admits a value; the vocabulary
    is :mod:`attnquery.learners._params`), extending this class's dict, and its rules that
    join several parameters in :meth:`_validate_extra`. Its ``fit`` calls
    :meth:`_validate_params` first, so a bad value raises
    :class:`~attnquery.errors.ConfigError` before any query. ``_parameter_errors`` maps a
    parameter to the ConfigError subclass its bad value raises, where that is more specific.
    """

    #: parameter name -> list of constraints (see :mod:`attnquery.learners._params`)
    _parameter_constraints: dict = {
        "verify": [VERIFY_PARAM],
        "random_state": ["random_state"],
    }
    #: parameter name -> the ConfigError subclass its bad value raises (default ConfigError)
    _parameter_errors: dict = {}

    @classmethod
    def parameter_constraints(cls) -> dict:
        """Each parameter's constraints in words (:func:`~attnquery.learners._params.
        describe_constraints`), in the order of ``__init__``: ``{"verify": "an integer in
        [0, 10000] (0 turns the check off)", ...}``."""
        from ._params import describe_constraints

        names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        return {n: describe_constraints(cls._parameter_constraints[n]) for n in names
                if n in cls._parameter_constraints}

    def _validate_params(self) -> None:
        """Check every declared parameter, then :meth:`_validate_extra`; raise
        :class:`~attnquery.errors.ConfigError` naming the parameter, what it may be and the
        value given. Asks no query: ``fit`` calls it first."""
        validate_parameter_constraints(type(self)._parameter_constraints, self.get_params(),
                                       errors=type(self)._parameter_errors)
        self._validate_extra()

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

    def _verify_fit(self, oracle, predict, rng: np.random.Generator, rtol: float,
                    atol=0.0, what: str = "a single attention head",
                    token_scale: float = 1.0, n0: int | None = None, lengths=CHECK_LENGTHS,
                    signs: bool = False, hint: str | None = None,
                    pair_atol: float | None = None, permuted: bool = True,
                    n_checks: int | None = None, check_length: int | None = None) -> None:
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
        learner of a position-dependent model, such as rotary heads).
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
                             pair_atol=pair_atol, permuted=permuted)
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

    def _rng(self) -> np.random.Generator:
        return as_rng(getattr(self, "random_state", None))

    @contextlib.contextmanager
    def _open_ledger(self, oracle, stages=(), what: str | None = None, cap: int | None = None,
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
    """Ask the oracle whether ``n`` queries fit its budget (if it has one) before spending them.

    The ledger's way to the oracle's budget (:meth:`QueryLedger.need` calls it; given a ledger,
    it is the ledger's ``need``): a learner plans with its fit's ledger, never with this."""
    if isinstance(oracle, QueryLedger):
        oracle.need(n, what, reserved=True)
        return
    if isinstance(oracle, Oracle):
        oracle.check_budget(n, what)
    else:
        remaining = getattr(oracle, "remaining", None)
        if remaining is not None and n > remaining:
            from ..errors import BudgetExceededError

            raise BudgetExceededError(f"{what} needs {n} queries; {remaining} remain")


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
                      stacklevel=5)
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


def check_length_param(n) -> int:
    """The ``check_length`` parameter of the position-free learners (an integer >= 1): the
    tokens of their longest check queries (:func:`check_lengths`)."""
    return check_scalar(n, "check_length", numbers.Integral, min_val=1)


#: how a learner judges the relative noise it measures on answers in a narrow format (its
#: ``noise`` parameter): "format", against what the format's rounding explains; "measured",
#: as it is, the answers declared noisier than their format
NOISE_MODES = ("format", "measured")
#: the most relative noise answers in a narrow format may carry, in units of the format's
#: rounding floor (:func:`attnquery.precision.rounding_floor`). Measured noise over floor on
#: valid boxes (docs/notes/2026-11-27-noise-format.md): the low-precision learner's
#: ``noise_level_`` on float32 heads 0.29 to 0.54 at d = 16 and 32 (random heads, the served
#: test checkpoint, ours and onnxruntime's), 0.79 to 0.96 at d = 64, 0.55 to 1.03 on six
#: MiniLM heads (d = 384); 0.77 to 1.42 in float16, 0.85 to 1.43 in bfloat16; the layer
#: learner's one-row noise 0.26 to 0.44 on float32 layers (test checkpoint, MiniLM layers 0 to
#: 5), 0.42 to 1.41 in float16, 0.73 to 1.43 in bfloat16. Misfits: a soft-capped float32 head
#: (d = 64) 7e3 to 1.4e4; a soft-capped float32 layer with relative noise 5e-6 (d = 32) 6.5
#: to 9.8
NOISE_FORMAT_FACTOR = 4.0


def check_noise_mode(noise) -> str:
    """The ``noise`` parameter of a learner, one of :data:`NOISE_MODES`."""
    if not isinstance(noise, str) or noise not in NOISE_MODES:
        raise ConfigError(f"noise must be one of {NOISE_MODES}; got {noise!r}")
    return noise


def judge_noise(learner, noise: float, fmt: str, d: int, what: str,
                stacklevel: int = 3) -> None:
    """Judge the answers' measured relative noise against what their format explains.

    Answers in a narrow format (``fmt``, :func:`attnquery.precision.answer_format`) are
    rounded by it, and a box of what the learner assumes answers with noise of at most
    :data:`NOISE_FORMAT_FACTOR` times :func:`~attnquery.precision.rounding_floor`: more is
    a box the learner's model does not fit (its answers' disagreement with that model is
    counted as noise) or noise the box adds. With ``learner.noise == "format"`` that raises
    :class:`~attnquery.errors.ModelMismatchError` (``error``: the noise, ``allowed``: the
    allowance); with ``"measured"`` (noise declared) it warns with
    :class:`~attnquery.errors.NoiseAboveFormatWarning`. Answers in no narrow format
    (``"float64"``) are not judged. Sets ``answer_format_``, ``noise_floor_`` (the floor; None
    for float64) and ``noise_above_format_`` on the learner. ``stacklevel``: the warning's, so
    that it names the line that called ``fit`` (3 where ``fit`` calls this directly).
    """
    learner.answer_format_, learner.noise_floor_ = fmt, None
    learner.noise_above_format_ = False
    if fmt == "float64":
        return
    floor = rounding_floor(fmt, d)
    learner.noise_floor_ = floor
    allowed = NOISE_FORMAT_FACTOR * floor
    if not noise > allowed:
        return
    learner.noise_above_format_ = True
    msg = (f"the answers are {fmt} values, whose rounding explains a relative noise of about "
           f"{floor:.3g} at d = {int(d)} (at most {NOISE_FORMAT_FACTOR:g} times it, "
           f"{allowed:.3g}, is allowed), but they carry {noise:.3g}, {noise / floor:.3g} times "
           "that floor")
    if check_noise_mode(learner.noise) == "format":
        raise ModelMismatchError(
            f"{msg}: the box is not {what} served in {fmt} (what it answers beyond the model "
            "is counted as noise), or it adds noise of its own (declare that with "
            "noise='measured')", error=float(noise), allowed=float(allowed))
    warnings.warn(f"{msg}; noise='measured' declares such answers, so {type(learner).__name__} "
                  "goes on with the noise it measured, which a box that is not "
                  f"{what} inflates too (noise_above_format_ = True)",
                  NoiseAboveFormatWarning, stacklevel=stacklevel)


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


def check_lengths(check_length: int = CHECK_LENGTH, lengths=CHECK_LENGTHS) -> tuple[int, ...]:
    """The lengths a position-free learner's check queries are spread over: ``lengths`` with
    its longest replaced by ``check_length`` (and those not below ``check_length`` dropped).

    ``check_length`` is then the longest, always asked, with its prefix-permuted copy
    (:func:`check_plan`), while the short end of the plan is that of ``lengths``: with
    :data:`DEFAULT_VERIFY` queries, the same lengths as before but for the longest (the short
    queries are where a loose error model still tests the estimate: the noisy learner's at
    tau = 1e-4, d = 6, on 2-token queries only). ``check_length = 128`` gives
    :data:`CHECK_LENGTHS` itself.

    Examples: ``check_lengths()`` is (2, 4, 8, 16, 32, 64, 4096), ``check_lengths(100)`` is
    (2, 4, 8, 16, 32, 64, 100), ``check_lengths(16)`` is (2, 4, 8, 16), ``check_lengths(1)``
    is (1,).
    """
    n = check_length_param(check_length)
    base = sorted({int(m) for m in lengths})
    return (*[m for m in base[:-1] if m < n], n)


def check_plan(n_checks: int, lengths=CHECK_LENGTHS,
               permuted: bool = True) -> tuple[list[int], int]:
    """How ``n_checks`` check queries are spent: the lengths of the fresh random queries and the
    number of prefix-permuted copies.

    One query in :data:`PERMUTED_SHARE` (rounded down) is a copy of one of the longest fresh
    queries with its first N - 1 tokens permuted (only queries of N >= 3 tokens have a prefix
    to permute; without any, or with ``permuted=False``, every query is fresh). The fresh
    queries' lengths are spread over ``lengths``: with fewer queries than lengths, the
    shortest, the longest and evenly spaced ones between; with more, every length about
    equally often.

    Examples: 8 queries with :data:`CHECK_LENGTHS` are 6 fresh of 2, 4, 8, 32, 64 and 128
    tokens and copies of the 128- and 64-token ones; 64 are 48 fresh (about 7 of each
    length) and 16 copies.
    """
    lengths = sorted(int(n) for n in lengths)
    if not lengths or lengths[0] < 1:
        raise ConfigError(f"check lengths must be positive integers; got {lengths!r}")

    def spread(m):
        L = len(lengths)
        if m <= L:
            idx = np.round(np.linspace(0, L - 1, m)).astype(int) if m > 1 else [L - 1][:m]
        else:
            idx = (np.arange(m) * L) // m
        return [lengths[i] for i in idx]

    n_perm = n_checks // PERMUTED_SHARE if permuted else 0
    fresh = spread(n_checks - n_perm)
    n_perm = min(n_perm, sum(n >= 3 for n in fresh))
    if n_perm == 0:
        fresh = spread(n_checks)
    return fresh, n_perm


def _permute_prefix(rng: np.random.Generator, X: np.ndarray) -> np.ndarray:
    """``X`` (B, N, d) with each query's first N - 1 tokens in a random order other than the
    given one (N >= 3)."""
    B, N, _ = X.shape
    perm = np.argsort(rng.random((B, N - 1)), axis=1)
    same = np.all(perm == np.arange(N - 1), axis=1)
    perm[same] = np.arange(N - 1)[::-1]
    out = X.copy()
    out[:, : N - 1] = np.take_along_axis(X[:, : N - 1], perm[:, :, None], axis=1)
    return out


def check_queries(rng: np.random.Generator, d: int, n_checks: int, token_scale: float = 1.0,
                  lengths=CHECK_LENGTHS, return_pairs: bool = False, permuted: bool = True):
    """Fresh random check queries: i.i.d. Gaussian tokens of norm about ``token_scale``, their
    lengths and the prefix-permuted copies as :func:`check_plan` says, one batch per length
    (the copies in batches of their own, after the fresh ones).

    With ``return_pairs``, also an (n_perm, 2) array of the positions, in the concatenated
    answers, of each fresh query and its permuted copy.
    """
    fresh, n_perm = check_plan(n_checks, lengths, permuted)
    sizes = {n: fresh.count(n) for n in sorted(set(fresh))}
    batches = [rng.standard_normal((size, n_tok, d)) * (token_scale / np.sqrt(d))
               for n_tok, size in sizes.items()]
    starts = np.cumsum([0] + [b.shape[0] for b in batches])
    pairs = []
    if n_perm:
        # copies of the n_perm longest fresh queries: the last rows of the last batches
        chosen = []  # (batch, row)
        for k in range(len(batches) - 1, -1, -1):
            for row in range(batches[k].shape[0] - 1, -1, -1):
                if len(chosen) < n_perm:
                    chosen.append((k, row))
        pos = int(starts[-1])
        for k in sorted({k for k, _ in chosen}):
            rows = sorted(r for kk, r in chosen if kk == k)
            batches.append(_permute_prefix(rng, batches[k][rows]))
            for r in rows:
                pairs.append((int(starts[k] + r), pos))
                pos += 1
    if return_pairs:
        return batches, np.array(pairs, dtype=int).reshape(-1, 2)
    return batches


def _allowance(atol, X: np.ndarray) -> np.ndarray:
    """Absolute allowance per query: ``atol`` itself, or ``atol(X)`` when it is callable."""
    if callable(atol):
        return np.asarray(atol(X), dtype=float).reshape(X.shape[0])
    return np.full(X.shape[0], float(atol))


@dataclass
class _CheckResult:
    error: float
    n_queries: int
    n_informative: int
    allowed_rel: float


def _ask_checks(oracle, predict, rng, n_checks, atol, token_scale, lengths, permuted=True):
    d = int(oracle.d)
    check_budget(oracle, n_checks, "the check of the estimate")
    n0 = oracle.n_queries
    ys, yhats, allow, ns = [], [], [], []
    batches, pairs = check_queries(rng, d, n_checks, token_scale, lengths, return_pairs=True,
                                   permuted=permuted)
    for X in batches:
        ys.append(np.asarray(oracle(X), dtype=float))
        yhats.append(np.asarray(predict(X), dtype=float))
        allow.append(_allowance(atol, X))
        ns.append(np.full(X.shape[0], X.shape[1]))
    return (np.concatenate(ys), np.concatenate(yhats), np.concatenate(allow),
            np.concatenate(ns), pairs, int(oracle.n_queries - n0))


_POSITION_HINT = ("the box's answer depends on the order of the tokens (a sliding window, ALiBi, "
                  "rotary or other positions), which {what} cannot; or {hint}")


def _run_check(oracle, predict, rng, n_checks, rtol, atol=0.0, what="a single attention head",
               token_scale=1.0, lengths=CHECK_LENGTHS, hint=None, signs=False,
               pair_atol=None, permuted=True) -> _CheckResult:
    """The check of :func:`check_answers` (or, with ``signs``, :func:`check_signs`), with the
    number of informative queries: those whose allowed disagreement is below the estimate's
    own answer, counting one-token queries only when there are no longer ones (they test v
    alone). The permuted pairs are not counted: they test the order of the tokens only."""
    if n_checks == 0:
        return _CheckResult(float("nan"), 0, 0, float("nan"))
    y, yhat, allow, ns, pairs, n_used = _ask_checks(oracle, predict, rng, n_checks, atol,
                                                    token_scale, lengths, permuted)
    a, b = pairs[:, 0], pairs[:, 1]
    if signs:
        return _signs_verdict(y, yhat, allow, pairs, rtol, what, hint, n_checks, n_used)
    diffs = np.abs(y - yhat)
    diff = float(np.max(diffs))
    scale = float(np.max(np.abs(y)))
    error = diff / scale if scale > 0 else diff
    unit = scale if scale > 0 else 1.0
    allowed = allow + rtol * scale
    # a permuted copy: a position-free box answers both alike, to within its answers' error
    pdiff = np.abs(y[a] - y[b])
    # (with pair_atol, float64 rounding on top: the two sums run in different orders)
    pallowed = (allowed[a] + allowed[b]) if pair_atol is None else \
        np.full(a.size, float(pair_atol) + 2 * max(rtol, ROUNDING_RTOL) * scale)
    pbad = ~(pdiff <= pallowed)
    if pbad.any():
        k = int(np.argmax(np.where(pbad, pdiff - pallowed, -np.inf)))
        raise ModelMismatchError(
            f"answers change by {pdiff[k] / unit:.3g} (relative) when the first "
            f"{int(ns[a[k]]) - 1} tokens of a {int(ns[a[k]])}-token check query are permuted, "
            f"where at most {pallowed[k] / unit:.3g} is expected; "
            + _POSITION_HINT.format(what=what, hint=hint or MISMATCH_HINT),
            error=max(error, float(pdiff[k] / unit)), allowed=float(pallowed[k] / unit),
            n_checks=n_used)
    bad = ~(diffs <= allowed)  # NaN included
    if bad.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            k = int(np.argmax(np.where(bad, np.nan_to_num(diffs / allowed, nan=np.inf), -1.0)))
        seen, allowed_rel = float(diffs[k] / unit), float(allowed[k] / unit)
        longest = int(ns.max())
        raise ModelMismatchError(
            f"answers differ from {what} by {error:.3g} (relative) on {n_checks} check "
            f"queries of {int(ns.min())} to {longest} tokens, {int(bad.sum())} of them by more "
            f"than expected (the farthest, of {int(ns[k])} tokens, by {seen:.3g} where at most "
            f"{allowed_rel:.3g} is expected); {hint or MISMATCH_HINT}",
            error=error, allowed=allowed_rel, n_checks=n_used)
    # one-token answers x^T v test v alone: the check of the rest (W, the positions) rests on
    # the longer queries, when there are any
    multi = ns >= 2 if np.any(ns >= 2) else np.ones(ns.size, dtype=bool)
    informative = int(np.count_nonzero((allowed < np.abs(yhat)) & multi))
    return _CheckResult(error, n_used, informative, float(np.min((allowed / unit)[multi])))


def check_answers(oracle, predict, rng: np.random.Generator, n_checks: int, rtol: float,
                  atol=0.0, what: str = "a single attention head",
                  token_scale: float = 1.0, lengths=CHECK_LENGTHS,
                  hint: str | None = None, pair_atol: float | None = None) -> tuple[float, int]:
    """Compare the oracle with an estimate on ``n_checks`` fresh random queries.

    The check queries come from :func:`check_queries` (lengths spread over ``lengths``, and
    prefix-permuted copies of the longest, :func:`check_plan`). The estimate passes when
    ``|y - y_hat| <= atol + rtol * max |y|`` on every query, where ``y`` are the oracle's
    answers and ``y_hat = predict(X)``; ``atol`` is a number or a function of the queries
    ``X (B, N, d)`` giving each query's own allowance (B,). The box's answers on a query and on
    its prefix-permuted copy must also agree, to within ``pair_atol + 2 max(rtol,
    ROUNDING_RTOL) max |y|`` (the answers' own error, when known, and rounding) or else the
    sum of the two queries' allowances: a position-free estimate answers both alike, so this
    catches position-dependent boxes even where the estimate's allowance is loose. ``hint``
    (what the disagreement may mean) ends the error message.

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
        When the estimate fails the test, or the answers change under a permutation of a
        query's first N - 1 tokens.
    """
    res = _run_check(oracle, predict, rng, n_checks, rtol, atol=atol, what=what,
                     token_scale=token_scale, lengths=lengths, hint=hint, pair_atol=pair_atol)
    return res.error, res.n_queries


def check_signs(oracle, predict, rng: np.random.Generator, n_checks: int, rtol: float = 0.0,
                atol=0.0, what: str = "a single attention head", token_scale: float = 1.0,
                lengths=CHECK_LENGTHS, hint: str | None = None) -> tuple[float, int]:
    """Compare a membership oracle's signs with an estimate's on ``n_checks`` fresh queries.

    ``predict(X)`` gives the estimate's values; a query where the estimate says
    ``f(X) > 0`` and the oracle answers 0 (or the reverse) is a disagreement unless
    ``|predict(X)| <= atol + rtol * max |predict(X)|`` (the estimate's own uncertainty there;
    ``atol`` a number or a function of the queries, as in :func:`check_answers`). The queries
    are :func:`check_queries`'s; the box must answer a query and its prefix-permuted copy
    with the same sign (a position-free head does, whatever the estimate's uncertainty).

    Returns
    -------
    error : float
        The fraction of check queries whose signs disagree beyond the estimate's uncertainty.
    n_queries : int
        Check queries counted by the oracle.

    Raises
    ------
    ModelMismatchError
        When any sign disagrees beyond the estimate's uncertainty, or the box's sign changes
        under a permutation of a query's first N - 1 tokens.
    """
    res = _run_check(oracle, predict, rng, n_checks, rtol, atol=atol, what=what,
                     token_scale=token_scale, lengths=lengths, hint=hint, signs=True)
    return res.error, res.n_queries


def _signs_verdict(ans, yhat, allow, pairs, rtol, what, hint, n_checks, n_used):
    a, b = pairs[:, 0], pairs[:, 1]
    flipped = (ans[a] > 0.5) != (ans[b] > 0.5)
    if flipped.any():
        raise ModelMismatchError(
            f"membership answers change sign on {int(flipped.sum())} of {a.size} check queries "
            "when their first N - 1 tokens are permuted; "
            + _POSITION_HINT.format(what=what, hint=hint or MISMATCH_HINT),
            error=float(np.mean(flipped)), allowed=0.0, n_checks=n_used)
    bound = allow + rtol * float(np.max(np.abs(yhat)))
    sure = ~(np.abs(yhat) <= bound)  # NaN: never sure
    wrong = sure & ((ans > 0.5) != (yhat > 0))
    error = float(np.mean(wrong))
    if wrong.any():
        raise ModelMismatchError(
            f"membership answers differ from {what} on {int(wrong.sum())} of {n_checks} check "
            f"queries where the estimate's sign is certain; {hint or MISMATCH_HINT}",
            error=error, allowed=0.0, n_checks=n_used)
    informative = int(np.count_nonzero(sure))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = float(np.min(bound / np.max(np.abs(yhat)))) if np.any(yhat) else float("nan")
    return _CheckResult(error, n_used, informative, rel)
