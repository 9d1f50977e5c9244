"""Every head's (W_h, c_h) of a layer from every token's outputs: the shared-token route.

A head's logit of key x_k for query x_n is ``x_k^T m_h(x_n)`` plus terms constant in k, with
``m_h(x) = W_h x + c_h``. The attention matrices of a query (every head's, read from every
token's outputs once the value maps are known) give, in row n, the N centred logits
``log a_{n,k} - mean_j log a_{n,j} = (x_k - x_bar)^T m_h(x_n)``: N - 1 projections of one
vector. A dense least squares for ``(W_h, c_h)`` has d (d + 1) unknowns per head (147,840 at
d = 384); this route needs none that large.

Queries come in groups. A group's Q queries share their first F tokens ``z_1 .. z_F`` and have
N - F fresh ones each:

* the row of a shared token z_i sees fresh keys in every query: over the group, Q (N - 1)
  projections of ``m_h(z_i)``, which one least squares of d unknowns solves (the keys, and so
  the design, are the same for every shared token and every head: one factorisation per
  group);
* the row of a fresh token x_n sees the shared keys: its centred logits over them are
  ``(z_k - z_bar)^T (W_h x_n + c_h) = l_k^T x_n + const_k`` with ``l_k = W_h^T (z_k - z_bar)``,
  which one least squares of d + 1 unknowns over the group's Q (N - F) fresh rows solves.

The ``m_h(z)`` lie in W_h's column space and the ``l_k`` in its row space ``R_h``, of
dimension r = rank W_h (dh for a layer's head, ``W_K^T W_Q``). Groups are added until the
``l_k`` of the last group add no dimension to ``R_h`` (the rank is then known); then
``m_h(z) = (W_h R_h) (R_h^T z) + c_h`` over all shared tokens is a least squares of r + 1
unknowns per output coordinate, and ``W_h = (W_h R_h) R_h^T``. For r = dh = 32 at d = 384 and
N = 24 that is 4 groups of 65 queries.

Under rounding (served answers) the two least squares leave accuracy behind: the fresh rows'
logits over the fresh keys are not used and every logit weighs alike. ``refine`` then refines
every head over every row of the groups (:mod:`._refine`), and ``answer_steps`` once more
on the groups' answers themselves, every head at once (:mod:`._answers`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ...errors import ConfigError, NotIdentifiableError
from ._answers import refine_on_answers
from ._refine import refine_head

__all__ = ["fit_shared", "group_size", "GROUP_OVERSAMPLE", "PILOT_QUERIES", "ROW_RTOL",
           "SHARED_SPREAD"]

#: equations per unknown of each group's least squares (d + 1 unknowns from Q (N - F) fresh
#: rows): twice as many keep the random designs well conditioned
GROUP_OVERSAMPLE = 2.0
#: queries of plain random tokens that measure how peaked the heads are (the token scale)
PILOT_QUERIES = 4
#: the groups' tokens are scaled so that a row's logits spread over about SHARED_SPREAD (log of
#: the largest weight over the smallest): the centred logits of small weights carry their
#: errors divided by the weight. At d = 96 with 6 heads (N = 12), the worst head's W: 8.7e-12 at
#: 1, 9.3e-12 at 0.5, 1.6e-11 at 2, 2.1e-10 at 4, refused by the check at 8
SHARED_SPREAD = 1.0
#: singular values of the row-space samples below this fraction of the largest are rounding
#: (their errors are about 1e-12 relative in float64)
ROW_RTOL = 1e-8


def group_size(d: int, N: int, oversample: float = GROUP_OVERSAMPLE) -> int:
    """Queries of one group of N-token queries (half of them shared)."""
    return math.ceil(oversample * (d + 1) / (N - N // 2))


def fit_shared(oracle, rng: np.random.Generator, d: int, H: int, N: int, attention, spreads,
               fit_bias: bool = True, target_spread: float = SHARED_SPREAD,
               max_rescale: float = 100.0, min_weight: float = 1e-12,
               n_attention_queries: int | None = None, need=None,
               group_oversample: float = GROUP_OVERSAMPLE, row_rtol: float = ROW_RTOL,
               rank_samples: float = 1.0, refine: int = 0, answer_steps: int = 0,
               values=None):
    """Every head's (W_h, c_h) by the shared-token route (see the module docstring).

    Parameters
    ----------
    oracle : callable
        Asks queries (B, N, d) and returns every token's outputs (B, N, d_out).
    rng : Generator
    d, H, N : int
        Token dimension, heads and tokens per query (``H N`` at most the outputs' dimension).
    attention : callable
        ``attention(X, O)``: the heads' attention matrices (H, B, N, N) behind answers O.
    spreads : callable
        ``spreads(A)``: each row's logit spread (the learner's).
    fit_bias : bool
        Fit c_h (else zero).
    target_spread, max_rescale, min_weight : float
        The token scale aims at rows whose logits spread over ``target_spread``, within a
        factor ``max_rescale`` of norm 1; weights below ``min_weight`` count as that.
    n_attention_queries : int, optional
        The most queries the route may ask (pilot and groups): the attention stage's.
    need : callable, optional
        The fit's ledger's ``need(n, what)``, called before each batch (refuses a batch its
        budget cannot pay for, before it is asked).
    group_oversample, row_rtol : float
        :data:`GROUP_OVERSAMPLE` and :data:`ROW_RTOL` for answers exact to float64; the served
        route passes its own.
    rank_samples : float
        Once the ranks are found, groups are added until the shared tokens' row-space samples
        (``G (F - 1)``) number ``rank_samples`` times the largest rank (1: none more); under
        noise, more groups of fewer queries (more shared tokens) give a better W.
    refine : int
        Sweeps of the log-weight refinement (:func:`~._refine.refine_head`; 0: none).
    answer_steps : int
        Then Gauss-Newton steps on the answers (:func:`~._answers.
        refine_on_answers`; 0: none); it needs ``values``, the value maps (H, d, d_out) and
        the output offset (d_out,) behind ``attention``.

    Returns
    -------
    W : ndarray (H, d, d)
    c : ndarray (H, d)
    info : dict
        ``rank`` (H,), ``groups``, ``group_queries``, ``token_scale``, ``residual`` (the
        largest disagreement of the shared tokens' ``m_h(z)`` with the fit, relative),
        ``refine_iterations`` (the refinements' conjugate-gradient iterations, 0 without).
    """
    Q = group_size(d, N, group_oversample)
    if answer_steps and values is None:
        raise ValueError("answer_steps needs values: the value maps and the output offset")

    def ask(X, what):
        if need is not None:
            need(X.shape[0], what)
        O = oracle(X)
        return O, attention(X, O)

    scale = _pilot_scale(lambda X, what: ask(X, what)[1], rng, N, d, spreads, target_spread,
                         max_rescale)
    keep = (bool(refine or answer_steps), bool(refine), bool(answer_steps))
    groups, ranks, L = _ask_groups(ask, rng, d, H, N, Q, scale, n_attention_queries, min_weight,
                                   row_rtol, rank_samples, keep)
    W, c, residual = _assemble(np.concatenate([g.Z for g in groups]),
                               np.concatenate([g.m for g in groups], axis=2), L, ranks, fit_bias)
    iterations = _refine(groups, W, c, ranks, min_weight, fit_bias, refine) if refine else 0
    if answer_steps:
        W, c, k = refine_on_answers(np.concatenate([g.X for g in groups]),
                                    np.concatenate([g.O for g in groups]), *values, W, c,
                                    ranks, fit_bias=fit_bias, steps=answer_steps)
        iterations += k
    info = dict(rank=ranks, groups=len(groups), group_queries=Q, token_scale=scale,
                residual=residual, refine_iterations=iterations)
    return W, c, info


def _ask_groups(ask, rng, d: int, H: int, N: int, Q: int, scale: float, n_attention_queries,
                min_weight: float, row_rtol: float, rank_samples: float, keep):
    """The route's groups of Q queries (:class:`_Group`), asked until the heads' row spaces
    stop growing and their samples number ``rank_samples`` times the largest rank; with the
    ranks and the row-space samples (d, H, G F). ``keep``: whether the groups keep their
    queries, attention matrices and answers (for the refinements)."""
    F = N // 2
    asked = PILOT_QUERIES
    groups = []
    while True:
        if n_attention_queries is not None and asked + Q > n_attention_queries:
            raise ConfigError(
                f"n_attention_queries={n_attention_queries}: the shared-token route asks "
                f"groups of {Q} queries until the heads' row spaces stop growing "
                f"({len(groups)} groups asked, ranks still growing); give more or None")
        Z, X = _group_queries(rng, Q, N, F, d, scale)
        O, A = ask(X, f"group {len(groups) + 1} of the shared-token queries ({Q} of {N} tokens)")
        asked += Q
        kept = (X, A, np.asarray(O, dtype=np.float64))
        groups.append(_Group(Z, *_read_group(X, A, F, min_weight),
                             *(v if k else None for v, k in zip(kept, keep, strict=True))))
        G = len(groups)
        L = np.concatenate([g.rows for g in groups], axis=2)  # (d, H, G F)
        ranks = np.array([_rank(L[:, h], row_rtol) for h in range(H)])
        found = np.all(ranks <= (G - 1) * (F - 1)) or (G - 1) * (F - 1) >= d
        if found and G * (F - 1) >= rank_samples * np.max(ranks):
            return groups, ranks, L


class _Group(NamedTuple):
    """One group of the route: its shared tokens Z (F, d), their ``m_h(z)`` (d, H, F) and the
    row-space samples (d, H, F) (:func:`_read_group`); its queries X, attention matrices A and
    answers O where a refinement needs them (else None)."""

    Z: np.ndarray
    m: np.ndarray
    rows: np.ndarray
    X: np.ndarray | None
    A: np.ndarray | None
    O: np.ndarray | None


def _refine(groups, W, c, ranks, min_weight: float, fit_bias: bool, sweeps: int) -> int:
    """Every head's (W, c) refined in place over every row of the groups' queries and
    attention matrices (:func:`~._refine.refine_head`); the refinement's iterations in
    all."""
    X, A = np.concatenate([g.X for g in groups]), np.concatenate([g.A for g in groups], axis=1)
    iterations = 0
    for h in range(W.shape[0]):
        W[h], c[h], k = refine_head(X, A[h], W[h], c[h], int(ranks[h]), min_weight,
                                    fit_bias=fit_bias, sweeps=sweeps)
        iterations += k
    return iterations


def _pilot_scale(ask, rng, N: int, d: int, spreads, target_spread: float,
                 max_rescale: float) -> float:
    """The tokens' scale: :data:`PILOT_QUERIES` queries of tokens of norm about 1 measure the
    rows' logit spread; logits are quadratic in the scale, which aims at ``target_spread``
    within a factor ``max_rescale`` of 1."""
    Xp = rng.standard_normal((PILOT_QUERIES, N, d)) / np.sqrt(d)
    spread = float(np.median(spreads(ask(Xp, "the pilot queries"))))
    if spread <= 0:
        return 1.0
    return float(np.clip(np.sqrt(target_spread / spread), 1 / max_rescale, max_rescale))


def _group_queries(rng, Q: int, N: int, F: int, d: int, scale: float):
    """One group: F shared tokens Z (F, d) and Q queries (Q, N, d) that begin with them, the
    other N - F tokens fresh (tokens of norm about ``scale``)."""
    Z = rng.standard_normal((F, d)) * (scale / np.sqrt(d))
    Xf = rng.standard_normal((Q, N - F, d)) * (scale / np.sqrt(d))
    return Z, np.concatenate([np.broadcast_to(Z, (Q, F, d)), Xf], axis=1)


def _read_group(X: np.ndarray, A: np.ndarray, F: int, min_weight: float):
    """A group's ``m_h(z_i)`` (d, H, F) from the shared tokens' rows and its row-space samples
    ``W_h^T (z_k - z_bar)`` (d, H, F) from the fresh tokens' rows; X (Q, N, d) holds the
    shared tokens first, A (H, Q, N, N) the heads' attention matrices."""
    Q, N, d = X.shape
    H = A.shape[0]
    logA = np.log(np.maximum(A, min_weight))
    # the shared tokens' rows: every key
    y = logA[:, :, :F, :] - logA[:, :, :F, :].mean(axis=3, keepdims=True)
    U = (X - X.mean(axis=1, keepdims=True)).reshape(Q * N, d)
    rhs = y.transpose(1, 3, 0, 2).reshape(Q * N, H * F)
    M = np.linalg.lstsq(U, rhs, rcond=None)[0].reshape(d, H, F)
    # the fresh tokens' rows: the shared keys
    y2 = logA[:, :, F:, :F] - logA[:, :, F:, :F].mean(axis=3, keepdims=True)
    design = np.concatenate([X[:, F:].reshape(-1, d), np.ones((Q * (N - F), 1))], axis=1)
    rhs2 = y2.transpose(1, 2, 0, 3).reshape(Q * (N - F), H * F)
    Lk = np.linalg.lstsq(design, rhs2, rcond=None)[0][:d].reshape(d, H, F)
    return M, Lk


def _assemble(Z: np.ndarray, M: np.ndarray, L: np.ndarray, ranks, fit_bias: bool):
    """Every head's W_h and c_h from ``m_h(z) = (W_h R_h) R_h^T z + c_h`` over the shared tokens
    Z (k, d), M (d, H, k), with R_h the leading ``ranks[h]`` directions of the row-space
    samples L (d, H, m); and the largest relative residual."""
    H, d = M.shape[1], M.shape[0]
    W, c = np.zeros((H, d, d)), np.zeros((H, d))
    residual = 0.0
    for h in range(H):
        if ranks[h] == 0:
            raise NotIdentifiableError(f"head {h}'s logits do not depend on its query token")
        R = np.linalg.svd(L[:, h], full_matrices=False)[0][:, :ranks[h]]
        design = Z @ R
        if fit_bias:
            design = np.concatenate([design, np.ones((Z.shape[0], 1))], axis=1)
        sol = np.linalg.lstsq(design, M[:, h].T, rcond=None)[0]  # (r [+ 1], d)
        W[h] = sol[:ranks[h]].T @ R.T
        if fit_bias:
            c[h] = sol[ranks[h]]
        res = M[:, h].T - design @ sol
        residual = max(residual, float(np.max(np.abs(res)) / np.max(np.abs(M[:, h]))))
    return W, c, residual


def _rank(L: np.ndarray, rtol: float = ROW_RTOL) -> int:
    """Numerical rank of the row-space samples (d, k)."""
    s = np.linalg.svd(L, compute_uv=False)
    return int(np.count_nonzero(s > rtol * s[0])) if s.size and s[0] > 0 else 0
