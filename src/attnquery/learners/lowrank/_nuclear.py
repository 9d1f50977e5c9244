"""Theorem 5.1: nuclear-norm minimisation from Gaussian rank-one projections, optionally
polished (:class:`NuclearNormROPLearner`; see :mod:`attnquery.learners.lowrank`)."""

from __future__ import annotations

import time
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.linalg

from ...errors import ConfigError
from .._base import (
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    N_QUERIES_PARAM,
    ROUNDING_RTOL,
    BaseLearner,
    check_oracle,
    check_verify_param,
)
from .._params import Interval, Options
from .._probes import (
    PROBE_PARAMS,
    Prober,
    check_probe_params,
    check_v,
    read_v,
)
from .._registry import LearnerSpec

__all__ = ["NuclearNormROPLearner", "SOLVERS"]

SOLVERS = ("SCS", "CLARABEL")
#: the stages the nuclear-norm learner's ``n_queries_by_stage_`` counts
NUCLEAR_STAGES = ("v", "measurements", "verify")
#: the nuclear-norm learner's check tolerance without polishing, in units of ``solver_eps``
NUCLEAR_VERIFY_FACTOR = 100.0
NUCLEAR_HINT = ("the measurements may be too few for the head's rank (raise n_measurements), "
                "or the box may have several heads, biases, noise or lower precision than "
                "float64")



# ----------------------------------------------------------------------------------------------
# Nuclear-norm minimisation from rank-one projections (Theorem 5.1)
# ----------------------------------------------------------------------------------------------


