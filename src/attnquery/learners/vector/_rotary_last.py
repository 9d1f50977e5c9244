"""The last token's outputs of a layer of rotary heads: the ``subspaces`` and ``forms`` stages
of :class:`~attnquery.learners.vector.rotary_layer.RotaryLayerVectorLearner` when an answer
holds one row, the last token's (``outputs="last"``).

The ``V`` and ``split`` stages read the last row already (a one-token query's only row; the
split's two-token lines' last row). The other two stages are read from that row alone:

* ``subspaces``: queries ``[f_1..f_m, r]`` (the f fixed per round, r random and last): the
  log-weight differences of the fixed keys in r's row are linear in ``[r; 1]`` with coefficients
  in the row space of the head's query map (m - 1 per round); queries ``[r_1..r_m, p]`` (p fixed
  per round and last): the log-weight of key r_i less the probe's own is linear in ``[r_i; 1]``
  with a coefficient in the key map's row space. The probe rotated by the m short offsets
  barely turns along the slow frequencies' pairs, so a round gives about one direction of each
  of those: the key rounds are :data:`KEY_ROUNDS` times the head dimension.
* ``forms``: dh + 5 probe tokens p are each asked as the last token of queries of
  ``max_offset + 1`` tokens (default ``check_length``: the key offsets reach every offset the
  check asks), the other tokens copies of p (one lumped value) but for a few keys
  at offsets drawn per key set with probability about ``1 / offset + 4 / max_offset`` (the fast
  frequencies need the short offsets densely, the slow ones the long ones), as
  :class:`~attnquery.learners.vector.rotary.RotaryVectorLearner` does for one head. Each answer
  gives every head's log-weights of the keys in the last row, linear in the probe's forms
  (:func:`~attnquery.learners.vector._rotary_reads.solve_forms`, one row per query).

Only the last row is read, so a causal mask changes nothing (the last token sees every token
either way).
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import ConfigError
from ...models import rope_frequencies
from ._attention import MIN_WEIGHT
from ._rotary_reads import (
    ask_blocks,
    head_weights,
    row_space,
    solve_forms,
    vanishing,
    whitened_solve,
)

__all__ = ["read_spaces_last", "read_forms_last", "last_plan", "KEY_ROUNDS",
           "FORM_OVERSAMPLE", "SPACE_OFFSET"]

#: rounds of the key row spaces' queries beyond the query row spaces' (one probe per round).
#: The Qwen2-style size (d = 256, 8 heads over 2): function 2.2e-9 at 2 (7,558 queries), 1.7e-10
#: at 4 (8,202), 7.6e-11 at 6, 6.1e-11 at 8; d = 128: 4.5e-10 at 2, 6.2e-11 at 4; d <= 64
#: unchanged (1e-10 or better either way, about 7 % more queries)
KEY_ROUNDS = 4
#: form equations (one per key, less the row's constant) per unknown of one probe
FORM_OVERSAMPLE = 2.0
#: longest key offset of the key rounds of the subspace stage (the row spaces do not depend on
#: the offsets; the forms' queries reach ``max_offset``)
SPACE_OFFSET = 511
#: what a box that fails these readings is not
WHAT = "a layer of rotary heads as declared"


def last_log_weights(est, T: np.ndarray, O: np.ndarray) -> np.ndarray:
    """log of every head's weights (H, n, s) on the distinct tokens T (n, s, d) of n queries
    (the copies of a token lumped: one weight) in their last row, from the last token's
    outputs O (n, d_out) (NaN below the smallest weight read)."""
    vals = np.einsum("bnd,hdr->hbnr", T, est._values)
    ys = np.einsum("bo,hor->hbr", O - est.output_bias_, est._reads)
    a = np.stack([head_weights(vals[h], ys[h][:, None], WHAT)[0][:, 0]
                  for h in range(vals.shape[0])])
    return np.log(np.where(a > MIN_WEIGHT, a, np.nan))


def key_positions(rng, n_sets: int, k: int, L: int) -> np.ndarray:
    """Positions (n_sets, k) of k keys before a last token at position L: distinct offsets
    1..L per set, drawn with probability proportional to ``1 / offset + 4 / L`` (Gumbel top-k;
    the fast frequencies need the short offsets densely, the slow ones the long ones)."""
    offsets = np.arange(1, L + 1)
    gumbel = -np.log(rng.exponential(size=(n_sets, L))) + np.log(1.0 / offsets + 4.0 / L)
    return L - offsets[np.argsort(-gumbel, axis=1)[:, :k]]


def last_plan(d: int, dh: int, slots: int, oversample: float, vectors: float,
              extra_probes: int) -> tuple[int, int]:
    """Queries of the ``subspaces`` and ``forms`` stages (from the last token's outputs) of a
    layer at d of heads of dimension dh read on ``slots`` values per row."""
    m = max(2, slots - 1)
    n = math.ceil(oversample * (d + 1))
    q_rounds = math.ceil(vectors * dh / (m - 1))
    k, e = slots - 1, dh + 1
    n_sets = math.ceil(FORM_OVERSAMPLE * (dh + 1) * e / (k - 1))
    return (2 * q_rounds + KEY_ROUNDS) * n, (e + extra_probes) * n_sets


def read_spaces_last(est, oracle, rng, d: int, oversample: float, vectors: float) -> None:
    """``est.query_bases_`` and ``est.key_bases_`` from the last token's outputs (the module's
    docstring): rounds of ``oversample (d + 1)`` queries, ``vectors`` query vectors per
    dimension of a head."""
    m = max(2, est._slots() - 1)  # fixed (or random) keys besides the last token
    H, dh = est._values.shape[0], est.head_dim or est._values.shape[2]
    n = math.ceil(oversample * (d + 1))
    L = min(est._form_offset(), SPACE_OFFSET)
    q_rounds = math.ceil(vectors * dh / (m - 1))
    k_rounds = q_rounds + KEY_ROUNDS
    oracle.need((q_rounds + k_rounds) * n, "the subspace stage", reserved=True)
    ones = np.ones((n, 1))
    qv, kv = [[] for _ in range(H)], [[] for _ in range(H)]
    for _ in range(q_rounds):  # fixed keys' differences in the row of r, linear in y(r)
        fixed = rng.standard_normal((m, d)) / np.sqrt(d)
        X = np.concatenate([np.broadcast_to(fixed, (n, m, d)),
                            rng.standard_normal((n, 1, d)) / np.sqrt(d)], axis=1)
        ell = last_log_weights(est, X, np.asarray(oracle(X), dtype=np.float64))
        Z = np.concatenate([X[:, m], ones], axis=1)
        rhs = (ell[:, :, 1:m] - ell[:, :, :1]).transpose(1, 0, 2).reshape(n, -1)
        w = whitened_solve(Z, rhs).reshape(H, m - 1, d + 1)
        for h in range(H):
            qv[h].append(w[h, :, :d])
    for _ in range(k_rounds):  # key r_i in the row of the probe, linear in y(r_i)
        probe = rng.standard_normal(d) / np.sqrt(d)
        keys = rng.standard_normal((n, m, d)) / np.sqrt(d)
        X = np.broadcast_to(probe, (n, L + 1, d)).copy()
        pos = key_positions(rng, 1, m, L)[0]
        X[:, pos] = keys  # offsets spread over 1..L
        T = np.concatenate([keys, np.broadcast_to(probe, (n, 1, d))], axis=1)
        ell = last_log_weights(est, T, np.asarray(oracle(X), dtype=np.float64))
        if not np.all(np.isfinite(ell)):  # a window (distant keys vanish), or too peaked
            vanishing(~np.all(np.isfinite(ell[:, :, :m]), axis=0),
                      np.broadcast_to((pos - L).astype(np.float64), (n, m)))
        for i in range(m):
            Z = np.concatenate([keys[:, i], ones], axis=1)
            u = whitened_solve(Z, (ell[:, :, i] - ell[:, :, m]).T)
            for h in range(H):
                kv[h].append(u[h:h + 1, :d])
    est.query_bases_ = np.stack([row_space(np.concatenate(v), dh, "query row space")
                                 for v in qv])
    est.key_bases_ = est._group_bases(kv, dh)


def read_forms_last(est, oracle, rng, d: int, extra_probes: int) -> None:
    """The forms in the bases from the last token's outputs (the module's docstring), from
    dh + 1 + ``extra_probes`` probes."""
    H, r = est.query_bases_.shape[:2]
    est.frequencies_ = rope_frequencies(r, float(est.rope_base))
    L = est._form_offset()  # the last token's position; the keys' offsets 1..L
    k = est._slots() - 1  # keys per query; the probe's copies are the last slot
    e = r + 1
    if L < k:
        raise ConfigError(f"max_offset={L} must reach the {k} keys of a form query")
    n_sets = math.ceil(FORM_OVERSAMPLE * (r + 1) * e / (k - 1))
    n_probes = e + extra_probes
    oracle.need(n_probes * n_sets, "the form stage", reserved=True)
    pos = key_positions(rng, n_sets, k, L)
    probes = rng.standard_normal((n_probes, d)) / np.sqrt(d)
    keys = rng.standard_normal((n_sets, k, d)) / np.sqrt(d)

    def queries(lo, hi):  # query q: probe q // n_sets with key set q % n_sets
        q = np.arange(lo, hi)
        X = np.broadcast_to(probes[q // n_sets][:, None], (hi - lo, L + 1, d)).copy()
        X[np.arange(hi - lo)[:, None], pos[q % n_sets]] = keys[q % n_sets]
        return X

    O = ask_blocks(oracle, n_probes * n_sets, queries)
    T = np.concatenate([np.broadcast_to(keys, (n_probes, n_sets, k, d)),
                        np.broadcast_to(probes[:, None, None], (n_probes, n_sets, 1, d))], 2)
    ell = last_log_weights(est, T.reshape(n_probes * n_sets, k + 1, d), O)[..., :k]
    ell = ell.reshape(H, n_probes, n_sets, k)
    forms, est.forms_rank_ = [None] * H, np.zeros(H, dtype=int)
    for g in np.unique(est.head_groups_):  # one solve per key/value head: shared keys
        heads = np.flatnonzero(est.head_groups_ == g)
        kappa = np.concatenate([keys @ est.key_bases_[heads[0]].T, np.ones((n_sets, k, 1))],
                               2)
        F, rank = solve_forms(kappa, (pos - L).astype(np.float64),
                              np.concatenate([ell[h] for h in heads]), est.frequencies_)
        for i, h in enumerate(heads):
            zeta = np.concatenate([probes @ est.query_bases_[h].T, np.ones((n_probes, 1))], 1)
            forms[h] = F[..., i * n_probes:(i + 1) * n_probes] @ np.linalg.pinv(zeta.T)
            est.forms_rank_[h] = rank
    F = np.stack(forms)  # (H, nb, e, e)
    j = est.frequencies_.size
    est.cos_forms_, est.sin_forms_, est.const_form_ = F[:, :j], F[:, j:2 * j], F[:, -1]
