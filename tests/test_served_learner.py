"""LowPrecisionValueQueryLearner(fit_bias=True): single heads with their biases extracted from
served answers (float32, float16, bfloat16), ours and onnxruntime's."""

import numpy as np
import pytest

from attnquery.errors import (
    AssumptionViolation,
    ConfigError,
    ModelMismatchError,
    NoiseAboveFormatWarning,
)
from attnquery.learners import LowPrecisionValueQueryLearner
from attnquery.learners._base import NOISE_FORMAT_FACTOR
from attnquery.learners.lowprecision import BiasedLowPrecisionLearner
from attnquery.models import MultiHeadAttention, random_head
from attnquery.oracles import ValueOracle
from attnquery.precision import Arithmetic, rounding_floor
from attnquery.realheads import (
    ModuleBlackBox,
    build_head,
    cached_checkpoint,
    readout_vector,
    write_test_checkpoint,
)

from .boxes import in_dtype, relative_noise, soft_capped
from .onnx_boxes import module_box

D = 32


def _truth(path, head):
    c = cached_checkpoint(path)
    return build_head(c, 0, head, readout_vector(c.d), biases=True)


def floor_W(path, head, precision):
    """Relative error of W from the checkpoint's weights rounded to the format."""
    c = cached_checkpoint(path)
    w = c.layers[0]
    rows = slice(head * c.d_head, (head + 1) * c.d_head)
    A = Arithmetic(precision)
    Wk, Wq = (A.store(w[k][rows]).astype(float) for k in ("k", "q"))
    W = _truth(path, head).W
    return float(np.linalg.norm(Wk.T @ Wq / np.sqrt(c.d_head) - W) / np.linalg.norm(W))


def _errors(est, h):
    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))
    return rel(est.W_, h.W), rel(est.v_, h.v), rel(est.key_bias_, h.key_bias)


def units(q):
    return int(q * (D * D + 2 * D + 1))


def test_exact_box_with_biases():
    h = random_head(16, 3, rank=4, key_bias=0.5, offset=0.3)
    est = LowPrecisionValueQueryLearner(n_queries=3000, random_state=0, fit_bias=True)
    est.fit(ValueOracle(h, 16))
    eW, ev, ec = _errors(est, h)
    assert eW < 1e-9 and ev < 1e-9 and ec < 1e-8
    assert abs(est.offset_ - 0.3) < 1e-12
    assert est.rank_ >= 4 and est.n_overflow_ == 0  # a 5th singular value at 1e-10 may stay


def _fitted(est):
    return {k: v for k, v in vars(est).items() if k.endswith("_") or k == "_W"}


def test_the_bias_route_is_its_own_estimator():
    """``LowPrecisionValueQueryLearner(fit_bias=True)`` runs BiasedLowPrecisionLearner with
    its parameters: the same fitted attributes bit for bit, on the same queries."""
    h = random_head(16, 3, rank=4, key_bias=0.5, offset=0.3)
    public = LowPrecisionValueQueryLearner(n_queries=3000, random_state=0, fit_bias=True)
    route = BiasedLowPrecisionLearner(n_queries=3000, random_state=0)
    o1, o2 = ValueOracle(h, 16), ValueOracle(h, 16)
    a, b = _fitted(public.fit(o1)), _fitted(route.fit(o2))
    assert set(a) == set(b) and o1.n_queries == o2.n_queries
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, tuple):
            assert all(np.array_equal(p, q) for p, q in zip(x, y, strict=True)), k
        else:
            assert np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y, k
    eW, ev, ec = _errors(route, h)
    assert eW < 1e-9 and ev < 1e-9 and ec < 1e-8 and abs(route.offset_ - 0.3) < 1e-12
    assert route.get_params() == {k: v for k, v in public.get_params().items()
                                  if k != "fit_bias"}


