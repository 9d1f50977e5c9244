"""Low-rank recovery of a single attention head from value queries (paper Section 5).

Both learners read v from the d one-row queries ``[e_i]`` and then measure bilinear forms
``u^T W b`` of the score matrix with scaled two-row probes ``[(c u + s b); s b]``: the attention
weight on the first row is ``sigma(c s u^T W b)``, so one value query gives one number
``u^T W b`` (see :func:`attnquery.learners.exact.probe_logits`). The scale ``kappa = c s`` is set
from the answers (a pilot batch) so that logits stay where the sigmoid can be inverted; a probe
whose logit is saturated is asked again at a smaller scale and counted in ``n_requeried_``.

* :class:`NuclearNormROPLearner` is Theorem 5.1: m Gaussian rank-one projections
  ``t_k = a_k^T W b_k`` and ``min ||W||_* s.t. <a_k b_k^T, W> = t_k`` in cvxpy, optionally
  polished (truncation to the rank the spectrum shows, then Gauss-Newton on the factors against
  the measurements).
* :class:`SketchLowRankLearner` measures ``W B`` (a random right sketch, read in a coordinate
  basis) and ``A^T W`` (a random left sketch, read against ``[B, e_j]`` so that the core
  ``A^T W B`` is never measured twice), and returns ``W = (W B)(A^T W B)^+ (A^T W)`` as factors.
  With ``k = r`` this is ``r (2d - r) + d`` queries, the degrees of freedom of (W, v).
"""

from __future__ import annotations

import time
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.linalg

from ..errors import AssumptionViolation, ConfigError
from ..theory import lowrank_floor
from ._base import (
    BLOCK_BYTES_PARAM,
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    ROUNDING_RTOL,
    BaseLearner,
    check_oracle,
    check_verify_param,
)
from ._params import Interval, Options
from ._probes import (
    PROBE_PARAMS,
    ZERO_LOGIT,
    ZERO_TOL_PARAM,
    Prober,
    SparseRows,
    check_probe_params,
    check_v,
    coordinate_rows,
    pivot_directions,
    read_head_constants,
    read_v,
    unit_directions,
)
from ._registry import LearnerSpec

__all__ = ["NuclearNormROPLearner", "SketchLowRankLearner", "lowrank_floor", "SOLVERS"]

SOLVERS = ("SCS", "CLARABEL")
#: the stages the sketch learner's ``n_queries_by_stage_`` counts
SKETCH_STAGES = ("constants", "right_sketch", "left_sketch", "verify")
#: the stages the nuclear-norm learner's ``n_queries_by_stage_`` counts
NUCLEAR_STAGES = ("v", "measurements", "verify")
#: the nuclear-norm learner's check tolerance without polishing, in units of ``solver_eps``
NUCLEAR_VERIFY_FACTOR = 100.0
SKETCH_HINT = ("the head's rank may exceed the given rank, or the box may have several heads, "
               "biases, noise or lower precision than float64")
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
        from ..models import AttentionHead

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


# ----------------------------------------------------------------------------------------------
# Sketch learner
# ----------------------------------------------------------------------------------------------


class _ColumnProbes:
    """The probes of a column ``W b``: directions ``u_j = e_j + coef_j e_p``
    (:func:`~attnquery.learners._probes.pivot_directions`) against the last token b."""

    def __init__(self, v: np.ndarray, zero_tol: float | None):
        self.pivot, self.coef = pivot_directions(v, zero_tol)
        self.uv_floor = float(np.min(np.abs(v + self.coef * v[self.pivot])))  # min |u_j^T v|

    def make(self, b, rows):
        """``make(idx)`` for :meth:`Prober.measure`: the probes of ``rows[idx]`` against b."""
        coef, pidx = self.coef, self.pivot
        d = coef.size

        def make(idx):
            jj = rows[idx]
            n = idx.size
            extra = np.flatnonzero(coef[jj])  # u = e_j + coef_j e_p
            U = SparseRows((n, d), np.concatenate([np.arange(n), extra]),
                           np.concatenate([jj, np.full(extra.size, pidx)]),
                           np.concatenate([np.ones(n), coef[jj[extra]]]))
            return U, np.broadcast_to(b, (n, d))
        return make

    def solve(self, tcol):
        """``W b`` from the measured ``t_j = u_j^T W b = y_j + coef_j y_p`` (``coef_p = 0``)."""
        return tcol - self.coef * tcol[self.pivot]


