"""Heads and layers of a checkpoint read out along a fixed vector ``r``
(:func:`readout_vector`): :func:`build_head` and :func:`build_layer` give the models of
:mod:`attnquery.models` (the conventions are in :mod:`attnquery.realheads`), and
:func:`head_summary` the scale facts a learner's assumptions refer to.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..models import AttentionHead, MultiHeadAttention
from .checkpoints import Checkpoint, cached_checkpoint

__all__ = [
    "READOUTS",
    "readout_vector",
    "build_head",
    "build_layer",
    "head_from_checkpoint",
    "layer_from_checkpoint",
    "head_summary",
]

#: readout choices: a seeded Gaussian unit vector, the normalised all-ones vector, or a coordinate
READOUTS = ("gaussian", "ones", "coordinate")


def readout_vector(d: int, readout: str = "gaussian", seed: int = 0) -> np.ndarray:
    """The fixed readout vector ``r`` (unit norm).

    Parameters
    ----------
    d : int
        Model width.
    readout : {"gaussian", "ones", "coordinate"}
        "gaussian": a standard Gaussian vector drawn from ``default_rng(seed)``, normalised;
        "ones": ``1 / sqrt(d)`` in every entry; "coordinate": the basis vector ``e_seed``.
    seed : int
        Seed of the Gaussian readout, or the coordinate's index.
    """
    if readout == "gaussian":
        r = np.random.default_rng(seed).standard_normal(d)
        return r / np.linalg.norm(r)
    if readout == "ones":
        return np.full(d, 1.0 / np.sqrt(d))
    if readout == "coordinate":
        if not 0 <= int(seed) < d:
            raise ModelError(f"the readout coordinate must be in [0, {d}); got {seed}")
        r = np.zeros(d)
        r[int(seed)] = 1.0
        return r
    raise ModelError(f"readout must be one of {READOUTS}; got {readout!r}")


def _check_layer(ckpt: Checkpoint, layer: int, r, biases: bool):
    if not 0 <= layer < ckpt.n_layers:
        raise ModelError(f"layer must be in [0, {ckpt.n_layers}); got {layer}")
    r = np.asarray(r, dtype=np.float64)
    if r.shape != (ckpt.d,):
        raise ModelError(f"the readout vector must have shape ({ckpt.d},); got {r.shape}")
    w = ckpt.layers[layer]
    if biases:
        missing = [n for n in ("bq", "bv", "bo") if w[n] is None]
        if missing:
            raise ModelError(f"{ckpt.path}: layer {layer} has no {', '.join(missing)} bias; "
                             "build the head with biases=False")
    return w, r


def _head(ckpt: Checkpoint, w: dict, head: int, r: np.ndarray, biases: bool,
          output_bias: bool) -> AttentionHead:
    if not 0 <= head < ckpt.n_heads:
        raise ModelError(f"head must be in [0, {ckpt.n_heads}); got {head}")
    dh = ckpt.d_head
    rows = slice(head * dh, (head + 1) * dh)
    scale = dh**-0.25
    K = w["k"][rows] * scale
    Q = w["q"][rows] * scale
    u = (w["o"].T @ r)[rows]
    v = w["v"][rows].T @ u
    if not biases:
        return AttentionHead(v, K=K, Q=Q)
    c = K.T @ (w["bq"][rows] * scale)
    beta = float(u @ w["bv"][rows]) + (float(r @ w["bo"]) if output_bias else 0.0)
    return AttentionHead(v, K=K, Q=Q, key_bias=c, offset=beta)


def build_head(ckpt: Checkpoint, layer: int, head: int, r: np.ndarray,
               biases: bool = False) -> AttentionHead:
    """Head ``head`` of layer ``layer`` as an :class:`AttentionHead` with factors K, Q.

    ``W = W_K,h^T W_Q,h / sqrt(d_h) = K^T Q`` with ``K = W_K,h / d_h^(1/4)``,
    ``Q = W_Q,h / d_h^(1/4)``; ``v = W_V,h^T u_h`` with ``u_h = (W_O^T r)[h d_h:(h + 1) d_h]``.
    With ``biases``, also the key bias ``c = W_K,h^T b_Q,h / sqrt(d_h)`` and the offset
    ``beta = u_h^T b_V,h + r^T b_O``: the answer is then that of the layer read out along r
    with every other head removed.
    """
    w, r = _check_layer(ckpt, layer, r, biases)
    return _head(ckpt, w, head, r, biases, output_bias=True)


def build_layer(ckpt: Checkpoint, layer: int, r: np.ndarray,
                biases: bool = True) -> MultiHeadAttention:
    """The whole attention layer ``layer`` read out along r, as a :class:`MultiHeadAttention`.

    ``f(X) = r^T (W_O concat_h(head_h(X)) + b_O)`` at the last token: the sum of the
    :func:`build_head` heads (each with ``c_h`` and its value-bias offset ``u_h^T b_V,h``) and
    the output bias ``r^T b_O`` once, as the model's own offset.
    """
    w, r = _check_layer(ckpt, layer, r, biases)
    heads = [_head(ckpt, w, h, r, biases, output_bias=False) for h in range(ckpt.n_heads)]
    return MultiHeadAttention(heads, offset=float(r @ w["bo"]) if biases else 0.0)


def head_from_checkpoint(path, layer: int, head: int, *, n_heads: int | None = None,
                         readout: str = "gaussian", readout_seed: int = 0,
                         biases: bool = False) -> AttentionHead:
    """Read a checkpoint (cached per process) and build one head; see :func:`build_head`."""
    ckpt = cached_checkpoint(path, n_heads)
    return build_head(ckpt, layer, head, readout_vector(ckpt.d, readout, readout_seed),
                      biases=biases)


def layer_from_checkpoint(path, layer: int, *, n_heads: int | None = None,
                          readout: str = "gaussian", readout_seed: int = 0,
                          biases: bool = True) -> MultiHeadAttention:
    """Read a checkpoint (cached per process) and build one layer; see :func:`build_layer`."""
    ckpt = cached_checkpoint(path, n_heads)
    return build_layer(ckpt, layer, readout_vector(ckpt.d, readout, readout_seed),
                       biases=biases)


def head_summary(head: AttentionHead) -> dict:
    """Scale facts about a head that the learners' assumptions refer to."""
    W = head.W
    av = np.abs(head.v)
    return {
        "d": head.d,
        "rank": int(head.K.shape[0]) if head.is_lowrank else int(np.linalg.matrix_rank(W)),
        "W_fro": float(np.linalg.norm(W)),
        "W_spectral": float(np.linalg.norm(W, 2)),
        "v_norm": float(np.linalg.norm(head.v)),
        "min_abs_v": float(av.min()),
        "max_abs_v": float(av.max()),
    }
