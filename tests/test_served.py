"""Served arithmetic (attnquery.precision): models computed in float32, float16 and bfloat16,
checked against onnxruntime, an engine the project did not write (tests/onnx_boxes.py)."""

import ml_dtypes
import numpy as np
import pytest

from attnquery.errors import ModelError, ModelMismatchError
from attnquery.learners import ExactValueQueryLearner
from attnquery.models import AttentionHead, MultiHeadAttention, random_head
from attnquery.oracles import RoundingOracle, ValueOracle
from attnquery.precision import (
    PRECISIONS,
    AnswerFormat,
    Arithmetic,
    answer_format,
    largest_finite,
    round_to,
    rounding_floor,
)
from attnquery.realheads import ModuleBlackBox, build_layer, write_test_checkpoint

from .onnx_boxes import module_box

#: unit roundoff of each format
EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_test_checkpoint(tmp_path_factory.mktemp("served") / "model.safetensors",
                                 n_layers=1, n_heads=4, d=32, seed=3)


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_float64_is_the_exact_model_bit_for_bit():
    h = random_head(12, 0, rank=4, key_bias=0.5, offset=0.3)
    X = np.random.default_rng(1).standard_normal((50, 3, 12))
    h64 = AttentionHead(h.v, K=h.K, Q=h.Q, key_bias=h.key_bias, offset=h.offset,
                        precision="float64")
    assert np.array_equal(h64(X), h(X))
    m = MultiHeadAttention([h, random_head(12, 2)], offset=0.1)
    m64 = MultiHeadAttention(m.heads, offset=0.1, precision="float64")
    assert np.array_equal(m64(X), m(X))


