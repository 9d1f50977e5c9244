"""A black box served by a real inference engine: an attention module run by onnxruntime.

The module (Q, K and V projections with biases, scaled dot products, softmax, output
projection with its bias, read out along a vector at the last token; d = 32, one head of
dimension 8, seeded weights) is written as an ONNX graph with ``onnx.helper`` and answered by an
``onnxruntime.InferenceSession`` in float32 (``served_head``) or float16 (``served_head_fp16``).
Point the command line at it, from the repository root (onnx and onnxruntime are test
dependencies: ``pip install -e '.[test]'``)::

    attnquery extract --oracle examples.onnxruntime_box:served_head --d 32 \
        --param fit_bias=true                  # refused (exit 1): the answers are float32's

The exact learner assumes answers exact to float64 rounding and refuses float32 answers
(ModelMismatchError), as it should. The low-precision learner extracts the head with its biases
from the same session (in Python; see docs/served.md)::

    from attnquery.learners import LowPrecisionValueQueryLearner
    from attnquery.oracles import ValueOracle
    from examples.onnxruntime_box import served_head
    est = LowPrecisionValueQueryLearner(n_queries=6 * (32**2 + 2 * 32 + 1), fit_bias=True,
                                        random_state=0).fit(ValueOracle(served_head, 32))
    est.W_, est.v_, est.key_bias_, est.offset_
"""

import functools

import numpy as np

_ONNX_TYPES = {"float32": 1, "float16": 10}  # onnx.TensorProto.FLOAT, FLOAT16
ELEM = {"float32": np.float32, "float16": np.float16}


def attention_module_graph(wq, bq, wk, bk, wv, bv, wo, bo, r, n_heads: int,
                           precision: str = "float32"):
    """An ONNX model of ``r^T (W_O concat_h(softmax(k_h q_h / sqrt(d_h)) v_h) + b_O)``.

    Parameters
    ----------
    wq, wk, wv : ndarray (m, d)
        Projections (PyTorch ``Linear`` orientation, ``m = n_heads d_h`` kept columns).
    bq, bk, bv : ndarray (m,)
    wo : ndarray (d, m), bo : ndarray (d,)
        Output projection (the kept heads' columns) and its bias.
    r : ndarray (d,)
        Readout vector.
    n_heads : int
    precision : {"float32", "float16"}
        Storage and compute type of the graph (the input too).

    Returns
    -------
    onnx.ModelProto
    """
    import onnx
    from onnx import helper, numpy_helper

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
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class OnnxBox:
    """An ONNX attention module run by onnxruntime: ``(B, N, d)`` float64 -> ``(B,)`` float64.

    The input is cast to the graph's type (as a client sends it to a served model) and the
    answers are the engine's, cast to float64. One thread, no graph optimisation beyond the
    basic level, so the arithmetic is the kernels' own.
    """

    def __init__(self, model, d: int, precision: str = "float32"):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        self.session = ort.InferenceSession(model.SerializeToString(), opts,
                                            providers=["CPUExecutionProvider"])
        self.d, self.precision = int(d), precision
        self._dt = ELEM[precision]

    def __call__(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 2:
            X = X[None]
        with np.errstate(over="ignore"):
            Xc = X.astype(self._dt)
        out = []
        for a in range(0, X.shape[0], 8192):
            out.append(self.session.run(["y"], {"X": Xc[a:a + 8192]})[0])
        return np.concatenate(out).astype(np.float64)



D, D_HEAD = 32, 8


@functools.lru_cache(maxsize=2)
def _box(precision: str) -> OnnxBox:
    rng = np.random.default_rng(2026)

    def w(*shape):
        return rng.standard_normal(shape) / np.sqrt(D)

    wq, wk, wv = w(D_HEAD, D), w(D_HEAD, D), w(D_HEAD, D)
    bq, bk, bv = w(D_HEAD), w(D_HEAD), w(D_HEAD)
    wo, bo = w(D, D_HEAD), w(D)
    r = rng.standard_normal(D)
    r /= np.linalg.norm(r)
    model = attention_module_graph(wq, bq, wk, bk, wv, bv, wo, bo, r, 1, precision)
    return OnnxBox(model, D, precision)


def served_head(X):
    """The module served by onnxruntime in float32: (B, N, 32) -> (B,)."""
    return _box("float32")(X)


def served_head_fp16(X):
    """The same module served in float16 (weights, inputs and answers in float16)."""
    return _box("float16")(X)
