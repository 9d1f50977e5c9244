"""Low-rank recovery by a two-sided sketch (:class:`SketchLowRankLearner`; see
:mod:`attnquery.learners.lowrank`)."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import scipy.linalg

from ...errors import AssumptionViolation, ConfigError
from ...theory import lowrank_floor
from .._base import (
    BLOCK_BYTES_PARAM,
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    N_QUERIES_PARAM,
    ROUNDING_RTOL,
    BaseLearner,
    check_oracle,
    check_verify_param,
)
from .._params import Interval
from .._probes import (
    PROBE_PARAMS,
    ZERO_LOGIT,
    ZERO_TOL_PARAM,
    Prober,
    SparseRows,
    check_probe_params,
    coordinate_rows,
    pivot_directions,
    read_head_constants,
    unit_directions,
)
from .._registry import LearnerSpec

__all__ = ["SketchLowRankLearner"]

#: the stages the sketch learner's ``n_queries_by_stage_`` counts
SKETCH_STAGES = ("constants", "right_sketch", "left_sketch", "verify")
SKETCH_HINT = ("the head's rank may exceed the given rank, or the box may have several heads, "
               "biases, noise or lower precision than float64")


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
    n_queries : int, optional
        The most queries the whole fit asks, its check's included (default None: no cap;
        :class:`~attnquery.learners.base.BaseLearner` says how a cap is kept).
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
        "n_queries": [N_QUERIES_PARAM, None],
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
        n_queries: int | None = None,
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
        self.n_queries = n_queries
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
        from ...models import AttentionHead

        L, R = self.W_factors_
        bias = dict(key_bias=self.key_bias_, offset=self.offset_)
        if L.shape[1] == 0:
            return AttentionHead(self.v_, W=np.zeros((self.v_.size,) * 2), **bias)(X)
        return AttentionHead(self.v_, K=L.T, Q=R.T, **bias)(X)
