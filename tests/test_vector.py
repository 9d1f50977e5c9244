"""Vector answers: VectorOracle (counting, budget, shapes, NaN) and the vector-output layers of
attnquery.models.vector against a direct computation."""

import numpy as np
import pytest

from attnquery.errors import AnswerError, BudgetExceededError, ModelError, QueryError
from attnquery.models.vector import (
    VectorAttentionLayer,
    bilinear_layer,
    random_vector_layer,
)
from attnquery.oracles import VectorOracle

# -- VectorOracle -----------------------------------------------------------------------------


def _box(d_out=3, outputs="all"):
    """A box that answers token n's output as (sum of the token's entries) * [1, 2, ..]."""
    scale = np.arange(1.0, d_out + 1)

    def fn(X):
        y = X.sum(axis=2)[..., None] * scale
        return y if outputs == "all" else y[:, -1]
    return fn


@pytest.mark.parametrize("outputs", ["all", "last"])
def test_vector_oracle_counts_queries_tokens_and_answers_the_box(outputs):
    o = VectorOracle(_box(3, outputs), 4, outputs=outputs)
    assert o.d_out is None and o.kind == "vector" and o.outputs == outputs
    X = np.random.default_rng(0).standard_normal((5, 7, 4))
    y = o(X)
    want = X.sum(axis=2)[..., None] * np.arange(1.0, 4)
    np.testing.assert_array_equal(y, want if outputs == "all" else want[:, -1])
    assert (o.n_queries, o.n_tokens, o.n_calls, o.d_out) == (5, 35, 1, 3)
    o(np.ones((2, 1, 4)))
    assert (o.n_queries, o.n_tokens, o.n_calls) == (7, 37, 2)


def test_vector_oracle_refuses_a_batch_over_budget_before_spending():
    o = VectorOracle(_box(), 4, budget=6)
    o(np.ones((4, 3, 4)))
    with pytest.raises(BudgetExceededError, match="2 of the budget of 6 remain"):
        o(np.ones((3, 2, 4)))
    assert (o.n_queries, o.n_tokens, o.remaining) == (4, 12, 2)


@pytest.mark.parametrize("outputs, fn, match", [
    ("all", lambda X: np.zeros((X.shape[0], 3)), r"\(B, N, d_out\) = \(2, 5, d_out\)"),
    ("all", lambda X: np.zeros((X.shape[0], X.shape[1] + 1, 3)), r"got \(2, 6, 3\)"),
    ("last", lambda X: np.zeros((X.shape[0], X.shape[1], 3)), r"\(B, d_out\) = \(2, d_out\)"),
    ("last", lambda X: np.zeros(X.shape[0]), r"got \(2,\)"),
    ("last", lambda X: np.zeros((X.shape[0], 0)), r"got \(2, 0\)"),
    ("all", lambda X: np.full((X.shape[0], X.shape[1], 3), np.nan), "non-finite"),
    ("last", lambda X: np.full((X.shape[0], 3), np.inf), "non-finite"),
    ("last", lambda X: np.ones((X.shape[0], 3)) + 1j, "complex answers"),
])
def test_vector_oracle_rejects_bad_answers_without_counting_them(outputs, fn, match):
    o = VectorOracle(fn, 4, outputs=outputs)
    with pytest.raises(AnswerError, match=match):
        o(np.ones((2, 5, 4)))
    assert o.n_queries == 0 and o.n_tokens == 0


def test_vector_oracle_holds_the_box_to_one_output_dimension():
    widths = iter([3, 4])
    o = VectorOracle(lambda X: np.zeros((X.shape[0], next(widths))), 2, outputs="last")
    o(np.ones((1, 1, 2)))
    with pytest.raises(AnswerError, match="d_out = 3"):
        o(np.ones((1, 1, 2)))
    given = VectorOracle(_box(3), 2, d_out=2)
    with pytest.raises(AnswerError, match=r"d_out = 2 numbers per output; got shape \(1, 1, 3\)"):
        given(np.ones((1, 1, 2)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(outputs="first"), "outputs must be one of"),
    (dict(d_out=0), "d_out must be a positive integer"),
    (dict(d_out=2.0), "d_out must be a positive integer"),
    (dict(budget=-1), "budget must be"),
])
def test_vector_oracle_rejects_bad_parameters(kwargs, match):
    with pytest.raises(QueryError, match=match):
        VectorOracle(_box(), 4, **kwargs)


def test_vector_oracle_rejects_bad_queries_as_the_other_oracles_do():
    o = VectorOracle(_box(), 4)
    with pytest.raises(QueryError, match="d = 4"):
        o(np.ones((1, 2, 3)))
    with pytest.raises(QueryError, match="finite"):
        o(np.full((1, 2, 4), np.nan))
    with pytest.raises(QueryError, match="callable"):
        VectorOracle(np.ones(3), 4)
    assert o.n_queries == 0