@pytest.mark.parametrize("precision", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("factored", [True, False])
def test_head_rounds_every_answer_to_the_format(precision, factored):
    h = random_head(16, 4, rank=4 if factored else None, key_bias=0.5, offset=0.3)
    kw = dict(K=h.K, Q=h.Q) if factored else dict(W=h.W)
    hp = AttentionHead(h.v, key_bias=h.key_bias, offset=h.offset, precision=precision, **kw)
    X = np.random.default_rng(2).standard_normal((400, 3, 16))
    y, y64 = hp(X), h(X)
    assert np.array_equal(round_to(y, precision), y)  # answers are the format's numbers
    err = _rel(y, y64)
    # the forward pass's roundings show (more than the answer's own rounding), within a few
    # dozen units of roundoff
    assert EPS[precision] / 4 < err < 40 * EPS[precision]


def test_bfloat16_is_ml_dtypes_and_float16_overflows():
    A = Arithmetic("bfloat16")
    x = np.array([1.0 + 2.0**-9, 3.14159])
    assert np.array_equal(A.store(x), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert largest_finite("float16") == 65504.0
    h = random_head(8, 5, key_bias=0.2)
    X = np.random.default_rng(3).standard_normal((20, 2, 8))
    big = X * 1e3  # scores of order 1e6: beyond float16's range, not bfloat16's
    y16 = AttentionHead(h.v, W=h.W, key_bias=h.key_bias, precision="float16")(big)
    ybf = AttentionHead(h.v, W=h.W, key_bias=h.key_bias, precision="bfloat16")(big)
    assert not np.all(np.isfinite(y16))
    assert np.all(np.isfinite(ybf))
    with pytest.raises(ModelError, match="precision"):
        AttentionHead(h.v, W=h.W, precision="float8")
    assert PRECISIONS == ("float64", "float32", "float16", "bfloat16")


@pytest.mark.parametrize("precision", ["float32", "float16", "bfloat16"])
def test_answers_read_their_format(precision):
    """A served head's answers are read as its format's (the narrowest holding them all);
    answers in no narrow format (a few decimal digits, float64) are float64's; answers that
    are not finite (an overflow) say nothing about the format."""
    h = random_head(16, 4, rank=4, key_bias=0.5, offset=0.3)
    hp = AttentionHead(h.v, K=h.K, Q=h.Q, key_bias=h.key_bias, offset=h.offset,
                       precision=precision)
    X = np.random.default_rng(2).standard_normal((400, 3, 16))
    y = hp(X)
    assert answer_format(y) == precision
    assert answer_format(np.append(y, [np.inf, np.nan])) == precision
    assert answer_format(h(X)) == "float64"
    digits = RoundingOracle(h, 16, digits=3)(X)
    assert answer_format(digits) == "float64"
    # batch by batch: one float64 answer makes the whole float64, float16's and bfloat16's
    # answers together are float16's, the formats' own subsets float32's
    seen = AnswerFormat()
    assert seen.update(y[:100]).format == precision
    assert seen.update(y[100:]).format == precision
    assert seen.update(h(X[:1])).format == "float64"
    y64 = h(X)
    mixed = AnswerFormat().update(round_to(y64, "bfloat16")).update(round_to(y64, "float16"))
    assert mixed.format == "float16"
    assert answer_format(np.concatenate([round_to(y64, "float16"), round_to(y64, "float32")])) \
        == "float32"


def test_rounding_floor_is_the_unit_roundoff_or_float32_sums():
    """The noise rounding explains: the format's unit roundoff, or float32's accumulated over
    d-term sums (``u sqrt(d)``) where larger; float64 has none to judge."""
    for precision, u in EPS.items():
        assert rounding_floor(precision, 1) == u
    assert rounding_floor("float32", 64) == 8 * EPS["float32"]
    assert rounding_floor("float16", 384) == EPS["float16"]
    assert rounding_floor("bfloat16", 4096) == EPS["bfloat16"]
    with pytest.raises(ModelError, match="precision"):
        rounding_floor("float64", 16)


@pytest.mark.parametrize("precision", ["float32", "float16", "bfloat16"])
def test_layer_in_a_precision(ckpt, precision):
    from attnquery.realheads import cached_checkpoint, readout_vector

    c = cached_checkpoint(ckpt)
    layer = build_layer(c, 0, readout_vector(c.d))
    served = MultiHeadAttention(layer.heads, layer.offset, precision=precision)
    X = np.random.default_rng(4).standard_normal((300, 4, 32))
    y = served(X)
    assert np.array_equal(round_to(y, precision), y)
    assert EPS[precision] / 4 < _rel(y, layer(X)) < 60 * EPS[precision]


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("head", [1, None])
def test_module_box_agrees_with_onnxruntime(ckpt, precision, head):
    X = np.random.default_rng(5).standard_normal((500, 5, 32))
    ours = ModuleBlackBox(ckpt, 0, head, precision=precision)(X)
    ort = module_box(ckpt, 0, head, precision)(X)
    exact = ModuleBlackBox(ckpt, 0, head)(X)
    eps = EPS[precision]
    # both are the module to the format's precision, and they agree with each other to it
    assert _rel(ort, exact) < 40 * eps
    assert _rel(ours, exact) < 40 * eps
    assert _rel(ours, ort) < 40 * eps
    # ... and both really compute in the format (not in float64 rounded at the end)
    assert _rel(ours, exact) > eps / 4 and _rel(ort, exact) > eps / 4


def test_float16_boxes_overflow(ckpt):
    X = np.random.default_rng(6).standard_normal((50, 3, 32))
    ours = ModuleBlackBox(ckpt, 0, 2, precision="float16")
    ort = module_box(ckpt, 0, 2, "float16")
    assert np.all(np.isfinite(ours(X))) and np.all(np.isfinite(ort(X)))
    # scores of order 1e7: our box rounds every operation to float16 (as a GPU engine does),
    # so they overflow; onnxruntime's CPU provider runs the nodes it has no float16 kernel for
    # in float32 (it inserts casts), so its answers stay finite there
    assert not np.any(np.isfinite(ours(X * 3e3)))
    # inputs beyond 65504 overflow in both
    assert not np.any(np.isfinite(ours(X * 1e5))) and not np.any(np.isfinite(ort(X * 1e5)))


@pytest.mark.parametrize("engine", ["ours", "onnxruntime"])
def test_exact_learner_refuses_a_float32_box(ckpt, engine):
    box = (ModuleBlackBox(ckpt, 0, 0, precision="float32") if engine == "ours"
           else module_box(ckpt, 0, 0, "float32"))
    with pytest.raises(ModelMismatchError):
        ExactValueQueryLearner(fit_bias=True, random_state=0).fit(ValueOracle(box, 32))


def test_onnxruntime_example_is_extracted_with_its_biases(repo):
    import importlib
    import sys

    from attnquery.learners import LowPrecisionValueQueryLearner

    sys.path.insert(0, str(repo))
    try:
        ex = importlib.import_module("examples.onnxruntime_box")
    finally:
        sys.path.remove(str(repo))
    oracle = ValueOracle(ex.served_head, 32)
    with pytest.raises(ModelMismatchError):
        ExactValueQueryLearner(fit_bias=True, random_state=0).fit(oracle)
    est = LowPrecisionValueQueryLearner(n_queries=6 * (32**2 + 2 * 32 + 1), fit_bias=True,
                                        random_state=0).fit(ValueOracle(ex.served_head, 32))
    assert est.rank_ == 8  # the head dimension
    X = np.random.default_rng(0).standard_normal((64, 3, 32))
    y = ex.served_head(X)
    assert _rel(est.predict(X), y) < 1e-5


def _exact_dot_rounded(A, B):
    """``A @ B`` of float32 matrices summed exactly (math.fsum of the exact float64 products),
    rounded once to float32: what no summation order changes."""
    import math

    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    out = np.empty((A.shape[0], B.shape[1]), dtype=np.float32)
    for i in range(A.shape[0]):
        for j in range(B.shape[1]):
            out[i, j] = np.float32(math.fsum(A64[i] * B64[:, j]))
    return out


def test_float32_products_are_the_exact_sums_rounded_once():
    # products of float32 values are exact in float64; summed in float64 and rounded once the
    # result is the exactly rounded sum but where a sum lies within float64's roundoff of the
    # midpoint of two float32 numbers (none here): no BLAS kernel's order shows
    rng = np.random.default_rng(8)
    A = rng.standard_normal((40, 384)).astype(np.float32)
    B = rng.standard_normal((384, 12)).astype(np.float32)
    A32 = Arithmetic("float32")
    got = A32.matmul(A, B)
    assert got.dtype == np.float32
    assert np.array_equal(got, _exact_dot_rounded(A, B))
    X = rng.standard_normal((6, 5, 384)).astype(np.float32)
    q = rng.standard_normal((6, 384)).astype(np.float32)
    scores = A32.einsum("bnk,bk->bn", X, q)
    assert np.array_equal(scores, np.vstack([_exact_dot_rounded(X[b], q[b][:, None]).ravel()
                                             for b in range(6)]))
    # the narrow formats: the same sum, rounded to the format
    for fmt in ("float16", "bfloat16"):
        An, Bn = Arithmetic(fmt).store(A / 8), Arithmetic(fmt).store(B / 8)
        assert np.array_equal(Arithmetic(fmt).matmul(An, Bn),
                              round_to(_exact_dot_rounded(An, Bn), fmt).astype(np.float32))
    # float64 keeps numpy's own product, bit for bit
    A64 = rng.standard_normal((7, 9))
    assert np.array_equal(Arithmetic("float64").matmul(A64, A64.T), A64 @ A64.T)


def test_float32_softmax_takes_its_exponential_from_float64():
    s = np.random.default_rng(9).standard_normal((50, 30)).astype(np.float32) * 10
    shifted = s - s.max(axis=-1, keepdims=True)
    e = np.exp(shifted.astype(np.float64)).astype(np.float32)
    assert np.array_equal(Arithmetic("float32").softmax(s), e / e.sum(axis=-1, keepdims=True))
    assert np.all(np.isnan(Arithmetic("float32").softmax(np.array([[1.0, np.inf]]))))


_KERNEL_SCRIPT = """
import sys, numpy as np
from attnquery.models import random_head, AttentionHead
from attnquery.realheads import ModuleBlackBox
X = np.random.default_rng(10).standard_normal((300, 4, 32))
h = random_head(32, 3, key_bias=0.4, offset=0.2)
y = [ModuleBlackBox(sys.argv[1], 0, None, precision=p)(X) for p in ("float32", "float16")]
y.append(AttentionHead(h.v, W=h.W, key_bias=h.key_bias, precision="float32")(X))
np.save(sys.argv[2], np.concatenate(y))
"""


def test_served_answers_do_not_depend_on_the_blas_kernel(ckpt, tmp_path):
    # OpenBLAS picks its kernels by CPU (DYNAMIC_ARCH); OPENBLAS_CORETYPE forces one per process.
    # Summed in float32 (BLAS sgemm) the served answers depended on it
    # (docs/notes/2026-11-27-cross-machine.md)
    import os
    import platform
    import subprocess
    import sys

    config = str(np.show_config(mode="dicts")["Build Dependencies"]["blas"])
    if platform.machine() not in ("x86_64", "AMD64") or "DYNAMIC_ARCH" not in config:
        pytest.skip("needs numpy's OpenBLAS built with DYNAMIC_ARCH on x86-64")
    out = {}
    for core in ("Haswell", "Nehalem"):  # AVX2 and SSE kernels: any x86-64 CPU with AVX2
        path = tmp_path / f"{core}.npy"
        env = {**os.environ, "OPENBLAS_CORETYPE": core, "OPENBLAS_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-c", _KERNEL_SCRIPT, str(ckpt), str(path)], env=env,
                       check=True)
        out[core] = np.load(path)
    assert np.array_equal(out["Haswell"], out["Nehalem"])
