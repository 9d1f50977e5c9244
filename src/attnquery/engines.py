"""Attention modules served by a real inference engine (onnxruntime), as black boxes.

Beyond the paper: the learners of Sections 4-6 are checked against answers computed by an
engine the project did not write. :func:`attention_module_graph` writes an attention module
(Q, K and V projections with their biases, scaled dot products per head, softmax, the
attention-weighted values, the output projection with its bias, and a readout vector at the last
token) as an ONNX graph with ``onnx.helper``, its weights stored in float32 or float16.
:class:`OnnxBox` runs it with an onnxruntime ``InferenceSession`` on the CPU: a callable
``(B, N, d) -> (B,)`` whose answers are the engine's own arithmetic. :func:`module_box` builds one
from a checkpoint's attention module.

A served module answers every token's output vector. :func:`vector_layer_graph` writes a
:class:`~attnquery.models.vector.VectorAttentionLayer` (heads, grouped key/value heads, biases,
causal mask, soft-capping; no rotary positions) as an ONNX graph whose output is every token's
output ``(B, N, d_out)`` or the last token's ``(B, d_out)``; :func:`vector_box` runs it by
onnxruntime in float32 or float16, and in bfloat16 (which onnxruntime's CPU provider does not
multiply) by the emulated arithmetic of :mod:`attnquery.precision`. :func:`vector_module_box`
builds one from a checkpoint's layer. Wrap one in :class:`attnquery.oracles.VectorOracle`.

onnx and onnxruntime are not runtime dependencies of attnquery: they come with the ``test``
extra (``pip install 'attnquery[test]'``) and are imported only when a graph is built or run.
"""

from __future__ import annotations

import importlib

import numpy as np

__all__ = ["attention_module_graph", "checked_model", "OnnxBox", "module_box", "ELEM",
           "vector_layer_graph", "vector_box", "vector_layer_of", "vector_module_box",
           "VECTOR_PRECISIONS"]

_ONNX_TYPES = {"float32": 1, "float16": 10}  # onnx.TensorProto.FLOAT, FLOAT16
#: The numpy type of each precision a graph can be written in.
ELEM = {"float32": np.float32, "float16": np.float16}
#: The precisions :func:`vector_box` serves a layer in: onnxruntime's float32 and float16, and
#: bfloat16 emulated (:mod:`attnquery.precision`).
VECTOR_PRECISIONS = ("float32", "float16", "bfloat16")


