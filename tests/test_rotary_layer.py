"""Whole rotary layers with grouped-query attention (Llama-style):
``AttentionLayerLearner(positions="rotary")`` (learners/multihead_generic/rotary_layer.py)."""

import numpy as np
import pytest

from attnquery.errors import (
    AssumptionViolation,
    AttnQueryError,
    ConfigError,
    ModelMismatchError,
    SearchLimitError,
)
from attnquery.learners import AttentionLayerLearner
from attnquery.learners.multihead_generic.rotary_layer import rotary_layer_probe_count
from attnquery.models import RotaryAttentionLayer, random_rotary_layer
from attnquery.oracles import ValueOracle


def _fit(L, **kw):
    oracle = ValueOracle(L, L.d)
    kw = {"random_state": 0, "positions": "rotary", "fit_bias": False, **kw}
    est = AttentionLayerLearner(n_heads=L.n_heads, **kw)
    return est.fit(oracle), oracle


def _func_err(est, L, seed=1, lengths=(1, 2, 16, 300, 4096)):
    rng = np.random.default_rng(seed)
    err = 0.0
    for N in lengths:
        X = rng.standard_normal((3 if N > 300 else 24, N, L.d)) / np.sqrt(L.d)
        y = L(X)
        err = max(err, float(np.max(np.abs(est.predict(X) - y)) / np.max(np.abs(y))))
    return err


def _matched(est, L):
    """The truth's head index of each recovered head (by the value vectors)."""
    truth = L.values
    idx = [int(np.argmin(np.linalg.norm(truth - v, axis=1))) for v in est.v_]
    assert sorted(idx) == list(range(L.n_heads))
    for v, k in zip(est.v_, idx, strict=True):
        assert np.linalg.norm(v - truth[k]) < 1e-10 * np.linalg.norm(truth[k])
    return idx


@pytest.mark.parametrize("d, H, G, R", [(32, 4, 2, None), (24, 4, 1, 4), (24, 4, 4, None)])
def test_recovers_gqa_mqa_and_mha_layers(d, H, G, R):
    L = random_rotary_layer(d, H, G, 3, rope_base=1e6, rotary_dim=R)
    est, oracle = _fit(L, n_kv_heads=G)
    r, m = d // H, d - H + 1
    stages = est.n_queries_by_stage_
    assert sum(stages.values()) == est.n_queries_ == oracle.n_queries
    assert est.n_requeried_ == 0
    k = min(m, r + 8)  # the right sketch's last tokens
    assert (stages["v_sum"], stages["isolated"], stages["missing"]) == (
        d, H * ((m + 1) * (k + 2 * r) + d * (r + 1)), 2 * H * (H - 1) * r)
    assert est.n_queries_ - stages["circle"] - stages["verify"] == rotary_layer_probe_count(
        d, H, r)
    assert np.max(np.abs(est.frequencies_ - L.frequencies)) < 1e-12
    assert est.rotary_dim_ == L.rotary_dim
    assert _func_err(est, L) < 1e-9
    # the heads that share keys are the truth's groups, up to the heads' permutation
    idx = _matched(est, L)
    truth_groups = L.groups[idx]
    for a in range(H):
        for b in range(H):
            assert (est.kv_groups_[a] == est.kv_groups_[b]) == (truth_groups[a]
                                                              == truth_groups[b])
    assert est.n_kv_heads_ == G


def test_llama_like_layer_goal():
    """Issue 23's goal: d = 128, 8 query heads, 2 key/value heads, RoPE: error <= 1e-8."""
    L = random_rotary_layer(128, 8, 2, 0, rope_base=1e4)
    est, _ = _fit(L, n_kv_heads=2)
    assert _func_err(est, L, lengths=(1, 16, 4096)) < 1e-9
    assert sorted(np.bincount(est.kv_groups_)) == [4, 4]


def test_refusals_and_bad_parameters():
    L = random_rotary_layer(24, 4, 2, 5, rope_base=1e4)
    with pytest.raises(AssumptionViolation, match="2 groups, not n_kv_heads=4"):
        _fit(L, n_kv_heads=4)
    with pytest.raises(ConfigError, match="fit_bias=False"):
        AttentionLayerLearner(n_heads=4, positions="rotary").fit(ValueOracle(L, 24))
    with pytest.raises(ConfigError, match="positions must be"):
        _fit(L, positions="alibi")
    with pytest.raises(ConfigError, match="n_kv_heads must divide"):
        _fit(L, n_kv_heads=3)
    # a layer with biases (Qwen2) is not what the rotary route assumes: a named error
    biased = random_rotary_layer(24, 4, 2, 5, rope_base=1e4, bias=0.3)
    with pytest.raises(AttnQueryError):
        _fit(biased)
    # the position-free route refuses a rotary layer at its check
    with pytest.raises(AssumptionViolation):
        AttentionLayerLearner(n_heads=4, fit_bias=False, random_state=0).fit(ValueOracle(L, 24))


def test_deterministic():
    L = random_rotary_layer(24, 4, 2, 7, rope_base=1e4)
    a, _ = _fit(L, random_state=4)
    b, _ = _fit(L, random_state=4)
    for ha, hb in zip(a.heads_, b.heads_, strict=True):
        np.testing.assert_array_equal(ha.W_Q, hb.W_Q)
        np.testing.assert_array_equal(ha.W_K, hb.W_K)


@pytest.mark.parametrize("kind, error, match", [
    ("b_Q", AssumptionViolation, "eigenvalues off the unit circle"),
    ("b_K", ModelMismatchError, "answers differ from a rotary attention layer"),
    ("b_V", SearchLimitError, "no circle of 6 tried separated"),
    ("b_O", SearchLimitError, "no circle of 6 tried separated"),
])
def test_each_bias_is_refused_with_its_named_error(kind, error, match):
    """Qwen2-style biases are not learnt on the rotary route; each kind is refused by name:
    a query bias breaks the factorisation of M_(-1)^+ M_(-2), a key bias (a score term that
    depends on the offset) is caught by the check, a value or output bias (an offset of the
    answers) by the circle that finds the value vectors."""
    L0 = random_rotary_layer(32, 4, 2, 5, rope_base=1e4)
    H, G, dh = 4, 2, L0.head_dim
    shape = {"b_Q": (H, dh), "b_K": (G, dh), "b_V": (G, dh), "b_O": (32,)}[kind]
    bias = 0.1 * np.random.default_rng(0).standard_normal(shape)
    L = RotaryAttentionLayer(L0.W_Q, L0.W_K, L0.W_V, L0.W_O, L0.readout,
                             frequencies=L0.frequencies, **{kind: bias})
    with pytest.raises(error, match=match):
        _fit(L, n_kv_heads=G)
