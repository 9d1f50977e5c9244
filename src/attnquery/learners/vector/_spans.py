"""The heads' output subspaces of a rotary layer without saturating a head (beyond the paper).

The saturated split (:mod:`._split`) multiplies a key difference by 1e10 to 1e16 so that every
weight is 0 or 1. Behind an input norm (a decoder layer's ``RMSNorm``) no token reaches
attention with more than the norm's gain allows, so this split reads the heads from weights
strictly between 0 and 1, with every token's outputs of a layer whose weights move with the
relative positions (rotary heads).

**Spans.** In a query of N tokens that are all a background token u but for copies of
``u + v`` (token 0 and a random :data:`COPY_SHARE` of the others), every row n >= 1 answers,
less the answer ``u^T V_sum + beta`` of all-u tokens, ``r_n = sum_h a_hn w_h(v)``: the weights
sum to one, so only the copies' extra value ``w_h(v) = v^T V_h`` is weighted, by head h's
weight ``a_hn`` on the copies in row n (which moves with n). The answers of
:data:`SPAN_BACKGROUNDS` backgrounds (in the value maps' null space where there is one) span
``T(v) = span_h w_h(v)``, of dimension H exactly. ``w_h(v + v') = w_h(v) + w_h(v')``, so
``T(v_0 + v_k)`` inside ``T(v_0) + T(v_k)`` is the graph of the map carrying each ``w_h(v_0)``
to ``w_h(v_k)``: bases
``A_k`` of every ``T(v_k)`` aligned to one unknown H x H matrix ``Gamma``
(``A_k Gamma = [w_1(v_k) .. w_H(v_k)]``).

**Ratios.** Query A holds ``u + v_0`` and ``u + v_1`` at positions 0 and 1, query B the same
one place later (u elsewhere). Row n of A and row n + 1 of B see both tokens at the same
offsets from the same query token, so every head gives them the same ratio of weights,
``a_h^A(0) a_h^B(1) = a_h^A(1) a_h^B(0)``. A row's answer has coordinates ``alpha_0, alpha_1``
in ``[A_0, A_1]`` with ``alpha = Gamma a``; the rows ``m_h`` of ``Gamma^-1`` therefore solve
the quadratic equations ``m^T (alpha_0^A alpha_1^B^T - alpha_1^A alpha_0^B^T) m = 0``. Their
linearisation in ``m m^T`` has the H-dimensional solution space ``span m_h m_h^T``, whose two
random elements are diagonalised together (their pencil's eigenvectors are Gamma's columns);
a few Gauss-Newton steps on the equations polish each ``m_h``.

**Heads.** Head h's vectors ``A_k Gamma e_h`` over :func:`n_vectors` differences ``v_k`` span its
output subspace (dimension dh exactly), and the subspaces give the projectors and
``V_h = V_sum E_h`` as the saturated split does. Queries: :data:`SPAN_BACKGROUNDS` ``(2 K - 1)``
of :data:`SPAN_TOKENS` tokens and ``2`` :data:`RATIO_PAIRS` of :data:`RATIO_TOKENS`, planned
before the first (:func:`spans_queries`).

Measured on SmolLM2-135M's layer 0 module (d = 576, 9 heads over 3): 590 queries, every
head's value map to 2.1e-11 (relative to the largest entry; the saturated split: 2,200
queries, 5.0e-12).
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import ModelMismatchError, NotIdentifiableError
from ._parts import _from_bases
from ._split import heads_fill

__all__ = ["spans_queries", "split_spans", "n_vectors", "SPAN_TOKENS", "RATIO_TOKENS",
           "RATIO_PAIRS", "SPAN_RTOL", "SPAN_SCALE"]

#: tokens of a span query (its N - 1 rows each answer a point of T(v))
SPAN_TOKENS = 64
#: background tokens u each difference is asked on (T(v) does not depend on u: more rows)
SPAN_BACKGROUNDS = 2
#: tokens of a ratio query (N - 3 equations per pair)
RATIO_TOKENS = 64
#: pairs of ratio queries, each on a fresh background token u
RATIO_PAIRS = 8
#: a span's answers (and a head's vectors) beyond its dimension must stay below this, relative
SPAN_RTOL = 1e-8
#: norm of the differences v relative to the background token's (about 1): the largest token
#: asked, ``u + v_0 + v_1``, has norm about ``sqrt(1 + 2 SPAN_SCALE^2)``
SPAN_SCALE = 0.5
#: share of a span query's tokens beyond the first that hold the changed token too
COPY_SHARE = 0.3
#: norm of the background tokens (about)
BACKGROUND_SCALE = 1.0
#: singular values of the value maps below this (relative) span their null space
NULL_RTOL = 1e-10
#: Gauss-Newton steps polishing each head's row of Gamma^-1
POLISH_STEPS = 4


def n_vectors(dh: int) -> int:
    """Differences v_k read per head dimension: twice dh and 16 more (each head's vectors must
    span dh dimensions with room to spare, so a wrong Gamma shows as more)."""
    return 2 * dh + 16


def spans_queries(d_out: int, n_heads: int) -> int:
    """Queries of :func:`split_spans` for heads of ``d_out / n_heads`` output dimensions."""
    return SPAN_BACKGROUNDS * (2 * n_vectors(d_out // n_heads) - 1) + 2 * RATIO_PAIRS


def _backgrounds(V_sum: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n background tokens u of norm about 1: in the null space of the value maps where they
    have one (grouped-query layers: ``u^T V_h = 0`` for every head, so an answer holds the
    perturbed token's values alone and its rounding is relative to them, not to the
    background's), else Gaussian."""
    d = V_sum.shape[0]
    U, s, _ = np.linalg.svd(V_sum)
    null = U[:, np.count_nonzero(s > NULL_RTOL * s[0]):]
    if null.shape[1] < 2:
        return BACKGROUND_SCALE * rng.standard_normal((n, d)) / math.sqrt(d)
    return (BACKGROUND_SCALE * rng.standard_normal((n, null.shape[1])) @ null.T
            / math.sqrt(null.shape[1]))


