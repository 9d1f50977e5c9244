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
