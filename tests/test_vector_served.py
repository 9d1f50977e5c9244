"""VectorLayerLearner on served answers (float32 and float16 through onnxruntime, bfloat16
emulated): its served route, ServedVectorLearner, against the true W, c, V and beta in units of
the format's rounding floor, and refused by name where the box is not such a head."""

import numpy as np
import pytest

from attnquery import engines
from attnquery.errors import (
    AnswerError,
    BudgetExceededError,
    ConfigError,
    ModelMismatchError,
    NoiseAboveFormatWarning,
)
from attnquery.learners import VectorLayerLearner
from attnquery.learners.vector.served import (
    TIGHT_SHRINK,
    TIGHT_SPLIT,
    VERIFY_UNITS,
    WIDE_SPLIT,
    ServedVectorLearner,
)
from attnquery.models.vector import random_vector_layer
from attnquery.oracles import VectorOracle
from attnquery.precision import round_to, rounding_floor
from attnquery.realheads import write_test_checkpoint

from .vector_boxes import Layer

#: the issue's goal for float16 and bfloat16: within 3 times the format's floor
FLOORS = 3.0


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def served(d, precision, outputs="all", seed=5, n_heads=1, **options):
    """The served box and the float64 layer it rounds."""
    exact = random_vector_layer(d, n_heads, seed=seed, bias=0.5, outputs=outputs, **options)
    layer = random_vector_layer(d, n_heads, seed=seed, bias=0.5, outputs=outputs,
                                precision=precision, **options)
    return engines.vector_box(layer, precision, outputs), exact


@pytest.mark.parametrize("precision, outputs", [
    ("float32", "all"), ("float32", "last"), ("float16", "all"), ("float16", "last"),
    ("bfloat16", "all"), ("bfloat16", "last"),
])
def test_single_head_within_three_format_floors(precision, outputs):
    d = 16
    box, exact = served(d, precision, outputs)
    oracle = VectorOracle(box, d, outputs=outputs)
    est = VectorLayerLearner(random_state=0).fit(oracle)
    assert isinstance(est.served_, ServedVectorLearner) and est.answer_format_ == precision
    floor = rounding_floor(precision, d)
    assert est.noise_floor_ == floor and est.noise_level_ <= floor
    assert rel(est.W_[0], exact.head_W()[0]) < FLOORS * floor
    assert rel(est.V_[0], exact.value_maps()[0]) < FLOORS * floor
    assert np.max(np.abs(est.key_bias_[0] - exact.key_bias()[0])) < FLOORS * floor
    assert np.max(np.abs(est.output_bias_ - exact.output_bias)) < FLOORS * floor
    X = np.random.default_rng(1).standard_normal((8, 16, d)) / np.sqrt(d)
    assert rel(est.predict(X), exact(X)) < FLOORS * floor
    assert est.verify_error_ <= est.served_._verify_tol()
    assert est.n_queries_ == oracle.n_queries == sum(est.n_queries_by_stage_.values())
    assert est.n_tokens_ == oracle.n_tokens


def test_float64_answers_stay_on_the_float64_route():
    d = 8
    est = VectorLayerLearner(random_state=0).fit(VectorOracle(random_vector_layer(d, 1, seed=3), d))
    assert est.served_ is None and not hasattr(est, "answer_format_")
    assert est.n_queries_by_stage_["V"] == d + 1


def test_served_learner_alone_matches_the_dispatch():
    d = 16
    box, exact = served(d, "float32")
    direct = ServedVectorLearner(random_state=0).fit(VectorOracle(box, d))
    routed = VectorLayerLearner(random_state=0).fit(VectorOracle(box, d))
    # the dispatch asks the float64 route's d + 1 one-token queries first, then the same fit
    assert routed.n_queries_ == direct.n_queries_ + d + 1
    assert rel(direct.W_[0], exact.head_W()[0]) < 3 * rounding_floor("float32", d)


