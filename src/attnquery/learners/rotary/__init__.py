"""A rotary attention head (RoPE, "rotate half") from value queries (beyond the paper).

The box is one head with rotary positions (:class:`attnquery.models.RotaryAttentionHead`):
positions ``0..N-1``, the query token last,

    s_i = (Rot_{N-1} W_Q x_N)^T (Rot_{i-1} W_K x_i) / sqrt(d_h),
    f(X) = sum_i softmax(s)_i v^T x_i,

so ``s_i = x_i^T M_delta x_N`` with one bilinear form per relative offset ``delta = i - N``,
``M_delta = W_K^T Rot_{-delta} W_Q / sqrt(d_h)``. Write ``D = Rot_1`` (the rotation by one
position, block-diagonal with the 2 x 2 rotations by ``theta_j`` on the pairs ``(j, j + R/2)``
and the identity on the ``d_h - R`` dimensions that are not rotated): ``M_{-k} = K^T D^k Q``
with ``Q = W_Q`` and ``K = W_K / sqrt(d_h)``.

**What the answers determine (identifiability).** Let r = d_h <= d with ``W_Q`` and ``W_K`` of
rank r, and the frequencies ``theta_j`` distinct in (0, pi) (true of every ``base^(-2j/R)``).
In the complex coordinates ``z_j = x_j + i x_{j + R/2}`` of each pair, ``D`` multiplies by
``e^{i theta_j}``, so ``M_{-k} = P + sum_j Re(e^{i k theta_j} Z_j)``, where
``Z_j = k_j q_j^H`` (q_j, k_j the complex rows of the pair) and P is the product of the rows that
are not rotated. The functions ``k -> cos(k theta_j), sin(k theta_j), 1`` are independent, so the
answers (which give every ``M_delta``, see below) determine each ``Z_j``, P and theta_j (mod 2 pi
and up to sign; the representative in (0, pi) is reported); conversely ``(Z_j, P, theta)`` fix
f. The remaining gauge of ``(W_Q, W_K)`` is therefore ``(C^*)^{R/2} x GL(d_h - R)``: a rotation
and a scale of each pair's two rows of ``W_Q`` (undone in ``W_K``), and any invertible map of
the rows that are not rotated, of dimension ``R + (d_h - R)^2``. The paper's head (no positions)
only determines ``W = W_K^T W_Q / sqrt(d_h)``, whose gauge on the factors is ``GL(d_h)``, of
dimension ``d_h^2``: a fully rotary head (R = d_h) determines ``d_h^2 - d_h`` more parameters,
``2 d d_h - d_h`` in the factors plus the ``d_h / 2`` frequencies, against ``2 d d_h - d_h^2``
(at d_h = d: ``2 d^2 - d/2`` against ``d^2``, about twice as many).

**Measurement.** With v read from the d one-row queries ``[e_i]`` (paper Theorem 4.1):

* two-row probes ``[c u; s b]`` answer ``y = alpha c u^T v + (1 - alpha) s b^T v`` with
  ``logit(alpha) = c s u^T M_{-1} b - s^2 b^T M_0 b``: for a last token b, the n first tokens
  ``c u_l`` (u_l the rows of an orthonormal basis with every ``|u_l^T v| = ||v|| / sqrt(d)``)
  and one more, ``-c u_1``, give ``M_{-1} b`` and the constant ``b^T M_0 b`` (n + 1 probes);
* three-row probes ``[c u; s b; s b]`` have
  ``logit(alpha) = c s u^T M_{-2} b - log(e^{s^2 b^T M_{-1} b} + e^{s^2 b^T M_0 b})``, whose
  constant is now known: n probes give ``M_{-2} b``.

The logit scale ``kappa = c s`` is learnt from the answers (a pilot column at
``initial_logit_scale``, then the largest value seen maps to logit 1); the ratio ``c / s``
keeps ``s b^T v`` from swamping ``c u^T v``; a column (or three-row probe) whose logit is
saturated (``|logit| > max_logit``) is asked again at a hundredth of the scale
(``n_requeried_``).

**From two forms to every form.** With the thin SVD ``M_{-1} = U S V^T`` (rank r),
``Q = G V^T`` for an invertible r x r G, and ``T = S^{-1} U^T M_{-2} V = G^{-1} D G``. The
eigenvalues of T are ``e^{+-i theta_j}`` (the frequencies) and 1 (``d_h - R`` times); the
eigenvector E_j of ``e^{i theta_j}`` is ``G^{-1} (e_j - i e_{j + R/2})`` up to a complex factor
(the gauge), so ``G^{-1} = [Re E; -Im E; E_pass]`` up to the gauge, and then
``Q_hat = G V^T``, ``K_hat^T = U S G^{-1} D^{-1}``: a rotary head, evaluated in O(N d r) per
sequence, with ``M_delta = K_hat^T D^{-delta} Q_hat`` for every offset. The learner checks
that every eigenvalue lies on the unit circle, that they come in conjugate pairs, and (with
``rope_base``) that the angles are the frequencies of that base, and raises
:class:`~attnquery.errors.AssumptionViolation` otherwise.

**Queries** (dense route, ``rank=None``): ``d`` (v) + ``d (d + 1)`` (M_{-1} and the
constants) + ``d^2`` (M_{-2}) = ``2 d^2 + 2 d`` = ``2 (d^2 + d)`` exactly on ordinary heads,
plus ``n_requeried_``, the ``d + 1 + 2 d k`` of the refinement on ill-conditioned heads
(below) and the ``verify`` check queries. Low-rank route (``rank=r``, r < d):
``d`` (v) + ``d (k + 1)`` (left sketch ``Psi M_{-1}``, k = r + ``oversample`` balanced first
tokens: the row space, approximately) + ``r (d + 1)`` (``M_{-1} V_Z`` on that row space: the
column space U, accurately) + ``d (r + 1)`` (``U^T M_{-1}``) + ``r`` (the constants
``b^T M_0 b`` of r last tokens in the row space) + ``r^2`` (``U_r^T M_{-2} V_r``):
``d (k + 2 r + 3) + r^2 + 2 r``.

**Biases** (``fit_bias=True``, dense route). With query and key biases,
``s_i = x_i^T M_delta x_N + x_i^T g_delta + h_delta^T x_N + k_delta`` with
``g_delta = K^T Rot_{-delta} b_Q`` (the query bias seen through the keys),
``h_delta = Q^T Rot_{-delta}^T b_K`` and ``k_delta = b_K^T Rot_{-delta} b_Q``; none of them
cancels, as they depend on the offset. The answer's constant beta (the value bias read out)
comes from the query ``[0]``; ``g_{-1}`` and ``g_{-2}`` from the probes ``[c u; 0]`` and
``[c u; 0; 0]`` (a zero token has score ``k_delta`` and value 0), whose logit is
``c u^T g + const`` (d + 1 probes each, the constant read by the pair ``+-u_1``). The two- and
three-row probes then carry ``c u^T g_{-1}`` (resp. ``g_{-2}``), which is subtracted, plus a
per-column constant, read by the pair ``+-u_1`` in both (d + 1 probes per column for M_{-2}
too). After the factorisation, ``b_Q = D^{-1} (K_^T)^+ g_{-1}``, and the two-row columns'
constants ``k_{-1} - k_0 + s (h_{-1} - h_0)_j - s^2 (M_0)_jj - s (g_0)_j`` give
``h_{-1} - h_0 = Q^T (D^T - I) b_K``, hence the rotated part of ``b_K`` (pair by pair,
dividing by ``e^{-i theta_j} - 1``). The part of ``b_K`` on the dimensions not rotated adds
the same to every score of a sequence and is not identifiable (``b_K_`` is 0 there).
Queries: ``1 + 2 (d + 1) + 2 d (d + 1) + d`` = ``2 d^2 + 5 d + 3``.

**Refinement** (``refine="auto"``, the default). The logit scale is learnt from a pilot column
of ``M_{-1}`` asked at ``initial_logit_scale``: its logits are about 30 times smaller than
the others', so that column carries about 200 eps of rounding (relative to the largest entry)
against 2 to 20 eps elsewhere. On a well-conditioned ``M_{-1}`` this does not matter; on a
square head (``d_h = d``, ``cond(M_{-1})`` 200 to 15,000) T inherits it magnified by the
condition number and the error at 4,096 tokens reached 1e-8. With ``cond(M_{-1}) >=
REFINE_CONDITION`` the dense route asks that column again at the learnt scale (``d + 1`` more
queries, stage ``refine``; skipped when ``n_queries`` or the oracle's budget has no room for
them; ``refine=True`` always, ``False`` never): ``2 (d^2 + d) + d + 1 <= 2.2 (d^2 + d)``
queries for d >= 5. What remained (worst 1.6e-9 at 4,096 tokens, d = 64) was the rounding of
the rows of M_{-1} and M_{-2} on M_{-1}'s smallest left singular directions: those rows are
``sigma_i`` times smaller than the largest, each entry measured to a few eps of the largest,
so ``T = M_{-1}^+ M_{-2}`` carried ``eps cond``. The refinement then asks those rows again
(float64 answers, no biases, when the budget has room), ``k = rotary_refine_rows(d)`` of
each form (``2 k d`` queries: 5 rows at d = 64), every row at its own logit scale (its
largest entry, from the first measurement, at the target logit): each entry to a few eps of
its own row. Within ``2.2 (d^2 + d)``. Other heads are unchanged (and keep exactly
``2 (d^2 + d)``).

**Served heads** (float32 answers). When every answer of the v stage is a float32 value,
the head is served in float32 (``answer_precision_``; float16 and bfloat16 answers, the
low-rank route and ``fit_bias`` are refused with
:class:`~attnquery.errors.AssumptionViolation`). Each form then carries the answers' rounding
(about 1e-6 relative), and from offset 2 alone the error at offset delta would be about
``|delta|`` times that. The served route spends a budget, ``n_queries`` or by default
``SERVED_QUERY_FACTOR (d^2 + d) = 8 (d^2 + d)`` with the check (a smaller ``n_queries`` than
the plain route, the pilot column and ``SERVED_VERIFY`` check queries raises
:class:`~attnquery.errors.BudgetExceededError` after the v stage):

* the pilot column asked again (always); singular values of ``M_{-1}`` below ``1e3 u`` (u
  the unit roundoff) are noise, T's eigenvalues may leave the unit circle by ``1e-3``;
* ``M_{-1}`` measured again up to ``SERVED_M1_REPEATS`` times with other first tokens and
  averaged (``n_m1_repeats_``; as many as leave room for ``M_{-2}`` and
  ``SERVED_MIN_BLOCKS`` blocks);
* blocks ``C_k = Y T^(L_k-1) X`` of the rotated pairs (X, Y their real right and left
  eigenbases of T, ``Y X = I``), measured by probes ``[c a; 0 (L - 1 times); s b]`` (a zero
  token scores 0 and has value 0, so ``y (e^s1 + e^sN + L - 1) = e^s1 c a^T v + e^sN s b^T
  v`` gives ``s1 = c s a^T M_{-L} b`` with ``s_N = s^2 b^T M_0 b`` from the estimate, kept
  below 1e-2 by the ratio c / s), first tokens an orthonormal basis of the span of ``U
  S^{-1} Y^T``, last tokens along ``V X``: ``R^2`` probes a block, as many blocks as the
  budget pays for, at most ``SERVED_MAX_BLOCKS``. The first offset L_1 is the largest (below
  ``SERVED_MAX_OFFSET`` = 1,024 and the longest check length, and such that ``(L - 1)``
  times the coarse angles' error stays below 0.1 rad) whose ``e^(+-i (L - 1) theta_j)`` are
  at least half as far apart as the best; it is measured twice and averaged (their spread,
  relative to the block's size, is ``noise_level_``). Its eigenvalues, matched to ``e^(+-i
  (L-1) theta_j)`` and unwrapped, give the frequencies (L - 1)-fold more precisely, its
  eigenvectors replace T's. The other offsets (``long_offsets_``) are chosen one by one to
  separate the pairs of eigenvalues that T and the offsets before separate least, and each
  pair of eigenvectors is corrected (to first order) by whichever of T and the blocks
  separates their eigenvalues most: the mixing of two eigenvectors is the noise divided by
  that separation, and it multiplies the error of every form by up to ``|delta| |theta_a -
  theta_b|``. With one block at one offset, the forms' error grew from 9e-7 at offset 1 to
  3e-6 at offset 2,000 (d = 64, d_h = 32); with the blocks at several offsets it stays at
  6e-7 to 1.1e-6.

The check of a served head is relative to each length on its own: ``max |f_hat - f| / max
|f|`` over the check sequences of one length must stay within ``SERVED_RTOL = 1e-5`` (the
goal, ``check_rtol_``) on every length, on ``SERVED_VERIFY`` = 40 queries, 8 of each of 2,
16, 256, 1,024 and 4,096 tokens (when ``verify_lengths`` is the default). A tolerance
relative to every answer together is no check of long sequences: their answers are averages,
10 to 30 times smaller than those of 2 tokens, so the earlier check (100 times the noise,
capped at 1e-3, relative to all the answers) returned heads 5e-5 to 1e-3 off at 256 to 4,096
tokens. Queries: at most ``8 (d^2 + d)``.

**Precision.** ``M_{-1}`` and ``M_{-2}`` are measured to about float64 rounding, but T
carries that rounding magnified by the condition number of ``M_{-1}``, and the eigenvectors
of frequencies closer than ``1 / N`` mix at that level: the error of ``M_delta`` grows about
linearly in ``|delta|``, to about ``|delta| eps cond(M_{-1})`` (measured: 2e-9 relative at
``delta = -4095`` for a square head, d = d_h = 64, ``cond(M_{-1}) = 1.4e4``, even from exact
forms; 1e-11 at d = 48, d_h = 32). The check allows
``max(1e-9, 4 eps cond(M_{-1}) N_max)`` (``check_rtol_``).

**Check.** The learner checks itself on fresh random sequences of lengths ``verify_lengths``
(up to 4,096 tokens by default) and raises :class:`~attnquery.errors.ModelMismatchError` on a
box that is not a rotary head in this sense: ALiBi (a bias linear in the offset), a sliding
window, several heads, query and key biases (without ``fit_bias``), noise (float16 and
bfloat16 answers raise :class:`~attnquery.errors.AssumptionViolation` at once). A
position-free head (the paper's) is a rotary head with ``R = 0`` (T = I): with
``rope_base=None`` and ``rotary_dim=None`` it is learnt as such (``rotary_dim_ = 0``); with
``rope_base`` or ``rotary_dim`` given, the missing frequencies raise :class:`AssumptionViolation`.
A head with more head dimensions than token dimensions (``d_h > d``) has eigenvalues off the
unit circle and is refused with :class:`AssumptionViolation` too.

**Where it lives.** :mod:`._learner` holds the estimator, :mod:`._routes` the float64 routes
(dense, low-rank) and the plan's budget check, :mod:`._served` the served route, :mod:`._prober`
the probes every route shares (and :mod:`attnquery.learners.multihead_generic.rotary_layer` too),
:mod:`._factor` the factorisation and the biases, :mod:`._common` the constants and the query
counts.
"""

