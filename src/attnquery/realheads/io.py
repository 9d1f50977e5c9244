"""Head and layer files: :func:`save_head`, :func:`load_head`, :func:`save_layer` and
:func:`load_layer` write and read ``.npz`` archives of plain arrays (written atomically, read
with ``allow_pickle=False``); :func:`load_vector_layer` reads the vector layers ``attnquery
extract --answers ... --out`` writes."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..files import special_file_kind
from ..models import AttentionHead, MultiHeadAttention, RotaryAttentionHead

__all__ = ["save_head", "load_head", "save_layer", "load_layer", "save_vector_layer",
           "load_vector_layer"]


def _save_arrays(path, arrays: dict, meta: dict) -> None:
    """Write ``arrays`` and the metadata ``meta`` (as ``meta_<key>``) to an .npz, atomically."""
    arrays = dict(arrays)
    for k, val in meta.items():
        if not isinstance(val, str | int | float | np.integer | np.floating):
            raise ModelError(f"metadata {k!r} must be a string or a number; got {type(val)}")
        arrays[f"meta_{k}"] = np.asarray(val)
    from ..results import atomic_path

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


def check_input_file(p: Path, name: str, folder: str) -> None:
    """ModelError ``"{name} {p} ..."`` when the input file ``p`` does not exist, is a folder
    (the message then says ``folder``) or is not a regular file (reading a FIFO would block)."""
    if not p.exists():
        raise ModelError(f"{name} {p} does not exist")
    if p.is_dir():
        raise ModelError(f"{name} {p} {folder}")
    kind = special_file_kind(p)
    if kind is not None:
        raise ModelError(f"{name} {p} is not a regular file (it is {kind})")


def _load_arrays(path, what: str, key: str = "v") -> tuple[dict, dict]:
    """The numeric arrays and the metadata of an .npz written by :func:`_save_arrays` (or of a
    vector layer's file), which must hold the array ``key``."""
    p = Path(path)
    check_input_file(p, f"{what} file", "is a folder")
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
    if key not in data:
        if key == "v" and "V" in data:
            raise ModelError(f"{p} is a vector layer's file (value maps 'V'), not a {what} "
                             "file: read it with attnquery.realheads.load_vector_layer (with "
                             "--model, give --answers all|last)")
        if key == "V" and "v" in data:
            raise ModelError(f"{p} is a head or layer file (value vectors 'v'), not a {what} "
                             "file: it answers one number per query (with --model, leave out "
                             "--answers)")
        what_key = "value vector 'v'" if key == "v" else f"array {key!r}"
        raise ModelError(f"{p} holds no {what_key}; arrays: {sorted(data)}")
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
    the layer's constant (the output bias and every head's offset). A layer of rotary heads is
    written as ``v``, the heads' factors ``W_Q`` and ``W_K`` (H, head_dim, d), biases ``b_Q``
    and ``b_K`` (H, head_dim), ``frequencies`` (H, R/2), ``scale`` (H,) and ``beta``. Written
    atomically; metadata as in :func:`save_head`. Read it with :func:`load_layer`.
    """
    heads = layer.heads
    if getattr(layer, "rotary", False):
        arrays = {k: np.stack([getattr(h, k) for h in heads])
                  for k in ("v", "W_Q", "W_K", "b_Q", "b_K", "frequencies")}
        arrays.update(scale=np.array([h.scale for h in heads]),
                      beta=np.asarray(layer.total_offset))
        _save_arrays(path, arrays, meta)
        return
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
    if V.ndim == 2 and "frequencies" in data:  # a layer of rotary heads
        return _load_rotary_layer(p, data), meta
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


def _load_rotary_layer(p: Path, data: dict) -> MultiHeadAttention:
    missing = [k for k in ("W_Q", "W_K", "b_Q", "b_K", "scale", "beta") if k not in data]
    if missing:
        raise ModelError(f"{p} is not a rotary layer file: it lacks {missing}")
    H = data["v"].shape[0]
    short = [k for k in ("W_Q", "W_K", "b_Q", "b_K", "frequencies", "scale")
             if data[k].ndim < 1 or data[k].shape[0] != H]
    if short:
        raise ModelError(f"{p} is not a rotary layer file: {short} do not hold one entry per "
                         f"head of the {H} value vectors")
    heads = [RotaryAttentionHead(data["W_Q"][h], data["W_K"][h], data["v"][h],
                                 frequencies=data["frequencies"][h], b_Q=data["b_Q"][h],
                                 b_K=data["b_K"][h], scale=float(data["scale"][h]))
             for h in range(H)]
    return MultiHeadAttention(heads, offset=float(data["beta"]))


def save_vector_layer(path, layer, /, **meta) -> None:
    """Write a vector layer's ``V`` (H, d, d_out), ``W`` (H, d, d), ``key_bias`` (H, d) and
    ``output_bias`` (d_out,) (a rotary layer's :attr:`~attnquery.models.vector.RotaryFormLayer.
    FIELDS` instead) to an .npz, atomically, metadata as in :func:`save_head`; what ``attnquery
    extract --answers ... --out`` writes and :func:`load_vector_layer` reads back."""
    if getattr(layer, "rotary", False):  # a RotaryFormLayer: forms, bases, frequencies, groups
        arrays = {k: getattr(layer, k) for k in layer.FIELDS}
        arrays.update(layer.norm_arrays())
    else:
        arrays = {"V": layer.value_maps(), "W": layer.head_W(), "key_bias": layer.key_bias(),
                  "output_bias": layer.output_bias}
    _save_arrays(path, arrays, meta)


def load_vector_layer(path, outputs: str | None = None):
    """Read a vector layer written by ``attnquery extract --answers all|last --out``; returns
    ``(layer, metadata)``.

    A layer without positions (arrays ``V``, ``W``, ``key_bias``, ``output_bias``) becomes the
    :class:`~attnquery.models.vector.VectorAttentionLayer` of
    :func:`~attnquery.models.vector.bilinear_layer`; a rotary one (``--param positions=rotary``:
    the arrays :attr:`~attnquery.models.vector.RotaryFormLayer.FIELDS`) a
    :class:`~attnquery.models.vector.RotaryFormLayer`, whose outputs are the fitted learner's
    ``predict``. The causal mask is the metadata ``causal``; the layer answers ``outputs``
    (default the metadata ``answers``: every token's output, ``"all"``, or the last token's).
    """
    from ..models.vector import RotaryFormLayer, bilinear_layer

    data, meta = _load_arrays(path, "vector layer", key="V")
    options = {"causal": bool(meta.get("causal", False)),
               "outputs": outputs or str(meta.get("answers", "all"))}
    if "frequencies" in data:
        missing = [k for k in RotaryFormLayer.FIELDS if k not in data]
        if missing:
            raise ModelError(f"{path} is not a rotary vector layer's file: it lacks {missing}")
        norm = {k: data[k].item() for k in RotaryFormLayer.NORM_FIELDS if k in data}
        if "norm_eps" in norm and not np.isfinite(norm["norm_eps"]):
            norm["norm_eps"] = None
        if "residual" in norm:
            norm["residual"] = bool(norm["residual"])
        return RotaryFormLayer(**{k: data[k] for k in RotaryFormLayer.FIELDS}, **options,
                               **norm), meta
    missing = [k for k in ("W", "key_bias", "output_bias") if k not in data]
    if missing:
        raise ModelError(f"{path} is not a vector layer's file: it lacks {missing}")
    return bilinear_layer(data["W"], data["key_bias"], data["V"], data["output_bias"],
                          **options), meta
