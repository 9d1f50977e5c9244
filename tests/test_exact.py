"""Theorem 4.1: exact recovery from d^2 + d value queries."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnquery.errors import BudgetExceededError, ConfigError, NotIdentifiableError
from attnquery.learners import ExactValueQueryLearner
from attnquery.learners._base import DEFAULT_VERIFY
from attnquery.metrics import relative_error
from attnquery.models import AttentionHead, random_head
from attnquery.oracles import ValueOracle


def fit(head, **kw):
    oracle = ValueOracle(head, head.d)
    est = ExactValueQueryLearner(**kw).fit(oracle)
    return est, oracle


def learning_queries(est, oracle) -> int:
    """Queries the oracle counted for learning: all of them but the check's."""
    assert est.n_queries_ == oracle.n_queries
    assert est.n_verify_queries_ == min(DEFAULT_VERIFY, est.verify)
    return oracle.n_queries - est.n_verify_queries_


@pytest.mark.parametrize("probes", ["gaussian", "basis", "orthogonal"])
@pytest.mark.parametrize("d", [1, 2, 3, 16, 64])
def test_recovers_W_and_v_exactly_with_d2_plus_d_queries(d, probes):
    head = random_head(d, seed=[d, 7])
    est, oracle = fit(head, probes=probes, random_state=0)
    assert learning_queries(est, oracle) == d * d + d
    assert relative_error(est.W_, head.W) <= 1e-10
    np.testing.assert_allclose(est.v_, head.v, rtol=0, atol=1e-15)


def test_gaussian_design_at_d256_stays_well_below_the_target():
    # the logit scale is set from the first column only: a pilot of many columns at the initial
    # scale 1e-2 reads them with logits near 1e-3 and costs an order of magnitude of accuracy
    head = random_head(256, seed=[256, 2026])
    est, oracle = fit(head, probes="gaussian", random_state=0)
    assert learning_queries(est, oracle) == 256 * 256 + 256
    assert relative_error(est.W_, head.W) <= 1e-10


@pytest.mark.parametrize("probes", ["gaussian", "basis"])
def test_v_with_zero_entries(probes):
    head = random_head(24, seed=1, zero_frac=0.5)
    assert np.sum(head.v == 0) == 12
    est, oracle = fit(head, probes=probes, random_state=1)
    assert learning_queries(est, oracle) == 24 * 24 + 24
    assert relative_error(est.W_, head.W) <= 1e-10
    if probes == "basis":  # the paper's fix: u_l = e_l + e_p where v_l = 0
        U = est.probe_matrix_
        zero = np.flatnonzero(head.v == 0)
        p = int(np.argmax(np.abs(head.v)))
        np.testing.assert_array_equal(U[zero, p], 1.0)


@pytest.mark.parametrize("probes", ["gaussian", "basis", "orthogonal"])
@pytest.mark.parametrize("d", [8, 128])
def test_large_logits_spectral_norm_500(d, probes):
    head = random_head(d, seed=[d, 3], W_spectral=500.0, zero_frac=0.25)
    assert np.isclose(np.linalg.norm(head.W, 2), 500.0)
    # unscaled Gaussian probes would saturate the sigmoid: |u^T w_j| is in the hundreds
    u = np.random.default_rng(0).standard_normal(d)
    assert np.max(np.abs(u @ head.W)) > 40
    est, oracle = fit(head, probes=probes, random_state=2)
    assert learning_queries(est, oracle) == d * d + d
    assert relative_error(est.W_, head.W) <= 1e-10


@pytest.mark.parametrize("probes", ["gaussian", "basis"])
def test_d512_spectral_norm_500(probes):
    head = random_head(512, seed=9, W_spectral=500.0)
    est, oracle = fit(head, probes=probes, random_state=3)
    assert learning_queries(est, oracle) == 512 * 512 + 512
    assert relative_error(est.W_, head.W) <= 1e-10


@pytest.mark.parametrize("probes", ["gaussian", "basis", "orthogonal"])
@pytest.mark.parametrize("d,kw", [(1, {}), (2, {}), (16, {"zero_frac": 0.25}), (64, {}),
                                  (48, {"W_spectral": 500.0}), (32, {"rank": 4})])
