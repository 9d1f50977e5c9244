"""Boxes of a Llama-architecture decoder layer's attention (beyond the paper), float64.

For layer L of a :class:`~attnquery.realheads.gguf_files.LlamaCheckpoint`:

* :func:`attention_module` is the attention module ``self_attn`` (Hugging Face's name): the
  normalized hidden states in, every token's outputs (or the last token's) out, causal, with
  the checkpoint's RoPE base and grouped-query attention::

      q_{h,n} = Rot(n) W_Q[h] x_n,  k_{g,i} = Rot(i) W_K[g] x_i,  v_{g,i} = W_V[g] x_i
      out_n = W_O concat_h( sum_{i <= n} softmax_i(q_{h,n} . k_{g(h),i} / sqrt(dh)) v_{g(h),i} )

  (``Rot`` rotate-half RoPE, ``g(h) = h // (H / G)``), a
  :class:`~attnquery.models.vector.VectorAttentionLayer`;
* :func:`attention_half` is the attention half of the decoder layer,
  ``x -> x + self_attn(RMSNorm(x))`` with ``RMSNorm(x) = gain * x / sqrt(mean(x^2) + eps)``
  (the checkpoint's gain ``attn_norm`` and eps), a :class:`NormedResidualAttention`.

Both are callables ``(B, N, d) -> (B, N, d)`` (or ``(B, d)`` for the last token's outputs) to
wrap in :class:`~attnquery.oracles.VectorOracle`.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..models import check_input
from ..models.vector import OUTPUTS, VectorAttentionLayer, rms_norm

__all__ = ["attention_module", "attention_half", "NormedResidualAttention", "rms_norm"]


def _layer_arrays(ckpt, layer: int) -> dict:
    if not hasattr(ckpt, "layer"):
        raise ModelError(f"ckpt must be a LlamaCheckpoint (attnquery.realheads.load_gguf); got "
                         f"{type(ckpt).__name__}")
    return ckpt.layer(int(layer))


def attention_module(ckpt, layer: int, outputs: str = "all") -> VectorAttentionLayer:
    """Layer ``layer``'s attention module (see the module's docstring), float64.

    Parameters
    ----------
    ckpt : LlamaCheckpoint
        From :func:`~attnquery.realheads.load_gguf` (rows of W_Q and W_K in rotate-half order).
    layer : int
    outputs : {"all", "last"}
        Every token's outputs (B, N, d) or the last token's (B, d).
    """
    w = _layer_arrays(ckpt, layer)
    H, G, dh, d = ckpt.n_heads, ckpt.n_kv_heads, ckpt.head_dim, ckpt.d
    return VectorAttentionLayer(
        w["q"].reshape(H, dh, d), w["k"].reshape(G, dh, d), w["v"].reshape(G, dh, d), w["o"],
        causal=True, outputs=outputs, rope_base=ckpt.rope_base)


class NormedResidualAttention:
    """The attention half of a decoder layer: ``x -> x + module(RMSNorm(x))``.

    Parameters
    ----------
    module : VectorAttentionLayer
        The attention module, answering every token's outputs (its ``outputs`` is what this
        box answers too: for ``"last"`` the last token's ``x_N + module(RMSNorm(X))``).
    gain : array_like (d,)
        The RMSNorm's gain.
    eps : float
        The RMSNorm's eps (> 0).
    """

    def __init__(self, module: VectorAttentionLayer, gain, eps: float):
        gain = np.asarray(gain, dtype=np.float64)
        if gain.shape != (module.d,) or not np.all(np.isfinite(gain)):
            raise ModelError(f"gain must be a finite vector of shape ({module.d},); got "
                             f"{gain.shape}")
        if not (np.isfinite(eps) and eps > 0):
            raise ModelError(f"eps must be a positive number; got {eps!r}")
        if module.d_out != module.d:
            raise ModelError(f"a residual needs d_out = d; the module maps {module.d} to "
                             f"{module.d_out}")
        if module.outputs not in OUTPUTS:
            raise ModelError(f"the module's outputs must be one of {OUTPUTS}")
        self.module, self.gain, self.eps = module, gain, float(eps)

    @property
    def d(self) -> int:
        """Token dimension."""
        return self.module.d

    @property
    def outputs(self) -> str:
        """``"all"`` or ``"last"``, as the module's."""
        return self.module.outputs

    def folded(self, scale: float = 1.0) -> VectorAttentionLayer:
        """The attention module with the gain folded into its input maps, ``W diag(gain)
        scale``: what a fit through the norm recovers (the gauge), on tokens
        ``x / sqrt(mean(x^2) + eps) / scale`` (``norm_scale_`` of the fit)."""
        m, g = self.module, self.gain * float(scale)
        return VectorAttentionLayer(m.W_Q * g, m.W_K * g, m.W_V * g, m.W_O, b_Q=m.b_Q,
                                    b_K=m.b_K, b_V=m.b_V, b_O=m.b_O, causal=m.causal,
                                    outputs=m.outputs, scale=m.scale, softcap=m.softcap,
                                    frequencies=m.frequencies if m.rotary else None,
                                    precision=m.precision)

    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
        out = self.module(rms_norm(X, self.gain, self.eps))
        return out + (X if self.outputs == "all" else X[:, -1])


def attention_half(ckpt, layer: int, outputs: str = "all") -> NormedResidualAttention:
    """The attention half of decoder layer ``layer``, ``x -> x + self_attn(RMSNorm(x))``, with
    the checkpoint's gain and eps (see the module's docstring), float64."""
    w = _layer_arrays(ckpt, layer)
    return NormedResidualAttention(attention_module(ckpt, layer, outputs), w["attn_norm"],
                                   ckpt.rms_eps)