def test_the_bias_routes_refusals_and_warnings_name_the_estimator_asked():
    oracle = ValueOracle(random_head(8, 1, key_bias=0.5, offset=0.3), 8)
    need = BiasedLowPrecisionLearner.min_queries(8)
    assert need == LowPrecisionValueQueryLearner.min_queries(8, fit_bias=True)
    assert need > LowPrecisionValueQueryLearner.min_queries(8)
    with pytest.raises(ConfigError, match=r"see BiasedLowPrecisionLearner\.min_queries"):
        BiasedLowPrecisionLearner(n_queries=need - 1).fit(oracle)
    with pytest.raises(ConfigError, match=r"see LowPrecisionValueQueryLearner\.min_queries"):
        LowPrecisionValueQueryLearner(n_queries=need - 1, fit_bias=True).fit(oracle)
    with pytest.raises(ConfigError, match="max_logit"):
        BiasedLowPrecisionLearner(n_queries=need, max_logit=20.0).fit(oracle)
    assert oracle.n_queries == 0
    noisy = random_head(16, 3, rank=4, key_bias=0.5, offset=0.3)
    for est in (LowPrecisionValueQueryLearner(n_queries=3000, random_state=0, fit_bias=True,
                                              noise="measured"),
                BiasedLowPrecisionLearner(n_queries=3000, random_state=0, noise="measured")):
        with pytest.warns(NoiseAboveFormatWarning, match=f"so {type(est).__name__} goes on"):
            est.fit(ValueOracle(in_dtype(relative_noise(noisy, 1e-4), "float32"), 16))


@pytest.mark.parametrize("engine", ["ours", "onnxruntime"])
def test_float32_served_head(layer_ckpt, engine):
    box = (ModuleBlackBox(layer_ckpt, 0, 1, precision="float32") if engine == "ours"
           else module_box(layer_ckpt, 0, 1, "float32"))
    oracle = ValueOracle(box, D)
    est = LowPrecisionValueQueryLearner(n_queries=units(6), random_state=0,
                                        fit_bias=True).fit(oracle)
    h = _truth(layer_ckpt, 1)
    eW, ev, ec = _errors(est, h)
    assert oracle.n_queries <= units(6)
    # measured 1.3e-7 (ours) and 1.1e-7 (onnxruntime) at 6 (d^2 + 2d + 1) (at d = 32 the
    # key-bias and offset stages take a larger share of a small budget than at d = 384); the
    # issue's goal is 3e-7
    assert eW <= 3e-7 and ev <= 1e-7 and ec <= 3e-7
    assert est.rank_ == 8 and est.n_overflow_ == 0
    # its noise judged against float32's floor and found within it (measured 0.42 to 0.54 of
    # the floor on the four heads, ours and onnxruntime's)
    assert est.answer_format_ == "float32" and not est.noise_above_format_
    assert est.noise_level_ <= est.noise_floor_ == rounding_floor("float32", D)


@pytest.mark.parametrize("precision,engine,q,factor", [
    ("float16", "onnxruntime", 20, 1.5), ("float16", "ours", 20, 2.5),
    ("bfloat16", "ours", 10, 2.5)])
def test_low_precision_served_head_near_its_floor(layer_ckpt, precision, engine, q, factor):
    """Recovered with its biases, no query overflowing, within ``factor`` of the floor (the
    error of W from the weights rounded to the format). Measured (seed 1): W to 3.3e-4
    (onnxruntime float16, 1.16x its floor 2.9e-4; the issue's goal is 2x), 5.4e-4 (ours in
    float16, which rounds every operation: 1.9x), 4.1e-3 (bfloat16, 1.84x its floor 2.2e-3;
    the goal is 1.5x, met on MiniLM heads at d = 384), see
    docs/notes/2026-11-27-served.md."""
    box = (ModuleBlackBox(layer_ckpt, 0, 2, precision=precision) if engine == "ours"
           else module_box(layer_ckpt, 0, 2, precision))
    oracle = ValueOracle(box, D)
    est = LowPrecisionValueQueryLearner(n_queries=units(q), random_state=1,
                                        fit_bias=True).fit(oracle)
    eW, ev, ec = _errors(est, _truth(layer_ckpt, 2))
    assert oracle.n_queries <= units(q)
    floor = floor_W(layer_ckpt, 2, precision)
    assert 0 < floor < eW <= factor * floor, (eW, floor)
    assert ev <= 3 * floor and ec <= 3 * factor * floor
    assert est.n_overflow_ == 0
    assert est.rank_ == 8
    # within two of its format's floors (measured at most 1.43; refused beyond 4)
    assert est.answer_format_ == precision and not est.noise_above_format_
    assert est.noise_level_ <= 2 * est.noise_floor_


