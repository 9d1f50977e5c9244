"""The attention module of a checkpoint evaluated from its raw tensors, as a black box:
:class:`ModuleBlackBox` (a head or the whole layer, exact or in a served precision)."""

from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..models import check_input, softmax_last
from ..precision import Arithmetic, check_precision
from .checkpoints import cached_checkpoint
from .readout import _check_layer, readout_vector

__all__ = ["ModuleBlackBox"]


class ModuleBlackBox:
    """The attention module of a checkpoint, evaluated from its raw tensors, as a black box.

    ``f(X) = r^T (W_O concat_h(head_h) + b_O)`` at the last token of each input, with
    ``head_h = sum_i softmax_i((W_Q,h x_N + b_Q,h)^T (W_K,h x_i + b_K,h) / sqrt(d_h))
    (W_V,h x_i + b_V,h)``, computed as the framework computes it (queries, keys and values
    first, then the scaled dot products), not through :class:`AttentionHead`. With ``head``
    given, every other head is removed (its slice of the concatenation is zero), so the answer
    is one head read out by ``u_h``, plus ``r^T b_O``. Pass it to
    :class:`~attnquery.oracles.ValueOracle` with ``d`` to extract it.

    With ``outputs``, the box answers the module's output vectors themselves, with no readout:
    ``W_O concat_h(head_h) + b_O`` at every token, an array (B, N, d) (``"all"``, every token
    its own query; a GPT-2-style module is causal, ``causal`` True: token n attends to the
    tokens up to n), or at the last token, (B, d) (``"last"``). Pass it to
    :class:`~attnquery.oracles.VectorOracle` with the same ``outputs`` to extract it
    (:class:`~attnquery.learners.VectorLayerLearner`); :meth:`vector_layer` is the same module
    as a :class:`~attnquery.models.vector.VectorAttentionLayer`, the ground truth.

    Parameters
    ----------
    path : str or Path
        A BERT- or GPT-2-style ``.safetensors`` checkpoint (read once per process).
    layer : int
        The layer.
    head : int, optional
        One head; ``None`` (default) is the whole layer.
    n_heads : int, optional
        Heads per layer (default: from ``config.json`` beside the checkpoint).
    readout : {"gaussian", "ones", "coordinate"}, readout_seed : int
        The readout vector r (:func:`readout_vector`).
    biases : bool
        Keep the module's biases (default); ``False`` drops them all.
    precision : {"float64", "float32", "float16", "bfloat16"}
        Compute precision (served arithmetic, :mod:`attnquery.precision`). Not float64, the
        weights and biases are stored in the format, the inputs are rounded to it, and every
        operation is rounded to it as an engine computes the module: ``q = X_N W_Q^T`` then
        ``+ b_Q``, likewise k and the values, per head ``q . k`` then ``/ sqrt(d_h)``, the
        softmax, the attention-weighted values, the output projection ``W_O concat`` (the kept
        heads' columns) then ``+ b_O``, and the readout ``r^T out`` (a matrix product sums
        the format's values in float64 and rounds once, so that the answers do not depend on
        the BLAS kernel: :mod:`attnquery.precision`). The readout vector r is stored in the
        format too. ``"float64"`` (default) is the exact module, computed as before.
    outputs : {None, "all", "last"}
        ``None`` (default): one number per input, read out along r as above. ``"all"`` or
        ``"last"``: every token's output vector or the last token's, computed operation by
        operation as above (in float64 without rounding), every query token's scores at once.
    """

    def __init__(self, path, layer: int, head: int | None = None, *, n_heads: int | None = None,
                 readout: str = "gaussian", readout_seed: int = 0, biases: bool = True,
                 precision: str = "float64", outputs: str | None = None):
        if outputs not in (None, "all", "last"):
            raise ModelError(f"outputs must be None, 'all' or 'last'; got {outputs!r}")
        ckpt = cached_checkpoint(path, n_heads)
        self.r = readout_vector(ckpt.d, readout, readout_seed)
        w, _ = _check_layer(ckpt, layer, self.r, biases)
        if head is not None and not 0 <= head < ckpt.n_heads:
            raise ModelError(f"head must be in [0, {ckpt.n_heads}); got {head}")
        self.d, self.n_heads, self.d_head = ckpt.d, ckpt.n_heads, ckpt.d_head
        self.layer, self.head, self.biases = int(layer), head, bool(biases)
        self.causal = ckpt.style == "gpt2"  # a decoder's mask (no effect on the last token)
        heads = range(ckpt.n_heads) if head is None else [int(head)]
        cols = np.concatenate([np.arange(h * ckpt.d_head, (h + 1) * ckpt.d_head) for h in heads])
        zero = np.zeros(ckpt.d)

        def bias(name):
            return w[name] if biases and w[name] is not None else zero

        self._heads = list(heads)
        self._cols = cols
        self._wq, self._wk, self._wv = w["q"][cols], w["k"][cols], w["v"][cols]
        self._bq, self._bk, self._bv = bias("bq")[cols], bias("bk")[cols], bias("bv")[cols]
        self._ro = (w["o"].T @ self.r)[cols]  # r^T W_O on the kept slices
        self._rbo = float(self.r @ bias("bo"))
        self.precision = check_precision(precision)
        self.outputs = outputs
        self._w = w
        if self.precision != "float64" or outputs is not None:
            A = self._arith = Arithmetic(self.precision)
            # the key and value projections of the kept heads as one (kept + kept, d) matrix:
            # one float32 product per element either way, one matrix product per call
            self._s = {"wq": A.store(self._wq), "wkv": A.store(np.vstack([self._wk, self._wv])),
                       "bq": A.store(self._bq), "bk": A.store(self._bk), "bv": A.store(self._bv),
                       "wo": A.store(w["o"][:, cols]), "bo": A.store(bias("bo")),
                       "r": A.store(self.r), "scale": A.store(np.sqrt(ckpt.d_head))}

    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
        if self.outputs is not None:
            return self._vectors(X)
        if self.precision != "float64":
            return self._served(X)
        dh = self.d_head
        q = X[:, -1, :] @ self._wq.T + self._bq  # (B, kept)
        k = X @ self._wk.T + self._bk  # (B, N, kept)
        val = X @ self._wv.T + self._bv
        out = np.full(X.shape[0], self._rbo)
        for j in range(len(self._heads)):
            sl = slice(j * dh, (j + 1) * dh)
            s = np.einsum("bnk,bk->bn", k[..., sl], q[:, sl]) / np.sqrt(dh)
            out += np.einsum("bn,bnk,k->b", softmax_last(s), val[..., sl], self._ro[sl])
        return out

    def _served(self, X: np.ndarray) -> np.ndarray:
        """The module in ``self.precision``, operation by operation (see the class).

        Every element of every product is one dot product of the format's values summed in
        float64 and rounded once (:meth:`attnquery.precision.Arithmetic.matmul`); the
        projections are two-dimensional matrix products over every token at once
        (``(B N, d) x (d, kept)``) and the scores and weighted values of all kept heads one
        batched contraction each (:meth:`~attnquery.precision.Arithmetic.einsum`), not one small
        matrix product per input and head."""
        A, P = self._arith, self._s
        B, N, d = X.shape
        dh, H = self.d_head, len(self._heads)
        kept = H * dh
        Xs = A.store(X)
        q = A.add(A.matmul(Xs[:, -1, :], P["wq"].T), P["bq"]).reshape(B, H, dh)
        kv = A.matmul(Xs.reshape(B * N, d), P["wkv"].T)  # (B N, 2 kept)
        k = A.add(kv[:, :kept], P["bk"]).reshape(B, N, H, dh)
        val = A.add(kv[:, kept:], P["bv"]).reshape(B, N, H, dh)
        s = A.div(A.einsum("bnhk,bhk->bhn", k, q), P["scale"])  # (B, H, N)
        alpha = A.softmax(s)
        o = A.einsum("bhn,bnhk->bhk", alpha, val).reshape(B, kept)
        out = A.add(A.matmul(o, P["wo"].T), P["bo"])  # (B, d)
        return A.answers(A.matmul(out, P["r"]))

    def _vectors(self, X: np.ndarray) -> np.ndarray:
        """The output vectors (``outputs="all"`` or ``"last"``) in ``self.precision``: the
        operations of :meth:`_served` with every answered token a query and no readout."""
        A, P = self._arith, self._s
        B, N, d = X.shape
        dh, H = self.d_head, len(self._heads)
        kept = H * dh
        Xs = A.store(X)
        rows = Xs if self.outputs == "all" else Xs[:, -1:, :]
        M = rows.shape[1]
        q = A.add(A.matmul(rows.reshape(B * M, d), P["wq"].T), P["bq"]).reshape(B, M, H, dh)
        kv = A.matmul(Xs.reshape(B * N, d), P["wkv"].T)  # (B N, 2 kept)
        k = A.add(kv[:, :kept], P["bk"]).reshape(B, N, H, dh)
        val = A.add(kv[:, kept:], P["bv"]).reshape(B, N, H, dh)
        # batched matrix products over (B, H): scores (B, H, M, N), weighted values (B, H, M, dh)
        s = A.div(A.matmul(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1)), P["scale"])
        if self.causal and M > 1:  # token m sees the tokens n <= m
            s = np.where(np.arange(N)[None, :] > np.arange(M)[:, None], -np.inf, s)
        alpha = A.softmax(s)
        o = A.matmul(alpha, val.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3).reshape(B, M, kept)
        out = A.add(A.matmul(o, P["wo"].T), P["bo"])  # (B, M, d)
        return A.answers(out if self.outputs == "all" else out[:, 0])

    def vector_layer(self):
        """The module this box computes (its kept heads, its biases or none) as a float64
        :class:`~attnquery.models.vector.VectorAttentionLayer` answering ``self.outputs``
        (``"all"`` when the box reads out one number): the ground truth of a vector learner."""
        from ..models.vector import VectorAttentionLayer

        H, dh = len(self._heads), self.d_head
        bo = self._w["bo"] if self.biases and self._w["bo"] is not None else np.zeros(self.d)
        return VectorAttentionLayer(
            self._wq.reshape(H, dh, self.d), self._wk.reshape(H, dh, self.d),
            self._wv.reshape(H, dh, self.d), self._w["o"][:, self._cols],
            b_Q=self._bq.reshape(H, dh), b_K=self._bk.reshape(H, dh),
            b_V=self._bv.reshape(H, dh), b_O=bo, causal=self.causal,
            outputs=self.outputs or "all")
