"""Rotary positions (RoPE) and grouped-query attention (beyond the paper).

The paper's head ignores token positions. The heads of Llama, Qwen and Mistral rotate queries
and keys by their positions ("rotate half" convention of the GPT-NeoX and Llama code) and share
keys and values between groups of query heads (grouped-query attention):
:class:`RotaryAttentionHead` is one such head and :class:`RotaryAttentionLayer` a whole layer
read out along a vector. These models are separate from the paper's and change none of them;
their seeded generators are :func:`attnquery.models.random_rotary_head` and
:func:`attnquery.models.random_rotary_layer`.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..precision import check_precision
from .heads import check_input, softmax_last

__all__ = ["RotaryAttentionHead", "RotaryAttentionLayer", "rope_frequencies", "rotate_half"]


def rope_frequencies(rotary_dim: int, rope_base: float) -> np.ndarray:
    """The rotary frequencies ``theta_j = rope_base^(-2 j / R)``, ``j < R / 2`` (R = rotary_dim).

    Parameters
    ----------
    rotary_dim : int
        The number R of rotated dimensions of a head vector (even, >= 2).
    rope_base : float
        The base (10,000 in Llama 2, 500,000 in Llama 3, 1,000,000 in Qwen2); > 1.
    """
    if isinstance(rotary_dim, bool) or int(rotary_dim) != rotary_dim or rotary_dim < 2 \
            or rotary_dim % 2:
        raise ModelError(f"rotary_dim must be an even integer >= 2; got {rotary_dim!r}")
    if not (np.isfinite(rope_base) and rope_base > 1.0):
        raise ModelError(f"rope_base must be a finite number > 1; got {rope_base!r}")
    R = int(rotary_dim)
    return float(rope_base) ** (-np.arange(0, R, 2, dtype=np.float64) / R)


def rotate_half(Z: np.ndarray, positions: np.ndarray, frequencies: np.ndarray) -> np.ndarray:
    """Rotate head vectors by their positions, "rotate half" convention (GPT-NeoX, Llama).

    With ``R = 2 len(frequencies)``, the dimensions ``(j, j + R/2)`` of every vector are rotated
    by the angle ``p theta_j`` at position ``p``::

        z'_j = z_j cos(p theta_j) - z_{j+R/2} sin(p theta_j)
        z'_{j+R/2} = z_{j+R/2} cos(p theta_j) + z_j sin(p theta_j)

    and the dimensions from R on are left as they are (partial rotary).

    Parameters
    ----------
    Z : ndarray (..., n, dh)
        Head vectors; the axis before last is the one the positions run along.
    positions : ndarray (n,)
        The position of each vector along that axis.
    frequencies : ndarray (R/2,)

    Returns
    -------
    ndarray, same shape as Z
    """
    half = frequencies.size
    if half == 0:
        return Z
    ang = np.asarray(positions, dtype=np.float64)[:, None] * frequencies[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    a, b = Z[..., :half], Z[..., half:2 * half]
    out = np.empty(Z.shape)
    out[..., :half] = a * cos - b * sin
    out[..., half:2 * half] = b * cos + a * sin
    out[..., 2 * half:] = Z[..., 2 * half:]
    return out


def _rotary_frequencies_arg(frequencies, rope_base, rotary_dim, head_dim: int) -> np.ndarray:
    """The frequencies of a rotary model from either ``frequencies`` or ``rope_base``."""
    if frequencies is not None:
        if rope_base is not None:
            raise ModelError("give either frequencies or rope_base, not both")
        th = np.atleast_1d(np.asarray(frequencies, dtype=np.float64))
        if th.ndim != 1 or not np.all(np.isfinite(th)):
            raise ModelError("frequencies must be a finite vector")
        if rotary_dim is not None and 2 * th.size != rotary_dim:
            raise ModelError(f"rotary_dim={rotary_dim} needs {rotary_dim // 2} frequencies; "
                             f"got {th.size}")
    else:
        if rope_base is None:
            raise ModelError("a rotary model needs rope_base or frequencies")
        th = rope_frequencies(head_dim if rotary_dim is None else rotary_dim, rope_base)
    if 2 * th.size > head_dim:
        raise ModelError(f"rotary_dim = {2 * th.size} exceeds the head dimension {head_dim}")
    return th


def _vec_or_zeros(b, n: int, name: str) -> np.ndarray:
    if b is None:
        return np.zeros(n)
    b = np.asarray(b, dtype=np.float64)
    if b.shape != (n,) or not np.all(np.isfinite(b)):
        raise ModelError(f"{name} must be a finite vector of shape ({n},); got {b.shape}")
    return b


class _GroupedLayer:
    """What a layer of H query heads and G key/value heads (grouped-query attention, G dividing
    H) reads from its weights ``W_Q`` (H, dh, d), ``W_K`` (G, dh, d), ``W_V`` (G, dv, d) and
    ``W_O`` (d_out, H dv): its shape, biases, scale and groups. :class:`RotaryAttentionLayer`
    and :class:`attnquery.models.vector.VectorAttentionLayer` share it."""

    def _init_grouped(self, b_Q, b_K, b_V, b_O, scale) -> None:
        """Set the biases (each zero when None, else finite with its shape), the logit scale
        (default ``1 / sqrt(dh)``) and ``groups`` (query head h reads key/value head
        ``h // (H / G)``); the weights are set and checked."""
        H, dh, _ = self.W_Q.shape
        G, dv = self.W_K.shape[0], self.W_V.shape[1]
        self.b_Q = _bias_or_zeros(b_Q, (H, dh), "b_Q")
        self.b_K = _bias_or_zeros(b_K, (G, dh), "b_K")
        self.b_V = _bias_or_zeros(b_V, (G, dv), "b_V")
        self.b_O = _bias_or_zeros(b_O, (self.W_O.shape[0],), "b_O")
        self.scale = 1.0 / np.sqrt(dh) if scale is None else float(scale)
        self.groups = np.arange(H) // (H // G)

    @property
    def d(self) -> int:
        """Token dimension."""
        return self.W_Q.shape[2]

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.W_K.shape[0]

    @property
    def head_dim(self) -> int:
        return self.W_Q.shape[1]


def _bias_or_zeros(b, shape: tuple, name: str) -> np.ndarray:
    if b is None:
        return np.zeros(shape)
    b = np.asarray(b, dtype=np.float64)
    if b.shape != shape or not np.all(np.isfinite(b)):
        raise ModelError(f"{name} must be finite with shape {shape}; got {b.shape}")
    return b


#: entries of the (batch x tokens x head_dim) key arrays of one block of a rotary evaluation
_ROTARY_BLOCK_ENTRIES = 2**22


class RotaryAttentionHead:
    """One attention head with rotary positions (RoPE, "rotate half") and Qwen-style biases.

    Positions are ``0..N-1`` and the query token is the last, ``x_N`` at position ``N - 1``::

        q = W_Q x_N + b_Q,   k_i = W_K x_i + b_K,
        s_i = scale (Rot_{N-1} q)^T (Rot_{i-1} k_i),
        f(X) = sum_i softmax(s)_i v^T x_i + offset,

    (tokens numbered from 1, positions from 0), where ``Rot_p`` rotates the dimension pairs
    ``(j, j + R/2)`` by ``p theta_j`` (:func:`rotate_half`) and ``scale = 1 / sqrt(head_dim)``.
    A head read out along a vector u with value weights ``W_V`` and bias ``b_V`` is the case
    ``v = W_V^T u`` and ``offset = u^T b_V``. Since ``Rot_a^T Rot_b = Rot_{b-a}``, the score
    depends on the positions only through the offset ``delta = i - N`` (<= 0):
    ``s_i = x_i^T M_delta x_N`` + bias terms, with one bilinear form per offset,
    ``M_delta = scale W_K^T Rot_{-delta} W_Q`` (:meth:`M`).

    The head is stored as its factors ``W_Q, W_K`` (head_dim x d) and evaluated from them in
    O(N d head_dim) per sequence; no d x d matrix is formed unless :meth:`M` is asked for.

    Parameters
    ----------
    W_Q, W_K : array_like (head_dim, d)
        Query and key weights.
    v : array_like (d,)
        Value vector (value weights read out).
    frequencies : array_like (R/2,), optional
        The rotary frequencies ``theta_j`` of the dimension pairs ``(j, j + R/2)``.
    rope_base : float, optional
        Instead of ``frequencies``: ``theta_j = rope_base^(-2j/R)`` (:func:`rope_frequencies`).
    rotary_dim : int, optional
        R, the rotated dimensions (the first R of each head vector); default head_dim.
    b_Q, b_K : array_like (head_dim,), optional
        Query and key biases (Qwen2); default 0.
    offset : float
        Constant added to every answer (the value bias read out); default 0.
    scale : float, optional
        Score scale; default ``1 / sqrt(head_dim)``.
    precision : {"float64", "float32", "float16", "bfloat16"}
        Compute precision of ``__call__`` (served arithmetic, :mod:`attnquery.precision`), as
        :class:`AttentionHead`'s: the weights, biases, v, the scale and the cos/sin tables
        (``cos(p theta_j)``, computed in float64, as an engine's precomputed cache) are stored
        in the format, and every operation (projections, bias adds, the rotation's products
        and sums, the scores, their scaling, the softmax, the values, their weighted sum, the
        offset) is rounded to it. ``"float64"`` (default) is the exact model, bit-identical to
        one built without ``precision``; :meth:`scores`, :meth:`attention` and :meth:`M` are
        always the float64 model's.
    """

    def __init__(self, W_Q, W_K, v, *, frequencies=None, rope_base=None, rotary_dim=None,
                 b_Q=None, b_K=None, offset=0.0, scale=None, precision: str = "float64"):
        W_Q = np.atleast_2d(np.asarray(W_Q, dtype=np.float64))
        W_K = np.atleast_2d(np.asarray(W_K, dtype=np.float64))
        v = np.asarray(v, dtype=np.float64)
        if v.ndim != 1 or v.size < 1:
            raise ModelError(f"v must be a non-empty vector; got shape {v.shape}")
        d = v.size
        if W_Q.shape != W_K.shape or W_Q.shape[1] != d or W_Q.ndim != 2:
            raise ModelError(f"W_Q and W_K must both have shape (head_dim, {d}); got "
                             f"{W_Q.shape} and {W_K.shape}")
        dh = W_Q.shape[0]
        if not all(np.all(np.isfinite(a)) for a in (W_Q, W_K, v)):
            raise ModelError("model parameters must be finite")
        self.frequencies = _rotary_frequencies_arg(frequencies, rope_base, rotary_dim, dh)
        self.W_Q, self.W_K, self.v = W_Q, W_K, v
        self.b_Q = _vec_or_zeros(b_Q, dh, "b_Q")
        self.b_K = _vec_or_zeros(b_K, dh, "b_K")
        if not np.isfinite(offset):
            raise ModelError(f"offset must be finite; got {offset}")
        self.offset = float(offset)
        self.scale = 1.0 / np.sqrt(dh) if scale is None else float(scale)
        if not np.isfinite(self.scale):
            raise ModelError(f"scale must be finite; got {scale}")
        self.precision = check_precision(precision)

    @property
    def d(self) -> int:
        """Token dimension."""
        return self.v.size

    @property
    def head_dim(self) -> int:
        return self.W_Q.shape[0]

    @property
    def rotary_dim(self) -> int:
        """R, the number of rotated dimensions."""
        return 2 * self.frequencies.size

    @property
    def has_bias(self) -> bool:
        return bool(self.offset != 0.0 or np.any(self.b_Q) or np.any(self.b_K))

    def M(self, delta: int) -> np.ndarray:
        """The bilinear form ``M_delta`` (d x d) of the relative offset ``delta = i - N <= 0``:
        the score of token i is ``x_i^T M_delta x_N`` plus the bias terms."""
        RQ = rotate_half(self.W_Q.T, np.full(self.d, -float(delta)), self.frequencies)
        return self.scale * (self.W_K.T @ RQ.T)

    def scores(self, X) -> np.ndarray:
        """Attention scores ``s_i``, shape (B, N)."""
        X = check_input(X, self.d)
        return np.concatenate([_rotary_scores(X[sl], self.W_Q, self.b_Q, self.W_K, self.b_K,
                                              self.frequencies, self.scale)[:, 0]
                               for sl in _rotary_blocks(X.shape, self.head_dim)], axis=0)

    def attention(self, X) -> np.ndarray:
        """Attention weights ``softmax(s)``, shape (B, N)."""
        return softmax_last(self.scores(X))

    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
        out = np.empty(X.shape[0])
        served = self.precision != "float64"
        for sl in _rotary_blocks(X.shape, self.head_dim):
            if served:
                out[sl] = self._served(X[sl])
                continue
            s = _rotary_scores(X[sl], self.W_Q, self.b_Q, self.W_K, self.b_K,
                               self.frequencies, self.scale)[:, 0]
            out[sl] = np.einsum("bn,bn->b", softmax_last(s), X[sl] @ self.v)
        return out if served else out + self.offset

    def _served(self, X: np.ndarray) -> np.ndarray:
        """The forward pass of a block in ``self.precision`` (:mod:`attnquery.precision`)."""
        from ..precision import Arithmetic

        A = Arithmetic(self.precision)
        P = getattr(self, "_served_cache", None)
        if P is None:
            P = {k: A.store(getattr(self, k)) for k in ("W_Q", "W_K", "v", "b_Q", "b_K")}
            P["scale"], P["offset"] = A.store(self.scale), A.store(self.offset)
            self._served_cache = P
        B, N, _ = X.shape
        ang = np.arange(N, dtype=np.float64)[:, None] * self.frequencies[None, :]
        cos, sin = A.store(np.cos(ang)), A.store(np.sin(ang))  # (N, R/2)
        Xs = A.store(X)

        def rot(Z, c, s):  # rotate_half, every product and sum rounded
            half = c.shape[-1]
            a, b = Z[..., :half], Z[..., half:2 * half]
            out = Z.copy()
            out[..., :half] = A.add(A.mul(a, c), -A.mul(b, s))
            out[..., half:2 * half] = A.add(A.mul(b, c), A.mul(a, s))
            return out

        q = A.matmul(Xs[:, -1, :], P["W_Q"].T)  # (B, dh)
        k = A.matmul(Xs, P["W_K"].T)  # (B, N, dh)
        if np.any(self.b_Q):
            q = A.add(q, P["b_Q"])
        if np.any(self.b_K):
            k = A.add(k, P["b_K"])
        q, k = rot(q, cos[-1], sin[-1]), rot(k, cos, sin)
        s = A.mul(A.matmul(k, q[:, :, None])[..., 0], P["scale"])
        alpha = A.softmax(s)
        out = A.matmul(alpha[:, None, :], A.matmul(Xs, P["v"])[:, :, None])[:, 0, 0]
        if self.offset:
            out = A.add(out, P["offset"])
        return A.answers(out)


def _rotary_blocks(shape, width: int):
    """Slices of a batch (B, N, d) small enough for the key arrays of one evaluation block."""
    B, N = shape[0], shape[1]
    step = max(1, _ROTARY_BLOCK_ENTRIES // max(1, N * width))
    return [slice(a, min(a + step, B)) for a in range(0, B, step)]


def _rotary_scores(X, W_Q, b_Q, W_K, b_K, frequencies, scale, groups=None) -> np.ndarray:
    """Scores of rotary heads on a validated batch X (B, N, d): shape (B, H, N).

    ``W_Q`` (H, dh, d) or (dh, d), ``W_K`` (G, dh, d) or (dh, d); query head h reads key head
    ``groups[h]`` (default: h, with G = H).
    """
    W_Q = W_Q[None] if W_Q.ndim == 2 else W_Q
    W_K = W_K[None] if W_K.ndim == 2 else W_K
    b_Q = b_Q[None] if b_Q.ndim == 1 else b_Q
    b_K = b_K[None] if b_K.ndim == 1 else b_K
    B, N, _ = X.shape
    pos = np.arange(N, dtype=np.float64)
    H, dh, d = W_Q.shape
    G = W_K.shape[0]
    # projections as BLAS products: (B, d) x (d, H dh) and (B N, d) x (d, G dh)
    q = (X[:, -1, :] @ W_Q.reshape(H * dh, d).T).reshape(B, H, dh) + b_Q  # (B, H, dh)
    q = rotate_half(q, np.full(H, N - 1.0), frequencies)
    k = (X.reshape(B * N, d) @ W_K.reshape(G * dh, d).T).reshape(B, N, G, dh)
    k = rotate_half(k.transpose(0, 2, 1, 3) + b_K[:, None, :], pos, frequencies)  # (B,G,N,dh)
    if groups is None:
        groups = np.arange(W_Q.shape[0])
    return scale * np.einsum("bhne,bhe->bhn", k[:, groups], q)


class RotaryAttentionLayer(_GroupedLayer):
    """A self-attention layer with rotary positions and grouped-query attention, read out.

    H query heads and G key/value heads (G divides H; G = H is multi-head attention, G = 1
    multi-query attention); query head h reads key/value head ``h // (H / G)``::

        s_{h,i} = scale (Rot_{N-1} (W_Q[h] x_N + b_Q[h]))^T (Rot_{i-1} (W_K[g] x_i + b_K[g])),
        o_h = sum_i softmax(s_h)_i (W_V[g] x_i + b_V[g]),
        f(X) = r^T (W_O [o_1; ...; o_H] + b_O),

    so ``f`` is a sum of :class:`RotaryAttentionHead` s (:meth:`heads`) with value vectors
    ``v_h = W_V[g]^T W_O[:, h]^T r`` (``W_O[:, h]`` the columns of head h) and one offset.
    Evaluated from the factors: O(N d dh (H + G)) per sequence.

    Parameters
    ----------
    W_Q : array_like (H, dh, d)
    W_K, W_V : array_like (G, dh, d)
    W_O : array_like (d, H dh)
    readout : array_like (d,)
        The vector r that reads the layer's output out as one number.
    frequencies, rope_base, rotary_dim, scale
        As in :class:`RotaryAttentionHead` (shared by every head).
    b_Q : array_like (H, dh), optional
    b_K, b_V : array_like (G, dh), optional
    b_O : array_like (d,), optional
        Biases (default 0).

    Attributes
    ----------
    d, n_heads, n_kv_heads, head_dim : int
        Token dimension, H, G and dh, read off the weights.
    """

    def __init__(self, W_Q, W_K, W_V, W_O, readout, *, frequencies=None, rope_base=None,
                 rotary_dim=None, b_Q=None, b_K=None, b_V=None, b_O=None, scale=None):
        W_Q = np.asarray(W_Q, dtype=np.float64)
        W_K = np.asarray(W_K, dtype=np.float64)
        W_V = np.asarray(W_V, dtype=np.float64)
        W_O = np.asarray(W_O, dtype=np.float64)
        r = np.asarray(readout, dtype=np.float64)
        if W_Q.ndim != 3 or W_K.ndim != 3 or W_K.shape != W_V.shape:
            raise ModelError("W_Q must have shape (H, dh, d) and W_K, W_V the shape (G, dh, d)")
        H, dh, d = W_Q.shape
        G = W_K.shape[0]
        if W_K.shape[1:] != (dh, d) or G < 1 or H % G:
            raise ModelError(f"W_K must have shape (G, {dh}, {d}) with G dividing H = {H}; "
                             f"got {W_K.shape}")
        if W_O.shape != (d, H * dh) or r.shape != (d,):
            raise ModelError(f"W_O must have shape ({d}, {H * dh}) and readout ({d},); got "
                             f"{W_O.shape} and {r.shape}")
        if not all(np.all(np.isfinite(a)) for a in (W_Q, W_K, W_V, W_O, r)):
            raise ModelError("model parameters must be finite")

        self.frequencies = _rotary_frequencies_arg(frequencies, rope_base, rotary_dim, dh)
        self.W_Q, self.W_K, self.W_V, self.W_O, self.readout = W_Q, W_K, W_V, W_O, r
        self._init_grouped(b_Q, b_K, b_V, b_O, scale)
        # value vectors and offset read out along r
        Or = (W_O.T @ r).reshape(H, dh)  # (H, dh): W_O[:, h]^T r
        self.values = np.einsum("he,hed->hd", Or, W_V[self.groups])
        self.offset = float(np.einsum("he,he->", Or, self.b_V[self.groups]) + r @ self.b_O)

    @property
    def rotary_dim(self) -> int:
        return 2 * self.frequencies.size

    def heads(self) -> list[RotaryAttentionHead]:
        """The layer as H single rotary heads (the offset carried by the first)."""
        return [RotaryAttentionHead(self.W_Q[h], self.W_K[g], self.values[h],
                                    frequencies=self.frequencies, b_Q=self.b_Q[h],
                                    b_K=self.b_K[g], offset=self.offset if h == 0 else 0.0,
                                    scale=self.scale)
                for h, g in enumerate(self.groups)]

    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
        out = np.empty(X.shape[0])
        for sl in _rotary_blocks(X.shape, self.head_dim * (self.n_heads + self.n_kv_heads)):
            s = _rotary_scores(X[sl], self.W_Q, self.b_Q, self.W_K, self.b_K, self.frequencies,
                               self.scale, self.groups)  # (B, H, N)
            vals = np.einsum("bnd,hd->bhn", X[sl], self.values)
            out[sl] = np.einsum("bhn,bhn->b", softmax_last(s), vals)
        return out + self.offset