def _soft_capped64():
    return soft_capped(random_head(64, 1, key_bias=0.5, offset=0.3))


UNITS64 = 3 * (64 * 64 + 2 * 64 + 1)


def test_soft_capped_float32_head_is_refused_by_its_noise():
    """Scores soft-capped to ``5 tanh(s / 5)`` in float32 are not a head. Their misfit shows as
    noise: measured 6.5e-3 relative (1.4e4 of float32's floor at d = 64), which once widened
    the check's tolerance until the box passed (function off by 0.67 on Gaussian tokens). The
    answers are float32 values, so that noise is judged against float32's rounding and the box
    refused before the check."""
    est = LowPrecisionValueQueryLearner(n_queries=UNITS64, random_state=0, fit_bias=True)
    with pytest.raises(ModelMismatchError, match="float32 values") as info:
        est.fit(ValueOracle(_soft_capped64(), 64))
    assert est.answer_format_ == "float32"
    assert est.noise_floor_ == rounding_floor("float32", 64)
    assert est.noise_level_ > 1e3 * est.noise_floor_
    assert info.value.allowed == NOISE_FORMAT_FACTOR * est.noise_floor_
    assert info.value.error == est.noise_level_
    assert est.n_queries_by_stage_["verify"] == 0  # refused before the check


def test_declared_noisy_answers_warn_instead():
    """``noise="measured"`` declares answers noisier than their format: the learner warns by
    name, records it and goes on with the noise it measured (whose tolerance passes the
    soft-capped box, as every box did before the noise was judged)."""
    est = LowPrecisionValueQueryLearner(n_queries=UNITS64, random_state=0, fit_bias=True,
                                        noise="measured")
    with pytest.warns(NoiseAboveFormatWarning, match="float32 values"):
        est.fit(ValueOracle(_soft_capped64(), 64))
    assert est.noise_above_format_ and est.answer_format_ == "float32"
    assert est.verify_error_ > 1e3 * est.noise_floor_
    with pytest.raises(ConfigError, match="noise"):
        LowPrecisionValueQueryLearner(n_queries=UNITS64, noise="declared").fit(
            ValueOracle(_soft_capped64(), 64))


def test_noise_of_the_box_is_judged_in_float32_answers_only():
    """Relative noise 1e-5 put on a head's answers: in float64 answers (a box that adds noise,
    no format to judge it by) the fit goes on as before; the same answers rounded to float32
    carry 25 times float32's floor at d = 16 (measured 5.9e-6 in both) and are refused unless
    declared."""
    h = random_head(16, 3, rank=4, key_bias=0.5, offset=0.3)
    noisy = relative_noise(h, 1e-5)

    def fit(box, **kw):
        return LowPrecisionValueQueryLearner(n_queries=3000, random_state=0, fit_bias=True,
                                             **kw).fit(ValueOracle(box, 16))

    est = fit(noisy)
    assert est.answer_format_ == "float64" and est.noise_floor_ is None
    assert not est.noise_above_format_ and est.noise_level_ > 1e-6
    with pytest.raises(ModelMismatchError, match="float32 values"):
        fit(in_dtype(noisy, np.float32))
    with pytest.warns(NoiseAboveFormatWarning):
        assert fit(in_dtype(noisy, np.float32), noise="measured").noise_above_format_


def test_two_heads_are_refused():
    a = random_head(12, 1, key_bias=0.3, offset=0.2)
    b = random_head(12, 2, key_bias=0.3)
    box = MultiHeadAttention([a, b], precision="float32")
    with pytest.raises((ModelMismatchError, AssumptionViolation)):
        LowPrecisionValueQueryLearner(n_queries=2000, random_state=0,
                                      fit_bias=True).fit(ValueOracle(box, 12))


@pytest.fixture(scope="module")
def ckpt64(tmp_path_factory):
    return write_test_checkpoint(tmp_path_factory.mktemp("served64") / "model.safetensors",
                                 n_layers=1, n_heads=4, d=64, seed=7)


