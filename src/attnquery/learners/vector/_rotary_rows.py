"""The form equations of
:class:`~attnquery.learners.vector.rotary_layer.RotaryLayerVectorLearner` on every token's
outputs (stage 4 of :mod:`attnquery.learners.vector.rotary_layer`): the padding rows of
queries that hold a few fixed keys, each a query of the probe token that sees the keys at its
own offsets, read as equations linear in the probe's forms. :class:`FormEquationsMixin` holds
the method; the learner inherits it.
"""

from __future__ import annotations

import math

import numpy as np

from ._attention import MIN_WEIGHT
from ._rotary_reads import ask_blocks, head_weights, row_space

__all__ = ["FormEquationsMixin", "ROW_OVERSAMPLE", "NEAR_ROWS"]

#: form equations per unknown of one probe (the padding rows used are spread evenly)
ROW_OVERSAMPLE = 8
#: padding rows right after the keys all used (the short offsets), beyond ROW_OVERSAMPLE's
NEAR_ROWS = 32


class FormEquationsMixin:
    """The form equations of a rotary layer read from every token's outputs (the learner's
    ``_form_equations``, over its ``query_bases_``, ``key_bases_``, value reads and slots),
    and the key bases they share per key/value head (``_group_bases``)."""

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
