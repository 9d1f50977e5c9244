"""VectorLayerLearner on served answers (float32 and float16 through onnxruntime, bfloat16
emulated): its served route, ServedVectorLearner, against the true W, c, V and beta in units of
the format's rounding floor, and refused by name where the box is not such a head."""

import numpy as np
import pytest

from attnquery import engines
from attnquery.errors import (
    BudgetExceededError,
    ConfigError,
    ModelMismatchError,
    NoiseAboveFormatWarning,
)
from attnquery.learners import VectorLayerLearner
from attnquery.learners.vector_served import ServedVectorLearner
from attnquery.oracles import VectorOracle
from attnquery.precision import round_to, rounding_floor
from attnquery.vector_models import random_vector_layer

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
    with pytest.raises(ConfigError, match="n_queries=2 queries of 4 tokens"):
        ServedVectorLearner(n_queries=2, random_state=0).fit(few)
    assert few.n_queries == 8 * (d + 1)  # the value stage only


def test_narrow_layers_are_refused_by_name():
    d = 16
    box, _ = served(d, "float16", n_heads=2, head_dim=d // 2)
    with pytest.raises(ConfigError, match="layers of several heads are read from float32"):
        VectorLayerLearner(n_heads=2, random_state=0).fit(VectorOracle(box, d))


@pytest.mark.slow  # 15 s on an idle 2-core machine, 2 minutes on a busy one
def test_float32_layer_beyond_the_dense_least_squares_d96():
    """6 heads of 16 at d = 96 in float32 (the split, the value maps from the parts of d key
    differences and the shared-token route under rounding): W and V within the issue's float32
    goal, 1e-5 (measured W 5.6e-6, V 2.2e-7; before the maps were read from the parts and the
    groups grew, W 2.4e-5 and V 3.0e-6)."""
    d, H = 96, 6
    layer = random_vector_layer(d, H, seed=22, head_dim=16, bias=0.3, precision="float32")
    exact = random_vector_layer(d, H, seed=22, head_dim=16, bias=0.3)
    oracle = VectorOracle(engines.vector_box(layer, "float32", "all"), d)
    est = VectorLayerLearner(n_heads=H, random_state=0).fit(oracle)
    assert est.route_ == "shared" and est.n_queries_ <= 20_000
    W, V = exact.head_W(), exact.value_maps()
    order = [int(np.argmin([rel(est.V_[h], V[g]) for g in range(H)])) for h in range(H)]
    assert sorted(order) == list(range(H))
    assert max(rel(est.V_[h], V[g]) for h, g in enumerate(order)) < 1e-6
    assert max(rel(est.W_[h], W[g]) for h, g in enumerate(order)) < 1e-5
    X = np.random.default_rng(1).standard_normal((8, 16, d)) / np.sqrt(d)
    assert rel(est.predict(X), exact(X)) < 1e-5


def test_float32_split_of_12_heads_at_d192_reads_parts_in_the_output_frame():
    """The split alone (the true summed value map given) of 12 float32 heads of 16 at d = 192,
    read in the answers' own frame from 3 (dh + 1) key differences, the maps then from the
    parts of d more: every head's V within 1e-6 (measured 3.7e-7; in ``V_sum^+``'s frame its 0/1
    patterns were off by 0.25)."""
    from attnquery.learners import _vector_split as split

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
    from attnquery.learners.vector_served import ServedVectorLearner as Served

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
    from attnquery.learners import _vector_split as split

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
    from attnquery.learners import _vector_split as split

    d, H = 32, 4
    box, _, beta, tols = split_case(d, H)
    other = random_vector_layer(d, H, seed=23, head_dim=d // H, bias=0.3).value_maps()
    with pytest.raises(ModelMismatchError, match="no 0/1 combinations") as info:
        split.values_from_parts(VectorOracle(box, d), other, beta, np.random.default_rng(0),
                                tols)
    assert info.value.error > info.value.allowed