def _fit64(box, q):
    oracle = ValueOracle(box, 64)
    est = LowPrecisionValueQueryLearner(n_queries=int(q * (64 * 64 + 2 * 64 + 1)),
                                        random_state=0, fit_bias=True)
    return est.fit(oracle), oracle


def test_query_bias_cancelled_where_the_rank_allows(ckpt64):
    """At d = 64 (rank 16, below the 48 rows measured first) and 10 (d^2 + 2d + 1) queries the
    shift of every probe is moved until ``W z + c = 0`` (measured: 3.1e-8 of |c|) with
    ``z^T v = -beta`` kept (4.5e-9), and W is measured from both sides of its rank-16 sketch:
    W to 1.5e-7, c to 1.4e-7, v to 4.2e-8 (float32). At 5 units the budget does not pay for
    it: z stays ``-beta v / |v|^2``, which leaves ``W z + c`` of the size of c."""
    from attnquery.learners import lowprecision

    h = _truth(ckpt64, 2)
    est, oracle = _fit64(ModuleBlackBox(ckpt64, 0, 2, precision="float32"), 10)
    sizes = lowprecision._CANCEL_SIZES
    assert est.query_bias_cancelled_ and est.sketch_
    assert sizes[0] / 2 <= est.answer_size_ <= 2 * sizes[-1]
    assert est.entry_logit_ in lowprecision._SKETCH_LOGITS
    z = est.shift_
    assert np.linalg.norm(h.W @ z + h.key_bias) <= 1e-6 * np.linalg.norm(h.key_bias)
    assert abs(z @ h.v + h.offset) <= 1e-6 * abs(h.offset)
    eW, ev, ec = _errors(est, h)
    assert eW <= 2.5e-7 and ec <= 2.5e-7 and ev <= 1e-7
    assert est.rank_ == 16 and oracle.n_queries <= 10 * (64 * 64 + 2 * 64 + 1)
    small, _ = _fit64(ModuleBlackBox(ckpt64, 0, 2, precision="float32"), 5)
    assert not small.query_bias_cancelled_ and small.answer_size_ is None and not small.sketch_
    assert np.linalg.norm(h.W @ small.shift_ + h.key_bias) > 0.1 * np.linalg.norm(h.key_bias)


def test_sketch_is_exact_on_an_exact_box():
    """The sketch's ``W = Z' (B Z')^+ Y`` holds for any rank-r W whatever the row space and
    the basis B it was measured along: a float64 head (d = 64, rank 16, biases) is recovered
    to float64 rounding through it (measured 2.9e-15 on W)."""
    h = random_head(64, 3, rank=16, key_bias=0.5, offset=0.3)
    est, _ = _fit64(h, 10)
    assert est.sketch_ and est.rank_ == 16
    eW, ev, ec = _errors(est, h)
    assert eW <= 1e-12 and ev <= 1e-12 and ec <= 1e-12


def test_two_heads_are_refused_where_the_query_bias_would_be_cancelled():
    a = random_head(64, 1, rank=8, key_bias=0.3, offset=0.2)
    b = random_head(64, 11, rank=8, key_bias=0.3)
    with pytest.raises((ModelMismatchError, AssumptionViolation)):
        _fit64(MultiHeadAttention([a, b], precision="float32"), 8)


def test_narrow_formats_keep_the_entry_by_entry_passes(ckpt64):
    """The sketch is used where the answers are float32's or finer: in bfloat16 the query bias
    is cancelled as before but W is measured entry by entry (the sketch made some MiniLM heads
    worse there, docs/notes/2026-11-27-served.md)."""
    box = ModuleBlackBox(ckpt64, 0, 2, precision="bfloat16")
    est, _ = _fit64(box, 12)
    assert est.query_bias_cancelled_ and not est.sketch_ and est.entry_logit_ is None
    eW, _, _ = _errors(est, _truth(ckpt64, 2))
    floor = floor_W(ckpt64, 2, "bfloat16")
    assert floor < eW <= 2.5 * floor, (eW, floor)