def _residual(Ts, piv, tcol):
    """``tcol`` minus its interpolation from the pivot rows of the columns so far."""
    Tk = np.stack(Ts, axis=1)
    P = np.asarray(piv)
    return tcol - Tk @ scipy.linalg.solve(Tk[P], tcol[P])



class SketchLowRankLearner(BaseLearner):
    """Low-rank recovery from ``r (2d - r) + d`` value queries by a two-sided sketch.

    1. v from the d one-row queries ``[e_i]``.
    2. Right sketch ``Y = W B``: for each sketch vector ``b`` (Gaussian, unit norm), the d values
       ``u_j^T W b`` with ``u_j = e_j`` (or ``e_j + e_p`` where ``v_j`` is near 0, ``p`` the
       largest entry of v, so every probe has ``u^T v != 0``); then ``W b`` by a triangular
       solve. With the rank unknown, each new sketch vector is first tested on a few rows
       (``k + n_check`` values, the pivot rows of the current ``Y`` plus ``n_check`` more): when
       ``W b`` already lies in the span of ``Y`` (relative residual below ``rank_tol``), the rank
       is ``k`` and the sketch stops; otherwise the rest of the column is measured.
    3. Left sketch ``Z = A^T W`` (k + oversample Gaussian unit directions): ``a^T W e_j`` for the
       ``d - k`` coordinates j outside a well-conditioned pivot set P of B's rows; the values
       ``A^T W B`` come from step 2, so the core is not measured twice, and ``Z[:, P]`` follows
       from ``Z B = A^T Y``.
    4. ``W = Y (A^T Y)^+ Z``, through a truncated SVD of the core, returned as factors
       ``W = L R^T`` (d x k each); W is never formed unless ``W_`` is asked for.

    With ``fit_bias`` (beyond the paper), the head of a module,
    ``softmax(X (W x_N + c))^T (X v) + beta``: step 1 also asks the zero token ``[0]`` (beta),
    then d key-bias probes ``[kappa a_m; 0]`` give c (as in
    :class:`~attnquery.learners.ExactValueQueryLearner`), and every later logit is corrected
    by the bias's share ``c u^T c``. With the rank known that is
    ``r (2d - r) + 2d + 1`` queries, the floor plus ``d + 1``, and ``p (d - r)`` more for
    ``p`` oversampled rows. The probe directions of step 2 are then ``e_j + sigma_j e_p``
    for every ``j != p`` (signed, ``|u^T v| >= max |v_i|``): the offset enters every answer, and
    a small ``u^T v`` would read alpha from a signal swamped by it.

    Parameters
    ----------
    rank : int, optional
        The rank r, if known (then exactly ``r (2d - r) + d`` queries on ordinary heads);
        ``None`` finds it from the answers. Must be at most d / 2.
    oversample : int, optional
        Extra left sketch vectors (each costs ``d - r`` queries). Default: as many as fit in 2%
        of the degrees-of-freedom floor, which keeps the count within ``1.05`` times the floor.
    rank_tol : float
        Relative residual below which a new sketch column counts as in the span of the others.
    n_check : int
        Extra rows of the span test (rank unknown only).
    zero_tol : float
        ``|v_j| < zero_tol * max|v|`` counts as ``v_j = 0`` for the choice of probe directions.
    max_logit, min_logit, initial_logit_scale : float
        Logit window: a probe with ``|logit| > max_logit`` is asked again at a 100x smaller
        scale; the pilot batch is asked at ``initial_logit_scale`` and once more at a larger
        scale when its largest ``|logit|`` is below ``min_logit``.
    block_bytes : int
        Memory bound on one batch of probes.
    fit_bias : bool
        Also learn the key bias c and the offset beta of a module's head (``d + 1`` more
        queries). Default False: the paper's head; ``key_bias_`` and ``offset_`` are 0.
    verify : int
        Check queries spent after fitting (0: no check)
        (default 8: 6 fresh random queries of 2 to ``check_length`` tokens and copies of the
        two longest with their first N - 1 tokens permuted, which the box must answer alike;
        :func:`~attnquery.learners._base.check_plan`); see
        :data:`ROUNDING_RTOL`.
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is a head on every
        input of up to ``check_length`` tokens, such as a wider sliding window, passes.
    random_state : int, sequence of ints, Generator or None
        Seed of the sketches.

    Attributes
    ----------
    rank_ : int
    v_ : ndarray (d,)
    key_bias_ : ndarray (d,)
        The key bias c (0 unless ``fit_bias``).
    offset_ : float
        The offset beta (0 unless ``fit_bias``).
    W_factors_ : tuple (L, R)
        ``W = L @ R.T``, each d x rank_.
    W_ : ndarray (d, d)
        Dense W, computed on request.
    n_queries_ : int
        Queries counted by the oracle during ``fit`` (the check queries included).
    n_verify_queries_ : int
        Check queries (``verify``), included in ``n_queries_``.
    verify_error_ : float
        Largest disagreement on the check queries, relative to the largest answer.
    n_requeried_ : int
        Probes asked again because their first answer was saturated (0 on ordinary heads).
    n_sketch_ : int
        Right sketch size k (= rank_); the left sketch has ``k + oversample_`` vectors.
    oversample_ : int
    n_queries_by_stage_ : dict
        Queries per stage: ``constants`` (v, and beta and c with ``fit_bias``),
        ``right_sketch``, ``left_sketch`` and ``verify``.
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        **PROBE_PARAMS,
        "rank": [Interval(Integral, 0, None, closed="left"), None],
        "oversample": [Interval(Integral, 0, None, closed="left"), None],
        "rank_tol": [Interval(Real, 0, 1, closed="neither")],
        "n_check": [Interval(Integral, 1, None, closed="left")],
        "zero_tol": [ZERO_TOL_PARAM],
        "block_bytes": [BLOCK_BYTES_PARAM],
        "fit_bias": ["boolean"],
    }
    spec = LearnerSpec(
        name="sketch", oracle="value", returns="head", stages=SKETCH_STAGES, fits_bias=True,
        description="low-rank sketch, r(2d - r) + d queries", label="sketch, rank found")

    def __init__(
        self,
        *,
        rank: int | None = None,
        oversample: int | None = None,
        rank_tol: float = 1e-9,
        n_check: int = 2,
        zero_tol: float = 1e-3,
        max_logit: float = 10.0,
        min_logit: float = 1e-5,
        initial_logit_scale: float = 1.0,
        block_bytes: int = 4 * 2**20,
        fit_bias: bool = False,
        verify: int = DEFAULT_VERIFY,
        check_length: int = CHECK_LENGTH,
        random_state=None,
    ):
        self.rank = rank
        self.oversample = oversample
        self.rank_tol = rank_tol
        self.n_check = n_check
        self.zero_tol = zero_tol
        self.max_logit = max_logit
        self.min_logit = min_logit
        self.initial_logit_scale = initial_logit_scale
        self.block_bytes = block_bytes
        self.fit_bias = fit_bias
        self.verify = verify
        self.check_length = check_length
        self.random_state = random_state

    # ------------------------------------------------------------------------------------------
    def _validate_extra(self):
        check_probe_params(self)

    def _validate(self, d: int):
        """The rule that needs d (the parameters are valid)."""
        if self.rank is not None and 2 * int(self.rank) > d:
            raise ConfigError(
                f"rank={self.rank} is larger than d / 2 = {d / 2:g}: the sketch would need "
                "more queries than the exact learner's d^2 + d; use ExactValueQueryLearner"
            )

    def _default_oversample(self, d: int, r: int) -> int:
        if self.oversample is not None:
            return int(self.oversample)
        if d - r <= 0:
            return 0
        return int(0.02 * lowrank_floor(d, r) // (d - r))

    def fit(self, oracle):
        """Recover (W, v), and (c, beta) with ``fit_bias``, from ``oracle``; returns self.

        Raises
        ------
        ConfigError
            Bad parameters (a rank larger than d / 2, ...).
        BudgetExceededError
            If the budget cannot pay for a stage; with a known rank the whole count
            ``r (2d - r) + d`` (plus oversampling) is checked before any query.
        NotIdentifiableError
            If v = 0.
        AssumptionViolation
            If the rank found exceeds d / 2, or the answers cannot come from one head.
        ModelMismatchError
            If the check queries disagree with the estimate beyond float64 rounding (a rank
            above ``rank``, several heads, biases, noise); the estimate's attributes are set.
        """
        self._validate_params()
        self._validate(d := check_oracle(oracle))
        rng = self._rng()
        rng_b, rng_a, rng_check = rng.spawn(3)
        with self._open_ledger(oracle, SKETCH_STAGES) as ledger:
            self._check_budget(ledger, d)
            with ledger.stage("constants"):  # 1. v (and beta, c with fit_bias)
                head = read_head_constants(ledger, d, bias=bool(self.fit_bias),
                                           chunk=self._chunk(d), max_logit=self.max_logit,
                                           min_logit=self.min_logit)
            prober = Prober(ledger, head.v, initial_logit_scale=self.initial_logit_scale,
                            max_logit=self.max_logit, min_logit=self.min_logit,
                            chunk=self._chunk(d), key_bias=head.key_bias, offset=head.offset)
            columns = _ColumnProbes(head.v, None if self.fit_bias else self.zero_tol)
            with ledger.stage("right_sketch"):  # 2. Y = W B, the rank found on the way
                B, Y = self._right_sketch(ledger, prober, columns, rng_b, rng_check)
            with ledger.stage("left_sketch"):  # 3-4. Z = A^T W, then W = Y core^+ Z
                self._left_sketch(ledger, prober, head.v, B, Y, rng_a)
            self.v_ = head.v
            self.key_bias_ = head.key_bias_or_zero()
            self.offset_ = head.offset
            self.n_sketch_ = B.shape[1]
            self.n_requeried_ = int(prober.n_requeried + head.n_requeried)
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, rng.spawn(1)[0], rtol=ROUNDING_RTOL,
                                 n0=ledger.n0, what=f"a single head of rank {self.rank_}",
                                 hint=SKETCH_HINT, check_length=self.check_length)
        return self

    def _chunk(self, d: int) -> int:
        return max(1, int(self.block_bytes // (32 * d)))

    def _check_budget(self, ledger, d: int) -> None:
        """With the rank known, the whole count before any query; else v's (and the biases'),
        against the fit's budget."""
        bias = bool(self.fit_bias)
        n_bias = d + 1 if bias else 0  # the zero token and the d key-bias probes
        if self.rank is not None:
            r = int(self.rank)
            p = self._default_oversample(d, r)
            n_check = check_verify_param(self.verify)
            floor = lowrank_floor(d, r)
            what = f"r (2d - r) + d = {floor}" + (f", plus d + 1 = {n_bias} for the biases"
                                                  if bias else "")
            ledger.need(floor + n_bias + p * (d - r) + n_check,
                        f"sketch recovery at rank {r} ({what} queries, plus {p} oversampled "
                        f"rows and {n_check} check queries)")
        else:
            ledger.need(d + n_bias, "reading v" + (" and the biases" if bias else "")
                        + f" ({d + n_bias} queries)")

    def _right_sketch(self, ledger, prober, columns, rng_b, rng_check):
        """Step 2: sketch vectors ``b`` (unit Gaussian) and their columns ``W b``, until the
        given rank, or (rank unknown) until a new ``W b`` lies in the span of the others.
        Returns B (d, k) and Y = W B (d, k)."""
        d = columns.coef.size
        Bs, Ts = [], []
        piv: list[int] = []  # pivot rows of T (greedy, as in LU with partial pivoting)
        while self.rank is None or len(Bs) < int(self.rank):
            k = len(Bs)
            b = rng_b.standard_normal(d)
            b /= np.linalg.norm(b)
            if self.rank is None and k > 0:
                tcol, e = self._next_column(ledger, prober, columns, b, Ts, piv, rng_check)
                if tcol is None:
                    break  # W b lies in span(W B): rank = k
            else:
                tcol = prober.measure(columns.make(b, np.arange(d)), d, columns.uv_floor)
                if self.rank is None and k == 0 and \
                        np.max(np.abs(tcol)) * prober.kappa <= ZERO_LOGIT:
                    break  # every logit is at rounding level: W b = 0 for a random b, W = 0
                e = tcol.copy() if k == 0 else _residual(Ts, piv, tcol)
            if piv:
                e[np.asarray(piv)] = 0.0
            piv.append(int(np.argmax(np.abs(e))))
            Bs.append(b)
            Ts.append(tcol)
        if not Bs:
            return np.zeros((d, 0)), np.zeros((d, 0))
        return (np.stack(Bs, axis=1),  # d x k
                np.stack([columns.solve(tc) for tc in Ts], axis=1))  # W B, d x k

    def _next_column(self, ledger, prober, columns, b, Ts, piv, rng_check):
        """Rank unknown: test ``W b`` on the pivot rows and ``n_check`` more; returns
        ``(None, None)`` when it lies in the span of the columns so far, else the whole
        column and its residual against them."""
        d, k = columns.coef.size, len(Ts)
        all_rows = np.arange(d)
        Tk = np.stack(Ts, axis=1)
        P = np.asarray(piv)
        rest = np.setdiff1d(all_rows, P)
        extra = rng_check.choice(rest, size=min(self.n_check, rest.size), replace=False)
        test_rows = np.concatenate([P, extra])
        ledger.need(test_rows.size, f"span test of sketch column {k + 1}")
        t_test = prober.measure(columns.make(b, test_rows), test_rows.size, columns.uv_floor)
        # interpolate the new column from the pivot rows; check it on the extra rows
        c = scipy.linalg.solve(Tk[P], t_test[:k])
        res = np.linalg.norm(Tk[extra] @ c - t_test[k:])
        scale = max(float(np.linalg.norm(t_test)), 1e-300)
        if res <= self.rank_tol * scale:
            return None, None
        if 2 * (k + 1) > d:
            raise AssumptionViolation(
                f"W has rank above d / 2 = {d / 2:g}: the sketch learner would need "
                "more queries than the exact learner; use ExactValueQueryLearner"
            )
        other = np.setdiff1d(all_rows, test_rows)
        ledger.need(other.size, f"sketch column {k + 1}")
        tcol = np.empty(d)
        tcol[test_rows] = t_test
        tcol[other] = prober.measure(columns.make(b, other), other.size, columns.uv_floor)
        return tcol, tcol - Tk @ c

    def _left_sketch(self, ledger, prober, v, B, Y, rng_a) -> None:
        """Steps 3-4: ``Z = A^T W`` outside a well-conditioned pivot set of B's rows, then
        ``W = Y core^+ Z`` as factors; sets ``rank_``, ``oversample_`` and ``W_factors_``."""
        d, k = B.shape
        if k == 0:
            self.rank_, self.oversample_ = 0, 0
            self.W_factors_ = (np.zeros((d, 0)), np.zeros((d, 0)))
            return
        p = self._default_oversample(d, k)
        kA = k + p
        A = unit_directions(kA, v, rng_a)  # kA x d, rows a_i
        PB = scipy.linalg.qr(B.T, pivoting=True, mode="r")[1][:k]
        CB = np.setdiff1d(np.arange(d), PB)
        nC = CB.size
        ledger.need(kA * nC, f"left sketch ({kA} x {nC} queries)")

        def row_probes(idx):
            # probe (i, j) is number j kA + i: the kA probes of a coordinate j share their
            # last token e_j
            jj, ii = np.divmod(idx, kA)
            return A[ii], coordinate_rows(CB[jj], d)

        S = prober.measure(row_probes, kA * nC, float(np.min(np.abs(A @ v))))
        S = S.reshape(nC, kA).T
        core = A @ Y  # kA x k = A^T W B, from the right sketch
        Z = np.empty((kA, d))
        Z[:, CB] = S
        rhs = core - S @ B[CB]  # = Z[:, PB] B[PB]
        Z[:, PB] = scipy.linalg.solve(B[PB].T, rhs.T).T
        # W = Y core^+ Z, through the truncated SVD of the core
        Uc, sc, Vct = np.linalg.svd(core, full_matrices=False)
        rk = int(np.sum(sc > sc[0] * max(self.rank_tol, np.finfo(float).eps * kA)))
        rk = min(rk, k)
        L = (Y @ Vct[:rk].T) / sc[:rk]
        R = Z.T @ Uc[:, :rk]
        self.rank_ = rk
        self.oversample_ = p
        self.W_factors_ = (L, R)

    @property
    def W_(self) -> np.ndarray:
        """Dense W (d x d), computed from the factors on request."""
        if not hasattr(self, "W_factors_"):
            raise AttributeError("W_ is available after fit()")
        L, R = self.W_factors_
        return L @ R.T

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered head on inputs X (B, N, d), from the factors."""
        from ..models import AttentionHead

        L, R = self.W_factors_
        bias = dict(key_bias=self.key_bias_, offset=self.offset_)
        if L.shape[1] == 0:
            return AttentionHead(self.v_, W=np.zeros((self.v_.size,) * 2), **bias)(X)
        return AttentionHead(self.v_, K=L.T, Q=R.T, **bias)(X)
