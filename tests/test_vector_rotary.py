"""RotaryVectorLearner: a rotary head with biases from vector answers."""

import math

import numpy as np
import pytest

from attnquery.errors import ConfigError, ModelMismatchError
from attnquery.learners.vector import rotary as vr
from attnquery.learners.vector.rotary import RotaryVectorLearner
from attnquery.models import rotate_half
from attnquery.models.vector import random_vector_layer
from attnquery.oracles import ValueOracle, VectorOracle

D = 8
#: the goal: the estimate's function to this (relative) on fresh queries of 1 to 512 tokens
FUNCTION_TOL = 1e-9
#: form queries' longest offset for boxes that answer every token's output
ALL_OFFSET = 512


def rotary_head(outputs="last", causal=True, seed=1, **options):
    return random_vector_layer(D, 1, seed=seed, bias=0.3, causal=causal, outputs=outputs,
                               rope_base=options.pop("rope_base", 10000.0), **options)


def fit(layer, **params):
    oracle = VectorOracle(layer, D, outputs=layer.outputs)
    return RotaryVectorLearner(random_state=0, **params).fit(oracle), oracle


def true_logit(layer, xk, i, xq, n):
    k = rotate_half((layer.W_K[0] @ xk + layer.b_K[0])[None], np.array([float(i)]),
                    layer.frequencies)[0]
    q = rotate_half((layer.W_Q[0] @ xq + layer.b_Q[0])[None], np.array([float(n)]),
                    layer.frequencies)[0]
    return layer.scale * q @ k


@pytest.mark.parametrize("outputs", ["last", "all"])
def test_a_causal_rotary_head_with_biases_is_recovered(outputs):
    layer = rotary_head(outputs)
    # every token's outputs of 4096-token queries cost the box N^2: shorter form queries
    est, oracle = fit(layer, check_length=ALL_OFFSET if outputs == "all" else 4096)
    np.testing.assert_allclose(est.V_, layer.value_maps()[0], atol=1e-14)
    np.testing.assert_allclose(est.output_bias_, layer.output_bias, atol=1e-14)
    np.testing.assert_array_equal(est.frequencies_, layer.frequencies)
    assert est.verify_error_ <= vr.VERIFY_RTOL
    rng = np.random.default_rng(7)
    for N in (1, 2, 5, 64, 512):
        X = rng.standard_normal((2, N, D)) / np.sqrt(D)
        O = layer(X)
        assert np.max(np.abs(est.predict(X) - O)) <= FUNCTION_TOL * np.max(np.abs(O))
    # queries: d + 1 one-token queries, every key set with every probe, the check
    unknowns = (2 * est.frequencies_.size + 1) * (D + 1)
    key_sets = math.ceil(vr.OVERSAMPLE * unknowns / (D // 2))
    assert est.n_queries_by_stage_ == {"V": D + 1, "forms": (D + 1) * key_sets,
                                       "verify": len(vr.CHECK_LENGTHS)}
    assert est.n_queries_ == oracle.n_queries


def test_the_forms_give_the_heads_logit_differences():
    layer = rotary_head()
    est, _ = fit(layer)
    rng = np.random.default_rng(3)
    xq, xa, xb = rng.standard_normal((3, D)) / np.sqrt(D)
    n, i, j = 900, 17, 640
    y = lambda x: np.append(x, 1.0)  # noqa: E731
    got = y(xa) @ est.M(i - n) @ y(xq) - y(xb) @ est.M(j - n) @ y(xq)
    want = true_logit(layer, xa, i, xq, n) - true_logit(layer, xb, j, xq, n)
    assert abs(got - want) <= 1e-8 * max(1.0, abs(want))


def test_fits_are_deterministic_for_a_seed():
    a, _ = fit(rotary_head())
    b, _ = fit(rotary_head())
    np.testing.assert_array_equal(a.cos_forms_, b.cos_forms_)
    np.testing.assert_array_equal(a.const_form_, b.const_form_)


@pytest.mark.parametrize("layer", [
    rotary_head(rope_base=500.0),  # another base than the declared 10000
    rotary_head(outputs="all", causal=False),  # no mask where one is declared (with ALL_OFFSET)
    random_vector_layer(D, 2, seed=1, bias=0.3, causal=True, rope_base=10000.0,
                        head_dim=D),  # two heads
], ids=["base", "mask", "two-heads"])
def test_a_box_that_is_not_the_declared_head_is_refused(layer):
    with pytest.raises(ModelMismatchError):
        fit(layer, check_length=ALL_OFFSET if layer.outputs == "all" else 4096)


@pytest.mark.parametrize("params, match", [
    ({"rotary_dim": 3}, "rotary_dim=3 must be even"),
    ({"rotary_dim": 10}, "exceeds the head dimension"),
    ({"max_offset": 2, "check_length": 3}, "max_offset=2 must be at least"),
    ({"max_offset": 4094}, "max_offset=4094 does not reach"),
    ({"n_key_sets": 1}, "n_key_sets=1 key sets"),
    ({"rope_base": 0.5}, "rope_base"),
])
def test_bad_parameters_are_refused(params, match):
    with pytest.raises(ConfigError, match=match):
        fit(rotary_head(), **params)


def test_other_oracles_and_unfitted_use_are_refused():
    with pytest.raises(ConfigError):
        RotaryVectorLearner().fit(ValueOracle(lambda X: X.sum(axis=(1, 2)), D))
    with pytest.raises(ConfigError, match="fit"):
        RotaryVectorLearner().predict(np.zeros((1, 2, D)))


def test_the_vector_layer_learner_routes_a_rotary_head_to_its_route():
    """VectorLayerLearner(positions="rotary") fits one rotary head through RotaryVectorLearner
    and answers as it does; several rotary heads go to RotaryLayerVectorLearner, which reads
    last-token answers too and refuses a box of another number of heads by name."""
    from attnquery.learners import VectorLayerLearner

    d = 8
    layer = random_vector_layer(d, 1, seed=3, bias=0.3, causal=True, rope_base=10000.0,
                                outputs="last")
    oracle = VectorOracle(layer, d, outputs="last")
    est = VectorLayerLearner(positions="rotary", causal=True, random_state=0).fit(oracle)
    assert est.rotary_ is not None and est.frequencies_.size > 0
    X = np.random.default_rng(5).standard_normal((4, 300, d)) / np.sqrt(d)
    assert np.max(np.abs(est.predict(X) - layer(X))) <= 1e-9 * np.max(np.abs(layer(X)))
    fresh = VectorOracle(layer, d, outputs="last")
    # refused by the split: the nearby differences' jumps disagree, or (where the approximate
    # parts pass, which depends on the last digits of the BLAS in use) the exact parts span more
    # than d / H dimensions
    with pytest.raises(ModelMismatchError,
                       match="not a layer of n_heads=2 heads|heads do not fill d as declared"):
        VectorLayerLearner(positions="rotary", n_heads=2).fit(fresh)