from __future__ import annotations

# the names the module exported before it became a package, and the private ones
# learners/multihead_generic/rotary_layer.py and the tests import
from ._common import (  # noqa: F401
    _NO_HEAD,
    _NO_POSITIVE_WEIGHT,
    CHECK_FACTOR,
    FREQ_TOL,
    PASS_TOL,
    REFINE_CONDITION,
    REFINE_MIN_SEPARATION,
    SERVED_M1_REPEATS,
    SERVED_MAX_BLOCKS,
    SERVED_MAX_OFFSET,
    SERVED_MIN_BLOCKS,
    SERVED_QUERY_FACTOR,
    SERVED_RANK_FACTOR,
    SERVED_RTOL,
    SERVED_UNIT_TOL,
    SERVED_VERIFY,
    SERVED_VERIFY_LENGTHS,
    STAGES,
    UNIT_TOL,
    VERIFY_LENGTHS,
    rotary_dof,
    rotary_query_count,
    rotary_refine_count,
    rotary_refine_rows,
)
from ._factor import thin_svd as _thin_svd  # noqa: F401
from ._learner import RotaryValueQueryLearner
from ._prober import _balanced_rows, _first_tokens, _RotaryProber  # noqa: F401
from ._served import _block_eigen, _correct_mixing, _long_offset, _long_offsets  # noqa: F401

__all__ = ["RotaryValueQueryLearner", "rotary_query_count", "rotary_refine_count",
           "rotary_refine_rows", "rotary_dof",
           "VERIFY_LENGTHS", "STAGES"]