def _copies(rng: np.random.Generator) -> list:
    """Per background, the positions that hold the changed token ``u + v``: position 0 and
    a random :data:`COPY_SHARE` of the others (a row's weight on them moves more with the
    row, from head to head, than a single token's)."""
    rest = np.arange(1, SPAN_TOKENS)
    return [np.concatenate([[0], rng.choice(rest, int(COPY_SHARE * rest.size), replace=False)])
            for _ in range(SPAN_BACKGROUNDS)]


def _span(O: np.ndarray, H: int, what: str) -> np.ndarray:
    """An orthonormal basis (d_out, H) of the answers' span O (B, rows, d_out), per query."""
    U, s, _ = np.linalg.svd(O.transpose(0, 2, 1), full_matrices=False)
    top = s[:, :1]
    over = s[:, H] / top[:, 0] if s.shape[1] > H else np.zeros(len(s))
    if np.any(over > SPAN_RTOL):
        raise ModelMismatchError(
            f"the answers to one key's change span more than n_heads={H} dimensions "
            f"(relative singular value {float(over.max()):.3g} beyond the {H}th, {what}): the box "
            "has another number of heads (more than declared), or is not an attention layer of "
            "rotary heads",
            error=float(over.max()), allowed=SPAN_RTOL)
    under = s[:, H - 1] / top[:, 0]
    if np.any(under <= 1e3 * SPAN_RTOL):
        raise NotIdentifiableError(
            f"the answers to one key's change span fewer than n_heads={H} dimensions "
            f"(relative singular value {float(under.min()):.3g} at the {H}th): heads whose "
            "weights do not move apart with the positions (no rotary positions, or fewer heads "
            "than declared)")
    return U[:, :, :H]