def test_float32_layer_of_heads_that_fill_d():
    d, H = 16, 2
    box, exact = served(d, "float32", n_heads=H, head_dim=d // H)
    est = VectorLayerLearner(n_heads=H, random_state=0).fit(VectorOracle(box, d))
    W, V = exact.head_W(), exact.value_maps()
    order = [int(np.argmin([rel(est.V_[h], V[g]) for g in range(H)])) for h in range(H)]
    assert sorted(order) == list(range(H))
    for h, g in enumerate(order):  # the float32 goal, 1e-5
        assert rel(est.W_[h], W[g]) < 1e-5 and rel(est.V_[h], V[g]) < 1e-5
    X = np.random.default_rng(1).standard_normal((8, 16, d)) / np.sqrt(d)
    assert rel(est.predict(X), exact(X)) < 1e-5


def two_heads(d, precision):
    return random_vector_layer(d, 2, seed=8, head_dim=d, bias=0.3, precision=precision)


@pytest.mark.parametrize("box, match", [
    (lambda d: two_heads(d, "float32"), "not a single attention head"),
    (lambda d: random_vector_layer(d, 1, seed=9, softcap=1.0, precision="float32"),
     "not a single head as declared"),
    (lambda d: random_vector_layer(d, 1, seed=9, rope_base=100.0, precision="float32"),
     "not a single head as declared"),
    (lambda d: random_vector_layer(d, 1, seed=9, rope_base=10000.0, precision="float32"),
     "not a single head as declared"),
    (lambda d: random_vector_layer(d, 1, seed=9, softcap=5.0, precision="float16"),
     "not a single head as declared"),
])
def test_served_boxes_that_are_not_a_single_head_are_refused(box, match):
    d = 16
    with pytest.raises(ModelMismatchError, match=match) as info:
        VectorLayerLearner(random_state=0).fit(VectorOracle(box(d), d))
    assert info.value.error > info.value.allowed


def noisy_float32(d, level):
    """A float32 head whose answers carry relative noise ``level`` of their own, rounded to
    float32 again (a box noisier than its format)."""
    layer = random_vector_layer(d, 1, seed=5, bias=0.5, precision="float32")
    rng = np.random.default_rng(0)

    def box(X):
        y = layer(X)
        return round_to(y + level * np.max(np.abs(y)) * rng.standard_normal(y.shape), "float32")
    return box


def test_noise_beyond_the_format_is_refused_or_declared():
    d = 16
    with pytest.raises(ModelMismatchError, match="noise='measured'") as info:
        VectorLayerLearner(random_state=0).fit(VectorOracle(noisy_float32(d, 1e-4), d))
    assert info.value.error > info.value.allowed
    with pytest.warns(NoiseAboveFormatWarning):
        est = ServedVectorLearner(noise="measured", random_state=0).fit(
            VectorOracle(noisy_float32(d, 1e-5), d))
    assert est.noise_above_format_ and est.noise_unit_ == est.noise_level_


def test_budget_and_bad_parameters_before_queries():
    d = 16
    box, _ = served(d, "float32")
    small = VectorOracle(box, d, budget=4 * d)
    with pytest.raises(BudgetExceededError, match="value stage"):
        ServedVectorLearner(random_state=0).fit(small)
    assert small.n_queries == 0
    with pytest.raises(ConfigError, match="noise must be one of"):
        ServedVectorLearner(noise="loud").fit(VectorOracle(box, d))
    few = VectorOracle(box, d)
    with pytest.raises(ConfigError, match=r"n_attention_queries=2 queries of \d+ tokens"):
        ServedVectorLearner(n_attention_queries=2, random_state=0).fit(few)
    assert few.n_queries == 0  # refused before the first query
    with pytest.raises(BudgetExceededError, match=r"n_queries=100\b"):
        ServedVectorLearner(n_queries=100, random_state=0).fit(few)
    assert few.n_queries == 0  # the whole fit's cap: refused before the first query too


def narrow_layer(d, n_heads, precision, outputs="all", seed=1, engine=True, **options):
    """A layer of heads that fill d with biases 0.3 in float16 or bfloat16, served by
    ``engines.vector_box`` (``engine``: float16 through onnxruntime) or by the layer's own
    arithmetic (float16 scores computed, and overflowing, in float16), and its float64 twin."""
    draw = {"head_dim": d // n_heads, "bias": 0.3, "outputs": outputs, **options}
    exact = random_vector_layer(d, n_heads, seed=seed, **draw)
    layer = random_vector_layer(d, n_heads, seed=seed, precision=precision, **draw)
    return (engines.vector_box(layer, precision, outputs) if engine else layer), exact


def assert_layer_within_floors(est, exact, floor, d):
    """Every head's W, V and c (matched by V), beta and the function on 1 to 64 tokens within
    FLOORS format floors of the float64 layer."""
    H = exact.n_heads
    W, V, c = exact.head_W(), exact.value_maps(), exact.key_bias()
    order = [int(np.argmin([rel(est.V_[h], V[g]) for g in range(H)])) for h in range(H)]
    assert sorted(order) == list(range(H))
    for h, g in enumerate(order):
        assert rel(est.W_[h], W[g]) < FLOORS * floor
        assert rel(est.V_[h], V[g]) < FLOORS * floor
        assert np.max(np.abs(est.key_bias_[h] - c[g])) < FLOORS * floor * np.max(np.abs(c[g]))
    assert rel(est.output_bias_, exact.output_bias) < FLOORS * floor
    rng = np.random.default_rng(1)
    for N in (1, 8, 64):
        X = rng.standard_normal((8, N, d)) / np.sqrt(d)
        assert rel(est.predict(X), exact(X)) < FLOORS * floor


@pytest.mark.parametrize("precision, outputs", [("float16", "all"), ("bfloat16", "last")])
def test_narrow_layer_of_two_heads_within_three_format_floors(precision, outputs):
    """float16 (onnxruntime) and bfloat16 layers of 2 heads at d = 16: the split's key scale
    is one the format holds (300, not 1e10), and every head within 3 floors (measured 0.5 to 1.5
    floors; docs/notes/2026-11-27-vector-lowprecision-layers.md)."""
    d, H = 16, 2
    box, exact = narrow_layer(d, H, precision, outputs)
    oracle = VectorOracle(box, d, outputs=outputs)
    est = VectorLayerLearner(n_heads=H, random_state=0).fit(oracle)
    assert est.answer_format_ == precision and est.split_key_scale_ == WIDE_SPLIT["key_scale"]
    assert_layer_within_floors(est, exact, rounding_floor(precision, d), d)
    assert est.n_queries_ == oracle.n_queries == sum(est.n_queries_by_stage_.values())


def test_float16_layer_whose_scores_overflow_takes_the_tight_split():
    """A float16 layer computing its scores in float16 answers NaN to the wide split's tokens
    (their self-scores pass 65504): the split falls back to the tight key scale and the layer
    is still within 3 floors."""
    d, H = 16, 2
    box, exact = narrow_layer(d, H, "float16", engine=False)
    keys = np.random.default_rng(0).standard_normal((8, 1, d)) / np.sqrt(d)
    wide = np.concatenate([WIDE_SPLIT["key_scale"] * keys, np.zeros((8, 1, d))], axis=1)
    assert not np.all(np.isfinite(box(wide)))
    est = VectorLayerLearner(n_heads=H, random_state=0).fit(VectorOracle(box, d))
    assert est.split_key_scale_ == TIGHT_SPLIT["key_scale"]
    assert_layer_within_floors(est, exact, rounding_floor("float16", d), d)


@pytest.mark.parametrize("limit, refused", [(45.0, False), (15.0, True)])
def test_float16_box_overflowing_at_the_tight_split_takes_a_shrunk_one(limit, refused):
    """A float16 box that answers NaN to any query with a token beyond norm 45 (the tight
    split asks tokens of norm about 47): the split starts again with its lengths shrunk
    (TIGHT_SHRINK) and the layer is within 3 floors; one that overflows beyond norm 15 (past
    the smallest shrink's tokens) is refused by name."""
    d, H = 16, 2
    layer, exact = narrow_layer(d, H, "float16", engine=False)

    def box(X):
        big = np.linalg.norm(X, axis=2).max(axis=1) > limit
        return np.where(big[:, None, None], np.nan, layer(X))

    est = VectorLayerLearner(n_heads=H, random_state=0, check_length=64)
    if refused:
        with pytest.raises(AnswerError, match="non-finite"):
            est.fit(VectorOracle(box, d))
        return
    est.fit(VectorOracle(box, d))
    assert est.split_key_scale_ in [f * TIGHT_SPLIT["key_scale"] for f in TIGHT_SHRINK]
    assert_layer_within_floors(est, exact, rounding_floor("float16", d), d)


@pytest.mark.parametrize("precision, seed, split", [
    ("float16", 0, TIGHT_SPLIT), ("bfloat16", 3, WIDE_SPLIT)])
def test_narrow_layer_of_four_heads_d16_whose_patterns_need_reading_again(precision, seed,
                                                                          split):
    """4 heads of 4 at d = 16, refused before (a head's parts span more than d / H): in
    float16 with scores in float16 (the tight split, crossings wide against their spacing)
    the line's jumps and the approximate projectors misread some points' patterns; in
    bfloat16 one refined difference's patterns were read consistently with two heads mixed.
    The split now checks the line's jumps at random points, reads each difference's patterns
    again against its own parts and leaves out differences that do not fit: within 3 floors.
    A short check keeps it fast."""
    d, H = 16, 4
    box, exact = narrow_layer(d, H, precision, seed=seed, engine=precision == "bfloat16")
    est = VectorLayerLearner(n_heads=H, random_state=0, check_length=64).fit(
        VectorOracle(box, d))
    assert est.split_key_scale_ == split["key_scale"]
    assert_layer_within_floors(est, exact, rounding_floor(precision, d), d)


@pytest.mark.parametrize("precision, box, match", [
    ("float16", lambda p: narrow_layer(16, 2, p, head_dim=16)[0], "do not fill d"),
    ("bfloat16", lambda p: narrow_layer(16, 4, p)[0], "another number of heads"),
    ("bfloat16", lambda p: narrow_layer(16, 2, p, softcap=1.0)[0], "another number of heads"),
    ("bfloat16", lambda p: narrow_layer(16, 2, p, rope_base=100.0, engine=False)[0],
     "not a single head as declared"),
])
def test_narrow_boxes_that_are_not_such_a_layer_are_refused(precision, box, match):
    """Two heads that do not fill d, four heads declared as two, soft-capped logits: refused by
    the split by name; rotary heads declared without positions: by the check (10 floors)."""
    with pytest.raises(ModelMismatchError, match=match) as info:
        VectorLayerLearner(n_heads=2, random_state=0).fit(VectorOracle(box(precision), 16))
    assert info.value.error > info.value.allowed


@pytest.mark.slow  # about 20 s each on a busy 2-core machine
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_narrow_layer_of_four_heads_d32(precision):
    """4 heads of 8 at d = 32 (about 14,000 queries): within 3 floors (measured W 1.1, V 0.9,
    function 0.6 to 1.0 floors)."""
    d, H = 32, 4
    box, exact = narrow_layer(d, H, precision, seed=2)
    est = VectorLayerLearner(n_heads=H, random_state=0).fit(VectorOracle(box, d))
    assert_layer_within_floors(est, exact, rounding_floor(precision, d), d)


@pytest.mark.slow  # 15 s on an idle 2-core machine, 2 minutes on a busy one
def test_float32_layer_beyond_the_dense_least_squares_d96():
    """6 heads of 16 at d = 96 in float32 (the split, the value maps from the parts of d key
    differences and the shared-token route under rounding, refined over every row and fitted to
    the answers): W within 5e-7 and V within 1e-6, well inside the issue's float32 goal (1e-5)
    (measured W 1.9e-7, V 2.2e-7, function 7.5e-8 from 7,064 queries; without the fit to the
    answers W 8.4e-7, without either refinement 5.6e-6 from 4,594; before the maps were read
    from the parts and the groups grew, W 2.4e-5 and V 3.0e-6)."""
    d, H = 96, 6
    layer = random_vector_layer(d, H, seed=22, head_dim=16, bias=0.3, precision="float32")
    exact = random_vector_layer(d, H, seed=22, head_dim=16, bias=0.3)
    oracle = VectorOracle(engines.vector_box(layer, "float32", "all"), d)
    est = VectorLayerLearner(n_heads=H, random_state=0).fit(oracle)
    assert est.attention_route_ == "shared" and est.route_ == "served"
    assert est.n_queries_ <= 20_000
    W, V = exact.head_W(), exact.value_maps()
    order = [int(np.argmin([rel(est.V_[h], V[g]) for g in range(H)])) for h in range(H)]
    assert sorted(order) == list(range(H))
    assert max(rel(est.V_[h], V[g]) for h, g in enumerate(order)) < 1e-6
    assert max(rel(est.W_[h], W[g]) for h, g in enumerate(order)) < 5e-7
    assert est.refine_iterations_ > 0
    X = np.random.default_rng(1).standard_normal((8, 16, d)) / np.sqrt(d)
    assert rel(est.predict(X), exact(X)) < 3e-7


def test_float32_split_of_12_heads_at_d192_reads_parts_in_the_output_frame():
    """The split alone (the true summed value map given) of 12 float32 heads of 16 at d = 192,
    read in the answers' own frame from 3 (dh + 1) key differences, the maps then from the
    parts of d more: every head's V within 1e-6 (measured 3.7e-7; in ``V_sum^+``'s frame its 0/1
    patterns were off by 0.25)."""
    from attnquery.learners.vector import _split as split

    d, H = 192, 12
    box, V, beta, tols = split_case(d, H)
    oracle = VectorOracle(box, d)
    assert tols.output_frame and tols.spread > 1
    Vh = split.split_values(oracle, V.sum(0), beta, H, np.random.default_rng(0), tols)
    assert oracle.n_queries <= split.split_queries(d, H, tols)
    errors = [min(rel(Vh[h], V[g]) for g in range(H)) for h in range(H)]
    assert max(errors) < 1e-6


def split_case(d, H, seed=22):
    """A float32 layer of H heads that fill d, its true value maps and offset, and the served
    route's split tolerances."""
    from attnquery.learners.vector.served import ServedVectorLearner as Served

    layer = random_vector_layer(d, H, seed=seed, head_dim=d // H, bias=0.3, precision="float32")
    exact = random_vector_layer(d, H, seed=seed, head_dim=d // H, bias=0.3)
    est = Served(n_heads=H)
    est.noise_unit_, est.outputs_ = rounding_floor("float32", d), "all"
    return (engines.vector_box(layer, "float32", "all"), exact.value_maps(),
            exact(np.zeros((1, 1, d)))[0, 0], est._split_tolerances())


def test_float32_value_maps_from_parts_do_not_inherit_the_summed_maps_error():
    """The served split reads every head's V from the exact parts of d key differences
    (``values_from_parts``): given a summed value map off by 1e-4 (relative, per entry), the
    maps cut from it along the projectors are off by about as much (measured 9e-4), those read
    from the parts stay at the answers' rounding (measured 1.6e-7)."""
    from attnquery.learners.vector import _split as split

    d, H = 32, 4
    box, V, beta, tols = split_case(d, H)
    assert tols.values_from_parts
    V_sum = V.sum(0) * (1 + 1e-4 * np.random.default_rng(3).standard_normal((d, d)))
    errors = {}
    for parts in (False, True):
        oracle = VectorOracle(box, d)
        t = tols._replace(values_from_parts=parts)
        Vh = split.split_values(oracle, V_sum, beta, H, np.random.default_rng(0), t)
        assert oracle.n_queries <= split.split_queries(d, H, t)
        errors[parts] = max(min(rel(Vh[h], V[g]) for g in range(H)) for h in range(H))
    assert errors[False] > 1e-5 and errors[True] < 1e-6


def test_value_maps_from_parts_refuse_maps_of_another_layer():
    from attnquery.learners.vector import _split as split

    d, H = 32, 4
    box, _, beta, tols = split_case(d, H)
    other = random_vector_layer(d, H, seed=23, head_dim=d // H, bias=0.3).value_maps()
    with pytest.raises(ModelMismatchError, match="no 0/1 combinations") as info:
        split.values_from_parts(VectorOracle(box, d), other, beta, np.random.default_rng(0),
                                tols)
    assert info.value.error > info.value.allowed


def test_float32_layer_example_prints_what_it_measured(repo, capsys, tmp_path):
    """examples/vector_float32_layer.py (the command of the MiniLM-size layer's benchmark row)
    at d = 16, 2 heads: its printed errors are the fit's against the float64 layer."""
    import importlib
    import sys

    sys.path.insert(0, str(repo))
    try:
        ex = importlib.import_module("examples.vector_float32_layer")
    finally:
        sys.path.remove(str(repo))
    ex.main(["--d", "16", "--heads", "2"])
    out = capsys.readouterr().out
    errors = {line.split(":")[0]: float(line.split()[3]) for line in out.splitlines()
              if line[:2] in ("W:", "V:", "c:")}
    assert set(errors) == {"W", "V", "c"}
    assert all(0 < e < 1e-6 for e in errors.values())
    with pytest.raises(SystemExit):
        ex.main(["--d", "16", "--heads", "3"])
    # a checkpoint's layer (4 heads of 4 at d = 16), served the same way
    path = write_test_checkpoint(tmp_path / "model.safetensors", n_layers=2, n_heads=4, d=16,
                                 seed=3)
    ex.main(["--checkpoint", str(path), "--layer", "1"])
    out = capsys.readouterr().out
    assert out.startswith("d = 16, 4 heads of 4")
    assert float(out.split("W: worst head ")[1].split()[0]) < 1e-6
    with pytest.raises(SystemExit, match="layers 0 to 1"):
        ex.main(["--checkpoint", str(path), "--layer", "2"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_soft_capped_layer_with_noise_is_refused_by_its_check(seed):
    """Logits soft-capped to ``100 tanh(z / 100)`` and Gaussian noise 5e-6 on every answer
    entry (float64 answers: no format to judge the noise by; the served route measures it):
    on check tokens of norm 1 the estimate was 4.4 to 7.8 units of that noise off, within the
    check's 10, and returned 3e-4 to 1e-3 off on 64 tokens; on tokens of norm VERIFY_SCALE the
    cap shows, 430 to 1,650 units off. The same box without the cap passes (0.87 to 1.06
    units) and is right to 0.17 to 0.31 units on 64 tokens."""
    d = 16
    box = Layer(d, 1, seed=seed, base=None, causal=False, outputs="last", scale=2.0,
                softcap=100.0, noise=5e-6)
    est = ServedVectorLearner(n_heads=1, random_state=seed)
    with pytest.raises(ModelMismatchError, match="differ from the box's") as err:
        est.fit(VectorOracle(box, d, outputs="last"))
    assert err.value.error > 10 * err.value.allowed and est.answer_format_ == "float64"
    plain = Layer(d, 1, seed=seed, base=None, causal=False, outputs="last", scale=2.0,
                  noise=5e-6)
    est = ServedVectorLearner(n_heads=1, random_state=seed).fit(
        VectorOracle(plain, d, outputs="last"))
    X = np.random.default_rng(3).standard_normal((50, 64, d)) / np.sqrt(d)
    truth = Layer(d, 1, seed=seed, base=None, causal=False, outputs="last", scale=2.0)
    assert est.verify_error_ <= VERIFY_UNITS * est.noise_unit_
    assert rel(est.predict(X), truth(X)) < est.noise_unit_  # measured 0.17 to 0.31 units


def test_the_route_parameter_picks_the_served_route_or_refuses_it():
    """route="served" fits the served route from the first query: the same estimate as "auto"
    hands over after its d + 1 float64 one-token queries, which it does not ask; "float64"
    reads the float32 answers as float64 ones, and its check refuses them by name."""
    d = 8
    box, exact = served(d, "float32")
    auto_oracle, served_oracle = VectorOracle(box, d), VectorOracle(box, d)
    auto = VectorLayerLearner(random_state=0).fit(auto_oracle)
    direct = VectorLayerLearner(route="served", random_state=0).fit(served_oracle)
    assert auto.route_ == direct.route_ == "served"
    assert isinstance(direct.served_, ServedVectorLearner)
    for name in ("W_", "key_bias_", "V_", "output_bias_"):
        np.testing.assert_array_equal(getattr(direct, name), getattr(auto, name), err_msg=name)
    assert direct.n_queries_ == served_oracle.n_queries == auto.n_queries_ - (d + 1)
    assert rel(direct.W_[0], exact.head_W()[0]) < FLOORS * rounding_floor("float32", d)
    with pytest.raises(ModelMismatchError):
        VectorLayerLearner(route="float64", random_state=0).fit(VectorOracle(box, d))