def _engine_module(name: str):
    """Import ``name`` (onnx, onnxruntime), or say how to install it.

    Parameters
    ----------
    name : str
        The module to import.

    Returns
    -------
    module

    Raises
    ------
    ImportError
        When the module is not installed; the message names the ``test`` extra.
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"attnquery.engines needs {name.split('.')[0]}, which is not installed; it comes "
            f"with the test extra: pip install 'attnquery[test]'") from exc


def _check_precision(precision: str) -> None:
    if precision not in ELEM:
        raise ValueError(f"precision must be one of {sorted(ELEM)}, got {precision!r}")


def attention_module_graph(wq, bq, wk, bk, wv, bv, wo, bo, r, n_heads: int,
                           precision: str = "float32"):
    """An ONNX model of ``r^T (W_O concat_h(softmax(k_h q_h / sqrt(d_h)) v_h) + b_O)``.

    Parameters
    ----------
    wq, wk, wv : ndarray (m, d)
        Projections (PyTorch ``Linear`` orientation, ``m = n_heads d_h`` kept columns).
    bq, bk, bv : ndarray (m,)
        Their biases.
    wo : ndarray (d, m)
        Output projection (the kept heads' columns).
    bo : ndarray (d,)
        Its bias.
    r : ndarray (d,)
        Readout vector.
    n_heads : int
        Number of heads the ``m`` columns hold.
    precision : {"float32", "float16"}
        Storage and compute type of the graph (the input too).

    Returns
    -------
    onnx.ModelProto
        A checked model with input ``X`` ``(B, N, d)`` and output ``y`` ``(B,)``.

    Raises
    ------
    ImportError
        When onnx is not installed.
    ValueError
        For an unknown precision.
    """
    _check_precision(precision)
    onnx = _engine_module("onnx")
    helper, numpy_helper = onnx.helper, _engine_module("onnx.numpy_helper")

    T = _ONNX_TYPES[precision]
    dt = ELEM[precision]
    m, d = np.shape(wq)
    dh = m // n_heads

    def init(name, a):
        return numpy_helper.from_array(np.asarray(a, dtype=np.float64).astype(dt), name)

    def shape(name, vals):
        return numpy_helper.from_array(np.asarray(vals, dtype=np.int64), name)

    inits = [init("WqT", np.transpose(wq)), init("bq", bq), init("WkT", np.transpose(wk)),
             init("bk", bk), init("WvT", np.transpose(wv)), init("bv", bv),
             init("WoT", np.transpose(wo)), init("bo", bo), init("r", r),
             init("scale", np.sqrt(dh)),
             numpy_helper.from_array(np.asarray(-1, dtype=np.int64), "last"),
             shape("q_shape", [0, n_heads, dh, 1]), shape("kv_shape", [0, 0, n_heads, dh]),
             shape("s_shape", [0, 0, 1, -1]), shape("o_shape", [0, m])]
    N = helper.make_node
    nodes = [
        N("Gather", ["X", "last"], ["xN"], axis=1),  # (B, d): the last token
        N("MatMul", ["xN", "WqT"], ["q0"]), N("Add", ["q0", "bq"], ["q"]),
        N("MatMul", ["X", "WkT"], ["k0"]), N("Add", ["k0", "bk"], ["k"]),
        N("MatMul", ["X", "WvT"], ["v0"]), N("Add", ["v0", "bv"], ["v"]),
        N("Reshape", ["q", "q_shape"], ["q4"]),  # (B, H, dh, 1)
        N("Reshape", ["k", "kv_shape"], ["k3"]), N("Transpose", ["k3"], ["k4"], perm=[0, 2, 1, 3]),
        N("Reshape", ["v", "kv_shape"], ["v3"]), N("Transpose", ["v3"], ["v4"], perm=[0, 2, 1, 3]),
        N("MatMul", ["k4", "q4"], ["s0"]),  # (B, H, N, 1)
        N("Div", ["s0", "scale"], ["s1"]), N("Reshape", ["s1", "s_shape"], ["s"]),  # (B,H,1,N)
        N("Softmax", ["s"], ["alpha"], axis=-1),
        N("MatMul", ["alpha", "v4"], ["o4"]),  # (B, H, 1, dh)
        N("Reshape", ["o4", "o_shape"], ["o"]),  # (B, m)
        N("MatMul", ["o", "WoT"], ["out0"]), N("Add", ["out0", "bo"], ["out"]),  # (B, d)
        N("MatMul", ["out", "r"], ["y"]),  # (B,)
    ]
    graph = helper.make_graph(
        nodes, "attention_module",
        [helper.make_tensor_value_info("X", T, ["B", "N", d])],
        [helper.make_tensor_value_info("y", T, ["B"])], inits)
    return checked_model(graph, opset=17)


#: The IR version each default-domain opset this module builds for is written with (the
#: oldest that carries it, so older onnxruntime releases still load the model).
IR_VERSION = {17: 8, 23: 10}


def checked_model(graph, opset: int = 17):
    """An ONNX model of ``graph`` in the default domain at ``opset``, checked by onnx.

    Parameters
    ----------
    graph : onnx.GraphProto
    opset : int
        17 (the module graph's operators) or 23 (``RotaryEmbedding`` and ``Attention``).

    Returns
    -------
    onnx.ModelProto
    """
    if opset not in IR_VERSION:
        raise ValueError(f"opset must be one of {sorted(IR_VERSION)}, got {opset!r}")
    onnx = _engine_module("onnx")
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION[opset]
    onnx.checker.check_model(model)
    return model


class OnnxBox:
    """An ONNX attention module run by onnxruntime: ``(B, N, d)`` float64 in, the graph's output
    ``y`` in float64 out: ``(B,)`` for :func:`attention_module_graph`, ``(B, N, d_out)`` or
    ``(B, d_out)`` for :func:`vector_layer_graph`.

    The input is cast to the graph's type (as a client sends it to a served model) and the
    answers are the engine's, cast to float64. One thread, no graph optimisation beyond the
    basic level, so the arithmetic is the kernels' own.

    Parameters
    ----------
    model : onnx.ModelProto
        A graph with input ``X`` and output ``y`` (:func:`attention_module_graph`,
        :func:`vector_layer_graph`).
    d : int
        Token dimension.
    precision : {"float32", "float16"}
        The graph's type.

    Attributes
    ----------
    session : onnxruntime.InferenceSession
        The engine's session.
    d : int
    precision : str

    Raises
    ------
    ImportError
        When onnxruntime is not installed.
    """

    def __init__(self, model, d: int, precision: str = "float32"):
        _check_precision(precision)
        ort = _engine_module("onnxruntime")

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        self.session = ort.InferenceSession(model.SerializeToString(), opts,
                                            providers=["CPUExecutionProvider"])
        self.d, self.precision = int(d), precision
        self._dt = ELEM[precision]

    def __call__(self, X) -> np.ndarray:
        """The engine's answers.

        Parameters
        ----------
        X : array_like (B, N, d) or (N, d)
            Queries in float64; cast to the graph's type (values beyond its range overflow
            to infinity, as a client's cast does).

        Returns
        -------
        ndarray (B,), (B, N, d_out) or (B, d_out)
            The graph's output, float64.
        """
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 2:
            X = X[None]
        with np.errstate(over="ignore"):
            Xc = X.astype(self._dt)
        out = []
        for a in range(0, X.shape[0], 8192):
            out.append(self.session.run(["y"], {"X": Xc[a:a + 8192]})[0])
        return np.concatenate(out).astype(np.float64)


def module_box(path, layer: int, head: int | None = None, precision: str = "float32",
               readout_seed: int = 0) -> OnnxBox:
    """The attention module of a checkpoint (one head, or the whole layer) as an onnxruntime box.

    Read out along the Gaussian readout vector of seed ``readout_seed``, as
    :class:`attnquery.realheads.ModuleBlackBox` reads it out.

    Parameters
    ----------
    path : str or Path
        A checkpoint :func:`attnquery.realheads.cached_checkpoint` reads.
    layer : int
        The layer.
    head : int, optional
        One head; all the layer's heads when None.
    precision : {"float32", "float16"}
        The graph's type.
    readout_seed : int
        Seed of the readout vector.

    Returns
    -------
    OnnxBox
    """
    from attnquery.realheads import cached_checkpoint, readout_vector

    ckpt = cached_checkpoint(path)
    w = ckpt.layers[layer]
    heads = range(ckpt.n_heads) if head is None else [head]
    cols = np.concatenate([np.arange(h * ckpt.d_head, (h + 1) * ckpt.d_head) for h in heads])
    r = readout_vector(ckpt.d, "gaussian", readout_seed)
    model = attention_module_graph(
        w["q"][cols], w["bq"][cols], w["k"][cols], w["bk"][cols], w["v"][cols], w["bv"][cols],
        w["o"][:, cols], w["bo"], r, len(cols) // ckpt.d_head, precision)
    return OnnxBox(model, ckpt.d, precision)


def _vector_graph_parts(layer) -> dict:
    """The weights of ``layer`` for :func:`vector_layer_graph`, key/value heads repeated for
    the query heads that read them (the engine then computes each head's keys and values)."""
    if layer.rotary:
        raise ValueError("vector_layer_graph writes layers without rotary positions; this "
                         "layer has rotary frequencies")
    H, dh, d = layer.W_Q.shape
    dv = layer.W_V.shape[1]
    g = layer.groups
    return dict(WqT=layer.W_Q.reshape(H * dh, d).T, bq=layer.b_Q.ravel(),
                WkT=layer.W_K[g].reshape(H * dh, d).T, bk=layer.b_K[g].ravel(),
                WvT=layer.W_V[g].reshape(H * dv, d).T, bv=layer.b_V[g].ravel(),
                WoT=layer.W_O.T, bo=layer.b_O, scale=layer.scale)


def vector_layer_graph(layer, precision: str = "float32", outputs: str | None = None):
    """An ONNX model of a :class:`~attnquery.models.vector.VectorAttentionLayer`: every token's
    output vector, or the last token's.

    The graph computes, per head, ``softmax(scale q k^T)`` (soft-capped and causally masked as
    the layer is) times the values, concatenates the heads and applies ``W_O`` and ``b_O``, all
    in the graph's type, as an exported attention module does.

    Parameters
    ----------
    layer : VectorAttentionLayer
        A layer without rotary positions (its ``precision`` is not used: the graph's type is).
    precision : {"float32", "float16"}
        Storage and compute type of the graph (the input and output too).
    outputs : {"all", "last"}, optional
        Every token's output ``(B, N, d_out)`` or the last token's ``(B, d_out)``; default the
        layer's own.

    Returns
    -------
    onnx.ModelProto
        A checked model with input ``X`` ``(B, N, d)`` and output ``y``.

    Raises
    ------
    ImportError
        When onnx is not installed.
    ValueError
        For an unknown precision or outputs, or a layer with rotary positions.
    """
    _check_precision(precision)
    outputs = layer.outputs if outputs is None else outputs
    if outputs not in ("all", "last"):
        raise ValueError(f"outputs must be 'all' or 'last', got {outputs!r}")
    parts = _vector_graph_parts(layer)
    onnx = _engine_module("onnx")
    helper, numpy_helper = onnx.helper, _engine_module("onnx.numpy_helper")
    T, dt = _ONNX_TYPES[precision], ELEM[precision]
    H, dh, d = layer.W_Q.shape
    dv, d_out = layer.W_V.shape[1], layer.d_out

    def init(name, a):
        return numpy_helper.from_array(np.asarray(a, dtype=np.float64).astype(dt), name)

    def ints(name, vals):
        return numpy_helper.from_array(np.asarray(vals, dtype=np.int64), name)

    inits = [init(k, v) for k, v in parts.items()]
    inits += [ints("qk_shape", [0, 0, H, dh]), ints("v_shape", [0, 0, H, dv]),
              ints("o_shape", [0, 0, H * dv])]
    N = helper.make_node
    # rows whose outputs are answered: every token, or the last one (kept as an axis of 1)
    rows = "X" if outputs == "all" else "xN"
    nodes = []
    if outputs == "last":
        inits += [ints("last", [-1]), ints("y_shape", [0, d_out])]
        nodes.append(N("Gather", ["X", "last"], ["xN"], axis=1))
    nodes += [
        N("MatMul", [rows, "WqT"], ["q0"]), N("Add", ["q0", "bq"], ["q1"]),
        N("MatMul", ["X", "WkT"], ["k0"]), N("Add", ["k0", "bk"], ["k1"]),
        N("MatMul", ["X", "WvT"], ["v0"]), N("Add", ["v0", "bv"], ["v1"]),
        N("Reshape", ["q1", "qk_shape"], ["q2"]), N("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
        N("Reshape", ["k1", "qk_shape"], ["k2"]), N("Transpose", ["k2"], ["kT"], perm=[0, 2, 3, 1]),
        N("Reshape", ["v1", "v_shape"], ["v2"]), N("Transpose", ["v2"], ["v"], perm=[0, 2, 1, 3]),
        N("MatMul", ["q", "kT"], ["s0"]), N("Mul", ["s0", "scale"], ["s1"]),  # (B, H, M, N)
    ]
    s = "s1"
    if layer.softcap is not None:
        inits.append(init("cap", layer.softcap))
        nodes += [N("Div", ["s1", "cap"], ["c0"]), N("Tanh", ["c0"], ["c1"]),
                  N("Mul", ["c1", "cap"], ["s2"])]
        s = "s2"
    if layer.causal and outputs == "all":  # the last token sees every token: no mask
        inits += [init("fill", 1.0), init("ninf", -np.inf)]
        nodes += [
            N("Shape", ["X"], ["n"], start=1, end=2), N("Concat", ["n", "n"], ["nn"], axis=0),
            N("Expand", ["fill", "nn"], ["full"]), N("Trilu", ["full"], ["tri"], upper=0),
            N("Cast", ["tri"], ["keep"], to=onnx.TensorProto.BOOL),  # (N, N): key i <= row n
            N("Where", ["keep", s, "ninf"], ["s3"]),
        ]
        s = "s3"
    nodes += [
        N("Softmax", [s], ["a"], axis=-1),
        N("MatMul", ["a", "v"], ["o0"]), N("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        N("Reshape", ["o1", "o_shape"], ["o"]),  # (B, M, H dv)
        N("MatMul", ["o", "WoT"], ["y0"]),
        N("Add", ["y0", "bo"], ["y"] if outputs == "all" else ["y1"]),
    ]
    out_shape = ["B", "N", d_out]
    if outputs == "last":
        nodes.append(N("Reshape", ["y1", "y_shape"], ["y"]))
        out_shape = ["B", d_out]
    graph = helper.make_graph(
        nodes, "vector_attention_layer",
        [helper.make_tensor_value_info("X", T, ["B", "N", d])],
        [helper.make_tensor_value_info("y", T, out_shape)], inits)
    return checked_model(graph, opset=17)


def vector_box(layer, precision: str = "float32", outputs: str | None = None):
    """A :class:`~attnquery.models.vector.VectorAttentionLayer` served in ``precision``.

    Parameters
    ----------
    layer : VectorAttentionLayer
        A layer without rotary positions.
    precision : {"float32", "float16", "bfloat16"}
        float32 and float16: the layer's ONNX graph (:func:`vector_layer_graph`) run by
        onnxruntime. bfloat16: onnxruntime's CPU provider has no bfloat16 matrix product, so the
        layer is evaluated in the emulated arithmetic of :mod:`attnquery.precision` (weights and
        inputs rounded to bfloat16, products accumulated in float32 and rounded once).
    outputs : {"all", "last"}, optional
        Every token's output or the last token's; default the layer's own.

    Returns
    -------
    callable
        ``(B, N, d)`` float64 -> ``(B, N, d_out)`` or ``(B, d_out)`` float64: an
        :class:`OnnxBox`, or a bfloat16 :class:`VectorAttentionLayer`.

    Raises
    ------
    ValueError
        For a precision not in :data:`VECTOR_PRECISIONS`, other outputs, or rotary positions.
    """
    from .models.vector import VectorAttentionLayer

    if precision not in VECTOR_PRECISIONS:
        raise ValueError(f"precision must be one of {VECTOR_PRECISIONS}, got {precision!r}")
    outputs = layer.outputs if outputs is None else outputs
    if precision != "bfloat16":
        return OnnxBox(vector_layer_graph(layer, precision, outputs), layer.d, precision)
    if outputs not in ("all", "last"):
        raise ValueError(f"outputs must be 'all' or 'last', got {outputs!r}")
    _vector_graph_parts(layer)  # the same layers as the graph: no rotary positions
    return VectorAttentionLayer(
        layer.W_Q, layer.W_K, layer.W_V, layer.W_O, b_Q=layer.b_Q, b_K=layer.b_K,
        b_V=layer.b_V, b_O=layer.b_O, causal=layer.causal, outputs=outputs, scale=layer.scale,
        softcap=layer.softcap, precision="bfloat16")


def vector_layer_of(path, layer: int, outputs: str = "all", n_heads: int | None = None):
    """The self-attention module of a checkpoint's layer as a
    :class:`~attnquery.models.vector.VectorAttentionLayer` (float64), every bias kept.

    Parameters
    ----------
    path : str or Path
        A checkpoint :func:`attnquery.realheads.cached_checkpoint` reads.
    layer : int
    outputs : {"all", "last"}
    n_heads : int, optional
        Heads per layer (default: the checkpoint's ``config.json``).
    """
    from .models.vector import VectorAttentionLayer
    from .realheads import cached_checkpoint

    ckpt = cached_checkpoint(path, n_heads)
    w = ckpt.layers[layer]
    H, dh = ckpt.n_heads, ckpt.d_head

    def heads(a):
        return np.asarray(a, dtype=np.float64).reshape(H, dh, -1)

    def bias(name):  # a checkpoint without the bias: none (zeros)
        return None if w[name] is None else heads(w[name])[..., 0]

    return VectorAttentionLayer(
        heads(w["q"]), heads(w["k"]), heads(w["v"]), w["o"], b_Q=bias("bq"), b_K=bias("bk"),
        b_V=bias("bv"), b_O=w["bo"], outputs=outputs)


def vector_module_box(path, layer: int, precision: str = "float32", outputs: str = "all",
                      n_heads: int | None = None):
    """A checkpoint's attention layer served in ``precision`` (:func:`vector_box` of
    :func:`vector_layer_of`): every token's output vector, or the last token's."""
    return vector_box(vector_layer_of(path, layer, outputs, n_heads), precision, outputs)