class NuclearNormROPLearner(BaseLearner):
    """Theorem 5.1: Gaussian rank-one projections and nuclear-norm minimisation.

    v comes from the d one-row queries ``[e_i]``; then m probes ``[(c a + s b); s b]`` with
    ``a, b ~ N(0, I)`` give ``t = a^T W b`` (``c s`` scaled from the answers), and
    ``min ||W||_* s.t. <a_k b_k^T, W> = t_k`` is solved with cvxpy. A d x d convex program:
    practical up to d of a few dozen.

    Parameters
    ----------
    n_measurements : int, optional
        Number m of rank-one measurements. Default: ``4 r (2d)`` (four times the scale of the
        theorem), which needs ``rank``; without ``rank`` the default is ``d^2``.
    rank : int, optional
        Rank bound r, used for the default m and for the truncation of the polishing step
        (the rank the spectrum shows otherwise). Must be at most d / 2.
    solver : {"SCS", "CLARABEL"}
        Conic solver. When ``m >= d^2`` the constraints are redundant (Clarabel then fails), so
        W is solved by least squares instead and ``solver_status_`` says so.
    polish : bool
        Truncate the solution to the rank its spectrum shows (largest gap among singular values
        above ``gap_floor`` of the largest) and refine the factors by Gauss-Newton on the
        measurements, so that a success reaches rounding-level error rather than the solver's
        tolerance. Skipped (and reported) when that rank's degrees of freedom exceed m.
    solver_eps : float
        Relative tolerance asked of the solver.
    max_iters : int
        Iteration cap of SCS.
    gap_floor : float
        Singular values are floored at ``gap_floor * sigma_1`` when reading the rank.
    min_gap : float
        Smallest ratio ``sigma_r / sigma_{r+1}`` that counts as the spectrum showing rank r;
        without such a drop the solution is not polished.
    max_logit, min_logit, initial_logit_scale : float
        Logit window of the probes (see :class:`SketchLowRankLearner`).
    verify : int
        Check queries spent after fitting (0: no check)
        (default 8: 6 fresh random queries of 2 to ``check_length`` tokens and copies of the
        two longest with their first N - 1 tokens permuted, which the box must answer alike;
        :func:`~attnquery.learners._base.check_plan`); the tolerance is
        :data:`ROUNDING_RTOL` when the solution is polished, else
        ``NUCLEAR_VERIFY_FACTOR * solver_eps``.
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is a head on every
        input of up to ``check_length`` tokens, such as a wider sliding window, passes.
    n_queries : int, optional
        The most queries the whole fit asks, its check's included (default None: no cap;
        :class:`~attnquery.learners.base.BaseLearner` says how a cap is kept).
    random_state : int, sequence of ints, Generator or None
        Seed of the Gaussian probes.

    Attributes
    ----------
    W_ : ndarray (d, d)
        Recovered W (polished when ``polish`` and the polish applied).
    W_raw_ : ndarray (d, d)
        The solver's solution, before polishing.
    v_ : ndarray (d,)
    rank_ : int
        Rank read from the spectrum of the solver's solution.
    gap_ : bool
        Whether that spectrum shows a drop of at least ``min_gap``.
    n_queries_ : int
        Queries counted by the oracle during ``fit`` (``d + m`` without re-asked probes, plus
        the check queries).
    n_verify_queries_ : int
        Check queries (``verify``), included in ``n_queries_``.
    verify_error_ : float
        Largest disagreement on the check queries, relative to the largest answer.
    n_measurements_ : int
    n_requeried_ : int
    solver_status_ : str
        cvxpy's status, or ``"least_squares"`` where the constraints determine W alone, or
        ``"failed: <message>"`` when the solver raised (``W_`` is then the least-norm solution).
    solve_time_s_ : float
        Wall time of the solver (or of the least-squares fallback).
    solver_iterations_ : int or None
    polished_ : bool
        Whether the polishing step was applied.
    measurement_residual_ : float
        Relative residual ``||A(W_) - t|| / ||t||``.
    n_queries_by_stage_ : dict
        Queries per stage: ``v``, ``measurements`` and ``verify``.
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        "n_queries": [N_QUERIES_PARAM, None],
        **PROBE_PARAMS,
        "n_measurements": [Interval(Integral, 1, None, closed="left"), None],
        "rank": [Interval(Integral, 1, None, closed="left"), None],
        "solver": [Options(SOLVERS)],
        "polish": ["boolean"],
        "solver_eps": [Interval(Real, 0, 1, closed="neither")],
        "max_iters": [Interval(Integral, 1, None, closed="left")],
        "gap_floor": [Interval(Real, 0, 1, closed="neither")],
        "min_gap": [Interval(Real, 1, None, closed="left")],
    }
    spec = LearnerSpec(
        name="nuclear", oracle="value", returns="head", stages=NUCLEAR_STAGES,
        description="nuclear-norm minimisation from rank-one projections (Theorem 5.1)",
        label="nuclear norm (Thm 5.1)")

    def __init__(
        self,
        *,
        n_measurements: int | None = None,
        rank: int | None = None,
        solver: str = "SCS",
        polish: bool = True,
        solver_eps: float = 1e-7,
        max_iters: int = 5000,
        gap_floor: float = 1e-12,
        min_gap: float = 1e3,
        max_logit: float = 10.0,
        min_logit: float = 1e-5,
        initial_logit_scale: float = 1e-2,
        verify: int = DEFAULT_VERIFY,
        check_length: int = CHECK_LENGTH,
        n_queries: int | None = None,
        random_state=None,
    ):
        self.n_measurements = n_measurements
        self.rank = rank
        self.solver = solver
        self.polish = polish
        self.solver_eps = solver_eps
        self.max_iters = max_iters
        self.gap_floor = gap_floor
        self.min_gap = min_gap
        self.max_logit = max_logit
        self.min_logit = min_logit
        self.initial_logit_scale = initial_logit_scale
        self.verify = verify
        self.check_length = check_length
        self.n_queries = n_queries
        self.random_state = random_state

    def _validate_extra(self):
        check_probe_params(self)

    def _validate(self, d: int) -> int:
        """The rules that need d (the parameters are valid); returns m."""
        r = None if self.rank is None else int(self.rank)
        if r is not None and 2 * r > d:
            raise ConfigError(
                f"rank={r} is larger than d / 2 = {d / 2:g}: a low-rank learner needs "
                f"more queries than the exact learner's d^2 + d here; use "
                "ExactValueQueryLearner"
            )
        m = None if self.n_measurements is None else int(self.n_measurements)
        if m is None:
            m = 4 * r * 2 * d if r is not None else d * d
        return int(m)

    def fit(self, oracle):
        """Recover (W, v) from ``oracle``; returns self.

        Raises
        ------
        ConfigError
            Bad parameters (rank larger than d / 2, unknown solver).
        BudgetExceededError
            If the oracle's budget cannot pay for ``d + m`` queries (raised before any query).
        NotIdentifiableError
            If v = 0.
        ModelMismatchError
            If the check queries disagree with the estimate beyond the solver's tolerance (too
            few measurements for the rank, or a box that is not one low-rank head); the
            estimate's attributes are set.
        """
        self._validate_params()
        d = check_oracle(oracle)
        m = self._validate(d)
        n_check = check_verify_param(self.verify)
        rng = self._rng()
        with self._open_ledger(oracle, NUCLEAR_STAGES) as ledger:
            ledger.need(d + m + n_check, f"nuclear-norm recovery (d + m = {d} + {m} queries "
                        f"and {n_check} check queries)")
            with ledger.stage("v"):
                v = read_v(ledger, d)
                check_v(v)
            with ledger.stage("measurements"):
                Aa, Bb, t = self._measure(ledger, v, m, rng)
            self.n_queries_ = ledger.total
            self.v_ = v
            self.n_measurements_ = m
            self._solve_and_polish(Aa, Bb, t)
            rtol = (ROUNDING_RTOL if self.polished_
                    else NUCLEAR_VERIFY_FACTOR * float(self.solver_eps))
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, rng.spawn(1)[0], rtol=rtol, n0=ledger.n0,
                                 what="a single low-rank head", hint=NUCLEAR_HINT,
                                 check_length=self.check_length)
        return self

    def _measure(self, oracle, v, m, rng):
        """m rank-one measurements ``t_k = a_k^T W b_k``, a, b ~ N(0, I): the paper's ensemble
        (unnormalised, as in Theorem A.2); sets ``n_requeried_``. Returns (A, B, t)."""
        d = v.size
        Aa = rng.standard_normal((m, d))
        Bb = rng.standard_normal((m, d))
        # redraw the rare a with tiny a^T v (the answer is divided by it); no query is spent
        vn = v / np.linalg.norm(v)
        for _ in range(100):
            bad = np.abs(Aa @ vn) < 0.05
            if not bad.any():
                break
            Aa[bad] = rng.standard_normal((int(bad.sum()), d))
        prober = Prober(
            oracle, v, initial_logit_scale=self.initial_logit_scale, max_logit=self.max_logit,
            min_logit=self.min_logit, chunk=max(1, (32 * 2**20) // (40 * d)),
        )
        t = prober.measure(lambda idx: (Aa[idx], Bb[idx]), m)
        self.n_requeried_ = int(prober.n_requeried)
        return Aa, Bb, t

    def _solve_and_polish(self, Aa, Bb, t) -> None:
        """``min ||W||_* s.t. <a_k b_k^T, W> = t_k``, then the polish where the spectrum
        shows a rank; sets ``W_``, ``W_raw_``, the solver's and the polish's attributes."""
        m, d = Aa.shape
        # M vec(W) = t with vec row-major: row k is kron(a_k, b_k)
        M = (Aa[:, :, None] * Bb[:, None, :]).reshape(m, d * d)
        W_raw, status, iters, t_solve = self._solve(M, t, d)
        self.W_raw_ = W_raw
        self.solver_status_ = status
        self.solver_iterations_ = iters
        self.solve_time_s_ = t_solve
        W = W_raw
        self.rank_ = self._spectral_rank(W_raw)
        self.polished_ = False
        r = self.rank_
        if (self.polish and self.gap_ and 0 < r and r * (2 * d - r) <= m
                and (self.rank is None or r <= int(self.rank))):
            # the spectrum shows rank r and r's degrees of freedom are determined by m
            W = _gauss_newton(Aa, Bb, t, W_raw, r)
            self.polished_ = True
        self.W_ = W
        tn = float(np.linalg.norm(t))
        res = float(np.linalg.norm(np.einsum("ki,ij,kj->k", Aa, W, Bb) - t))
        self.measurement_residual_ = res / tn if tn > 0 else res

    def _spectral_rank(self, W) -> int:
        """Rank at the largest drop of the spectrum; sets ``gap_`` (a drop >= ``min_gap``)."""
        self.gap_ = False
        if not np.all(np.isfinite(W)):
            return 0
        s = np.linalg.svd(W, compute_uv=False)
        if s[0] == 0:
            return 0
        s = np.maximum(s, self.gap_floor * s[0])
        gaps = s[:-1] / s[1:]
        if gaps.size == 0:
            return 1
        j = int(np.argmax(gaps))
        self.gap_ = bool(gaps[j] >= self.min_gap)
        return j + 1 if self.gap_ else int(s.size)

    def _solve(self, M, t, d):
        import cvxpy as cp

        m = M.shape[0]
        t0 = time.perf_counter()
        if m >= d * d:
            # the measurements determine W alone; Clarabel fails on the redundant equalities
            sol, *_ = scipy.linalg.lstsq(M, t, lapack_driver="gelsd")
            return sol.reshape(d, d), "least_squares", None, time.perf_counter() - t0
        W = cp.Variable((d, d))
        # cp.vec is column-major: vec(W^T) is W row-major
        prob = cp.Problem(cp.Minimize(cp.normNuc(W)), [M @ cp.vec(W.T, order="F") == t])
        if self.solver == "SCS":
            opts = {"eps_abs": self.solver_eps, "eps_rel": self.solver_eps,
                    "max_iters": self.max_iters}
        else:
            opts = {"tol_gap_abs": self.solver_eps, "tol_gap_rel": self.solver_eps,
                    "tol_feas": self.solver_eps}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "inaccurate" is reported in the status
                prob.solve(solver=self.solver, **opts)
            status = str(prob.status)
            W_val = W.value
        except Exception as exc:  # solver failure is a result, not a crash
            status = f"failed: {type(exc).__name__}: {exc}"[:200]
            W_val = None
        elapsed = time.perf_counter() - t0
        iters = None
        stats = getattr(prob, "solver_stats", None)
        if stats is not None and stats.num_iters is not None:
            iters = int(stats.num_iters)
        if W_val is None:
            # the least-norm solution of the constraints stands in for a failed solve
            sol, *_ = scipy.linalg.lstsq(M, t, lapack_driver="gelsd")
            W_val = sol.reshape(d, d)
            if not status.startswith("failed"):
                status = f"failed: {status}"
        return np.asarray(W_val, dtype=float), status, iters, elapsed

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered head on inputs X (B, N, d)."""
        from ...models import AttentionHead

        return AttentionHead(self.v_, W=self.W_)(X)


