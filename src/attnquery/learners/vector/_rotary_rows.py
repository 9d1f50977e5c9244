"""The readings of
:class:`~attnquery.learners.vector.rotary_layer.RotaryLayerVectorLearner` on every token's
outputs: every head's log-weights in the rows of a query, the heads' query and key row spaces
(stage 3 of :mod:`attnquery.learners.vector.rotary_layer`), and the form equations (stage 4):
the padding rows of queries that hold a few fixed keys, each a query of the probe token that
sees the keys at its own offsets, read as equations linear in the probe's forms.
:class:`FormEquationsMixin` holds the methods; the learner inherits them.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import ModelMismatchError
from ._attention import ATTENTION_TOL, MIN_WEIGHT
from ._rotary_reads import ask_blocks, head_weights, row_space, whitened_solve

__all__ = ["FormEquationsMixin", "ROW_OVERSAMPLE", "NEAR_ROWS", "SPACE_OVERSAMPLE",
           "SPACE_VECTORS"]

#: queries of a subspace round per unknown of its least squares (d + 1)
SPACE_OVERSAMPLE = 1.25
#: fixed tokens' differences per dimension of a query/key row space
SPACE_VECTORS = 1.3

#: form equations per unknown of one probe (the padding rows used are spread evenly)
ROW_OVERSAMPLE = 8
#: padding rows right after the keys all used (the short offsets), beyond ROW_OVERSAMPLE's
NEAR_ROWS = 32


class FormEquationsMixin:
    """The form equations of a rotary layer read from every token's outputs (the learner's
    ``_form_equations``, over its ``query_bases_``, ``key_bases_``, value reads and slots),
    and the key bases they share per key/value head (``_group_bases``)."""

    def _log_weights(self, X, O, rows, what) -> np.ndarray:
        """log of every head's weights (H, n, M, N) of the rows ``rows`` of queries X whose
        tokens are all distinct (NaN where a row does not see a token)."""
        n, N, _ = X.shape
        vals = np.einsum("bnd,hdr->hbnr", X, self._values)
        ys = np.einsum("bno,hor->hbnr", O - self.output_bias_, self._reads)
        out = np.full((vals.shape[0], n, len(rows), N), np.nan)
        later = 0.0
        for m, row in enumerate(rows):
            seen = np.arange(row + 1 if self.causal else N)
            for h in range(vals.shape[0]):
                a = head_weights(vals[h][:, seen], ys[h][:, row:row + 1], what)[0][:, 0]
                out[h, :, m, seen] = np.log(np.where(a > MIN_WEIGHT, a, np.nan)).T
                later = max(later, float(np.max(a[:, row + 1:], initial=0.0)))
        if not self.causal and later <= ATTENTION_TOL:
            raise ModelMismatchError(
                "no token attends to a later token: the box has a causal mask; fit it with "
                "causal=True", error=1.0, allowed=ATTENTION_TOL)
        return out

    def _read_spaces(self, oracle, rng, d: int) -> None:
        """``query_bases_`` and ``key_bases_`` (stage 3 of the module's docstring)."""
        s = self._slots()
        m = max(2, (s - 1) // 2)  # fixed keys f and fixed probes p per round
        k = max(1, s - 2 * m)  # random tokens r
        H, dh = self._values.shape[0], self.head_dim or self._values.shape[2]
        # the slow frequencies barely turn over a query: their pairs' directions are spanned by
        # the fixed tokens' differences (m - 1 per round), not by the rows' offsets
        rounds = math.ceil(SPACE_VECTORS * dh / (m - 1))
        n = math.ceil(SPACE_OVERSAMPLE * (d + 1))
        oracle.need(rounds * n, "the subspace stage", reserved=True)
        qv, kv = [[] for _ in range(H)], [[] for _ in range(H)]
        for _ in range(rounds):
            fixed = rng.standard_normal((2 * m, d)) / np.sqrt(d)
            X = np.concatenate([np.broadcast_to(fixed[:m], (n, m, d)),
                                rng.standard_normal((n, k, d)) / np.sqrt(d),
                                np.broadcast_to(fixed[m:], (n, m, d))], axis=1)
            O = np.asarray(oracle(X), dtype=np.float64)
            rows = np.arange(m, 2 * m + k)
            ell = self._log_weights(X, O, rows, "a layer of rotary heads as declared")
            ones = np.ones((n, 1))
            for j in range(k):  # row of r_j: fixed keys' differences, linear in y(r_j)
                Z = np.concatenate([X[:, m + j], ones], axis=1)
                rhs = (ell[:, :, j, 1:m] - ell[:, :, j, :1]).transpose(0, 2, 1)
                w = whitened_solve(Z, rhs.reshape(H * (m - 1), n).T).reshape(H, m - 1, d + 1)
                for h in range(H):
                    qv[h].append(w[h, :, :d])
            for i in range(k):  # key r_i in the rows of the p: linear in y(r_i)
                Z = np.concatenate([X[:, m + i], ones], axis=1)
                rhs = (ell[:, :, k:, m + i] - ell[:, :, k:, 0]).transpose(0, 2, 1)
                u = whitened_solve(Z, rhs.reshape(H * m, n).T).reshape(H, m, d + 1)
                for h in range(H):
                    kv[h].append(u[h, :, :d])
        self.query_bases_ = np.stack([row_space(np.concatenate(v), dh, "query row space")
                                      for v in qv])
        self.key_bases_ = self._group_bases(kv, dh)

    def _group_bases(self, kv: list, dh: int) -> np.ndarray:
        """One key row space basis per key/value head (``head_groups_``), from the vectors
        ``kv`` every head of the group collected: the heads of a group read the same keys, so
        their forms share one set of key coordinates (and one form solve, :meth:`_read_forms`).
        Vectors of a group's heads that span more than dh dimensions are refused by name (the
        heads do not share their keys)."""
        bases = np.empty((len(kv), dh, kv[0][0].shape[1]))
        for g in np.unique(self.head_groups_):
            heads = np.flatnonzero(self.head_groups_ == g)
            bases[heads] = row_space(np.concatenate([u for h in heads for u in kv[h]]), dh,
                                     f"key row space of key/value head {g}")
        return bases

    def _form_equations(self, oracle, rng, d: int, probes, L: int, n_sets: int):
        """The form equations of ``n_sets`` key sets asked with every probe in queries of L
        tokens (the probe's copies the padding): the offsets (E, k) of the E rows read, and
        per head the keys' coordinates (E, k, e) and the probes' log-weights (P, E, k)."""
        H, r = self.query_bases_.shape[:2]
        k, e, n_probes = self._slots() - 1, r + 1, probes.shape[0]
        pos = (np.arange(k) if self.causal else
               np.concatenate([np.arange(k - k // 2), L - 1 - np.arange(k // 2)[::-1]]))
        pad = np.setdiff1d(np.arange(L), pos)
        nb = r + 1
        # rows at most k apart (every offset asked), and ROW_OVERSAMPLE equations per unknown
        used = min(pad.size, max(math.ceil(ROW_OVERSAMPLE * nb * e / (n_sets * k)),
                                 math.ceil(pad.size / k)))
        # the first padding rows see the keys at the short offsets, the rest spread evenly
        near = min(pad.size, NEAR_ROWS)
        rows = pad[np.unique(np.concatenate([
            np.arange(near), np.linspace(0, pad.size - 1, max(used - near, 2)).round()
        ]).astype(int))]
        keys = rng.standard_normal((n_sets, k, d)) / np.sqrt(d)

        def queries(lo, hi):  # query q: probe q // n_sets with key set q % n_sets
            q = np.arange(lo, hi)
            X = np.broadcast_to(probes[q // n_sets][:, None], (hi - lo, L, d)).copy()
            X[:, pos] = keys[q % n_sets]
            return X

        O = ask_blocks(oracle, n_probes * n_sets, queries, lambda O: O[:, rows])
        O = O - self.output_bias_
        offsets = np.tile((pos[None, :] - rows[:, None]).astype(np.float64), (n_sets, 1))
        kappas, ells, shared = [], [], {}
        for h in range(H):
            vals = np.concatenate([
                np.broadcast_to(keys @ self._values[h], (n_probes, n_sets, k, r)),
                (probes @ self._values[h])[:, None, None, :].repeat(n_sets, 1)], axis=2)
            a = head_weights(vals.reshape(n_probes * n_sets, k + 1, r), O @ self._reads[h],
                             "a layer of rotary heads as declared")[0][..., :k]
            ells.append(np.log(np.where(a > MIN_WEIGHT, a, np.nan)).reshape(n_probes, -1, k))
            g = self.head_groups_[h]
            if g not in shared:  # the heads of a key/value head share their key coordinates
                kappa = np.concatenate([keys @ self.key_bases_[h].T, np.ones((n_sets, k, 1))],
                                       2)
                shared[g] = np.repeat(kappa, rows.size, axis=0)
            kappas.append(shared[g])
        return offsets, kappas, ells