def test_fit_bias_recovers_W_c_v_beta_with_d2_plus_2d_plus_1_queries(d, kw, probes):
    # a module's head: softmax(X (W x_N + c))^T (X v) + beta. Queries: the zero token (beta),
    # the d one-row queries [e_i] (v), d key-bias probes [kappa a_m; 0] (c), and the d^2
    # column probes of Theorem 4.1: d^2 + 2d + 1, the number of unknowns
    head = random_head(d, seed=[d, 11], key_bias=1.5, offset=0.3, **kw)
    est, oracle = fit(head, probes=probes, random_state=0, fit_bias=True)
    assert oracle.n_queries == est.n_queries_
    assert est.n_queries_ - est.n_verify_queries_ == d * d + 2 * d + 1
    assert est.n_requeried_ == 0
    tol = 1e-9 if probes == "gaussian" else 1e-12
    assert relative_error(est.W_, head.W) <= tol
    assert relative_error(est.key_bias_, head.key_bias) <= 1e-12
    assert relative_error(est.v_, head.v) <= 1e-14
    assert abs(est.offset_ - head.offset) <= 1e-15
    X = np.random.default_rng(1).standard_normal((8, 3, d))
    np.testing.assert_allclose(est.predict(X), head(X), rtol=1e-9, atol=1e-12)


def test_fit_bias_on_a_head_without_biases_and_fit_bias_off():
    head = random_head(12, seed=5)
    est, oracle = fit(head, probes="basis", fit_bias=True)
    assert oracle.n_queries - est.n_verify_queries_ == 12 * 12 + 2 * 12 + 1
    assert est.offset_ == 0.0 and np.abs(est.key_bias_).max() <= 1e-14
    assert relative_error(est.W_, head.W) <= 1e-12
    plain, oracle = fit(head, probes="basis")  # the paper's learner: d^2 + d, zero biases
    assert oracle.n_queries - plain.n_verify_queries_ == 12 * 12 + 12
    assert plain.offset_ == 0.0 and not np.any(plain.key_bias_)


def test_fit_bias_budget_and_parameter():
    oracle = ValueOracle(random_head(5, seed=0, key_bias=1.0, offset=1.0), 5, budget=35)
    # d^2 + 2d + 1 = 36 queries and the 8 check queries
    with pytest.raises(BudgetExceededError, match="needs 44 queries"):
        ExactValueQueryLearner(fit_bias=True).fit(oracle)
    assert oracle.n_queries == 0
    with pytest.raises(ConfigError, match="fit_bias"):
        ExactValueQueryLearner(fit_bias="yes").fit(oracle)


def test_v_zero_is_not_identifiable():
    head = AttentionHead(np.zeros(5), W=np.eye(5))
    with pytest.raises(NotIdentifiableError, match="v = 0"):
        fit(head)


def test_low_rank_and_zero_W():
    head = random_head(20, seed=2, rank=3)
    est, _ = fit(head, random_state=0)
    assert relative_error(est.W_, head.W) <= 1e-10
    zero = AttentionHead(np.ones(4), W=np.zeros((4, 4)))
    est, oracle = fit(zero, random_state=0)
    # rounding noise of alpha = 1/2 (~1e-16) read at the initial logit scale 1e-2, through U^-1
    assert np.abs(est.W_).max() <= 1e-12
    assert learning_queries(est, oracle) == 20 + est.n_requeried_ and est.n_requeried_ <= 16


def test_works_against_a_plain_function():
    rng = np.random.default_rng(5)
    W, v = rng.standard_normal((6, 6)), rng.standard_normal(6)

    def black_box(X):
        s = np.einsum("bnd,de,be->bn", X, W, X[:, -1])
        a = np.exp(s - s.max(axis=1, keepdims=True))
        return np.einsum("bn,bn->b", a / a.sum(axis=1, keepdims=True), X @ v)

    est = ExactValueQueryLearner(random_state=0).fit(ValueOracle(black_box, 6))
    assert relative_error(est.W_, W) <= 1e-10
    np.testing.assert_allclose(est.predict(np.ones((2, 3, 6))), black_box(np.ones((2, 3, 6))))


def test_same_seed_same_result_and_fit_returns_self():
    head = random_head(10, seed=0)
    a, _ = fit(head, random_state=42)
    b, _ = fit(head, random_state=42)
    np.testing.assert_array_equal(a.W_, b.W_)
    est = ExactValueQueryLearner()
    assert est.fit(ValueOracle(head, 10)) is est


