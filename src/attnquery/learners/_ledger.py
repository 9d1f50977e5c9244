"""The query ledger every fit asks its oracle through and the check of an oracle; the wrapper
the ledger derives from (:class:`~attnquery.oracles.ForwardingOracle`) and the check of an
oracle's budget (:func:`check_budget`) are the oracles' (:mod:`attnquery.oracles._base`),
imported here.

Re-exported by :mod:`attnquery.learners._base`, where learners import them from."""

from __future__ import annotations

import contextlib

import numpy as np

from ..errors import BudgetExceededError, ConfigError
from ..oracles._base import ForwardingOracle, check_budget

__all__ = ["ForwardingOracle", "QueryLedger", "check_oracle", "check_budget"]


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

    #: :func:`check_budget` asks the ledger itself (its ``check_budget``: the fit's cap, then the
    #: oracle's budget)
    own_budget = True

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