# -- the layers ---------------------------------------------------------------------------------


def naive(layer: VectorAttentionLayer, X: np.ndarray) -> np.ndarray:
    """Token by token, head by head: the layer's defining formula (no positions, no cap)."""
    B, N, _ = X.shape
    H, dv = layer.n_heads, layer.W_V.shape[1]
    out = np.zeros((B, N, layer.d_out))
    for b in range(B):
        for n in range(N):
            parts = []
            for h in range(H):
                g = layer.groups[h]
                q = layer.W_Q[h] @ X[b, n] + layer.b_Q[h]
                keys = range(n + 1) if layer.causal else range(N)
                s = np.array([layer.scale * q @ (layer.W_K[g] @ X[b, i] + layer.b_K[g])
                              for i in keys])
                a = np.exp(s - s.max())
                a /= a.sum()
                parts.append(sum(a[j] * (layer.W_V[g] @ X[b, i] + layer.b_V[g])
                                 for j, i in enumerate(keys)))
            out[b, n] = layer.W_O @ np.concatenate(parts) + layer.b_O
    assert out.shape[-1] == layer.d_out and len(parts) == H and parts[0].size == dv
    return out


@pytest.mark.parametrize("H, G, causal", [(1, 1, False), (2, 2, True), (4, 2, False),
                                          (4, 1, True)])
def test_layer_matches_the_direct_computation(H, G, causal):
    layer = random_vector_layer(8, H, seed=H + G, n_kv_heads=G, d_out=5, bias=0.5,
                                causal=causal)
    X = np.random.default_rng(1).standard_normal((3, 6, 8)) / np.sqrt(8)
    want = naive(layer, X)
    np.testing.assert_allclose(layer(X), want, rtol=0, atol=1e-13)
    last = random_vector_layer(8, H, seed=H + G, n_kv_heads=G, d_out=5, bias=0.5,
                               causal=causal, outputs="last")
    np.testing.assert_allclose(last(X), want[:, -1], rtol=0, atol=1e-13)


def test_layer_is_the_bilinear_form_of_its_head_maps():
    layer = random_vector_layer(6, 3, seed=2, head_dim=4, d_out=7, bias=0.7, causal=True)
    W, c, V, beta = layer.head_W(), layer.key_bias(), layer.value_maps(), layer.output_bias
    assert W.shape == (3, 6, 6) and c.shape == (3, 6) and V.shape == (3, 6, 7)
    X = np.random.default_rng(3).standard_normal((4, 9, 6))
    same = bilinear_layer(W, c, V, beta, causal=True)
    np.testing.assert_allclose(same(X), layer(X), rtol=0, atol=1e-12)
    # one-token answers are x^T sum_h V_h + beta
    x = X[:, :1]
    np.testing.assert_allclose(layer(x)[:, 0], x[:, 0] @ V.sum(axis=0) + beta, atol=1e-13)


def test_long_sequences_are_evaluated_in_blocks_alike():
    layer = random_vector_layer(4, 2, seed=4, causal=True)
    X = np.random.default_rng(5).standard_normal((2, 1500, 4)) / 2
    whole = layer(X)  # 2 x 2 x 1500 x 1500 score entries: several blocks
    np.testing.assert_allclose(whole[:, :40], layer(X[:, :40]), rtol=0, atol=1e-14)
    last = random_vector_layer(4, 2, seed=4, causal=True, outputs="last")
    np.testing.assert_allclose(last(X), whole[:, -1], rtol=0, atol=1e-14)


def test_positions_and_soft_capping_change_the_layer_as_documented():
    X = np.random.default_rng(6).standard_normal((2, 5, 8))
    plain = random_vector_layer(8, 1, seed=7)
    rope = random_vector_layer(8, 1, seed=7, rope_base=1e4)
    capped = random_vector_layer(8, 1, seed=7, softcap=0.5)
    # rotary: position 0 is not rotated, so one-token queries agree; longer ones do not
    np.testing.assert_allclose(rope(X[:, :1]), plain(X[:, :1]), atol=1e-15)
    assert np.abs(rope(X) - plain(X)).max() > 1e-3
    assert np.abs(capped(X) - plain(X)).max() > 1e-3
    with pytest.raises(ModelError, match="not bilinear"):
        rope.head_W()
    # float32 serving: close to the float64 layer, not equal to it
    served = random_vector_layer(8, 1, seed=7, precision="float32")
    err = np.abs(served(X) - plain(X)).max()
    assert 0 < err < 1e-5


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_kv_heads=3), "n_kv_heads must divide"),
    (dict(outputs="every"), "outputs must be one of"),
    (dict(softcap=-1.0), "softcap must be"),
    (dict(bias=-0.1), "bias must be"),
])
def test_bad_layer_parameters_are_refused(kwargs, match):
    with pytest.raises(ModelError, match=match):
        random_vector_layer(8, 2, seed=0, **kwargs)