def split_spans(oracle, V_sum: np.ndarray, beta: np.ndarray, n_heads: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The heads' value-output maps (H, d, d_out) and output projectors (H, d_out, d_out) of a
    layer of rotary heads whose output subspaces fill d_out, from every token's outputs,
    without saturating a head (see the module's docstring); the same as
    :func:`~attnquery.learners.vector._split.split_outputs` returns. Asks exactly
    :func:`spans_queries` queries, of tokens of norm about 1.2 at most.

    Raises
    ------
    NotIdentifiableError
        H does not divide d_out, or the answers do not tell the heads apart.
    ModelMismatchError
        The answers span more dimensions than H heads give, or a head's vectors more than
        d_out / H.
    """
    d, d_out = V_sum.shape
    H = heads_fill(d_out, n_heads)
    dh = d_out // H
    K = n_vectors(dh)
    oracle.need(spans_queries(d_out, H), "the split by spans", reserved=True)
    u = _backgrounds(V_sum, SPAN_BACKGROUNDS, rng)
    v = SPAN_SCALE * rng.standard_normal((K, d)) / math.sqrt(d)
    diffs = np.concatenate([v, v[:1] + v[1:]])  # T(v_k), then T(v_0 + v_k)
    X = np.repeat(u[None, :, None, :], len(diffs), axis=0).repeat(SPAN_TOKENS, axis=2)
    for b, copies in enumerate(_copies(rng)):  # the changed token at a few positions
        X[:, b, copies] += diffs[:, None]
    O = np.asarray(oracle(X.reshape(-1, SPAN_TOKENS, d)), dtype=np.float64)
    O = (O.reshape(len(diffs), SPAN_BACKGROUNDS, SPAN_TOKENS, -1)[:, :, 1:]
         - (u @ V_sum + beta)[None, :, None]).reshape(len(diffs), -1, d_out)
    Q = _span(O, H, "a span query")
    A = np.empty((K, d_out, H))
    A[0] = Q[0]
    for k in range(1, K):  # T(v_0 + v_k): the graph of w_h(v_0) -> w_h(v_k)
        XY = np.linalg.lstsq(np.concatenate([Q[0], Q[k]], axis=1), Q[K + k - 1], rcond=None)[0]
        A[k] = Q[k] @ XY[H:] @ np.linalg.inv(XY[:H])
    Gamma = _gamma(oracle, V_sum, beta, A[:2], H, rng, v[:2])
    bases = []
    for h in range(H):
        W = np.einsum("kdh,h->dk", A, Gamma[:, h])
        U, s, _ = np.linalg.svd(W, full_matrices=False)
        if s[dh] > SPAN_RTOL * s[0]:
            raise ModelMismatchError(
                f"a head's output vectors span more than d_out / H = {dh} dimensions (relative "
                f"singular value {s[dh] / s[0]:.3g}): the box is not a layer of {H} rotary heads "
                "whose outputs fill d_out", error=float(s[dh] / s[0]), allowed=SPAN_RTOL)
        bases.append(U[:, :dh])
    E = _from_bases(bases, dh)
    return np.einsum("do,hoe->hde", V_sum, E), E


def _gamma(oracle, V_sum, beta, A01, H: int, rng, v01) -> np.ndarray:
    """Gamma (H, H): ``A_k Gamma`` holds the heads' vectors, from :data:`RATIO_PAIRS` pairs of
    ratio queries (see the module's docstring)."""
    d = V_sum.shape[0]
    N = RATIO_TOKENS
    u = _backgrounds(V_sum, RATIO_PAIRS, rng)
    X = np.repeat(u[:, None, None, :], 2, axis=1).repeat(N, axis=2)  # (P, 2, N, d)
    X[:, 0, 0] += v01[0]
    X[:, 0, 1] += v01[1]
    X[:, 1, 1] += v01[0]
    X[:, 1, 2] += v01[1]
    O = np.asarray(oracle(X.reshape(-1, N, d)), dtype=np.float64).reshape(RATIO_PAIRS, 2, N, -1)
    O = O - (u @ V_sum + beta)[:, None, None, :]
    basis = np.concatenate(list(A01), axis=1)  # (d_out, 2H)
    coef = np.linalg.lstsq(basis, O.reshape(-1, O.shape[-1]).T, rcond=None)[0].T
    coef = coef.reshape(RATIO_PAIRS, 2, N, 2 * H)
    a0, a1 = coef[:, 0, 2:N - 1, :H], coef[:, 0, 2:N - 1, H:]  # rows n of A
    b0, b1 = coef[:, 1, 3:N, :H], coef[:, 1, 3:N, H:]  # rows n + 1 of B
    C = (np.einsum("pni,pnj->pnij", a0, b1) - np.einsum("pni,pnj->pnij", a1, b0)).reshape(-1, H,
                                                                                          H)
    S = (C + C.transpose(0, 2, 1)) / 2
    iu = np.triu_indices(H)
    weight = np.where(iu[0] == iu[1], 1.0, 2.0)
    _, s, Vt = np.linalg.svd(S[:, iu[0], iu[1]] * weight, full_matrices=False)
    if s.size < Vt.shape[1] or s[-H - 1] <= 1e3 * SPAN_RTOL * s[0]:
        raise NotIdentifiableError(
            "the ratio queries' equations leave more than the heads' own solutions "
            f"(relative singular value {float(s[min(len(s) - 1, len(s) - H - 1)] / s[0]):.3g}): "
            "heads whose weight ratios do not tell them apart")

    def sym(x):
        M = np.zeros((H, H))
        M[iu] = x
        return M + np.triu(M, 1).T

    null = Vt[-H:]
    N1, N2 = (sym(rng.standard_normal(H) @ null) for _ in range(2))
    w, P = np.linalg.eig(np.linalg.solve(N2, N1))
    if np.max(np.abs(w.imag)) > 1e-6 * np.max(np.abs(w)):
        raise ModelMismatchError(
            "the ratio queries' equations are not those of one weight per head (complex "
            "eigenvalues): the box is not an attention layer of rotary heads",
            error=float(np.max(np.abs(w.imag))), allowed=0.0)
    M = np.linalg.inv(P.real)
    for h in range(H):  # Gauss-Newton on m^T S m = 0, |m| = 1
        m = M[h] / np.linalg.norm(M[h])
        for _ in range(POLISH_STEPS):
            Sm = S @ m
            J = 2 * Sm
            J -= np.outer(J @ m, m)
            m = m + np.linalg.lstsq(J, -(Sm @ m), rcond=None)[0]
            m /= np.linalg.norm(m)
        M[h] = m
    return np.linalg.inv(M)
