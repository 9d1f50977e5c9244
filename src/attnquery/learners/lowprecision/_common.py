"""What both low-precision estimators share: their parameters and constraints, the checks of
the box and the budget before any query, the fit's query ledger (the one budget), the check
of the estimate, and the fitted head's results (``W_``, :meth:`predict`, :meth:`queries_for`)."""

from __future__ import annotations

import contextlib
from numbers import Integral, Real

import numpy as np

from ...errors import ConfigError
from .._base import (
    BLOCK_BYTES_PARAM,
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    NOISE_MODES,
    BaseLearner,
    check_verify_param,
    judge_noise,
)
from .._params import Interval, Options
from ._constants import _MIN_BIAS_ROUNDS, _OFFSET_QUERIES, _SCOUT_ALLOWANCE, STAGES


def min_queries(d: int, verify: int = DEFAULT_VERIFY, fit_bias: bool = False) -> int:
    """The least ``n_queries`` at dimension d (see
    :meth:`LowPrecisionValueQueryLearner.min_queries`)."""
    extra = (d + 1 + _OFFSET_QUERIES + 2 * d * (_MIN_BIAS_ROUNDS + 2)) if fit_bias else 0
    return int(2 * d * d + d + verify + _SCOUT_ALLOWANCE + extra)


class LowPrecisionBase(BaseLearner):
    """The parameters, checks and results both low-precision estimators share
    (:class:`~attnquery.learners.lowprecision.LowPrecisionValueQueryLearner`, the public
    entry, and :class:`~attnquery.learners.lowprecision.BiasedLowPrecisionLearner`, its bias
    route). Not a learner of its own: no ``fit``. Parameters: see
    :class:`~attnquery.learners.lowprecision.LowPrecisionValueQueryLearner`."""

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        "noise": [Options(NOISE_MODES)],
        "n_queries": [Interval(Integral, 1, None, closed="left")],
        "rank": [Interval(Integral, 1, None, closed="left"), None],
        "target_logit": [Interval(Real, 0, None, closed="neither")],
        "answer_scale": [Interval(Real, 0, None, closed="neither")],
        "max_logit": [Interval(Real, 1, 12, closed="right",
                               note="beyond 12 the smaller answer of a pair, exp(-max_logit) "
                                    "of the larger, nears the last token's own value")],
        "initial_logit_scale": [Interval(Real, 0, None, closed="neither")],
        "pilot_rows": [Interval(Integral, 2, None, closed="left")],
        "block_bytes": [BLOCK_BYTES_PARAM],
    }

    def __init__(self, *, n_queries: int, rank: int | None = None, target_logit: float = 2.5,
                 answer_scale: float = 16.0, max_logit: float = 10.0,
                 initial_logit_scale: float = 1.0, pilot_rows: int = 8,
                 block_bytes: int = 16 * 2**20, noise: str = "format",
                 verify: int = DEFAULT_VERIFY, check_length: int = CHECK_LENGTH,
                 random_state=None):
        self.n_queries = n_queries
        self.rank = rank
        self.target_logit = target_logit
        self.answer_scale = answer_scale
        self.max_logit = max_logit
        self.initial_logit_scale = initial_logit_scale
        self.pilot_rows = pilot_rows
        self.block_bytes = block_bytes
        self.verify = verify
        self.check_length = check_length
        self.random_state = random_state
        self.noise = noise

    def _validate_extra(self) -> None:
        if 2 * self.target_logit > self.max_logit:
            raise ConfigError(f"target_logit must be at most max_logit / 2; got "
                              f"{self.target_logit} with max_logit {self.max_logit}")

    def _check_box(self, oracle, d: int, fit_bias: bool) -> int:
        """Raise :class:`~attnquery.errors.ConfigError` before any query for a membership
        oracle, a rank above d or ``n_queries`` below :func:`min_queries`; returns the check
        queries, the ledger's reserve."""
        name = type(self).__name__
        if getattr(oracle, "kind", "value") == "membership":
            raise ConfigError(f"{name} needs value answers; got a "
                              "membership oracle (use MembershipLearner)")
        if self.rank is not None and self.rank > d:
            raise ConfigError(f"rank must be at most d = {d}; got {self.rank}")
        n_verify = check_verify_param(self.verify)
        budget = int(self.n_queries)
        need = min_queries(d, n_verify, fit_bias)
        if budget < need:
            raise ConfigError(
                f"n_queries = {budget} is below the {need} queries one probe pair per entry of W "
                f"needs at d = {d} (2 d^2 + d + verify + {_SCOUT_ALLOWANCE}; see "
                f"{name}.min_queries)")
        return n_verify

    @contextlib.contextmanager
    def _open_budget(self, oracle, n_verify: int):
        """The fit's query ledger, its one budget: ``cap=n_queries`` with the check queries
        as its ``reserve`` (``ledger.left()`` is what the passes share, ``need`` refuses a step
        that does not fit); the oracle's budget must pay for all ``n_queries`` before any
        query (:class:`~attnquery.errors.BudgetExceededError` otherwise)."""
        budget, name = int(self.n_queries), type(self).__name__
        with self._open_ledger(oracle, STAGES, what=name, cap=budget,
                               reserve=n_verify) as ledger:
            ledger.need(budget, f"{name}(n_queries={budget})", reserved=True)
            yield ledger

    def _check(self, oracle, ledger, rng, d: int, answer_format: str, W_err_noise: float,
               what: str) -> None:
        """The noise judged against the answers' format (in "format" mode the check's
        tolerance, built from the noise, is then bounded by the format's floor), then the
        check queries against the estimate (:meth:`_verify_fit`)."""
        judge_noise(self, self.noise_level_, answer_format, d, what)
        Wn = float(np.linalg.norm(self.singular_values_))
        with ledger.stage("verify"):
            self._verify_fit(oracle, self.predict, rng,
                             rtol=self._check_tolerance(W_err_noise),
                             token_scale=float(np.sqrt(d / Wn)) if Wn > 0 else 1.0,
                             n0=ledger.n0, check_length=self.check_length)

    def _check_tolerance(self, W_err_noise: float) -> float:
        """Relative tolerance of the check: the answers' own noise (six times its relative
        size) and the estimate's error, with a margin of ten."""
        return float(6.0 * self.noise_level_
                     + 10.0 * (W_err_noise + self.v_error_estimate_) + 1e-9)

    # -- results ----------------------------------------------------------------------------------
    @property
    def W_(self) -> np.ndarray:
        """Estimate of W (d x d); from the factors, on request, when they are set."""
        if not hasattr(self, "v_"):
            raise AttributeError("W_ is available after fit()")
        if self.W_factors_ is None:
            return self._W
        L, R = self.W_factors_
        return L @ R.T

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered head on inputs X (B, N, d) (from the factors when set)."""
        from ...models import AttentionHead

        bias = {"key_bias": self.key_bias_, "offset": self.offset_}
        if self.W_factors_ is None:
            return AttentionHead(self.v_, W=self._W, **bias)(X)
        L, R = self.W_factors_
        if L.shape[1] == 0:
            return AttentionHead(self.v_, W=np.zeros((self.v_.size,) * 2), **bias)(X)
        return AttentionHead(self.v_, K=L.T, Q=R.T, **bias)(X)

    def queries_for(self, rel_error: float) -> int:
        """Queries this learner would need for a relative error of W of ``rel_error``: its own
        error estimate scaled by the ``1 / sqrt(queries)`` of averaging (at least
        :func:`min_queries`)."""
        if not hasattr(self, "W_error_estimate_"):
            raise AttributeError("queries_for needs a fitted learner")
        if not (isinstance(rel_error, int | float | np.floating) and np.isfinite(rel_error)
                and rel_error > 0):
            raise ConfigError(f"rel_error must be a positive number; got {rel_error!r}")
        d = self.v_.size
        n_w = 2 * d * (self.n_passes_ * d + self.n_partial_rows_)
        need = n_w * (self.W_error_estimate_ / rel_error) ** 2 + (self.n_queries_ - n_w)
        return int(max(np.ceil(need), min_queries(d, check_verify_param(self.verify))))
