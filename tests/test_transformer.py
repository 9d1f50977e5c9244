"""One-layer transformers (Sec. 4.1): antisymmetric queries, the ReLU FFN learner, the whole."""

import numpy as np
import pytest

from attnquery.errors import (
    BudgetExceededError,
    ConfigError,
    ModelError,
    ModelMismatchError,
    NotIdentifiableError,
)
from attnquery.learners import ReLUNetworkLearner, TransformerLearner
from attnquery.metrics import functional_error, match_neurons, relative_error
from attnquery.models import OneLayerTransformer, random_head, random_transformer
from attnquery.oracles import AntisymmetricOracle, QueryError, ValueOracle


def ffn_error(tf, predict, d, seed=0, n=2000):
    """Worst difference of two FFNs over the largest true output, on random unit inputs.

    Both networks are positively homogeneous, so unit inputs cover every scale.
    """
    Z = np.random.default_rng(seed).standard_normal((n, d))
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    y = tf.ffn(Z)
    return float(np.max(np.abs(predict(Z) - y)) / np.max(np.abs(y)))


# --------------------------------------------------------------------------------------------
# Antisymmetric oracle
# --------------------------------------------------------------------------------------------


def test_antisymmetric_oracle_is_the_attention_head_with_v_equal_A_w_o():
    d, m = 6, 5
    tf = random_transformer(d, m, seed=3)
    head_W = tf.W
    inner = ValueOracle(tf, d)
    anti = AntisymmetricOracle(inner)
    X = np.random.default_rng(0).standard_normal((50, 3, d))
    from attnquery.models import AttentionHead

    np.testing.assert_allclose(anti(X), AttentionHead(tf.A @ tf.w_o, W=head_W)(X), atol=1e-13)
    assert anti.n_queries == 50
    assert inner.n_queries == anti.n_underlying_queries == 100  # two per antisymmetric query


def test_antisymmetric_oracle_budget_counts_two_per_query():
    tf = random_transformer(4, 3, seed=0)
    anti = AntisymmetricOracle(ValueOracle(tf, 4, budget=10))
    anti(np.ones((5, 2, 4)))
    with pytest.raises(BudgetExceededError):
        anti(np.ones((1, 2, 4)))
    with pytest.raises(QueryError):
        AntisymmetricOracle(lambda X: X)


# --------------------------------------------------------------------------------------------
# The FFN learner
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d,m", [(1, 1), (3, 2), (8, 8), (16, 12), (24, 24)])
def test_ffn_recovered_exactly_with_true_width_for_m_le_d(d, m):
    tf = random_transformer(d, m, seed=[d, m])
    oracle = ValueOracle(tf, d)
    est = ReLUNetworkLearner(random_state=1).fit(oracle)
    assert est.n_queries_ == oracle.n_queries
    assert ffn_error(tf, est.predict, d) <= 1e-8
    assert est.width_recovered_ and est.A_.shape == (d, m)
    match = match_neurons(est.A_, est.w_o_, tf.A, tf.w_o)
    assert match["same_width"] and match["max_rel_err"] <= 1e-7
    assert est.verify_error_ <= 1e-8


@pytest.mark.parametrize("seed", range(6))
def test_ffn_functional_error_on_random_nets(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 20))
    m = int(rng.integers(1, d + 1))
    tf = random_transformer(d, m, seed=seed)
    est = ReLUNetworkLearner(random_state=seed).fit(ValueOracle(tf, d))
    assert ffn_error(tf, est.predict, d, seed) <= 1e-8


def test_ffn_wider_than_d_is_functionally_exact():
    d, m = 6, 20
    tf = random_transformer(d, m, seed=5)
    est = ReLUNetworkLearner(random_state=0).fit(ValueOracle(tf, d))
    assert ffn_error(tf, est.predict, d) <= 1e-8
    assert est.n_neurons_ == m  # every hyperplane found; the orientation may need 2 linear units


def test_even_ffn_with_shared_hyperplanes_is_functionally_exact():
    # neurons (a, w) and (-a, w): one hyperplane per pair, so the width cannot be the true one
    tf = random_transformer(5, 4, seed=2, even=True)
    est = ReLUNetworkLearner(random_state=0).fit(ValueOracle(tf, 5))
    assert ffn_error(tf, est.predict, 5) <= 1e-8
    assert est.n_neurons_ == 2


