"""Multi-head attention, :class:`MultiHeadAttention`: a sum of :class:`AttentionHead` s (paper
Sec. 7), the model of a whole attention layer read out along a vector (or a sum of
:class:`~attnquery.models.RotaryAttentionHead` s, a rotary layer read out)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ModelError
from ..precision import check_precision
from .heads import AttentionHead, check_input, run_starts, softmax_last
from .rotary import RotaryAttentionHead

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention:
    """Sum of single-head attentions, ``f(X) = sum_h alpha_h^T (X v_h) + beta`` (paper Sec. 7).

    Parameters
    ----------
    heads : sequence of AttentionHead or of RotaryAttentionHead
        The heads (each may carry its own key bias and offset). Rotary heads (a rotary layer
        read out, as :class:`~attnquery.learners.AttentionLayerLearner` recovers it with
        ``positions="rotary"``) are evaluated one by one, in float64 only.
    offset : float
        A constant added to every answer on top of the heads' own offsets (a layer's output
        bias read out, ``r^T b_O``). Default 0.
    precision : {"float64", "float32", "float16", "bfloat16"}
        Compute precision of ``__call__`` (:mod:`attnquery.precision`): every head is
        evaluated in it (as :class:`AttentionHead` with that precision), the heads' answers are
        added in order and the offset last, each addition rounded. Default ``"float64"``: the
        exact model of the heads' float64 parameters.
    """

    def __init__(self, heads: Sequence[AttentionHead], offset: float = 0.0,
                 precision: str = "float64"):
        heads = tuple(heads)
        if not heads:
            raise ModelError("a multi-head model needs at least one head")
        d = heads[0].d
        #: whether the heads are rotary heads (all of them; none otherwise)
        self.rotary = isinstance(heads[0], RotaryAttentionHead)
        kind = RotaryAttentionHead if self.rotary else AttentionHead
        if any(not isinstance(h, kind) or h.d != d for h in heads):
            raise ModelError("every head must be an AttentionHead of the same dimension d (or "
                             "every head a RotaryAttentionHead)")
        if not np.isfinite(offset):
            raise ModelError(f"offset must be finite; got {offset}")
        self.heads = heads
        self.offset = float(offset)
        self.precision = check_precision(precision)
        if self.rotary and self.precision != "float64":
            raise ModelError("a layer of rotary heads is evaluated in float64 only; got "
                             f"precision={precision!r}")
        if self.precision != "float64":
            self._served_heads = tuple(
                AttentionHead(h.v, W=h.W_dense, K=h.K, Q=h.Q, key_bias=h.key_bias,
                              offset=h.offset, precision=self.precision) for h in heads)

    @property
    def d(self) -> int:
        return self.heads[0].d

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    @property
    def total_offset(self) -> float:
        """The constant of the whole function: ``offset`` plus every head's offset."""
        return self.offset + sum(h.offset for h in self.heads)

    def __call__(self, X) -> np.ndarray:
        """``f(X)`` for a batch (B, N, d): every head at once.

        The query vectors ``W_h x_N + c_h`` are computed once per run of identical last tokens
        (as :class:`AttentionHead` does), for all heads together, in blocks of
        ``_BLOCK`` inputs.
        """
        X = check_input(X, self.d)
        if self.rotary:  # each head adds its own offset
            return sum(h(X) for h in self.heads) + self.offset
        if self.precision != "float64":
            return self._served(X)
        out = np.empty(X.shape[0])
        V = np.stack([h.v for h in self.heads])  # (H, d)
        for a in range(0, X.shape[0], _BLOCK):
            out[a:a + _BLOCK] = self._block(X[a:a + _BLOCK], V)
        return out + self.total_offset

    def _served(self, X: np.ndarray) -> np.ndarray:
        """The layer in ``self.precision``: the heads' answers added in order, then the
        offset, every sum rounded."""
        from ..precision import Arithmetic

        A = Arithmetic(self.precision)
        out = None
        for h in self._served_heads:
            y = A.store(h(X))  # already the format's values
            out = y if out is None else A.add(out, y)
        if self.offset:
            out = A.add(out, A.store(self.offset))
        return A.answers(out)

    def _block(self, X: np.ndarray, V: np.ndarray) -> np.ndarray:
        B = X.shape[0]
        last = X[:, -1, :]
        starts = run_starts(last)
        bounds = np.append(starts, B)
        # (U, H, d): every head's W_h x_N + c_h for each distinct run's last token
        A = np.stack([h.W_times(last[starts]) + h.key_bias for h in self.heads], axis=1)
        if 4 * starts.size <= B:
            scores = np.empty((B, len(self.heads), X.shape[1]))
            for u in range(starts.size):
                lo, hi = bounds[u], bounds[u + 1]
                scores[lo:hi] = np.einsum("bnd,hd->bhn", X[lo:hi], A[u])
        else:
            A = np.repeat(A, np.diff(bounds), axis=0)
            scores = np.einsum("bnd,bhd->bhn", X, A)
        values = np.einsum("bnd,hd->bhn", X, V)
        return np.einsum("bhn,bhn->b", softmax_last(scores), values)


#: inputs evaluated at once by :class:`MultiHeadAttention`
_BLOCK = 4096
