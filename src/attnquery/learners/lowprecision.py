"""Recovery of a single attention head from low-precision answers (beyond the paper).

Serving stacks answer in float16 or bfloat16, or round to a few digits. Such answers are exact up
to a deterministic error of relative size about ``eps`` (``2^-11`` for float16, ``2^-8`` for
bfloat16, ``0.5 * 10^(1-k)`` for k significant digits): asking the same query again teaches
nothing, but distinct probes have errors that behave like independent noise, and averaging them
lowers the error like ``1 / sqrt(queries)``.

The measurement is an antipodal pair of two-row probes with a shared last token ``s e_j``::

    X(+u) = [( c u + s e_j); s e_j],     X(-u) = [(-c u + s e_j); s e_j].

With ``alpha = sigma(t)``, ``t = c s u^T W e_j`` and ``beta = s v_j``, a single head answers
``y(+u) = beta + alpha c u^T v`` and ``y(-u) = beta - (1 - alpha) c u^T v``, so

    t = log((y(+u) - beta) / (beta - y(-u))),     y(+u) - y(-u) = c u^T v.

The logit is a ratio of two answers: a relative error ``e`` in each answer moves it by about
``e(+u) - e(-u)``, whatever ``t`` is (no margin on v and no sigmoid slope enter), and ``beta`` is
kept below ``1e-3 |c u^T v|`` by the ratio ``c / s``, so v need only be known roughly. The
difference of the pair measures ``u^T v`` with the answers' relative precision and does not
depend on W at all (for any sum of heads too): its scatter over the columns that share ``u``
estimates the answers' relative noise (``noise_level_``) from residuals, without assuming the box
is a single head, and its average gives v.

Structure: the directions ``u_1..u_d`` are one random orthonormal basis reflected so that every
``|u_l^T v|`` is the same (:func:`~attnquery.learners._probes.balanced_orthonormal`), so
``W = U^T T`` where ``T_lj = u_l^T W e_j``. Every entry ``T_lj`` is measured by one pair per pass
over the d x d entries, each pass at a scale ``kappa`` (the logit's) and an answer size drawn
afresh per column (the answers of two passes then sit at unrelated places of the rounding grid,
so their errors are unrelated); a final partial pass covers a random subset of the directions.
Each entry is the weighted mean of its measurements (weights ``kappa^2``, the inverse variances),
which is the exact weighted least-squares solution; their scatter is the logits' residual. The
pairs of a column share their last token (a box that caches per-token work evaluates ``W e_j``
once per column), memory is ``O(d^2)`` besides one batch, and time is ``O(n_queries d)``.

Errors: under relative noise of size sigma each pair measures ``t`` with variance ``2 sigma^2``,
so with the scale of column j chosen to put its root-mean-square logit at ``target_logit``, the
relative error of W is about ``sqrt(2) sigma / (target_logit sqrt(k))`` after k passes (``2 k``
queries per entry of W). The learner computes this from its own residuals (``W_error_estimate_``)
and checks its estimate against the oracle on fresh random queries
(:meth:`~attnquery.learners._base.BaseLearner._verify_fit`) with a tolerance built from the
answers' noise, so a box that is not a single head raises
:class:`~attnquery.errors.ModelMismatchError` while rounded answers of a single head pass.
Where every answer is a float32, float16 or bfloat16 value, that noise is first judged against
what the format's rounding explains (:func:`~attnquery.learners._base.judge_noise`): a box
that is not a head shows its misfit as noise, which would otherwise widen the check's
tolerance with it (``noise`` parameter).

With ``fit_bias=True`` the head may carry a key bias and an offset, as a served module's head
does (docs/served.md): the offset is averaged from one-token answers and cancelled by a shift of
every probe along v, the key bias is measured in the probe basis with pairs whose last token is
that shift and taken out of every logit, the probes' scale is capped so that the bias's part of
a logit stays small and its sign opposes the measured part, every pair is weighed by its
inverse variance, and logits stay within 8: in a box computed in float32, float16 or bfloat16
the scores' own rounding, of order ``eps |k| |q|``, is what limits the precision. Where W's rank
is below 48 and d above it, the shift is then moved within W's row space until ``W z + c = 0``
(the query bias cancelled in the query vector itself), which frees the probes' scale from the
key bias's cap; their answer size is then chosen by the measured scatter of repeated probes,
and W, of rank r, is measured from both sides of its sketch (``U W R`` along its row space R
and ``B W`` along its column space and v), ``r (2d - r) + d`` entries instead of ``d^2``: each
is asked often enough that its pairs' scale can be set from its own estimate (all at one
logit, chosen by the same measured scatter) and its last-token signs alternate from pass to
pass (errors that flip with the sign, such as the key bias's, cancel instead of averaging).

Floating-point formats carry more absolute precision near zero than near their largest answers;
this learner does not exploit that (it treats every answer as carrying the same relative noise),
so its query counts are what an attacker pays when the answers' errors are relative noise.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np

from ..errors import AssumptionViolation, BudgetExceededError, ConfigError, ModelMismatchError
from ..precision import AnswerFormat
from ._base import (
    BLOCK_BYTES_PARAM,
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    NOISE_MODES,
    BaseLearner,
    check_budget,
    check_oracle,
    check_verify_param,
    chunk_slices,
    judge_noise,
)
from ._params import Interval, Options
from ._probes import balanced_orthonormal, check_v, read_v
from ._registry import LearnerSpec

__all__ = ["LowPrecisionValueQueryLearner", "pair_logits", "MAX_NOISE_LEVEL"]

#: |beta| / |c u^T v| at most this: the last token's own value stays negligible beside the
#: smaller answer of a pair, (1 - alpha) |c u^T v| >= exp(-max_logit) |c u^T v|
_BETA_RATIO = 1e-6
#: largest answer size asked for (float16's largest number is 65504)
_MAX_ANSWER = 1e4
#: rounds of a search for a usable logit scale before giving up
_MAX_ROUNDS = 12
#: columns, and directions per column, of the first search for the model's logit scale
_SCOUT_COLUMNS, _SCOUT_ROWS = 4, 2
#: queries :meth:`LowPrecisionValueQueryLearner.min_queries` allows that search
_SCOUT_ALLOWANCE = 3 * 2 * _SCOUT_COLUMNS * _SCOUT_ROWS
#: largest relative noise of the answers the learner accepts. Beyond it the log-ratio of a pair
#: is biased by about the noise squared, which averaging does not remove (one significant digit,
#: relative noise about 0.1, leaves a floor of about 2e-2 on the error of W at d = 16)
MAX_NOISE_LEVEL = 0.03
#: half-width of the per-pass dither of a column's logit scale, in log units
_KAPPA_DITHER = 0.1
#: with ``fit_bias``: largest |c u^T c_b|, the key bias's part of a probe's logit (the probes'
#: scale c is capped by it; the rest of the logit range is left to the measured part)
_BIAS_LOGIT = 2.0
#: with ``fit_bias``: largest |logit| of a probe pair (measured on MiniLM heads served in
#: float32 at 3 (d^2 + 2d + 1) queries: 10 gave 7.7e-7 on W, 8 gave 3.3e-7, 12 gave 4e-6)
_BIAS_MAX_LOGIT = 8.0
#: with ``fit_bias``: singular values of W below this multiple of the key bias's rank-one error
#: are taken for that error when the rank is found
_BIAS_SV_FACTOR = 5.0
#: with ``fit_bias``: largest relative jitter of each pair's last-token scale (_Pairs.jitter),
#: used where the answers' relative noise is above _JITTER_NOISE (measured on MiniLM L0H0 and
#: L0H1 at 10 (d^2 + 2d + 1): bfloat16 error over its floor 1.49 and 1.58 without, 1.44 and 1.54
#: at 0.05, 1.40 and 1.51 at 0.2; in float32 at 3 units it made heads worse: not used there)
_LAST_TOKEN_JITTER = 0.2
_JITTER_NOISE = 1e-5
#: with ``fit_bias``: one-row queries that average the offset
_OFFSET_QUERIES = 64
#: with ``fit_bias``: fewest rounds of key-bias pairs (2 d queries each)
_MIN_BIAS_ROUNDS = 16
#: with ``fit_bias``: rows of T measured first to cancel the query bias (the shift z moved
#: within W's row space until ``W z + c_b = 0``); the stage runs where d exceeds it and those
#: rows show W's rank below it (LowPrecisionValueQueryLearner._cancel_query_bias)
_CANCEL_ROWS = 48
#: singular values of those rows above this fraction of the largest may span W's row space
_CANCEL_SV = 1e-3
#: ... and at least this ratio between the last of them and the next
_CANCEL_GAP = 4.0
#: moves of z: after the throwaway rows, and after each key-bias stage but the last
_CANCEL_STEPS = 2
#: answer sizes |c u^T v| the design search compares once the query bias is cancelled, and its
#: entries and repetitions per size (5 x 3 x 64 x 4 = 3,840 queries)
_CANCEL_SIZES = (0.03, 0.1, 0.3, 1.0, 3.0)
_DESIGN_ENTRIES, _DESIGN_REPS = 64, 3
#: key-bias rounds per expected pass over W once the query bias is cancelled
_CANCEL_BIAS_ROUNDS = 16
#: entry logits the design search compares for the sketch's passes (each pair's scale set
#: from its entry's estimate so that its logit is this); the largest stays within the logit
#: limit with the dither and the last-token jitter
#: uniform passes over both sides of the sketch after the first, before the rest of the budget is
#: shared among the entries by their measured noise (LowPrecisionValueQueryLearner._entry_quotas)
_SKETCH_UNIFORM = 2
_SKETCH_LOGITS = (1.5, 2.25, 3.0)
#: largest relative noise of the answers (measured on the rows of stage 3b) for the sketch
_SKETCH_NOISE = _JITTER_NOISE



#: the stages ``n_queries_by_stage_`` counts
STAGES = ("v", "scale_search", "passes", "verify")

#: rows of the array :func:`pair_logits` returns
_T, _M, _C, _Q, _H = range(5)


def pair_logits(y_plus, y_minus, beta, c) -> np.ndarray:
    """What a pair of answers measures, and how their errors reach it.

    Parameters
    ----------
    y_plus, y_minus : ndarray
        Answers to ``[(c u + s b); s b]`` and ``[(-c u + s b); s b]``.
    beta : ndarray
        ``s b^T v`` (the last token's value), from an estimate of v.
    c : ndarray
        The scale of the probe direction.

    Returns
    -------
    ndarray (5, ...)
        Row ``_T``: the logit ``log((y+ - beta) / (beta - y-)) = c s u^T W b`` (NaN where the
        ratio is not positive and finite: answers no single head gives, or lost to rounding).
        Row ``_M``: ``(y+ - y-) / c``, which is ``u^T v`` for any sum of heads. Row ``_C``: c.
        Row ``_Q``: ``y+^2 + y-^2``. Row ``_H``: the variance of the logit per unit of relative
        noise in the answers, ``y+^2 / (y+ - beta)^2 + y-^2 / (beta - y-)^2`` (about 2).
    """
    num1 = y_plus - beta
    num0 = beta - y_minus
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = num1 / num0
        ok = np.isfinite(ratio) & (ratio > 0)
        t = np.where(ok, np.log(np.where(ok, ratio, 1.0)), np.nan)
        return np.stack(np.broadcast_arrays(
            t, (y_plus - y_minus) / c, c, y_plus * y_plus + y_minus * y_minus,
            (y_plus / num1) ** 2 + (y_minus / num0) ** 2))


class _Entries:
    """Running weighted means of the measurements of every ``T_lj`` and of every ``u_l^T v``,
    and the sums their error estimates need.

    Sums are kept relative to each entry's first measurement, so the scatter is computed without
    cancellation even when it is at float64 rounding level. The answers' noise is modelled as
    relative, ``var(y) = sigma^2 y^2``, with sigma estimated from the scatter of
    ``(y+ - y-) / c = u^T v`` over the columns that share a direction.
    """

    def __init__(self, d: int, inverse_variance: bool = False, n_cols: int | None = None):
        #: weigh each measurement by kappa^2 min(1, 2 / H) (its inverse variance, up to the
        #: noise level) instead of kappa^2: a pair whose smaller answer nears the rest of the
        #: answer (a large H) then counts little (used with fit_bias)
        self.iv = inverse_variance
        shape = (d, d if n_cols is None else int(n_cols))  # directions x last tokens
        self.ref = np.full(shape, np.nan)  # first z of each entry

        self.s0 = np.zeros(shape)  # sum of weights kappa^2
        self.s1 = np.zeros(shape)  # sum of w (z - ref)
        self.s2 = np.zeros(shape)  # sum of w (z - ref)^2
        self.h = np.zeros(shape)  # sum of kappa^2 H: logit variance per sigma^2
        self.n = np.zeros(shape, dtype=np.int64)
        self.mref = np.full(d, np.nan)  # u_l^T v: first per-row mean
        self.om = np.zeros(d)  # sum of weights omega = c^2 / q
        self.m1 = np.zeros(d)
        self.ss = 0.0  # omega-weighted scatter of u^T v over the columns sharing a direction
        self.dof = 0

    def add(self, rows, cols, P, kap, max_logit: float = np.inf):
        """Measurements ``P`` (:func:`pair_logits`, (5, len(rows), len(cols))) of directions
        ``rows`` against columns ``cols`` at logit scales ``kap``. A logit that is not finite
        or beyond ``max_logit`` carries no weight."""
        ix = np.ix_(rows, cols)
        t = P[_T]
        ok = np.abs(t) <= max_logit  # False for NaN
        z = np.where(ok, t / kap, 0.0)
        if self.iv:
            with np.errstate(divide="ignore", invalid="ignore"):
                g = np.where(ok, np.minimum(1.0, 2.0 / P[_H]), 0.0)
            g = np.where(np.isfinite(g), g, 0.0)
            ok = ok & (g > 0)
        else:
            g = 1.0
        w = np.where(ok, kap * kap * g, 0.0)
        ref = self.ref[ix]
        ref = np.where(np.isnan(ref) & ok, z, ref)
        self.ref[ix] = ref
        dz = np.where(ok, z - ref, 0.0)
        self.s0[ix] += w
        self.s1[ix] += w * dz
        self.s2[ix] += w * dz * dz
        self.h[ix] += np.where(ok, w * g * P[_H], 0.0)
        self.n[ix] += ok
        m, c, q = P[_M], P[_C], P[_Q]
        good = np.isfinite(m) & (q > 0) & np.isfinite(q)
        om = np.where(good, c * c / np.where(good, q, 1.0), 0.0)
        m = np.where(good, m, 0.0)
        w_om = om.sum(axis=1)
        seen = w_om > 0
        mhat = np.where(seen, (om * m).sum(axis=1) / np.where(seen, w_om, 1.0), 0.0)
        self.ss += float(np.sum(om * (m - mhat[:, None]) ** 2))
        self.dof += int(np.sum(np.maximum(good.sum(axis=1) - 1, 0)))
        rows = np.asarray(rows)[seen]
        mref = self.mref[rows]
        mref = np.where(np.isnan(mref), mhat[seen], mref)
        self.mref[rows] = mref
        self.om[rows] += w_om[seen]
        self.m1[rows] += w_om[seen] * (mhat[seen] - mref)

    def means(self, rows=slice(None)) -> np.ndarray:
        """The weighted means of the entries of ``rows`` (NaN where none was measured)."""
        return self.ref[rows] + self.s1[rows] / self.s0[rows]

    def v_means(self) -> np.ndarray:
        """The weighted means of every direction's ``u_l^T v``."""
        return self.mref + self.m1 / self.om

    def noise(self) -> float:
        """The answers' relative noise sigma (NaN before two columns shared a direction)."""
        return float(np.sqrt(self.ss / self.dof)) if self.dof else float("nan")


def _fill_pairs(X, c, U, s, cols, V=None) -> None:
    """Write antipodal probe pairs into ``X`` (k, ..., 2, 2, d): for each k (a column) and
    each direction ``u`` of ``U`` (broadcast over the middle axes), the queries
    ``[(c_k u + s_k e_j); s_k e_j]`` and ``[(-c_k u + s_k e_j); s_k e_j]`` with
    ``j = cols[k]`` (with ``V``, rows of last-token directions: ``V[j]`` instead of ``e_j``).
    The one pair-query builder of the learner."""
    extra = X.ndim - 4  # axes between the column and the pair
    np.multiply(c.reshape(c.shape + (1,) * (extra + 1)), U, out=X[..., 0, 0, :])
    np.negative(X[..., 0, 0, :], out=X[..., 1, 0, :])
    X[..., 1, :] = 0.0
    s = s.reshape(s.shape + (1,) * (extra + 2))
    if V is None:
        X[np.arange(len(cols)), ..., cols] += s
    else:
        X += s[..., None] * V[cols].reshape((len(cols),) + (1,) * (extra + 2) + (V.shape[1],))


def _move_shift(pairs, Q, P, S) -> None:
    """Move the shift z within W's row space (``Q``, from the SVD ``P S Q^T`` of the rows of
    T measured) so that the measured key-bias logits of those rows vanish, then along the part
    of v off that space so that ``z^T v = -beta`` (the offset stays cancelled)."""
    v0 = pairs.v0
    p = v0 - Q @ (Q.T @ v0)
    z0 = pairs.z if pairs.z is not None else np.zeros(v0.size)
    z = z0 - Q @ ((P.T @ pairs.b[:P.shape[0]]) / S)
    z = z - ((z @ v0) + pairs.off) / (p @ v0) * p
    pairs.z, pairs.zv = z, float(z @ v0)


def _combine_key_bias(cb, W, U, pairs, col_err):
    """The key bias from both shifts: ``U^T b - W z`` carries W's error times z, and the moved
    shift (larger where the offset needs a long step off W's row space) can carry more of it
    than the first. Returns the mix ``lambda c_first + (1 - lambda) cb`` (lambda in 0, 0.1,
    ..., 1) whose predicted variance, ``sum_j col_err_j^2 z_lambda,j^2`` (independent column
    errors) plus the key-bias rounds' own, is least."""
    b0, bv0, z0 = pairs.first
    c0 = U.T @ b0 - W @ z0
    lam = np.linspace(0.0, 1.0, 11)[:, None]
    zl = lam * z0 + (1.0 - lam) * pairs.z
    var = ((zl * col_err) ** 2).sum(axis=1) + (lam[:, 0] ** 2 * bv0.sum()
                                               + (1.0 - lam[:, 0]) ** 2 * pairs.b_var.sum())
    k = float(lam[int(np.argmin(var)), 0])
    return k * c0 + (1.0 - k) * cb


class _Pairs:
    """The probe pairs of one ``fit``: the directions, the rough v that sets their scales,
    the ledger they are asked through and the budget left for them.

    Parameters
    ----------
    learner : LowPrecisionValueQueryLearner
        Its parameters (``answer_scale``, ``max_logit``, ``target_logit``, ``block_bytes``).
    ledger : QueryLedger
    v0 : ndarray (d,)
        v from the one-row queries.
    U : ndarray (d, d)
        The directions, one per row.
    budget : int
        Queries this fit may spend before its check.
    """

    def __init__(self, learner, ledger, v0: np.ndarray, U: np.ndarray, budget: int):
        self.learner = learner
        self.ledger = ledger
        self.v0 = v0
        self.uv = float(np.linalg.norm(v0) / np.sqrt(v0.size)) if v0 is not None else np.nan
        self.U = U
        self.budget = budget
        self.n_requeried = 0
        # with fit_bias (LowPrecisionValueQueryLearner): the offset, the shift z of every probe
        # and z^T v, the key bias in the basis U, each direction's cap on c, the entries'
        # running means (for the last tokens' signs), the logit limits, overflowed answers
        self.fit_bias = bool(getattr(learner, "fit_bias", False))
        self.off, self.z, self.zv = 0.0, None, 0.0
        self.b = self.c_bias = self.acc = None
        self.max = float(learner.max_logit)
        self.mlog = self.max
        if self.fit_bias:
            self.max = min(self.max, _BIAS_MAX_LOGIT)
            self.mlog = self.max - _BIAS_LOGIT
        self.n_overflow = 0
        self.rng = None  # with fit_bias: the generator of the last tokens' jitter
        self.cancelled = False  # with fit_bias: the query bias cancelled by the shift z
        self.null = None  # with fit_bias: basis of W's row space and v, once z is moved
        self.first = None  # with fit_bias: (b, its variance, z) at the shift before the move
        self.jitter_size = 0.0
        self.V = None  # last-token directions (rows) of the columns; None: e_j
        self.sign_base = None  # the sketch's passes: each entry's last-token sign
        self.rowspace = self.T0 = None  # with fit_bias: W's row space and rows found in 3b
        self.formats = AnswerFormat()  # the format of every answer the pairs met

    def col_v(self, cols) -> np.ndarray:
        """``w_j^T v`` for the columns' last-token directions (``v_j`` for ``e_j``)."""
        return self.v0[cols] if self.V is None else self.V[cols] @ self.v0

    def answers(self, X) -> np.ndarray:
        """The ledger's answers to X; answers that are not finite (the box's format
        overflowed) are counted in ``n_overflow`` and, NaN to the pairs, make the probes that
        met them be asked again at a smaller scale: the overflow bounds the input scale."""
        y = np.asarray(self.ledger(X), dtype=float)
        self.formats.update(y)
        bad = ~np.isfinite(y)
        if bad.any():
            self.n_overflow += int(bad.sum())
            y = np.where(bad, np.nan, y)
        return y

    def signs(self, rows, cols) -> np.ndarray:
        """With ``fit_bias``: the sign of each pair's last token, ``-sign(T_lj b_l)`` where the
        entry has been measured (+1 elsewhere), so that the measured part of the logit,
        ``kappa T_lj``, and the key bias's part, ``c b_l``, have opposite signs and the logit
        stays moderate (a large logit leaves the smaller answer of a pair small beside the
        rest of the answer)."""
        if self.acc is None:
            return np.ones(np.broadcast_shapes(np.shape(rows), np.shape(cols)))
        if self.sign_base is not None:  # the sketch's passes: each entry's sign alternates
            return self.sign_base[rows, cols]
        if self.cancelled:  # the key bias's part is about 0: random signs, so that the error
            # of b_l reaches the entries of its row with random signs, not as a rank-one error
            shape = np.broadcast_shapes(np.shape(rows), np.shape(cols))
            return self.rng.choice([-1.0, 1.0], size=shape)
        T = self.acc.ref[rows, cols]
        sg = -np.sign(np.nan_to_num(T) * self.b[rows])
        return np.where(sg == 0, 1.0, sg)

    def jitter(self, shape) -> np.ndarray:
        """With ``fit_bias``: a factor in ``[1, 1 + jitter_size]`` per pair for its last
        token's scale s. A pair's logit less the key bias's part is linear in s, so it is
        divided by the factor and measures ``kappa T_lj`` as before; but the pairs of a column
        no longer share one last token, so a served box rounds each pair's query vector
        ``W_Q x_N + b_Q`` differently and that rounding averages over the pairs of a column
        instead of only over passes. ``jitter_size`` is ``_LAST_TOKEN_JITTER`` where the
        answers' relative noise exceeds ``_JITTER_NOISE`` (float16, bfloat16) and 0 below it
        (float32, where a larger last token costs more than the jitter gains)."""
        if self.rng is None or self.jitter_size == 0:
            return np.ones(shape)
        return 1.0 + self.rng.uniform(0.0, self.jitter_size, size=shape)

    def left(self) -> int:
        """Queries of the budget not spent yet."""
        return self.budget - self.ledger.total

    def scales(self, kappa, cols, dither, rows=None):
        """Token scales ``(c, s)`` with ``c s = kappa``: answers ``|c u^T v|`` of at least
        ``answer_scale`` and large enough that ``|beta| <= 1e-6 |c u^T v|``, times ``dither``,
        and at most 1e4 (with ``fit_bias``: c capped per direction, see ``c_bias``)."""
        uv = self.uv
        if self.fit_bias:  # each direction's key-bias logit c u_l^T c_b stays within _BIAS_LOGIT
            c = np.minimum(min(float(self.learner.answer_scale), _MAX_ANSWER) / uv,
                           self.c_bias[rows]) * dither ** -0.1
            c = np.broadcast_to(c, np.broadcast_shapes(np.shape(c), np.shape(kappa)))
            return c, kappa / c
        size = np.maximum(float(self.learner.answer_scale),
                          np.sqrt(kappa * np.abs(self.v0[cols]) * uv / _BETA_RATIO))
        c = np.minimum(size * dither, _MAX_ANSWER) / uv
        return c, kappa / c

    def need(self, n: int) -> None:
        if n > self.left():
            raise BudgetExceededError(
                f"{n} more queries are needed to measure every entry of W once but only "
                f"{self.left()} of n_queries = {self.learner.n_queries} remain for fitting (the "
                "search for the logit scale and pairs asked again at a smaller scale took the "
                "rest)")

    def ask(self, rows, cols, kappa, dither):
        """Ask the pairs (direction ``rows[k]``, column ``cols[k]``); returns their
        :func:`pair_logits` (5, n)."""
        n, d = rows.size, self.U.shape[1]
        self.need(2 * n)
        P = np.empty((5, n))
        for sl in chunk_slices(n, max(1, self.learner.block_bytes // (32 * d))):
            k = sl.stop - sl.start
            cj = cols[sl]
            c, s = self.scales(kappa[sl], cj, dither[sl], rows[sl])
            sg = self.signs(rows[sl], cj) if self.fit_bias else 1.0
            jit = self.jitter(np.shape(s)) if self.fit_bias else 1.0
            s = s * sg * jit
            X = np.empty((k, 2, 2, d))
            _fill_pairs(X, c, self.U[rows[sl]], s, cj, self.V)
            if self.z is not None:
                X += self.z
            y = self.answers(X.reshape(2 * k, 2, d)).reshape(k, 2)
            P[:, sl] = pair_logits(y[:, 0], y[:, 1], s * self.col_v(cj) + self.off + self.zv, c)
            if self.fit_bias:  # the key bias's part of the logit, c u^T c_b, taken out
                P[_T, sl] = sg * (P[_T, sl] - c * self.b[rows[sl]]) / jit
        return P

    def ask_rows(self, rows, kappa, dither):
        """Directions ``rows`` against every column at the columns' ``kappa`` and ``dither``
        (d,): their :func:`pair_logits`, (5, len(rows), d). The pairs of a column share their
        last token and are asked one after the other."""
        U = self.U[rows]
        r, d = U.shape
        self.need(2 * r * d)
        P = np.empty((5, r, d))
        per = max(1, min(d, self.learner.block_bytes // (32 * r * d)))  # columns per batch
        buf = np.empty((per, r, 2, 2, d))  # reused: no page faults per batch
        for sl in chunk_slices(d, per):
            cols = np.arange(sl.start, sl.stop)
            k = cols.size
            X = buf[:k]
            if self.fit_bias:  # scales per pair (k, r): c depends on the direction too
                kk = kappa[:, sl].T if np.ndim(kappa) == 2 else kappa[sl][:, None]
                c, s = self.scales(kk, cols, dither[sl][:, None], rows[None, :])
                sg = self.signs(rows[None, :], cols[:, None])
                jit = self.jitter(np.shape(s))
                s = s * sg * jit
                np.multiply(c[:, :, None], U[None], out=X[:, :, 0, 0, :])
                np.negative(X[:, :, 0, 0, :], out=X[:, :, 1, 0, :])
                X[:, :, :, 1, :] = 0.0
                X[np.arange(k), :, :, :, cols] += s[:, :, None, None]
                if self.z is not None:
                    X += self.z
                y = self.answers(X.reshape(2 * k * r, 2, d)).reshape(k, r, 2)
                Pk = pair_logits(y[:, :, 0], y[:, :, 1],
                                 s * self.v0[cols][:, None] + self.off + self.zv, c)
                Pk[_T] = sg * (Pk[_T] - self.b[rows][None, :] * c) / jit
                P[:, :, sl] = Pk.transpose(0, 2, 1)
                continue
            c, s = self.scales(kappa[sl], cols, dither[sl])
            _fill_pairs(X, c, U, s, cols)
            y = self.answers(X.reshape(2 * k * r, 2, d)).reshape(k, r, 2)
            P[:, :, sl] = pair_logits(y[:, :, 0], y[:, :, 1], (s * self.v0[cols])[:, None],
                                      c[:, None]).transpose(0, 2, 1)
        return P

    def sweep(self, rows, kappa, dither, mask=None):
        """One pass of ``rows`` over every column (only the entries of ``mask``, (len(rows),
        columns), where given; the others are NaN); pairs with a non-finite or too large logit
        are asked again at a tenth of the scale. Returns the :func:`pair_logits` of every entry
        and its scale."""
        if mask is None and self.V is None:
            P = self.ask_rows(rows, kappa, dither)
        else:  # flat pairs: the entries of mask, or every last-token direction of V
            if mask is None:
                mask = np.ones((rows.size, self.V.shape[0]), dtype=bool)
            P = np.full((5,) + mask.shape, np.nan)
            i, j = np.nonzero(mask)
            P[:, i, j] = self.ask(rows[i], j, np.broadcast_to(kappa, mask.shape)[i, j],
                                  dither[j])
        kap = np.broadcast_to(kappa, P.shape[1:]).copy()
        dit = np.broadcast_to(dither, P.shape[1:])
        for _ in range(_MAX_ROUNDS):
            bad = ~(np.abs(P[_T]) <= self.mlog)
            if mask is not None:
                bad &= mask
            if not bad.any():
                return P, kap
            r, c = np.nonzero(bad)
            kap[r, c] /= 10.0
            P[:, r, c] = self.ask(rows[r], c, kap[r, c], dit[r, c])
            self.n_requeried += r.size
        raise ModelMismatchError(
            "the answers are not those of a single attention head: some probe pairs give no "
            f"positive ratio at any of {_MAX_ROUNDS} scales")

    def search(self, rows, cols, kappa, acc):
        """For each column, a scale at which directions ``rows`` give usable logits (all finite,
        within ``max_logit``, root-mean-square at least ``target_logit / 10`` unless the column
        shows only noise). Every round's answers go into ``acc`` (a measurement at any scale
        counts, with its weight). Returns ``kappa`` and the accepted logits (len(rows),
        len(cols))."""
        # the rows' largest logit is about three times their root-mean-square
        T, max_logit = min(float(self.learner.target_logit), self.mlog / 3.0), self.mlog
        p = rows.size
        kappa = np.asarray(kappa, dtype=float).copy()
        dither = np.ones(cols.size)
        t = np.full((p, cols.size), np.nan)
        todo = np.ones(cols.size, dtype=bool)
        prev_rms = np.full(cols.size, np.nan)
        prev_kap = np.full(cols.size, np.nan)
        for rnd in range(_MAX_ROUNDS):
            idx = np.flatnonzero(todo)
            if idx.size == 0:
                return kappa, t
            if rnd:
                self.n_requeried += p * idx.size
            rr, cc = np.tile(rows, idx.size), np.repeat(idx, p)
            P = self.ask(rr, cols[cc], kappa[cc], dither[cc]).reshape(5, idx.size, p)
            P = P.transpose(0, 2, 1)
            acc.add(rows, cols[idx], P, kappa[idx][None, :], max_logit)
            tt = P[_T]
            t[:, idx] = tt
            rms = np.sqrt(np.mean(tt**2, axis=0))
            finite = np.all(np.isfinite(tt), axis=0)
            big = ~(np.max(np.abs(tt), axis=0) <= max_logit)  # NaN counts as big
            small = ~big & (rms < T / 10)
            # a scale raised tenfold that raised the logits less than twofold shows noise only:
            # the column is zero to the answers' precision, and its scale is kept
            stalled = small & (kappa[idx] >= 10 * prev_kap[idx]) & (rms < 2 * prev_rms[idx])
            prev_rms[idx], prev_kap[idx] = rms, kappa[idx]
            kappa[idx[big & ~finite]] /= 100.0
            fix = (big & finite) | (small & ~stalled)
            kappa[idx[fix]] *= np.minimum(1e4, T / np.maximum(rms[fix], 1e-300))
            todo[idx[~big & (~small | stalled)]] = False
        _check_noise(acc)
        raise ModelMismatchError(
            f"the answers are not those of a single attention head: no logit scale gave usable "
            f"answers within {_MAX_ROUNDS} rounds for {int(todo.sum())} columns")


class _Side:
    """One side of the rank-r sketch of :meth:`LowPrecisionValueQueryLearner._sketch_passes`:
    its running means, its directions ``U`` (rows), last tokens ``V`` (rows; None: ``e_j``),
    each entry's measurements so far and its first last-token sign."""

    def __init__(self, acc, U, V, rng):
        self.acc, self.U, self.V = acc, U, V
        self.count = np.zeros(acc.s0.shape, dtype=np.int64)
        self.base = rng.choice([-1.0, 1.0], size=acc.s0.shape)
        self.last = []  # each entry's measurements in the uniform passes

    def mean(self) -> np.ndarray:
        """The entries' weighted means (0 where none was measured yet)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.nan_to_num(self.acc.means())


def _noise_model(side) -> np.ndarray:
    """Each entry's standard deviation of one measurement, ``sqrt(a + b T^2)``: ``a`` and
    ``b`` (non-negative) fitted to the medians of ``(x_1 - x_2)^2 / 2`` over 16 bins of the
    entries' ``|T|``, from the side's last two uniform passes (a noise of the answers' own
    size gives ``b``, one of the box's rounding whatever the entry gives ``a``)."""
    import scipy.optimize

    T = np.abs(side.mean()).ravel()
    half = ((side.last[-1] - side.last[-2]) ** 2 / 2.0).ravel()
    ok = np.isfinite(half)
    T, half = T[ok], half[ok]
    edges = np.quantile(T, np.linspace(0.0, 1.0, 17))
    b = np.clip(np.searchsorted(edges, T, side="right") - 1, 0, 15)
    rows = [(np.mean(T[b == i] ** 2), np.median(half[b == i]) / 0.455)
            for i in range(16) if np.count_nonzero(b == i) >= 8]
    if len(rows) < 2:
        return np.ones(side.count.shape)
    t2, v = np.asarray(rows).T
    sc = np.maximum(v, 1e-300)  # relative residuals: every bin counts alike
    (a, bb), _ = scipy.optimize.nnls(np.column_stack([np.ones_like(t2), t2]) / sc[:, None],
                                     v / sc)
    sd = np.sqrt(a + bb * side.mean() ** 2)
    return sd if np.all(np.isfinite(sd)) and sd.max() > 0 else np.ones(side.count.shape)


def _tail(n: int) -> float:
    """About how many times their root-mean-square the largest of n Gaussian values is,
    ``sqrt(2 ln 2n)``."""
    return float(np.sqrt(2.0 * np.log(2.0 * n)))


def _spread_root(k: int) -> float:
    """``sqrt(chi2_k(0.025) / k)``: a root-mean-square estimated from k values is at least
    this fraction of the true one, 39 times out of 40."""
    import scipy.stats  # here, not at the top: importing it costs every study job 0.5 s

    return float(np.sqrt(scipy.stats.chi2.ppf(0.025, k) / k))


def _check_noise(acc) -> None:
    """Raise when the answers are too coarse for the learner's error model."""
    rel = acc.noise() if acc.dof >= 10 else 0.0
    if rel > MAX_NOISE_LEVEL:
        raise AssumptionViolation(
            f"the answers carry a relative noise of {rel:.3g}, above "
            f"the {MAX_NOISE_LEVEL:g} this learner allows: a pair's log-ratio is then biased "
            "by about the noise squared, which no number of queries averages away")


class LowPrecisionValueQueryLearner(BaseLearner):
    """Recovery of (W, v) from answers rounded to low precision, with a given query budget.

    Parameters
    ----------
    n_queries : int
        Queries the learner may spend, the check queries included; at least
        :meth:`min_queries` (one probe pair per entry of W, about ``2 d^2``). What is left after
        v (d one-row queries), the scale search and the check goes to passes of ``2 d^2``
        queries over every entry of W and a last partial pass; fewer than ``4 d`` queries may
        stay unspent.
    rank : int, optional
        Rank of W. Given, the estimate is truncated to it (``W_factors_``); without it the rank
        is the number of singular values above ``2 / sqrt(3)`` times the spectral edge of the
        noise the learner estimated (a hard threshold in the manner of Gavish and Donoho), and W
        is returned as factors when that rank is below d.
    random_state : int, sequence of ints, Generator or None
        Seed of the probe directions and scales, and (an independent stream) of the check
        queries.
    target_logit : float
        Root-mean-square logit ``|t|`` the probes of a column aim at once its scale is known.
        The error of W falls like ``1 / target_logit`` under relative noise; larger values ask
        more pairs again (those beyond ``max_logit``). 2.5 gave the smallest errors at a fixed
        budget among 1.5, 2, 2.5 and 3 on random and MiniLM heads once those re-asked pairs fit
        the smallest budgets (3 asks about 0.7% of the pairs again).
    answer_scale : float
        Smallest size ``|c u^T v|`` of the answers (float16 answers then stay within its normal
        range, 6e-5 to 65504, for logits up to ``max_logit``). It grows where the last token's
        own value ``s v_j`` would not be negligible, and each pass after the first multiplies a
        column's answer size by a factor drawn log-uniformly in [1, 10]; answers never exceed
        1e4.
    max_logit : float
        A pair whose ``|t|`` exceeds this (or whose ratio is not positive) is asked again at a
        tenth of the scale.
    initial_logit_scale : float
        Scale ``c s`` of the first probes, before any answer has shown the model's scale.
    pilot_rows : int
        Directions every column is asked first, at a common scale, to set its own scale (they
        count as measurements of the first pass).
    block_bytes : int
        Memory bound on one batch of queries.
    verify : int
        Check queries spent after fitting (0 turns the check off)
        (default 8: 6 fresh random queries of 2 to ``check_length`` tokens and copies of the
        two longest with their first N - 1 tokens permuted, which the box must answer alike;
        :func:`~attnquery.learners._base.check_plan`).
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is a head on every
        input of up to ``check_length`` tokens, such as a wider sliding window, passes.
    fit_bias : bool
        The head may carry a key bias c and an offset beta, as a real module's head does
        (``f(X) = softmax(X (W x_N + c))^T (X v) + beta``; served boxes, docs/served.md). The
        learner then reads v at two scales and the offset as a mean of 64 one-row answers,
        measures ``b_l = u_l^T c`` with pairs whose last token is 0 (16 to 256 rounds of ``2 d``
        queries, more with larger budgets), caps every probe's scale c so that the key bias's
        part of its logit stays within 2 (and the bias's part of the query vector no larger than
        the measured part), and takes ``c b_l`` out of every logit. Where d exceeds 48 and W's
        rank is below it (and the budget pays for a full pass after it), the query bias is then
        cancelled: 48 rows of W measured once give its row space, the shift z of every probe
        is moved in it until ``W z + c = 0``, so the key bias no longer caps c, whose answer
        size is then chosen among 0.03 to 3 by the measured scatter of repeated probes
        (``query_bias_cancelled_``, ``answer_size_``; docs/served.md), and W is measured from
        both sides of its rank-r sketch instead of entry by entry (``sketch_``: ``r (2d - r)
        + d`` entries, each asked in several passes with its own scale, so that its logit is
        ``entry_logit_``, and alternating last-token signs). Answers that are not
        finite (the box's format overflowed) count in ``n_overflow_`` and their probes are
        asked again at a smaller scale. Default False (the paper's head, and the float64
        behaviour of earlier versions).
    noise : {"format", "measured"}
        How the answers' measured relative noise (``noise_level_``) is judged when every answer
        is a value of a narrow format (float32, float16, bfloat16: ``answer_format_``).
        "format" (default): it may be at most ``NOISE_FORMAT_FACTOR`` (4) times what the
        format's rounding explains (``noise_floor_``,
        :func:`~attnquery.precision.rounding_floor`); more means the box is not a single head
        (its disagreement with one is counted as noise, and the check's tolerance, built from
        the noise, would grow with it), and :class:`~attnquery.errors.ModelMismatchError` is
        raised before the check. "measured": the answers are declared noisier than their
        format (a box that adds noise before it rounds); the learner then warns with
        :class:`~attnquery.errors.NoiseAboveFormatWarning`, sets ``noise_above_format_`` and
        goes on with the noise it measured. Answers in no narrow format (float64, a few decimal
        digits, noise added in float64) are not judged, in either mode. docs/served.md, "Noise
        judged against the format".

    Attributes
    ----------
    W_ : ndarray (d, d)
        Estimate of W (from the factors, on request, when ``W_factors_`` is set).
    W_factors_ : tuple (L, R) or None
        ``W = L @ R.T``, each d x ``rank_``, when the rank is below d; else None.
    v_ : ndarray (d,)
        Estimate of v, from the pairs' differences.
    rank_ : int
        Rank of the estimate.
    n_queries_ : int
        Queries counted by the oracle during ``fit``, check queries included.
    noise_level_ : float
        Relative noise of the answers (root-mean-square of error / answer), estimated from the
        scatter of ``u^T v`` over the columns that share a direction.
    W_error_estimate_ : float
        Estimated relative Frobenius error of ``W_``: the answers' noise propagated through the
        logits and the weighted means (or, per column, the residual scatter of repeated
        measurements where that is larger), times ``sqrt(r (2d - r)) / d`` after truncation to
        rank r.
    v_error_estimate_ : float
        Estimated relative error of ``v_``.
    residual_ratio_ : float
        Error of W predicted from the scatter of repeated logit measurements over the error the
        noise level predicts, both squared (about 1 for a single head; NaN when no entry was
        measured twice).
    singular_values_ : ndarray (d,)
        Singular values of the dense estimate before truncation.
    n_passes_ : int
        Complete passes over the d x d entries (with ``sketch_``: over both sides of the
        sketch).
    n_partial_rows_ : int
        Directions of the final partial pass.
    sketch_ : bool
        Whether W was measured from its rank-r sketch (with ``fit_bias``, where the query bias
        was cancelled): the columns ``U W R`` along W's row space R and the rows ``B W`` along
        a basis B of its column space and v, ``W = (U^T U W R) (B U^T U W R)^+ (B W)``.
    logit_scale_ : ndarray (d,)
        Scale ``kappa_j = c s`` of column j's probes after the first pass (before dithering).
    n_requeried_ : int
        Pairs asked again (scale search and saturated pairs).
    verify_error_, n_verify_queries_ : float, int
        Relative disagreement and number of the check queries.
    key_bias_ : ndarray (d,)
        Estimate of the key bias c (projected on the column space of ``W_`` when its rank is
        below d); zeros without ``fit_bias``.
    offset_ : float
        Estimate of the offset beta; 0 without ``fit_bias``.
    n_overflow_ : int
        Answers that were not finite (inf or NaN: the box's format overflowed).
    n_bias_rounds_ : int
        Rounds of key-bias pairs (with ``fit_bias``).
    query_bias_cancelled_ : bool
        With ``fit_bias``: whether the probes' shift was moved to cancel the query bias
        (``W z + c = 0``).
    answer_size_ : float or None
        With ``fit_bias``, once the query bias is cancelled: the probes' answer size
        ``|c u^T v|`` the design search chose (None otherwise).
    entry_logit_ : float or None
        With ``sketch_``: the logit each entry's pairs aim at (its scale from its estimate),
        chosen among 1.5, 2.25 and 3 by the design search's measured scatter (None otherwise).
    shift_ : ndarray (d,) or None
        With ``fit_bias``: the shift z added to every probe's tokens (``z^T v = -beta``; None
        where the offset is 0).
    answer_format_ : str
        The narrowest format holding every answer the fit used: "bfloat16", "float16",
        "float32" or "float64" (:func:`~attnquery.precision.answer_format`).
    noise_floor_ : float or None
        The relative noise the answers' format explains
        (:func:`~attnquery.precision.rounding_floor`); None for float64 answers.
    noise_above_format_ : bool
        Whether ``noise_level_`` exceeded ``NOISE_FORMAT_FACTOR`` times ``noise_floor_`` (set
        only with ``noise="measured"``, which warns; "format" raises).
    """

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
        "fit_bias": ["boolean"],
    }
    spec = LearnerSpec(
        name="lowprecision", oracle="value", returns="head", stages=STAGES, fits_bias=True,
        description="a head behind float16, bfloat16 or rounded answers, within a budget of "
        "n_queries value queries (beyond the paper)", label="low precision",
        command_line=False)

    def __init__(self, *, n_queries: int, rank: int | None = None, target_logit: float = 2.5,
                 answer_scale: float = 16.0, max_logit: float = 10.0,
                 initial_logit_scale: float = 1.0, pilot_rows: int = 8,
                 block_bytes: int = 16 * 2**20, fit_bias: bool = False,
                 noise: str = "format", verify: int = DEFAULT_VERIFY,
                 check_length: int = CHECK_LENGTH, random_state=None):
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
        self.fit_bias = fit_bias
        self.noise = noise

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def min_queries(d: int, verify: int = DEFAULT_VERIFY, fit_bias: bool = False) -> int:
        """The least ``n_queries`` at dimension d: ``2 d^2`` (one pair per entry of W), ``d``
        (v), the check queries and 48 for the search of the logit scale; with ``fit_bias``
        also ``d + 1 + 64`` one-row queries (v at a second scale and the offset) and 16 rounds
        of ``2 d`` key-bias pairs. A budget this small leaves nothing for re-asking pairs
        (:class:`~attnquery.errors.BudgetExceededError` then)."""
        extra = (d + 1 + _OFFSET_QUERIES + 2 * d * (_MIN_BIAS_ROUNDS + 2)) if fit_bias else 0
        return int(2 * d * d + d + verify + _SCOUT_ALLOWANCE + extra)

    def _validate_extra(self) -> None:
        if 2 * self.target_logit > self.max_logit:
            raise ConfigError(f"target_logit must be at most max_logit / 2; got "
                              f"{self.target_logit} with max_logit {self.max_logit}")

    # ------------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover (W, v) from ``oracle`` within ``n_queries`` queries; returns self.

        Raises
        ------
        ConfigError
            Bad parameters, a rank above d, ``n_queries`` below :meth:`min_queries`, or a
            membership oracle.
        BudgetExceededError
            The oracle's budget is below ``n_queries``, or re-asking saturated pairs needs more
            queries than are left.
        NotIdentifiableError
            Every answer to the one-row queries is 0 (v = 0).
        AssumptionViolation
            The answers' relative noise is above ``MAX_NOISE_LEVEL`` (0.03: one significant
            digit, for instance), where averaging cannot remove the bias of a pair's log-ratio.
        ModelMismatchError
            The box is not a single attention head: some pairs give no positive ratio at any
            scale, the answers are values of a narrow format but carry more than
            ``NOISE_FORMAT_FACTOR`` times the noise its rounding explains (with
            ``noise="format"``), or the check queries disagree with the estimate beyond the
            learner's own error estimate (also when the answers carry additive noise that is
            large beside the check's answers: the error model is relative).

        Warns
        -----
        NoiseAboveFormatWarning
            With ``noise="measured"``, where ``noise="format"`` would raise.
        """
        self._validate_params()
        d = check_oracle(oracle)
        budget = self._check_budget(oracle, d)
        fit_rng, check_rng = self._rng().spawn(2)
        with self._open_ledger(oracle, STAGES) as ledger:
            pairs = _Pairs(self, ledger, None, None, budget)
            with ledger.stage("v"):  # with fit_bias, the offset and the key bias too
                v0 = self._read_v_offset(pairs, d, fit_rng) if self.fit_bias else read_v(
                    ledger, d)
                if not self.fit_bias:  # the answers themselves
                    pairs.formats.update(v0)
                check_v(v0)
                pairs.v0, pairs.uv = v0, float(np.linalg.norm(v0) / np.sqrt(d))
                pairs.U = balanced_orthonormal(v0, fit_rng)
                if self.fit_bias:
                    self._shift_and_key_bias(pairs, d, fit_rng)
            self.sketch_ = self._sketch_ok(pairs)
            try:  # every entry of W (U^T T), or the two sides of its rank-r sketch
                acc = (self._sketch_passes if self.sketch_ else self._full_passes)(
                    pairs, ledger, fit_rng)
            finally:
                self.n_requeried_ = int(pairs.n_requeried)
                self.n_overflow_ = int(pairs.n_overflow)
            W_err_noise = (self._solve_sketch(pairs, *acc) if self.sketch_
                           else self._solve(acc, pairs.U, pairs))
            # the noise against the answers' format: in "format" mode the check's tolerance,
            # built from the noise, is then bounded by the format's floor
            judge_noise(self, self.noise_level_, pairs.formats.format, d,
                        "a single attention head" + (" with biases" if self.fit_bias else ""))
            Wn = float(np.linalg.norm(self.singular_values_))
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, check_rng,
                                 rtol=self._check_tolerance(W_err_noise),
                                 token_scale=float(np.sqrt(d / Wn)) if Wn > 0 else 1.0,
                                 n0=ledger.n0, check_length=self.check_length)
        return self

    def _full_passes(self, pairs, ledger, rng) -> _Entries:
        """Every entry of ``T = U W``: the scale search, then passes over the d x d entries
        while the budget pays for them, and a partial one."""
        acc = _Entries(pairs.U.shape[0], inverse_variance=bool(self.fit_bias))
        pairs.acc = acc if self.fit_bias else None
        with ledger.stage("scale_search"):  # the model's scale, then each column's
            kappa_p, zero = self._scale_search(pairs, acc)
        with ledger.stage("passes"):  # passes over every entry, then a partial one
            self.logit_scale_ = self._first_pass(pairs, acc, kappa_p, zero)
            self._more_passes(pairs, acc, self.logit_scale_, rng)
        return acc

    def _shift_and_key_bias(self, pairs, d: int, rng) -> None:
        """With ``fit_bias``: every later probe shifted by ``z = -beta v / |v|^2`` (the answers
        then no longer carry the offset, ``z^T v = -beta``, whose rounding would swamp the
        smaller answer of a pair), the key bias measured at last token z, then the query bias
        cancelled by a move of z where W's rank allows (:meth:`_cancel_query_bias`)."""
        v0 = pairs.v0
        z = -pairs.off * v0 / float(v0 @ v0)
        if pairs.off != 0 and np.all(np.isfinite(z)):
            pairs.z, pairs.zv = z, float(z @ v0)
        self._key_bias_stage(pairs, d, rng)
        self.query_bias_cancelled_, self.answer_size_, self.entry_logit_ = False, None, None
        # the cancellation's queries: its rows (with their scale search), the design search
        # and two key-bias stages; it runs where a full pass over W is still paid for after it
        cost = (3 * d * _CANCEL_ROWS + 4 * _DESIGN_ENTRIES * _DESIGN_REPS
                * (len(_CANCEL_SIZES) + 2 + len(_SKETCH_LOGITS))
                + 4 * 2 * d * _MIN_BIAS_ROUNDS)
        # after it, a full pass over W: whether the sketch takes over is known only once its
        # rows show the answers' noise, and in narrow formats the full passes follow
        if d > _CANCEL_ROWS and pairs.left() - cost >= 2.1 * d * d:
            self._cancel_query_bias(pairs, d, rng)
            self.query_bias_cancelled_ = bool(pairs.cancelled)
        self.shift_ = None if pairs.z is None else pairs.z.copy()
        pairs.rng = rng.spawn(1)[0]

    def _check_budget(self, oracle, d: int) -> int:
        """The queries the fit may spend before its check; raises before any query when
        ``n_queries`` or the oracle's budget is too small."""
        if getattr(oracle, "kind", "value") == "membership":
            raise ConfigError("LowPrecisionValueQueryLearner needs value answers; got a "
                              "membership oracle (use MembershipLearner)")
        if self.rank is not None and self.rank > d:
            raise ConfigError(f"rank must be at most d = {d}; got {self.rank}")
        n_verify = check_verify_param(self.verify)
        budget = int(self.n_queries)
        need = self.min_queries(d, n_verify, bool(self.fit_bias))
        if budget < need:
            raise ConfigError(
                f"n_queries = {budget} is below the {need} queries one probe pair per entry of W "
                f"needs at d = {d} (2 d^2 + d + verify + {_SCOUT_ALLOWANCE}; see "
                "LowPrecisionValueQueryLearner.min_queries)")
        check_budget(oracle, budget, f"LowPrecisionValueQueryLearner(n_queries={budget})")
        return budget - n_verify

    def _scale_search(self, pairs: _Pairs, acc: _Entries):
        """The model's logit scale from a few scout columns, then every column's from its
        pilot rows. Returns the columns' scales and which columns are zero to the answers'
        precision."""
        d = pairs.U.shape[0]
        p = min(int(self.pilot_rows), d)
        scouts = np.unique(np.linspace(0, d - 1, min(_SCOUT_COLUMNS, d)).astype(int))
        kap_s, _ = pairs.search(np.arange(min(_SCOUT_ROWS, d)), scouts,
                                np.full(scouts.size, float(self.initial_logit_scale)), acc)
        kappa_p, tp = pairs.search(np.arange(p), np.arange(d),
                                   np.full(d, np.median(kap_s) / 2.0), acc)
        if self.fit_bias and (acc.noise() > _JITTER_NOISE or pairs.cancelled):
            pairs.jitter_size = _LAST_TOKEN_JITTER  # the passes' last tokens jittered
        return kappa_p, np.sqrt(np.mean(tp**2, axis=0)) < float(self.target_logit) / 10

    def _pass_logit(self, pairs, d: int) -> float:
        """The passes' root-mean-square logit: ``target_logit``, lowered where the largest of a
        column's d logits, dithered, would pass the logit limit."""
        return min(float(self.target_logit), pairs.mlog / (np.exp(_KAPPA_DITHER) * _tail(d)))

    def _first_pass(self, pairs: _Pairs, acc: _Entries, kappa_p, zero, stop=None):
        """The first pass over the rows after the pilot's (up to ``stop``, all by default), in
        stages growing fourfold, each column's scale re-estimated from the rows measured so far.
        Returns the scales."""
        d = pairs.U.shape[0]
        stop = d if stop is None else int(stop)
        cols = np.arange(d)
        # columns zero to the answers' precision keep the pilot's scale. The others aim at a
        # root-mean-square logit lowered where the largest of a column's d logits (about
        # sqrt(2 ln 2d) times it) would pass max_logit, with a margin for the spread of the
        # scale estimated from the rows measured so far
        tail = _tail(d)
        T = self._pass_logit(pairs, d)
        n = min(int(self.pilot_rows), d)
        while True:
            z = acc.means(slice(None, n))  # u^T w of the rows measured
            rms = np.sqrt(np.mean(z**2, axis=0))
            spread = 1.0 / _spread_root(n) if n < d else 1.0
            kappa = np.where(zero | (rms == 0), kappa_p,
                             min(T, pairs.mlog / (spread * tail)) / np.where(rms > 0, rms, 1))
            if n >= stop:
                break
            rows = np.arange(n, min(4 * n, stop))
            acc.add(rows, cols, *pairs.sweep(rows, kappa, np.ones(d)))  # (P, kappa)
            n = rows[-1] + 1
        _check_noise(acc)  # before the rest of the budget is spent
        return kappa

    def _more_passes(self, pairs: _Pairs, acc: _Entries, kappa, rng) -> None:
        """Full passes while the budget pays for them, then a partial one over random
        directions, each at a dithered scale and answer size; sets ``n_passes_`` and
        ``n_partial_rows_``."""
        d = kappa.size
        cols = np.arange(d)
        n_passes, partial = 1, 0
        while True:
            left = pairs.left() - 2 * d  # one direction's worth kept for re-asked pairs
            rows = np.arange(d) if left >= 2 * d * d else np.sort(
                rng.choice(d, size=max(0, min(d, left // (2 * d))), replace=False))
            if rows.size == 0:
                break
            kap_b = kappa * np.exp(rng.uniform(-_KAPPA_DITHER, _KAPPA_DITHER, size=d))
            acc.add(rows, cols, *pairs.sweep(rows, kap_b, 10.0 ** rng.uniform(0.0, 1.0, size=d)))
            if rows.size < d:
                partial = rows.size
                break
            n_passes += 1
        self.n_passes_, self.n_partial_rows_ = n_passes, partial

    # -- W from its rank-r sketch ------------------------------------------------------------------
    def _sketch_ok(self, pairs) -> bool:
        """Whether W is measured from its rank-r sketch (:meth:`_sketch_passes`): with
        ``fit_bias``, once the query bias is cancelled (stage 3b found W's row space and rank
        r), no other rank given, and the budget paying for two passes over both sides."""
        if not (self.fit_bias and pairs.cancelled and pairs.rowspace is not None):
            return False
        d, r = pairs.rowspace.shape
        if self.rank is not None and int(self.rank) != r:
            return False
        return pairs.left() >= 2 * 2 * (2 * r + 1) * d

    def _side_scales(self, pairs, pred, n_rows: int) -> np.ndarray:
        """Each column's logit scale from ``pred``, an estimate of some of its ``n_rows``
        entries: the root-mean-square logit at ``target_logit``, and the largest (with the
        dither and the last-token jitter) within the logit limit: measured where ``pred`` has
        every row, else about ``sqrt(2 ln 2 n_rows)`` times the root-mean-square, with a margin
        for the spread of an estimate from few rows."""
        rms = np.sqrt(np.mean(pred**2, axis=0))
        if pred.shape[0] < n_rows:
            big = rms * _tail(n_rows) / _spread_root(pred.shape[0])
        else:
            big = np.max(np.abs(pred), axis=0)
        lim = pairs.mlog / (np.exp(_KAPPA_DITHER) * (1.0 + _LAST_TOKEN_JITTER))
        with np.errstate(divide="ignore"):
            kap = np.minimum(float(self.target_logit) / rms, lim / big)
        return np.where(np.isfinite(kap) & (kap > 0), kap, self.initial_logit_scale)

    @staticmethod
    def _use_side(pairs, U, V, kb) -> None:
        """Probe directions ``U`` (rows) against last tokens ``V`` (rows; None: ``e_j``): the
        key bias's logits ``b = U kb`` and every direction's scale c at the chosen answer size
        ``|c u^T v|``."""
        uv = np.abs(U @ pairs.v0)
        pairs.U, pairs.V, pairs.b = U, V, U @ kb
        pairs.c_bias = pairs.learner.answer_size_ / np.where(uv > 0, uv, pairs.uv)

    def _sketch_passes(self, pairs, ledger, rng):
        """W from both sides of its rank-r sketch, once the query bias is cancelled.

        The columns ``Z = U W R`` (every direction of U against r last tokens along W's row
        space R, from stage 3b's rows) are asked first, each column at its own scale; the rows
        ``Y = B W`` (r + 1 directions, a balanced orthonormal basis B of W's column space, from
        Z, and of v, so that ``|u^T v|`` is large on each, against every coordinate last token)
        then, each entry at its own scale (its estimate from Z). Two more passes over both
        sides show how each side's noise grows with the size of an entry; the rest of the
        budget is then shared among the entries of both sides in proportion to the error each
        measurement of an entry leaves in W (:meth:`_entry_quotas`), every pair at the scale
        that puts its entry's logit at ``entry_logit_`` and each entry's last-token sign
        alternating from one measurement to the next. Then ``W = Z' (B Z')^+ Y`` with ``Z' = U^T Z``
        (:meth:`_solve_sketch`): exact for a rank-r W whatever R and B, with the noise of
        ``r (2d - r) + d`` entries instead of ``d^2``. Returns the two sides' :class:`_Entries`
        and B."""
        R, U0, kb = pairs.rowspace, pairs.U, pairs.U.T @ pairs.b  # kb: W z + c_b
        d, r = R.shape
        accZ = _Entries(d, inverse_variance=True, n_cols=r)
        pairs.acc, pairs.jitter_size = accZ, _LAST_TOKEN_JITTER
        with ledger.stage("passes"):
            Z = _Side(accZ, U0, R.T, rng)
            self._side_pass(pairs, Z, kb, rng, kappa=self._side_scales(pairs, pairs.T0 @ R, d))
            Zw = U0.T @ Z.mean()  # W R
            Cb = np.linalg.qr(np.column_stack([Zw, pairs.v0]))[0]
            B = balanced_orthonormal(Cb.T @ pairs.v0, rng) @ Cb.T
            Y = _Side(_Entries(r + 1, inverse_variance=True, n_cols=d), B, None, rng)
            self._side_pass(pairs, Y, kb, rng, pred=B @ Zw @ R.T)
            for _ in range(_SKETCH_UNIFORM):  # passes that show how the noise grows with T
                for side in (Z, Y):
                    if pairs.left() >= 2.5 * side.count.size:
                        side.last.append(self._side_pass(pairs, side, kb, rng))
            quotas = self._entry_quotas(pairs, (Z, Y), 1.0 - r / d, rng)
            for k in range(max(int(q.max()) for q in quotas)):
                for side, q in zip((Z, Y), quotas, strict=True):
                    if (q > k).any():
                        self._side_pass(pairs, side, kb, rng, mask=q > k)
        self._use_side(pairs, U0, None, kb)
        pairs.sign_base = None
        self.n_passes_ = int(min(np.min(Z.count), np.min(Y.count)))
        self.n_partial_rows_ = 0
        self.logit_scale_ = self._side_scales(pairs, B @ Zw @ R.T, r + 1)
        return Z.acc, Y.acc, B

    def _side_pass(self, pairs, side, kb, rng, kappa=None, pred=None, mask=None) -> np.ndarray:
        """One pass over a side of the sketch (the entries of ``mask`` only, where given): at
        the columns' scales ``kappa``, or at each entry's own (the logit ``entry_logit_`` from
        ``pred``, the side's estimate by default, and at most ten times its column's), dithered
        per column; each entry's last-token sign alternates with its measurements. Returns the
        pass's measurement of every entry (NaN where none)."""
        self._use_side(pairs, side.U, side.V, kb)
        m, n = side.count.shape
        if kappa is None:
            pred = side.mean() if pred is None else pred
            with np.errstate(divide="ignore"):  # each entry's logit at entry_logit_
                kappa = np.minimum(self.entry_logit_ / np.abs(pred),
                                   10.0 * self._side_scales(pairs, pred, m))
        kappa = kappa * np.exp(rng.uniform(-_KAPPA_DITHER, _KAPPA_DITHER, size=n))
        pairs.sign_base = side.base * (-1.0) ** side.count
        rows = np.arange(m) if mask is None else np.flatnonzero(mask.any(axis=1))
        sub = None if mask is None else mask[rows]
        kap = np.broadcast_to(kappa, (m, n))[rows]
        P, kap = pairs.sweep(rows, kap, 10.0 ** rng.uniform(0.0, 1.0, size=n), sub)
        side.acc.add(rows, np.arange(n), P, kap)
        side.count[rows] += 1 if mask is None else sub
        with np.errstate(invalid="ignore"):
            return np.where(np.abs(P[_T]) <= pairs.mlog, P[_T] / kap, np.nan)

    def _entry_quotas(self, pairs, sides, keep: float, rng):
        """Measurements of every entry of both sides after those made so far: the pairs the
        budget has left (less a reserve for pairs asked again) shared in proportion to the
        error one measurement of the entry leaves in W, its noise times ``sqrt(keep)`` on Z
        (the share of its error off W's column space): the allocation that minimizes the
        summed variances for the budget. An entry's noise is ``sqrt(a + b T_e^2)``, fitted on
        each side to the differences of its last two passes (:func:`_noise_model`; uniform
        without them); fractions are rounded at random."""
        cost = []
        for k, side in enumerate(sides):
            sd = _noise_model(side) if len(side.last) >= 2 else np.ones(side.count.shape)
            cost.append(sd * (np.sqrt(keep) if k == 0 else 1.0))
        total = sum(float(c.sum()) for c in cost)
        n = max(0, int(0.997 * pairs.left()) - 4 * pairs.U.shape[1]) // 2
        out = []
        for c in cost:
            q = n * c / total
            out.append(np.floor(q) + (rng.random(q.shape) < q - np.floor(q)))
        return out

    def _solve_sketch(self, pairs, accZ, accY, B) -> float:
        """W, v, the key bias and the error estimates from the two sides of the sketch
        (:meth:`_sketch_passes`); the rank is stage 3b's. To first order the error of W is
        ``(I - P_C) dZ' R^T + H dY`` (H the map from B's coordinates onto W's column space),
        from which the error estimates follow. Returns the relative error of W that the
        answers' noise alone explains (the check's share)."""
        R, U0 = pairs.rowspace, pairs.U
        d, r = R.shape
        accs = (accZ, accY)
        if not all(np.all(a.s0 > 0) and np.all(a.om > 0) for a in accs):
            raise AssumptionViolation("some entries of W's sketch were never measured by a "
                                      "usable pair")
        Zw = U0.T @ accZ.means()  # W R
        Y = accY.means()  # B W
        core = 0.5 * (B @ Zw + Y @ R)  # B W R, measured by both sides
        Uh, sh, Vht = np.linalg.svd(Zw @ np.linalg.pinv(core), full_matrices=False)
        a, sv, bt = np.linalg.svd((sh[:r, None] * Vht[:r]) @ Y, full_matrices=False)
        L, Rf = Uh[:, :r] @ a[:, :r], bt[:r].T  # W = L diag(sv) Rf^T, L orthonormal
        sv = sv[:r]
        W = (L * sv) @ Rf.T
        v = U0.T @ accZ.v_means()
        dof = accZ.dof + accY.dof
        rel = float(np.sqrt((accZ.ss + accY.ss) / dof)) if dof else 0.0
        self.noise_level_ = rel
        rss = sum(float(np.sum(a.s2 - a.s1**2 / a.s0)) for a in accs)
        dof_t = sum(int(np.sum(a.n - 1)) for a in accs)
        resid2 = max(rss, 0.0) / dof_t if dof_t > 0 else 0.0
        var_m = [rel**2 * a.h / a.s0**2 for a in accs]  # each entry's, from the noise
        var = [np.maximum(vm, resid2 / a.s0) for vm, a in zip(var_m, accs, strict=True)]
        keep = 1.0 - r / d  # the part of dZ' off W's column space
        self.residual_ratio_ = (float(sum(np.sum(resid2 / a.s0) for a in accs)
                                      / sum(np.sum(vm) for vm in var_m))
                                if dof_t > 0 else float("nan"))
        col_err = np.sqrt(var[1].sum(axis=0) + keep * (R**2) @ var[0].sum(axis=0))
        Wn, vn = float(np.linalg.norm(sv)), float(np.linalg.norm(v))
        self.rank_ = r
        self.singular_values_ = np.concatenate([sv, np.zeros(d - r)])
        self.W_error_estimate_ = (float(np.sqrt(np.sum(var[1]) + keep * np.sum(var[0]))) / Wn
                                  if Wn > 0 else float("inf"))
        self.v_error_estimate_ = (rel * float(np.sqrt(np.sum(1.0 / accZ.om))) / vn if vn > 0
                                  else float("inf"))
        self.W_factors_, self._W, self.v_ = (L * sv, Rf), None, v
        z = pairs.z if pairs.z is not None else np.zeros(d)
        cb = _combine_key_bias(U0.T @ pairs.b - W @ z, W, U0, pairs, col_err)
        self.key_bias_ = L @ (L.T @ cb)  # in W's column space, as a module's is
        self.offset_ = float(pairs.off)
        return (float(np.sqrt(np.sum(var_m[1]) + keep * np.sum(var_m[0]))) / Wn if Wn > 0
                else 0.0)

    # -- biases ---------------------------------------------------------------------------------
    def _read_v_offset(self, pairs, d: int, rng) -> np.ndarray:
        """v and the offset beta from one-row queries: ``[0]`` and ``[e_j]`` (v roughly), then
        ``[rho e_j]`` with answers ``rho v_j`` of order 1 (v to the answers' precision), then
        the offset as the mean of ``y - x^T v`` over 64 small random tokens (each answer is
        rounded afresh, so their errors average)."""
        pairs.need(2 * d + 1 + _OFFSET_QUERIES)
        X = np.zeros((d + 1, 1, d))
        X[np.arange(1, d + 1), 0, np.arange(d)] = 1.0
        y = pairs.answers(X)
        if not np.all(np.isfinite(y)):
            raise ModelMismatchError("the box gives no finite answer to one-token queries of "
                                     "unit size")
        off0 = float(y[0])
        va = y[1:] - off0
        amax = float(np.max(np.abs(va)))
        rho = float(np.clip(1.0 / amax, 1.0, 1e3)) if amax > 0 else 1.0
        y2 = pairs.answers(rho * X[1:])
        g = rng.standard_normal((_OFFSET_QUERIES, d))
        vb = (y2 - off0) / rho
        if not np.all(np.isfinite(vb)):
            vb = va
        vn = float(np.linalg.norm(vb))
        spread = 0.2 * abs(off0) + 1e-3 * rho * amax  # size of x^T v: many grid steps
        x = g * (spread / (vn * np.sqrt(d))) * np.sqrt(d) / np.linalg.norm(g, axis=1,
                                                                            keepdims=True)
        if vn == 0:
            x = np.zeros_like(g)
        y3 = pairs.answers(x[:, None, :])
        ok = np.isfinite(y3)
        off = float(np.mean((y3 - x @ vb)[ok])) if ok.any() else off0
        pairs.off = off
        return (y2 - off) / rho if np.all(np.isfinite(y2)) else va

    def _bias_pairs(self, pairs, rows, c, w=None) -> np.ndarray:
        """Pairs ``[+-c u_l + z; z]`` with the shift z (0 at first): the logit is
        ``c u_l^T (W z + c_b)`` and the difference ``c u_l^T v``; returns their
        :func:`pair_logits` (5, n)."""
        n, d = rows.size, pairs.U.shape[1]
        pairs.need(2 * n)
        X = np.zeros((n, 2, 2, d))
        X[:, 0, 0, :] = c[:, None] * pairs.U[rows]
        X[:, 1, 0, :] = -X[:, 0, 0, :]
        if pairs.z is not None:
            X += pairs.z
        wv = 0.0
        if w is not None:
            X += w
            wv = float(w @ pairs.v0)
        y = pairs.answers(X.reshape(2 * n, 2, d)).reshape(n, 2)
        return pair_logits(y[:, 0], y[:, 1], pairs.off + pairs.zv + wv, c)

    def _key_bias_stage(self, pairs, d: int, rng, c_fixed=None) -> None:
        """Measure ``b_l = u_l^T c_b`` for every direction (the key bias c_b in the basis U):
        a search for each direction's scale (or ``c_fixed`` for every direction), then rounds
        of pairs with a zero last token at that scale (dithered), averaged with weights
        ``c^2``. The number of rounds grows with the budget (four per pass over W expected, 16
        to 256), so that the key bias's error, which reaches every entry of its row of W, stays
        below the entries' own. Sets the cap ``_c_bias`` on the W probes' scale c (``c_fixed``
        where given) and refines v from the pairs' differences."""
        T, uv = float(self.target_logit), pairs.uv
        cmax = min(float(self.answer_scale), _MAX_ANSWER) / uv  # the W probes' largest c
        rows = np.arange(d)
        if c_fixed is None:
            c0 = self._bias_scales(pairs, rows, np.full(d, cmax), cmax, T)
        else:
            c0 = np.full(d, float(c_fixed))
        per_pass = 2 * d * d
        rpp = 4 if c_fixed is None else _CANCEL_BIAS_ROUNDS
        rounds = 2 * (int(np.clip(rpp * (pairs.left() // per_pass), _MIN_BIAS_ROUNDS, 256)) // 2)
        null_size = float(np.linalg.norm(pairs.z)) if pairs.z is not None else 1.0
        sw = np.zeros(d)
        s1 = np.zeros(d)
        s2 = np.zeros(d)
        sm = np.zeros(d)
        swm = np.zeros(d)
        null = pairs.null
        shift = None
        for k in range(rounds):
            if null is None or k % 2 == 0:  # +-w at the same scale: weights alike, W w cancels
                c = c0 * rng.uniform(0.8, 1.0, size=d)
            if null is not None:  # last tokens z +- w, w off W's row space: W w cancels in
                # the mean, the box's rounding of the query at z does not repeat
                if k % 2 == 0:
                    g = rng.standard_normal(d)
                    g -= null @ (null.T @ g)
                    shift = g * (null_size / np.linalg.norm(g))
                else:
                    shift = -shift
            P = self._bias_pairs(pairs, rows, c, shift)
            ok = np.abs(P[_T]) <= pairs.max
            z = np.where(ok, P[_T] / c, 0.0)
            w = np.where(ok, c * c, 0.0)
            sw += w
            s1 += w * z
            s2 += w * z * z
            good = np.isfinite(P[_M])
            sm += np.where(good, c * c * P[_M], 0.0)
            swm += np.where(good, c * c, 0.0)
        if not (np.all(sw > 0) and np.all(swm > 0)):
            raise AssumptionViolation("some directions' key bias was never measured by a "
                                      "usable pair")
        b = s1 / sw
        pairs.b = b
        # variance of each b_l's weighted mean, from the scatter of its rounds
        pairs.b_var = np.maximum(s2 / sw - b * b, 0.0) / np.maximum(rounds - 1, 1)
        self.n_bias_rounds_ = rounds
        # the probes' scale c: the key bias's part of each logit within _BIAS_LOGIT, and for
        # every direction at most _BIAS_LOGIT / rms(b), where the key bias's part of the query
        # vector, c c_b, is as large as its measured part kappa W e_j: a larger c (a smaller
        # last token) leaves the scores dominated by the bias, whose rounding in a served box
        # (errors of order eps |k| |q|) then swamps the logit
        rms_b = float(np.sqrt(np.mean(b * b)))
        if c_fixed is not None:
            pairs.c_bias = np.full(d, float(c_fixed))
        else:
            with np.errstate(divide="ignore"):
                pairs.c_bias = np.minimum(_BIAS_LOGIT / np.abs(b),
                                          _BIAS_LOGIT / rms_b if rms_b > 0 else np.inf)
        v = pairs.U.T @ (sm / swm)  # u_l^T v at the answers' precision
        if np.all(np.isfinite(v)) and np.linalg.norm(v) > 0:
            pairs.v0 = v
            pairs.uv = float(np.linalg.norm(v) / np.sqrt(d))
            if pairs.z is not None:
                pairs.zv = float(pairs.z @ v)

    def _bias_scales(self, pairs, rows, c0, cmax, T):
        """Each direction's scale for the key-bias pairs: a search until its logit is usable,
        then the scale that puts it at ``T`` (at most ``cmax``)."""
        P = self._bias_pairs(pairs, rows, c0)
        for _ in range(_MAX_ROUNDS):
            t = P[_T]
            big = ~(np.abs(t) <= pairs.mlog)
            small = ~big & (np.abs(t) < T / 10) & (c0 < cmax)
            redo = big | small
            if not redo.any():
                break
            c0[big] /= 10.0
            c0[small] = np.minimum(cmax, c0[small] * np.minimum(
                1e4, T / np.maximum(np.abs(t[small]), 1e-300)))
            idx = np.flatnonzero(redo)
            P[:, idx] = self._bias_pairs(pairs, idx, c0[idx])
            pairs.n_requeried += idx.size
        else:
            raise ModelMismatchError(
                "the answers are not those of a single attention head with biases: probes "
                f"with a zero last token give no usable logit at any of {_MAX_ROUNDS} scales")
        b0 = P[_T] / c0
        return np.where(b0 != 0, np.minimum(cmax, T / np.maximum(np.abs(b0), 1e-300)), cmax)

    def _cancel_query_bias(self, pairs, d: int, rng) -> None:
        """With ``fit_bias``, where W's rank is below ``_CANCEL_ROWS``: cancel the query bias.

        The first ``_CANCEL_ROWS`` rows of ``T = U^T W`` are measured once at the shift z (a
        throwaway first pass); their top right singular vectors span W's row space. z is moved
        within that space so that their key-bias logits vanish, ``u_l^T (W z + c_b) = 0``
        (then ``W z + c_b = 0``: c_b lies in W's column space), and along the rest of v so that
        ``z^T v = -beta`` still. With the key bias's part of every logit gone, the probes' scale
        c is no longer capped by it: it is chosen by :meth:`_design_search`, the key bias is
        measured again at that scale and z moved once more with it. Kept where the key bias
        fell (``query_bias_cancelled_``); else the earlier shift, caps and key bias stay."""
        m = _CANCEL_ROWS
        acc0 = _Entries(d, inverse_variance=True)
        pairs.acc = acc0
        kappa_p, zero = self._scale_search(pairs, acc0)
        self._first_pass(pairs, acc0, kappa_p, zero, stop=m)
        pairs.acc = None
        T0 = acc0.means(slice(None, m))  # the m rows of T measured
        P, S, Qt = np.linalg.svd(T0, full_matrices=False)
        # W's rank: the last gap of _CANCEL_GAP between consecutive singular values within the
        # first three quarters (the rest is the noise, of a rank below them), above 1e-3 of
        # the largest; none: no clear rank below the rows, no row space to move z in
        gaps = np.flatnonzero((S[:-1] >= _CANCEL_GAP * S[1:])
                              & (S[:-1] > _CANCEL_SV * S[0]))
        gaps = gaps[gaps < m - m // 4]
        if gaps.size == 0:
            return
        keep = np.arange(m) <= gaps[-1]
        # the sketch where the answers are float32's or finer (measured: in bfloat16 it took
        # W over its floor from 1.19 to 1.81 on L2H0, 1.25 to 2.26 on L2H9,
        # docs/notes/2026-11-27-served.md)
        if acc0.noise() <= _SKETCH_NOISE:
            pairs.rowspace, pairs.T0 = Qt[keep].T.copy(), T0
        old = (pairs.z, pairs.zv, pairs.b, pairs.b_var, pairs.c_bias, pairs.v0, pairs.uv,
               self.n_bias_rounds_)
        pairs.first = (pairs.b.copy(), pairs.b_var.copy(),
                       pairs.z.copy() if pairs.z is not None else np.zeros(d))
        rms0 = float(np.sqrt(np.mean(pairs.b**2)))
        Q = Qt[keep].T
        # the key-bias rounds shift z by +-w off W's row space and v (pairs.null)
        pairs.null = np.linalg.qr(np.column_stack([Q, pairs.v0]))[0]
        step = (Q, P[:, keep], S[keep])
        _move_shift(pairs, *step)
        grid, errs = self._design_search(pairs, T0, rng, _CANCEL_SIZES)
        best = int(np.nanargmin(errs))
        self.answer_size_ = float(grid[best, 0])
        if pairs.rowspace is not None:  # for the sketch: the sizes a factor sqrt(3) either
            a = self.answer_size_  # side, then the entries' logit at the best size
            g2, e2 = self._design_search(pairs, T0, rng, (a / np.sqrt(3.0), a * np.sqrt(3.0)))
            g2, e2 = np.vstack([g2, grid[[best]]]), np.append(e2, errs[best])
            self.answer_size_ = float(g2[int(np.nanargmin(e2)), 0])
            grid, errs = self._design_search(pairs, T0, rng, (self.answer_size_,),
                                             _SKETCH_LOGITS)
            self.entry_logit_ = float(grid[int(np.nanargmin(errs)), 1])
        for k in range(_CANCEL_STEPS):
            self._key_bias_stage(pairs, d, rng, c_fixed=self.answer_size_ / pairs.uv)
            if k < _CANCEL_STEPS - 1:
                _move_shift(pairs, *step)
        pairs.cancelled = float(np.sqrt(np.mean(pairs.b**2))) < rms0
        if not pairs.cancelled:
            pairs.null, self.answer_size_, pairs.rowspace = None, None, None
            (pairs.z, pairs.zv, pairs.b, pairs.b_var, pairs.c_bias, pairs.v0, pairs.uv,
             self.n_bias_rounds_) = old

    def _design_search(self, pairs, Tm, rng, sizes, logits=None):
        """The relative scatter of repeated logits of ``_DESIGN_ENTRIES`` large entries of
        ``Tm`` (rows of T) at each answer size of ``sizes`` and, where given, each entry logit
        of ``logits`` (else the passes' root-mean-square logit), ``_DESIGN_REPS`` times each
        at dithered scales. Each repetition asks the entry with its last token at +s and at -s
        and the same c, so the key bias's part of the logit cancels. Returns the sizes (or the
        logits, where given) and their scatters (NaN where no entry was measured twice)."""
        m, d = Tm.shape
        rms = float(np.sqrt(np.mean(Tm**2)))
        cand = np.argwhere(np.abs(Tm) > rms)
        pick = rng.choice(len(cand), size=min(_DESIGN_ENTRIES, len(cand)), replace=False)
        rows, cols = cand[pick].T
        Tlj = Tm[rows, cols]
        n = rows.size
        rows2, cols2 = np.concatenate([rows, rows]), np.concatenate([cols, cols])
        if logits is None:
            logits = (self._pass_logit(pairs, d),)
        grid = [(a, T) for a in sizes for T in logits]
        errs = []
        for a, T in grid:
            est = np.empty((_DESIGN_REPS, n))
            for k in range(_DESIGN_REPS):
                c = a / pairs.uv * rng.uniform(0.8, 1.0, size=n)
                s = T / (c * Tlj)
                c, s = np.concatenate([c, c]), np.concatenate([s, -s])
                X = np.zeros((2 * n, 2, 2, d))
                _fill_pairs(X, c, pairs.U[rows2], s, cols2)
                X += pairs.z
                pairs.need(4 * n)
                y = pairs.answers(X.reshape(4 * n, 2, d)).reshape(2 * n, 2)
                t = pair_logits(y[:, 0], y[:, 1], s * pairs.v0[cols2] + pairs.off + pairs.zv,
                                c)[_T]
                est[k] = (t[:n] - t[n:]) / (2 * c[:n] * s[:n])
            ok = np.isfinite(est)
            cnt = ok.sum(axis=0)
            e = np.where(ok, est, 0.0)
            mean = e.sum(axis=0) / np.maximum(cnt, 1)
            var = np.where(ok, (e - mean) ** 2, 0.0).sum(axis=0) / np.maximum(cnt - 1, 1)
            two = cnt >= 2
            errs.append(float(np.sqrt(np.mean(var[two] / Tlj[two] ** 2))) if two.any()
                        else np.nan)
        if np.all(np.isnan(errs)):
            raise ModelMismatchError("the answers are not those of a single attention head with "
                                     "biases: no repeated probe gave a usable logit at any "
                                     "answer size")
        return np.asarray(grid, dtype=float), np.asarray(errs)

    def _solve(self, acc: _Entries, U: np.ndarray, pairs=None) -> float:
        """W and v from the weighted means; noise, error estimates and rank. Returns the
        relative error of W that the answers' noise alone explains (the check's share)."""
        d = U.shape[0]
        if not (np.all(acc.s0 > 0) and np.all(acc.om > 0)):  # every pass re-asks until usable
            raise AssumptionViolation("some entries of W were never measured by a usable pair")
        T = acc.means()
        W = U.T @ T
        v = U.T @ acc.v_means()
        rss = float(np.sum(acc.s2 - acc.s1**2 / acc.s0))
        dof_t = int(np.sum(acc.n - 1))
        resid2 = max(rss, 0.0) / dof_t if dof_t > 0 else np.nan  # kappa^2-weighted logit scatter
        rel = acc.noise()
        if not np.isfinite(rel):  # d = 1: no column shares a direction; use the residuals
            rel = float(np.sqrt(resid2 / 2.0)) if np.isfinite(resid2) else 0.0
        self.noise_level_ = rel
        # variance of each T_lj: the answers' noise through the weighted mean, and the scatter
        # of repeated measurements where that is larger (per column)
        col_model = rel**2 * np.sum(acc.h / acc.s0**2, axis=0)
        col_resid = resid2 * np.sum(1.0 / acc.s0, axis=0) if dof_t > 0 else np.zeros(d)
        self.residual_ratio_ = (float(np.sum(col_resid) / np.sum(col_model))
                                if dof_t > 0 and np.sum(col_model) > 0 else float("nan"))
        col_err = np.sqrt(np.maximum(col_model, col_resid))  # error norm of each column
        E = float(np.sqrt(np.sum(col_err**2)))
        Wn, vn = float(np.linalg.norm(W)), float(np.linalg.norm(v))
        Uw, sv, Vt = np.linalg.svd(W)
        self.singular_values_ = sv
        if self.rank is not None:
            r = int(self.rank)
        else:  # 2/sqrt(3) times the noise's spectral edge (rows' and columns' error norms)
            edge = E / np.sqrt(d) + float(np.max(col_err))
            cut = (2.0 / np.sqrt(3.0)) * edge
            if self.fit_bias:
                # the key bias's error reaches every entry of its direction's row through
                # c / kappa: a rank-one error, of norm about ||db c|| ||1 / kappa||, which the
                # entries' noise does not cover
                c_row = np.minimum(min(float(self.answer_scale), _MAX_ANSWER) / pairs.uv,
                                   pairs.c_bias)
                bias_sv = float(np.linalg.norm(np.sqrt(pairs.b_var) * c_row)
                                * np.linalg.norm(1.0 / self.logit_scale_))
                if pairs.cancelled:  # random last-token signs: that error is spread like
                    bias_sv *= 2.0 / np.sqrt(d)  # noise, its spectral norm 2 / sqrt(d) of it
                cut = max(cut, _BIAS_SV_FACTOR * bias_sv)
            r = int(np.count_nonzero(sv > cut))
        self.rank_ = r
        shrink = np.sqrt(r * (2 * d - r)) / d if r < d else 1.0
        self.W_error_estimate_ = E * shrink / Wn if Wn > 0 else float("inf")
        self.v_error_estimate_ = (rel * float(np.sqrt(np.sum(1.0 / acc.om))) / vn if vn > 0
                                  else float("inf"))
        # the check's tolerance uses the answers' noise alone, which a box that is not a single
        # head does not inflate (unlike the scatter of the logits)
        W_err_noise = (float(np.sqrt(np.sum(col_model))) * shrink / Wn if Wn > 0 else 0.0)
        if r < d:
            self.W_factors_ = (Uw[:, :r] * sv[:r], Vt[:r].T.copy())
            self._W = None
        else:
            self.W_factors_ = None
            self._W = W
        self.v_ = v
        if self.fit_bias:
            cb = U.T @ pairs.b  # u_l^T (W z + c_b) in the basis U, z the shift (if any)
            if pairs.z is not None:
                cb = cb - W @ pairs.z
            if pairs.cancelled:
                cb = _combine_key_bias(cb, W, U, pairs, col_err)
            # a module's key bias W_K^T b_Q / sqrt(d_h) lies in W's column space
            self.key_bias_ = Uw[:, :r] @ (Uw[:, :r].T @ cb) if r < d else cb
            self.offset_ = float(pairs.off)
        else:
            self.key_bias_ = np.zeros(d)
            self.offset_ = 0.0
        return W_err_noise

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
        from ..models import AttentionHead

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
        :meth:`min_queries`)."""
        if not hasattr(self, "W_error_estimate_"):
            raise AttributeError("queries_for needs a fitted learner")
        if not (isinstance(rel_error, int | float | np.floating) and np.isfinite(rel_error)
                and rel_error > 0):
            raise ConfigError(f"rel_error must be a positive number; got {rel_error!r}")
        d = self.v_.size
        n_w = 2 * d * (self.n_passes_ * d + self.n_partial_rows_)
        need = n_w * (self.W_error_estimate_ / rel_error) ** 2 + (self.n_queries_ - n_w)
        return int(max(np.ceil(need), self.min_queries(d, check_verify_param(self.verify))))
