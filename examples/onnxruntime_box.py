"""A black box served by a real inference engine: an attention module run by onnxruntime.

The module (Q, K and V projections with biases, scaled dot products, softmax, output
projection with its bias, read out along a vector at the last token; d = 32, one head of
dimension 8, seeded weights) is written as an ONNX graph with ``onnx.helper`` and answered by an
``onnxruntime.InferenceSession`` in float32 (``served_head``) or float16 (``served_head_fp16``),
both by :mod:`attnquery.engines`.
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

from attnquery.engines import OnnxBox, attention_module_graph

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
