"""Rotary grouped-query layers from Llama- and Qwen2-layout checkpoints (beyond the paper).

A checkpoint folder holds ``model.safetensors`` and ``config.json`` in the layout of the
Hugging Face Llama and Qwen2 models: per layer L, the tensors
``model.layers.L.self_attn.{q,k,v,o}_proj.weight`` (q: ``(H d_h, d)``, k and v: ``(G d_h, d)``,
o: ``(d, H d_h)``) and, for Qwen2, the biases ``{q,k,v}_proj.bias``; the configuration gives
``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` (default
``hidden_size / num_attention_heads``), ``rope_theta`` (default 10,000) and
``partial_rotary_factor`` (default 1). These checkpoints store the query and key rows in the
"rotate half" order, so the layer is :class:`attnquery.models.RotaryAttentionLayer` read out
along a vector (:func:`attnquery.realheads.readout_vector`). Tensors are read with
:func:`safetensors.numpy.load_file` (nothing is unpickled) and converted to float64.

:func:`write_rotary_checkpoint` writes a small seeded checkpoint of that layout (float32, as
real ones are) for the tests and the study.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..models import RotaryAttentionLayer
from ..rng import as_rng

__all__ = ["write_rotary_checkpoint", "load_rotary_layer", "load_rotary_head", "PREFIX"]

#: key prefix of the attention tensors of layer L
PREFIX = "model.layers.{layer}.self_attn."


def write_rotary_checkpoint(folder, *, n_layers: int = 1, d: int = 64, n_heads: int = 4,
                            n_kv_heads: int = 2, head_dim: int | None = None,
                            rope_theta: float = 1e6, biases: bool = True,
                            seed=0) -> Path:
    """Write a seeded Llama/Qwen2-layout checkpoint (``model.safetensors``, ``config.json``).

    Weights are i.i.d. Gaussian, with standard deviation ``4 / sqrt(d)`` for q and k (a score of
    two unit tokens has standard deviation about ``16 / d``) and ``1 / sqrt(d)`` for v and o;
    biases (``biases=True``, Qwen2: q, k, v) have standard deviation 0.5.
    Returns the path of ``model.safetensors``.
    """
    from safetensors.numpy import save_file

    rng = as_rng(seed)
    H, G = int(n_heads), int(n_kv_heads)
    if H < 1 or G < 1 or H % G:
        raise ModelError(f"n_kv_heads must divide n_heads; got {n_heads}, {n_kv_heads}")
    dh = d // H if head_dim is None else int(head_dim)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for L in range(int(n_layers)):
        p = PREFIX.format(layer=L)
        shapes = {"q": H * dh, "k": G * dh, "v": G * dh}
        for name, rows in shapes.items():
            sd = (4.0 if name in "qk" else 1.0) / np.sqrt(d)
            tensors[f"{p}{name}_proj.weight"] = rng.standard_normal((rows, d)) * sd
            if biases:
                tensors[f"{p}{name}_proj.bias"] = 0.5 * rng.standard_normal(rows)
        tensors[f"{p}o_proj.weight"] = rng.standard_normal((d, H * dh)) / np.sqrt(H * dh)
    save_file({k: np.ascontiguousarray(val, dtype=np.float32) for k, val in tensors.items()},
              str(folder / "model.safetensors"))
    config = {"architectures": ["Qwen2ForCausalLM" if biases else "LlamaForCausalLM"],
              "hidden_size": d, "num_attention_heads": H, "num_key_value_heads": G,
              "head_dim": dh, "rope_theta": float(rope_theta), "num_hidden_layers": n_layers}
    (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    return folder / "model.safetensors"


def _config(path: Path) -> dict:
    cfg_path = path.with_name("config.json")
    if not cfg_path.exists():
        raise ModelError(f"{path}: no config.json beside it (hidden_size, num_attention_heads, "
                         "num_key_value_heads, rope_theta)")
    cfg = json.loads(cfg_path.read_text())
    for key in ("hidden_size", "num_attention_heads"):
        if key not in cfg:
            raise ModelError(f"{cfg_path} has no {key!r}")
    return cfg


def load_rotary_layer(path, layer: int, readout=None, readout_seed: int = 0
                      ) -> RotaryAttentionLayer:
    """Attention layer ``layer`` of a Llama/Qwen2-layout checkpoint, read out along a vector.

    Parameters
    ----------
    path : path of ``model.safetensors`` (``config.json`` beside it)
    layer : int
    readout : array_like (d,) or str, optional
        The readout vector, or a kind for :func:`attnquery.realheads.readout_vector`
        (default ``"gaussian"`` with ``readout_seed``).
    """
    from safetensors.numpy import load_file

    from .readout import readout_vector

    path = Path(path)
    if not path.exists():
        raise ModelError(f"checkpoint {path} does not exist")
    cfg = _config(path)
    d, H = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    G = int(cfg.get("num_key_value_heads", H))
    dh = int(cfg.get("head_dim") or d // H)
    R = int(round(dh * float(cfg.get("partial_rotary_factor", 1.0))))
    tensors = load_file(str(path))
    p = PREFIX.format(layer=int(layer))

    def get(name, shape, required=True):
        key = p + name
        if key not in tensors:
            if required:
                raise ModelError(f"{path}: no tensor {key!r} (layer {layer})")
            return None
        a = np.asarray(tensors[key], dtype=np.float64)
        if a.shape != shape:
            raise ModelError(f"{path}: {key} has shape {a.shape}; the config says {shape}")
        return a

    W_Q = get("q_proj.weight", (H * dh, d)).reshape(H, dh, d)
    W_K = get("k_proj.weight", (G * dh, d)).reshape(G, dh, d)
    W_V = get("v_proj.weight", (G * dh, d)).reshape(G, dh, d)
    W_O = get("o_proj.weight", (d, H * dh))
    b = {}
    for name, rows, heads in (("q", H * dh, H), ("k", G * dh, G), ("v", G * dh, G)):
        val = get(f"{name}_proj.bias", (rows,), required=False)
        if val is not None:
            b[f"b_{name.upper()}"] = val.reshape(heads, dh)
    o_bias = get("o_proj.bias", (d,), required=False)
    if o_bias is not None:
        b["b_O"] = o_bias
    if readout is None or isinstance(readout, str):
        r = readout_vector(d, readout or "gaussian", readout_seed)
    else:
        r = np.asarray(readout, dtype=np.float64)
    return RotaryAttentionLayer(W_Q, W_K, W_V, W_O, r, rope_base=float(cfg.get("rope_theta",
                                                                                1e4)),
                                rotary_dim=R, **b)


def load_rotary_head(path, layer: int, head: int, readout=None, readout_seed: int = 0):
    """Query head ``head`` of :func:`load_rotary_layer` as a
    :class:`~attnquery.models.RotaryAttentionHead` (its value vector read out along the layer's
    readout, its offset the value bias's share ``o_h^T b_V``)."""
    L = load_rotary_layer(path, layer, readout, readout_seed)
    if not 0 <= head < L.n_heads:
        raise ModelError(f"head must be in [0, {L.n_heads}); got {head}")
    from ..models import RotaryAttentionHead

    g = L.groups[head]
    dh = L.head_dim
    o_r = L.W_O[:, head * dh:(head + 1) * dh].T @ L.readout
    return RotaryAttentionHead(L.W_Q[head], L.W_K[g], L.values[head],
                               frequencies=L.frequencies, b_Q=L.b_Q[head], b_K=L.b_K[g],
                               offset=float(o_r @ L.b_V[g]), scale=L.scale)