def test_ffn_learner_can_fail_if_the_search_is_too_coarse():
    # no refinement of the normals and a large finite-difference step: the normals leave an
    # error well above rounding, which the check queries find and refuse
    tf = random_transformer(24, 24, seed=0)
    coarse = ReLUNetworkLearner(random_state=0, refine=False, fd_rel_step=0.3)
    with pytest.raises(ModelMismatchError, match="the network found"):
        coarse.fit(ValueOracle(tf, 24))
    fine = ReLUNetworkLearner(random_state=0).fit(ValueOracle(tf, 24))
    assert fine.verify_error_ <= 1e-9 < 1e-8 < coarse.verify_error_


def test_ffn_learner_rejects_bad_parameters():
    tf = random_transformer(3, 2, seed=0)
    with pytest.raises(ConfigError, match="n_grid"):
        ReLUNetworkLearner(n_grid=2).fit(ValueOracle(tf, 3))
    with pytest.raises(ConfigError, match="fit\\(\\) needs an oracle"):
        ReLUNetworkLearner().fit(tf)


# --------------------------------------------------------------------------------------------
# The whole transformer
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d,m", [(2, 1), (8, 4), (16, 16), (32, 8)])
def test_transformer_recovered(d, m):
    tf = random_transformer(d, m, seed=[d, m, 1])
    oracle = ValueOracle(tf, d)
    est = TransformerLearner(random_state=0).fit(oracle)
    assert relative_error(est.W_, tf.W) <= 1e-10
    assert relative_error(est.v_, tf.v) <= 1e-12
    # attention: 2 (d^2 + d) value queries (two per antisymmetric query)
    assert est.n_queries_attention_ == 2 * (d * d + d)
    assert est.n_verify_queries_ == 8
    assert est.n_queries_ == oracle.n_queries == (est.n_queries_attention_ + est.n_queries_ffn_
                                                   + est.n_verify_queries_)
    assert ffn_error(tf, est.ffn_.predict, d) <= 1e-8
    assert functional_error(tf, est.predict, d, np.random.default_rng(3), n=64) <= 1e-8
    np.testing.assert_allclose(est.A_ @ est.w_o_, tf.v, atol=1e-8 * np.linalg.norm(tf.v))


def test_transformer_not_identifiable_when_A_w_o_is_zero():
    tf = random_transformer(6, 4, seed=0, even=True)
    assert np.all(tf.v == 0)
    with pytest.raises(NotIdentifiableError, match="A w_o = 0"):
        TransformerLearner(random_state=0).fit(ValueOracle(tf, 6))


def test_transformer_budget_checked_before_spending():
    tf = random_transformer(4, 2, seed=0)
    oracle = ValueOracle(tf, 4, budget=30)
    with pytest.raises(BudgetExceededError):
        TransformerLearner(random_state=0).fit(oracle)
    assert oracle.n_queries == 0


def test_transformer_learner_is_a_pure_function_of_the_seed():
    tf = random_transformer(6, 5, seed=4)
    a = TransformerLearner(random_state=7).fit(ValueOracle(tf, 6))
    b = TransformerLearner(random_state=7).fit(ValueOracle(tf, 6))
    np.testing.assert_array_equal(a.W_, b.W_)
    np.testing.assert_array_equal(a.A_, b.A_)
    with pytest.raises(ConfigError, match="ffn"):
        TransformerLearner(ffn="other").fit(ValueOracle(tf, 6))


def test_generators_validate_and_are_seeded():
    assert np.array_equal(random_transformer(5, 3, seed=1).A, random_transformer(5, 3, seed=1).A)
    with pytest.raises(ModelError):
        random_transformer(5, 3, seed=0, even=True)
    with pytest.raises(ModelError):
        random_transformer(5, 0, seed=0)
    assert isinstance(random_transformer(3, 2, 0), OneLayerTransformer)
    assert random_head(3, 0).d == 3


def test_transformer_experiment_claims_hold():
    from attnquery.experiments import expand_cells, run_cells
    from attnquery.figures.transformer import transformer_claims
    from attnquery.results import rows_to_table

    rows, _ = run_cells(expand_cells("transformer", {"d": [3, 8], "width": [2, 8], "seeds": 2}),
                        study_seed=1)
    df = rows_to_table(rows).to_pandas()
    claims = {c.name: c for c in transformer_claims(df)}
    for c in claims.values():
        assert c.passed, c
    ok = df[df["width"] <= df["d"]]
    assert (ok["width_found"] == ok["width"]).all() and (ok["neuron_err"] <= 1e-7).all()
    bad = df.copy()
    bad.loc[bad.index[0], "rel_err_W"] = 1e-6
    assert not {c.name: c for c in transformer_claims(bad)}["transformer_W"].passed
