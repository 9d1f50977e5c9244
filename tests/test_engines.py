"""attnquery.engines: the onnxruntime attention module, and what it says without onnx."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from attnquery import engines


def _weights(d, m, seed):
    rng = np.random.default_rng(seed)
    w = [rng.standard_normal(s) / np.sqrt(d) for s in
         [(m, d), (m,), (m, d), (m,), (m, d), (m,), (d, m), (d,), (d,)]]
    return w


def _numpy_module(X, wq, bq, wk, bk, wv, bv, wo, bo, r, n_heads):
    """The module in float64 numpy, head by head."""
    m = wq.shape[0]
    dh = m // n_heads
    q, k, v = X[:, -1] @ wq.T + bq, X @ wk.T + bk, X @ wv.T + bv
    outs = []
    for h in range(n_heads):
        s = slice(h * dh, (h + 1) * dh)
        z = np.einsum("bnk,bk->bn", k[..., s], q[:, s]) / np.sqrt(dh)
        a = np.exp(z - z.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        outs.append(np.einsum("bn,bnk->bk", a, v[..., s]))
    return (np.concatenate(outs, axis=1) @ wo.T + bo) @ r


@pytest.mark.parametrize("precision, tol", [("float32", 1e-5), ("float16", 5e-2)])
def test_the_engine_answers_the_module(precision, tol):
    pytest.importorskip("onnxruntime")
    d, m, H = 8, 4, 2
    w = _weights(d, m, 0)
    box = engines.OnnxBox(engines.attention_module_graph(*w, H, precision), d, precision)
    X = np.random.default_rng(1).standard_normal((5, 7, d))
    y, ref = box(X), _numpy_module(X, *w, H)
    assert y.dtype == np.float64 and y.shape == (5,)
    err = np.max(np.abs(y - ref)) / np.max(np.abs(ref))
    assert err < tol
    # the test can fail: the graph with one head is another function
    one = engines.OnnxBox(engines.attention_module_graph(*w, 1, precision), d, precision)
    assert np.max(np.abs(one(X) - ref)) / np.max(np.abs(ref)) > 10 * tol


def test_a_missing_engine_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ImportError, match=r"pip install 'attnquery\[test\]'"):
        engines.attention_module_graph(*_weights(4, 2, 0), 1)
    with pytest.raises(ImportError, match="onnxruntime"):
        engines.OnnxBox(object(), 4)


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="bfloat16"):
        engines.attention_module_graph(*_weights(4, 2, 0), 1, "bfloat16")


def test_checked_model_names_the_opsets_it_writes():
    from attnquery.engines import checked_model

    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    graph = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "g", [x],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    assert checked_model(graph, opset=23).ir_version == 10
    assert checked_model(graph).opset_import[0].version == 17
    with pytest.raises(ValueError, match="opset must be one of"):
        checked_model(graph, opset=12)


# -- vector answers: every token's output vector ---------------------------------------------------

#: unit roundoff of each format a layer is served in
EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def _with(layer, **changes):
    """``layer`` (a VectorAttentionLayer) with some of its constructor arguments changed."""
    from attnquery.models.vector import VectorAttentionLayer

    kw = dict(b_Q=layer.b_Q, b_K=layer.b_K, b_V=layer.b_V, b_O=layer.b_O, causal=layer.causal,
              outputs=layer.outputs, scale=layer.scale, softcap=layer.softcap)
    return VectorAttentionLayer(layer.W_Q, layer.W_K, layer.W_V, layer.W_O, **{**kw, **changes})


@pytest.mark.parametrize("precision", engines.VECTOR_PRECISIONS)
@pytest.mark.parametrize("outputs, options", [
    ("all", {}),
    ("all", {"causal": True, "n_kv_heads": 2, "softcap": 2.0}),
    ("last", {"causal": True}),
])
def test_the_vector_engine_answers_the_layer_at_the_formats_rounding(precision, outputs,
                                                                      options):
    from attnquery.models.vector import random_vector_layer

    pytest.importorskip("onnxruntime")
    d = 16
    layer = random_vector_layer(d, 4, 0, bias=0.3, outputs=outputs, **options)
    X = np.random.default_rng(1).standard_normal((6, 9, d))
    y, ref = engines.vector_box(layer, precision)(X), layer(X)
    assert y.dtype == np.float64 and y.shape == ((6, 9, d) if outputs == "all" else (6, d))
    err = np.max(np.abs(y - ref)) / np.max(np.abs(ref))
    # the format's rounding shows, within a few units of roundoff (measured: 1.5 to 7)
    assert EPS[precision] / 4 < err < 16 * EPS[precision]
    # the test can fail: the layer with the mask (or soft-capping) flipped is another function
    other = _with(layer, causal=not layer.causal) if outputs == "all" else _with(layer,
                                                                                 softcap=0.5)
    assert np.max(np.abs(other(X) - y)) / np.max(np.abs(ref)) > 20 * EPS[precision]


def test_the_vector_graph_is_onnx_checked_and_answers_its_outputs():
    from attnquery.models.vector import random_vector_layer

    pytest.importorskip("onnxruntime")
    layer = random_vector_layer(8, 2, 3, bias=0.2)
    X = np.random.default_rng(4).standard_normal((3, 5, 8))
    every = engines.OnnxBox(engines.vector_layer_graph(layer, "float32"), 8, "float32")(X)
    last = engines.OnnxBox(engines.vector_layer_graph(layer, "float32", "last"), 8, "float32")(X)
    assert every.shape == (3, 5, 8) and last.shape == (3, 8)
    assert np.allclose(last, every[:, -1], rtol=0, atol=1e-6)


def test_a_checkpoint_layer_served_by_the_engine_is_the_module_read_out(tmp_path):
    from attnquery.realheads import ModuleBlackBox, write_test_checkpoint

    pytest.importorskip("onnxruntime")
    path = write_test_checkpoint(tmp_path / "model.safetensors", n_layers=2, n_heads=4, d=16,
                                 seed=5)
    X = np.random.default_rng(6).standard_normal((4, 7, 16))
    module = ModuleBlackBox(path, 1, None)  # the layer with its biases, read out along r
    ref = module(X)
    for precision in engines.VECTOR_PRECISIONS:
        y = engines.vector_module_box(path, 1, precision, "last")(X) @ module.r
        assert np.max(np.abs(y - ref)) / np.max(np.abs(ref)) < 16 * EPS[precision]
    # another layer of the checkpoint answers otherwise
    y0 = engines.vector_module_box(path, 0, "float32", "last")(X) @ module.r
    assert np.max(np.abs(y0 - ref)) / np.max(np.abs(ref)) > 1e-2


def test_a_vector_box_refuses_what_it_cannot_serve():
    from attnquery.models.vector import random_vector_layer

    with pytest.raises(ValueError, match="rotary"):
        engines.vector_box(random_vector_layer(8, 2, 0, rope_base=100.0), "float32")
    with pytest.raises(ValueError, match="rotary"):
        engines.vector_box(random_vector_layer(8, 2, 0, rope_base=100.0), "bfloat16")
    with pytest.raises(ValueError, match="precision must be one of"):
        engines.vector_box(random_vector_layer(8, 2, 0), "float64")
    with pytest.raises(ValueError, match="outputs must be"):
        engines.vector_box(random_vector_layer(8, 2, 0), "bfloat16", "first")


@pytest.mark.parametrize("outputs", ["all", "last"])
def test_the_vector_learner_reads_float32_answers_by_its_served_route(outputs):
    """onnxruntime computes in float32 at best: the learner reads the format of its first
    one-token answers and hands the served head to its served route (ServedVectorLearner,
    docs/vector.md), which recovers W to float32's floor; the same head in float64 is
    recovered to 1e-9 by the float64 route."""
    from attnquery.learners import VectorLayerLearner
    from attnquery.models.vector import random_vector_layer
    from attnquery.oracles import VectorOracle
    from attnquery.precision import rounding_floor

    pytest.importorskip("onnxruntime")
    d = 16
    layer = random_vector_layer(d, 1, 0, bias=0.3, outputs=outputs)
    est = VectorLayerLearner(random_state=0).fit(VectorOracle(layer, d, outputs=outputs))
    W = layer.head_W()
    assert est.served_ is None and np.max(np.abs(est.W_ - W)) / np.max(np.abs(W)) < 1e-9
    served = VectorOracle(engines.vector_box(layer, "float32"), d, outputs=outputs)
    est32 = VectorLayerLearner(random_state=0).fit(served)
    assert est32.answer_format_ == "float32"
    err = np.max(np.abs(est32.W_ - W)) / np.max(np.abs(W))
    assert err < 3 * rounding_floor("float32", d)