def test_budget_too_small_fails_before_any_query():
    # d^2 + d = 30 queries to learn and the check queries: all paid for up front
    oracle = ValueOracle(random_head(5, seed=0), 5, budget=37)
    with pytest.raises(BudgetExceededError, match="needs 38 queries"):
        ExactValueQueryLearner().fit(oracle)
    assert oracle.n_queries == 0
    oracle = ValueOracle(random_head(5, seed=0), 5, budget=30)
    est = ExactValueQueryLearner(verify=0).fit(oracle)
    assert est.n_queries_ == oracle.n_queries == 30 and est.n_verify_queries_ == 0
    assert np.isnan(est.verify_error_)


@pytest.mark.parametrize("kw", [{"probes": "sobol"}, {"max_logit": 0.1}, {"zero_tol": 2.0}])
def test_bad_parameters(kw):
    with pytest.raises(ConfigError):
        ExactValueQueryLearner(**kw).fit(ValueOracle(random_head(3, seed=0), 3))


def test_fit_needs_an_oracle():
    with pytest.raises(ConfigError, match="oracle"):
        ExactValueQueryLearner().fit(random_head(3, seed=0).W)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    d=st.integers(1, 12),
    log_scale=st.floats(-3, 3),
    rank=st.one_of(st.none(), st.integers(0, 12)),
    zero_frac=st.sampled_from([0.0, 0.3, 0.9, 1.0]),
    probes=st.sampled_from(["gaussian", "basis", "orthogonal"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_random_heads(d, log_scale, rank, zero_frac, probes, seed):
    rank = None if rank is None else min(rank, d)
    head = random_head(d, seed=seed, rank=rank, W_fro=10.0**log_scale, zero_frac=zero_frac)
    oracle = ValueOracle(head, d)
    if not np.any(head.v):
        with pytest.raises(NotIdentifiableError):
            ExactValueQueryLearner(probes=probes, random_state=seed).fit(oracle)
        return
    est = ExactValueQueryLearner(probes=probes, random_state=seed).fit(oracle)
    assert np.all(np.isfinite(est.W_)) and np.all(np.isfinite(est.v_))
    assert learning_queries(est, oracle) == d * d + d + est.n_requeried_
    scale = max(np.linalg.norm(head.W), 1e-300)
    assert np.linalg.norm(est.W_ - head.W) <= 1e-9 * scale + 1e-12


def test_orthogonal_probes_are_perfectly_conditioned_and_balanced():
    head = random_head(40, seed=4, zero_frac=0.5)
    est, _ = fit(head, probes="orthogonal", random_state=0)
    U = est.probe_matrix_
    np.testing.assert_allclose(U @ U.T, np.eye(40), atol=1e-12)
    np.testing.assert_allclose(np.abs(U @ head.v), np.linalg.norm(head.v) / np.sqrt(40),
                               rtol=1e-10)
    assert relative_error(est.W_, head.W) <= 1e-12


def test_exact_experiment_counts_check_queries_apart_and_its_claims_can_fail():
    from attnquery.experiments import expand_cells, run_cells
    from attnquery.figures.exact import exact_claims
    from attnquery.results import rows_to_table

    cells = expand_cells("exact", {"d": [4, 16, 32], "probes": ["basis", "gaussian"],
                                   "seeds": 2})
    rows, _ = run_cells(cells, study_seed=3)
    df = rows_to_table(rows).to_pandas()
    assert (df["status"] == "ok").all()
    assert (df["n_queries"] == df["d"] ** 2 + df["d"]).all()  # learning only
    assert (df["verify_queries"] == DEFAULT_VERIFY).all() and df["verified"].all()
    assert (df["verify_error"] < 1e-12).all()
    claims = {c.name: c for c in exact_claims(df)}
    assert all(c.passed for c in claims.values()), claims
    bad = df.copy()
    bad.loc[bad.index[0], "verified"] = False
    assert not {c.name: c for c in exact_claims(bad)}["exact_checked"].passed
    bad = df.copy()
    bad.loc[bad.index[0], "n_queries"] += DEFAULT_VERIFY  # counting the check queries in
    assert not {c.name: c for c in exact_claims(bad)}["exact_count"].passed
