"""Vector-output attention layers: every token's output vector, as a served module returns it.

The models of :mod:`attnquery.models` answer one number per sequence. A served attention module
answers an output vector per token; :class:`VectorAttentionLayer` is such a module, with H query
heads and G key/value heads (grouped-query attention, G dividing H), biases, an optional causal
mask, rotary positions and logit soft-capping::

    s_{h,n,i} = scale (W_Q[h] x_n + b_Q[h])^T (W_K[g] x_i + b_K[g])     (rotated, capped, masked)
    o_{h,n} = sum_i softmax(s_{h,n})_i (W_V[g] x_i + b_V[g])             (g = h // (H / G))
    out_n = W_O [o_{1,n}; ...; o_{H,n}] + b_O

for every token n (``outputs="all"``, shape (B, N, d_out)) or the last one only
(``outputs="last"``, shape (B, d_out)). Wrap one in :class:`attnquery.oracles.VectorOracle`.

Without positions and soft-capping, head h's logit of key x_i for query x_n is
``x_i^T W_h x_n + x_i^T c_h`` plus terms constant in i (which the softmax cancels), and the layer
is ``out_n = sum_h sum_i a_{h,n,i} x_i^T V_h + beta``: :meth:`VectorAttentionLayer.head_W`,
:meth:`~VectorAttentionLayer.key_bias`, :meth:`~VectorAttentionLayer.value_maps` and
:attr:`~VectorAttentionLayer.output_bias` give W_h, c_h, V_h and beta, the quantities
:class:`attnquery.learners.VectorLayerLearner` recovers. :func:`bilinear_layer` builds the layer
back from them.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..precision import Arithmetic, check_precision
from ..rng import as_rng
from .generators import _check_scales, _draw_gqa_biases, _draw_gqa_weights, _gqa_heads
from .heads import check_input, softmax_last
from .rotary import _GroupedLayer, _rotary_frequencies_arg, rotate_half

__all__ = ["VectorAttentionLayer", "RotaryFormLayer", "bilinear_layer", "rms_norm",
           "random_vector_layer", "OUTPUTS"]

#: what a layer answers: every token's output vector, or the last token's
OUTPUTS = ("all", "last")
#: score entries (batch x heads x rows x keys) evaluated at once: bounds the memory of long
#: sequences (4096 tokens of 12 heads are evaluated a few rows at a time)
_BLOCK_ENTRIES = 1 << 22


def _blocks(B: int, M: int, per_row: int):
    """(batch slice, row slice) pairs covering B queries of M rows, each block holding at most
    about ``_BLOCK_ENTRIES`` score entries (``per_row`` entries per row of one query)."""
    rows = max(1, _BLOCK_ENTRIES // max(1, per_row))
    if rows >= M:
        step = max(1, rows // M)
        return [(slice(b, min(b + step, B)), slice(0, M)) for b in range(0, B, step)]
    return [(slice(b, b + 1), slice(r, min(r + rows, M)))
            for b in range(B) for r in range(0, M, rows)]


class VectorAttentionLayer(_GroupedLayer):
    """A self-attention layer that answers output vectors (see the module's docstring).

    Parameters
    ----------
    W_Q : array_like (H, dh, d)
    W_K : array_like (G, dh, d)
    W_V : array_like (G, dv, d)
    W_O : array_like (d_out, H dv)
        Head h's output columns are ``W_O[:, h dv:(h + 1) dv]``.
    b_Q : array_like (H, dh), optional
    b_K : array_like (G, dh), optional
    b_V : array_like (G, dv), optional
    b_O : array_like (d_out,), optional
        Biases (default 0).
    causal : bool
        Token n attends to tokens i <= n only (a decoder's mask).
    outputs : {"all", "last"}
        Answer every token's output (B, N, d_out) or the last token's (B, d_out).
    scale : float, optional
        Logit scale; default ``1 / sqrt(dh)``.
    softcap : float, optional
        Logits ``s`` become ``softcap * tanh(s / softcap)`` (Gemma 2); default none.
    rope_base, frequencies, rotary_dim : optional
        Rotary positions (as :class:`attnquery.models.RotaryAttentionHead`): token n's query and
        key vectors are rotated by position n. Default: no positions.
    precision : {"float64", "float32", "float16", "bfloat16"}
        Compute precision of ``__call__`` (:mod:`attnquery.precision`): weights and inputs
        stored in the format, every product, sum and softmax rounded to it.

    Attributes
    ----------
    d, n_heads, n_kv_heads, head_dim : int
        Token dimension, H, G and dh, read off the weights.
    """

    def __init__(self, W_Q, W_K, W_V, W_O, *, b_Q=None, b_K=None, b_V=None, b_O=None,
                 causal: bool = False, outputs: str = "all", scale=None, softcap=None,
                 rope_base=None, frequencies=None, rotary_dim=None,
                 precision: str = "float64"):
        W_Q, W_K, W_V, W_O = (np.asarray(a, dtype=np.float64) for a in (W_Q, W_K, W_V, W_O))
        if W_Q.ndim != 3 or W_K.ndim != 3 or W_V.ndim != 3 or W_O.ndim != 2:
            raise ModelError("W_Q, W_K and W_V must have shapes (H, dh, d), (G, dh, d) and "
                             f"(G, dv, d), W_O (d_out, H dv); got {W_Q.shape}, {W_K.shape}, "
                             f"{W_V.shape} and {W_O.shape}")
        H, dh, d = W_Q.shape
        G, dv = W_K.shape[0], W_V.shape[1]
        if W_K.shape != (G, dh, d) or W_V.shape != (G, dv, d) or G < 1 or H % G:
            raise ModelError(f"W_K must have shape (G, {dh}, {d}) and W_V (G, dv, {d}) with G "
                             f"dividing H = {H}; got {W_K.shape} and {W_V.shape}")
        if W_O.shape[1] != H * dv:
            raise ModelError(f"W_O must have H dv = {H * dv} columns; got shape {W_O.shape}")
        if not all(np.all(np.isfinite(a)) for a in (W_Q, W_K, W_V, W_O)):
            raise ModelError("model parameters must be finite")
        if not isinstance(causal, bool | np.bool_):
            raise ModelError(f"causal must be True or False; got {causal!r}")
        if outputs not in OUTPUTS:
            raise ModelError(f"outputs must be one of {OUTPUTS}; got {outputs!r}")
        self.W_Q, self.W_K, self.W_V, self.W_O = W_Q, W_K, W_V, W_O
        self._init_grouped(b_Q, b_K, b_V, b_O, scale)
        self.causal = bool(causal)
        self.outputs = outputs
        if softcap is not None and not (np.isfinite(softcap) and softcap > 0):
            raise ModelError(f"softcap must be a positive number or None; got {softcap!r}")
        self.softcap = None if softcap is None else float(softcap)
        rotary = rope_base is not None or frequencies is not None
        self.frequencies = (_rotary_frequencies_arg(frequencies, rope_base, rotary_dim, dh)
                            if rotary else np.zeros(0))
        self.precision = check_precision(precision)

    # -- shape ---------------------------------------------------------------------------------
    @property
    def d_out(self) -> int:
        """Output dimension."""
        return self.W_O.shape[0]

    @property
    def rotary(self) -> bool:
        """Whether the layer has rotary positions."""
        return self.frequencies.size > 0

    # -- the quantities a learner recovers --------------------------------------------------------
    def _bilinear(self, what: str) -> None:
        if self.rotary or self.softcap is not None:
            raise ModelError(f"{what} is defined for layers without rotary positions and "
                             "soft-capping (their logits are not bilinear in the tokens)")

    def head_W(self) -> np.ndarray:
        """Every head's score matrix ``W_h = scale W_K[g]^T W_Q[h]``, shape (H, d, d): the logit
        of key x_i for query x_n is ``x_i^T W_h x_n + x_i^T c_h`` plus terms constant in i."""
        self._bilinear("head_W")
        return self.scale * np.einsum("hed,hef->hdf", self.W_K[self.groups], self.W_Q)

    def key_bias(self) -> np.ndarray:
        """Every head's ``c_h = scale W_K[g]^T b_Q[h]``, shape (H, d)."""
        self._bilinear("key_bias")
        return self.scale * np.einsum("hed,he->hd", self.W_K[self.groups], self.b_Q)

    def value_maps(self) -> np.ndarray:
        """Every head's value-output map ``V_h = W_V[g]^T W_O[:, h]^T``, shape (H, d, d_out)."""
        H, dv = self.n_heads, self.W_V.shape[1]
        Oh = self.W_O.T.reshape(H, dv, self.d_out)
        return np.einsum("hed,hek->hdk", self.W_V[self.groups], Oh)

    @property
    def output_bias(self) -> np.ndarray:
        """``beta = W_O [b_V[g(1)]; ...; b_V[g(H)]] + b_O``, shape (d_out,): added to every
        output (the attention weights of a head sum to one)."""
        return self.W_O @ self.b_V[self.groups].ravel() + self.b_O

    def M(self, delta: int, head: int = 0) -> np.ndarray:
        """Head ``head``'s form at the relative offset ``delta`` (key position minus query
        position), shape (d+1, d+1): ``scale [W_K, b_K]^T Rot(-delta) [W_Q, b_Q]``, so the logit
        of key x_i for query x_n is ``[x_i; 1]^T M_(i-n) [x_n; 1]`` (the same at every offset
        without positions: ``[[W_h, c_h], ...]``)."""
        if self.softcap is not None:
            raise ModelError("M is defined for layers without soft-capping (capped logits are "
                             "no bilinear form)")
        g = self.groups[head]
        Q = np.concatenate([self.W_Q[head], self.b_Q[head][:, None]], axis=1)  # (dh, d+1)
        K = np.concatenate([self.W_K[g], self.b_K[g][:, None]], axis=1)
        RQ = rotate_half(Q.T, np.full(Q.shape[1], -float(delta)), self.frequencies)
        return self.scale * (K.T @ RQ.T)

    # -- evaluation --------------------------------------------------------------------------------
    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
        A = Arithmetic(self.precision)
        B, N, d = X.shape
        H, dh, G = self.n_heads, self.head_dim, self.n_kv_heads
        dv = self.W_V.shape[1]
        Xs = A.store(X)
        W_Q, W_K, W_V, W_O = (A.store(a) for a in (self.W_Q, self.W_K, self.W_V, self.W_O))
        pos = np.arange(N, dtype=np.float64)
        # keys and values of every token, per key/value head: (B, G, N, dh) and (B, G, N, dv)
        k = A.add(A.matmul(Xs, W_K.reshape(G * dh, d).T).reshape(B, N, G, dh)
                  .transpose(0, 2, 1, 3), A.store(self.b_K)[:, None, :])
        vals = A.add(A.matmul(Xs, W_V.reshape(G * dv, d).T).reshape(B, N, G, dv)
                     .transpose(0, 2, 1, 3), A.store(self.b_V)[:, None, :])
        if self.rotary:
            k = A.rnd(rotate_half(k, pos, self.frequencies))
        rows = np.arange(N) if self.outputs == "all" else np.array([N - 1])
        M = rows.size
        heads = np.empty((B, M, H * dv), dtype=A.compute)
        for bs, rs in _blocks(B, M, H * N):
            q = A.add(A.matmul(Xs[bs][:, rows[rs]], W_Q.reshape(H * dh, d).T)
                      .reshape(-1, rows[rs].size, H, dh).transpose(0, 2, 1, 3),
                      A.store(self.b_Q)[:, None, :])  # (b, H, m, dh)
            if self.rotary:
                q = A.rnd(rotate_half(q, pos[rows[rs]], self.frequencies))
            s = A.mul(A.matmul(q, k[bs][:, self.groups].swapaxes(2, 3)), self.scale)
            if self.softcap is not None:
                s = A.mul(A.rnd(np.tanh(A.div(s, self.softcap))), self.softcap)
            if self.causal:
                s = np.where(pos[None, :] > rows[rs][:, None], -np.inf, s)
            o = A.matmul(A.softmax(s), vals[bs][:, self.groups]).transpose(0, 2, 1, 3)
            heads[bs, rs] = o.reshape(o.shape[0], o.shape[1], H * dv)
        out = A.add(A.matmul(heads, W_O.T), A.store(self.b_O))
        return A.answers(out if self.outputs == "all" else out[:, 0])


class RotaryFormLayer:
    """A layer of rotary heads given by their bilinear forms, as the rotary vector learners
    recover it (:class:`~attnquery.learners.vector.rotary_layer.RotaryLayerVectorLearner`,
    :class:`~attnquery.learners.vector.rotary.RotaryVectorLearner`): head h's logit of key x_i
    (position i) for query x_n (position n) is ``kappa_i^T F_h(i - n) zeta_n`` with
    ``kappa = [Bk_h x_i; 1]``, ``zeta = [Bq_h x_n; 1]`` and

        F_h(delta) = sum_j cos(theta_j delta) P_hj + sin(theta_j delta) S_hj + C_h

    (up to terms constant over the keys, which the softmax cancels), and token n's output is
    ``sum_h sum_i a_{h,n,i} x_i^T V_h + beta``.

    Parameters
    ----------
    V : array_like (H, d, d_out)
        Value-output maps.
    output_bias : array_like (d_out,)
        beta.
    frequencies : array_like (R/2,)
        theta_j.
    cos_forms, sin_forms : array_like (H, R/2, r+1, r+1)
        P_hj and S_hj in the bases' coordinates.
    const_form : array_like (H, r+1, r+1)
        C_h.
    query_bases, key_bases : array_like (H, r, d), optional
        Bq_h and Bk_h (default the identity: the forms are over ``[x; 1]``, r = d).
    head_groups : array_like (H,), optional
        The key/value head each head reads (default one each); a description, not used to
        evaluate.
    causal : bool
        Token n attends to tokens i <= n only.
    outputs : {"all", "last"}
        Answer every token's output (B, N, d_out) or the last token's (B, d_out).
    norm_eps : float, optional
        A layer read through its input norm (``input_norm="rms"`` of the rotary layer route):
        the tokens reach the forms and values as ``x / sqrt(mean(x^2) + norm_eps) /
        norm_scale`` (the norm's gain is folded into the forms and V). None (default): as
        they are.
    norm_scale : float
        The folded tokens' scale (with ``norm_eps``; default 1).
    residual : bool
        Add each answered token's input to its output (the attention half of a decoder layer,
        ``x + attn(norm(x))``; needs ``d_out = d``).
    """

    #: the arrays that define the layer (the names of its attributes and of a layer file's
    #: members, :func:`attnquery.realheads.load_vector_layer`)
    FIELDS = ("V", "output_bias", "frequencies", "cos_forms", "sin_forms", "const_form",
              "query_bases", "key_bases", "head_groups")
    #: what a layer read through its norm adds (a file's members where set)
    NORM_FIELDS = ("norm_eps", "norm_scale", "residual")

    def __init__(self, V, output_bias, frequencies, cos_forms, sin_forms, const_form, *,
                 query_bases=None, key_bases=None, head_groups=None, causal: bool = True,
                 outputs: str = "all", norm_eps=None, norm_scale=1.0, residual=False):
        V, beta, theta, P, S, C = (np.asarray(a, dtype=np.float64) for a in (
            V, output_bias, frequencies, cos_forms, sin_forms, const_form))
        if V.ndim != 3 or C.ndim != 3 or C.shape[0] != V.shape[0] or C.shape[1] != C.shape[2]:
            raise ModelError(f"V must have shape (H, d, d_out) and const_form (H, r+1, r+1); "
                             f"got {V.shape} and {C.shape}")
        H, d, d_out = V.shape
        r = C.shape[1] - 1
        eye = np.broadcast_to(np.eye(d), (H, d, d))
        Bq = eye if query_bases is None else np.asarray(query_bases, dtype=np.float64)
        Bk = eye if key_bases is None else np.asarray(key_bases, dtype=np.float64)
        groups = np.arange(H) if head_groups is None else np.asarray(head_groups)
        want = {"output_bias": (beta, (d_out,)), "frequencies": (theta, (theta.size,)),
                "cos_forms": (P, (H, theta.size, r + 1, r + 1)),
                "sin_forms": (S, (H, theta.size, r + 1, r + 1)),
                "query_bases": (Bq, (H, r, d)), "key_bases": (Bk, (H, r, d)),
                "head_groups": (groups, (H,))}
        bad = [f"{k} {a.shape} (expected {shape})" for k, (a, shape) in want.items()
               if a.shape != shape]
        if bad:
            raise ModelError(f"the arrays of a layer of {H} rotary head(s) of dimension d = {d} "
                             f"(forms of {r + 1} coordinates) do not fit: {'; '.join(bad)}")
        if not all(np.all(np.isfinite(a)) for a in (V, beta, theta, P, S, C, Bq, Bk)):
            raise ModelError("model parameters must be finite")
        if not np.issubdtype(groups.dtype, np.integer):
            raise ModelError(f"head_groups must be integers; got {groups.dtype}")
        if not isinstance(causal, bool | np.bool_):
            raise ModelError(f"causal must be True or False; got {causal!r}")
        if outputs not in OUTPUTS:
            raise ModelError(f"outputs must be one of {OUTPUTS}; got {outputs!r}")
        self.V, self.output_bias, self.frequencies = V, beta, theta
        self.cos_forms, self.sin_forms, self.const_form = P, S, C
        self.query_bases, self.key_bases, self.head_groups = Bq, Bk, groups
        self.causal, self.outputs = bool(causal), outputs
        if norm_eps is not None and not (np.isfinite(norm_eps) and float(norm_eps) > 0):
            raise ModelError(f"norm_eps must be a positive number or None; got {norm_eps!r}")
        if not (np.isfinite(norm_scale) and float(norm_scale) > 0):
            raise ModelError(f"norm_scale must be a positive number; got {norm_scale!r}")
        if bool(residual) and d_out != d:
            raise ModelError(f"a residual needs d_out = d; the layer maps {d} to {d_out}")
        self.norm_eps = None if norm_eps is None else float(norm_eps)
        self.norm_scale, self.residual = float(norm_scale), bool(residual)

    def norm_arrays(self) -> dict:
        """The :data:`NORM_FIELDS` of a layer read through its norm or with a residual (what a
        layer file adds), else {}."""
        if self.norm_eps is None and not self.residual:
            return {}
        return {"norm_eps": np.asarray(np.nan if self.norm_eps is None else self.norm_eps),
                "norm_scale": np.asarray(self.norm_scale),
                "residual": np.asarray(float(self.residual))}

    @property
    def d(self) -> int:
        """Token dimension."""
        return self.V.shape[1]

    @property
    def d_out(self) -> int:
        """Output dimension."""
        return self.V.shape[2]

    @property
    def n_heads(self) -> int:
        return self.V.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return int(np.unique(self.head_groups).size)

    rotary = True

    def value_maps(self) -> np.ndarray:
        """Every head's value-output map V_h, shape (H, d, d_out)."""
        return self.V

    def M(self, delta: int, head: int = 0) -> np.ndarray:
        """Head ``head``'s form at the relative offset ``delta`` (key position minus query
        position), shape (d+1, d+1): the logit of key x_i for query x_n is
        ``[x_i; 1]^T M [x_n; 1]`` up to terms constant over the keys."""
        a = float(delta) * self.frequencies
        F = (np.tensordot(np.cos(a), self.cos_forms[head], 1)
             + np.tensordot(np.sin(a), self.sin_forms[head], 1) + self.const_form[head])

        def lift(B):  # [x; 1] -> [B x; 1]
            return np.block([[B, np.zeros((B.shape[0], 1))],
                             [np.zeros((1, B.shape[1])), np.ones((1, 1))]])

        return lift(self.key_bases[head]).T @ F @ lift(self.query_bases[head])

    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
        out = self._attention(X if self.norm_eps is None else
                              rms_norm(X, 1.0, self.norm_eps) / self.norm_scale)
        if self.residual:
            out = out + (X if self.outputs == "all" else X[:, -1])
        return out

    def _attention(self, X: np.ndarray) -> np.ndarray:
        B, N, _ = X.shape
        a = np.arange(N, dtype=np.float64)[:, None] * self.frequencies
        c, s = np.cos(a)[None, :, :, None], np.sin(a)[None, :, :, None]
        rows = np.arange(N) if self.outputs == "all" else np.array([N - 1])
        M, e = rows.size, self.const_form.shape[1]
        ones = np.ones((B, N, 1))
        out = np.broadcast_to(self.output_bias, (B, M, self.d_out)).copy()
        for h in range(self.n_heads):
            kap = np.concatenate([X @ self.key_bases[h].T, ones], axis=2)
            zet = np.concatenate([X[:, rows] @ self.query_bases[h].T, ones[:, rows]], axis=2)
            # P_j zeta and S_j zeta of every row: (B, M, R/2, e)
            PZ, SZ = ((zet @ F.transpose(2, 0, 1).reshape(e, -1)).reshape(B, M, -1, e)
                      for F in (self.cos_forms[h], self.sin_forms[h]))
            cq, sq = c[:, rows], s[:, rows]
            Kj = kap[:, :, None, :]
            # cos(t(i-n)) = c_i c_n + s_i s_n, sin(t(i-n)) = s_i c_n - c_i s_n
            kf = np.concatenate([(c * Kj).reshape(B, N, -1), (s * Kj).reshape(B, N, -1), kap],
                                axis=2)
            qf = np.concatenate([(cq * PZ - sq * SZ).reshape(B, M, -1),
                                 (sq * PZ + cq * SZ).reshape(B, M, -1),
                                 zet @ self.const_form[h].T], axis=2)
            vals = X @ self.V[h]
            for bs, rs in _blocks(B, M, N):  # the logits a few rows at a time
                logits = qf[bs, rs] @ kf[bs].swapaxes(1, 2)  # (b, m rows, N keys)
                if self.causal:
                    logits[:, np.arange(N)[None, :] > rows[rs][:, None]] = -np.inf
                out[bs, rs] += softmax_last(logits) @ vals[bs]
        return out if self.outputs == "all" else out[:, 0]


def rms_norm(X, gain, eps: float) -> np.ndarray:
    """``gain * x / sqrt(mean(x^2) + eps)`` over the last axis (Llama's RMSNorm; with gain 1,
    divided by ``norm_scale``, the tokens a :class:`RotaryFormLayer` read through its norm
    reads)."""
    X = np.asarray(X, dtype=np.float64)
    return np.asarray(gain) * X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + eps)


def bilinear_layer(W, key_bias, V, output_bias, *, causal: bool = False,
                   outputs: str = "all") -> VectorAttentionLayer:
    """The layer with score matrices ``W`` (H, d, d), key biases ``key_bias`` (H, d),
    value-output maps ``V`` (H, d, d_out) and output offset ``output_bias`` (d_out,): head h's
    logit of key x_i for query x_n is ``x_i^T (W_h x_n + c_h)``, and token n's output is
    ``sum_h sum_i a_{h,n,i} x_i^T V_h + beta``.

    It is a :class:`VectorAttentionLayer` with ``W_Q = W``, ``b_Q = c``, one identity key map
    shared by every head, identity value maps, ``W_O = [V_1^T, ..., V_H^T]`` and scale 1.
    """
    W = np.asarray(W, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64)
    if W.ndim != 3 or W.shape[1] != W.shape[2] or V.ndim != 3 or V.shape[:2] != W.shape[:2]:
        raise ModelError(f"W must have shape (H, d, d) and V (H, d, d_out); got {W.shape} and "
                         f"{V.shape}")
    H, d, _ = W.shape
    eye = np.eye(d)[None]
    return VectorAttentionLayer(W, eye, eye, np.concatenate(list(V), axis=0).T, b_Q=key_bias,
                                b_O=output_bias, causal=causal, outputs=outputs, scale=1.0)


def random_vector_layer(d: int, n_heads: int, seed=None, *, n_kv_heads: int | None = None,
                        head_dim: int | None = None, d_out: int | None = None,
                        key_dim: int | None = None, bias: float = 0.0,
                        logit_scale: float = 1.0, causal: bool = False,
                        outputs: str = "all", **options) -> VectorAttentionLayer:
    """Draw a random :class:`VectorAttentionLayer`.

    ``W_Q`` and ``W_K`` have i.i.d. ``N(0, logit_scale)`` entries, so a logit between two tokens
    of norm 1 has standard deviation about ``logit_scale``; ``W_V`` has ``N(0, 1 / d)`` and
    ``W_O`` ``N(0, 1 / (H dv))`` entries, so outputs have about the tokens' norm.

    Parameters
    ----------
    d, n_heads : int
        Token dimension and number H of query heads.
    seed : int, sequence of ints or Generator
    n_kv_heads : int, optional
        Number G of key/value heads (dividing H); default H.
    head_dim : int, optional
        dh = dv; default ``d // n_heads``.
    d_out : int, optional
        Output dimension; default d.
    key_dim : int, optional
        Rows of each head's ``W_Q`` and ``W_K`` when they differ from dh (default dh):
        ``key_dim = d`` draws heads of full-rank W with value maps of rank dh, the generic
        family of :mod:`attnquery.experiments.multihead_generic` with vector values.
    bias : float
        Standard deviation of every bias entry (query, key, value and output); 0 (the default)
        draws none.
    logit_scale : float
    causal, outputs, **options
        Passed to :class:`VectorAttentionLayer` (``softcap``, ``rope_base``, ``precision``, ...).
    """
    rng = as_rng(seed)
    H, G = _gqa_heads(n_heads, n_kv_heads)
    dh = d // H if head_dim is None else int(head_dim)
    dout = d if d_out is None else int(d_out)
    dk = dh if key_dim is None else int(key_dim)
    if dh < 1 or dout < 1 or dk < 1:
        raise ModelError(f"head_dim, d_out and key_dim must be >= 1; got {dh}, {dout} and {dk}")
    _check_scales(logit_scale, bias)
    W_Q, W_K, W_V, W_O = _draw_gqa_weights(rng, H, G, dh, d, dout, logit_scale, dk)
    b = _draw_gqa_biases(rng, H, G, dh, dout, bias, dk)
    return VectorAttentionLayer(W_Q, W_K, W_V, W_O, causal=causal, outputs=outputs, **b,
                                **options)