def _gauss_newton(Aa, Bb, t, W0, r, iters: int = 20) -> np.ndarray:
    """Refine a rank-r ``W = L R^T`` by Gauss-Newton on ``a_k^T L R^T b_k = t_k``.

    Starts from the truncated SVD of ``W0``; each step solves the (rank-deficient, the factors'
    gauge) linearised system by least squares. Stops when the residual stops decreasing.
    """
    m, d = Aa.shape
    U, s, Vt = np.linalg.svd(W0)
    L = U[:, :r] * np.sqrt(s[:r])
    R = Vt[:r].T * np.sqrt(s[:r])

    def resid(L, R):
        return np.einsum("kr,kr->k", Aa @ L, Bb @ R) - t

    res = resid(L, R)
    best = float(np.linalg.norm(res))
    for _ in range(iters):
        AL, BR = Aa @ L, Bb @ R
        J = np.concatenate(
            [(Aa[:, :, None] * BR[:, None, :]).reshape(m, d * r),
             (Bb[:, :, None] * AL[:, None, :]).reshape(m, d * r)], axis=1)
        step, *_ = scipy.linalg.lstsq(J, -res, cond=1e-10, lapack_driver="gelsd")
        L2 = L + step[: d * r].reshape(d, r)
        R2 = R + step[d * r:].reshape(d, r)
        res2 = resid(L2, R2)
        n2 = float(np.linalg.norm(res2))
        if not n2 < best:
            break
        L, R, res = L2, R2, res2
        improved = n2 < 0.5 * best
        best = n2
        if not improved:
            break
    return L @ R.T
