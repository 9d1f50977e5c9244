"""Refusals say what was measured: a noisy layer and a layer normalised after its attention
are refused by the vector learner's split with messages that name what the answers showed and
leave the cause open (plain-numpy boxes, written from the formulas)."""

import numpy as np
import pytest

from attnquery.errors import ModelMismatchError, NotIdentifiableError
from attnquery.learners import VectorLayerLearner
from attnquery.oracles import VectorOracle
from tests.test_early_refusals import vector_layer


@pytest.mark.parametrize("outputs", ["all", "last"])
def test_a_noisy_layer_is_not_put_down_to_its_heads_alone(outputs):
    d, H = 16, 4
    box, rng = vector_layer(d, H, outputs), np.random.default_rng(1)

    def noisy(X):  # Gaussian noise of 1e-6 of the largest answer, fresh on every call
        y = box(X)
        return y + 1e-6 * np.max(np.abs(y)) * rng.standard_normal(y.shape)

    with pytest.raises(ModelMismatchError) as info:
        VectorLayerLearner(n_heads=H, random_state=0).fit(VectorOracle(noisy, d, outputs))
    msg = str(info.value)
    # what was measured: far more changes along a line than heads, most far below a switch
    assert f"where n_heads={H} switches were declared" in msg
    smallest = float(msg.split("the smallest change ")[1].split(" ")[0])
    assert smallest < 1e-3
    assert "noise in the answers" in msg and "soft-capped" in msg


@pytest.mark.parametrize("outputs", ["all", "last"])
def test_a_post_layernorm_layer_is_not_put_down_to_heads_that_do_not_fill_d(outputs):
    d, H = 32, 4
    box = vector_layer(d, H, outputs)

    def normed(X):  # LayerNorm of every output, without gain or bias: rank d - 1 in one token
        y = box(X)
        y = y - y.mean(axis=-1, keepdims=True)
        return y / np.sqrt((y * y).mean(axis=-1, keepdims=True) + 1e-5)

    oracle = VectorOracle(normed, d, outputs)
    with pytest.raises(NotIdentifiableError, match="the one-token answers give a map of rank "
                       "31.*heads that do not fill d, or one-token answers that are not affine "
                       "in the token .*normalisation"):
        VectorLayerLearner(n_heads=H, random_state=0).fit(oracle)
    assert oracle.n_queries == d + 1  # refused after the value stage, before the split
