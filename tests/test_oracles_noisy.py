"""ApproximateValueOracle, RoundingOracle and MembershipOracle: answers, determinism, counting."""

import numpy as np
import pytest

from attnquery.errors import AssumptionViolation, BudgetExceededError, QueryError
from attnquery.models import random_head
from attnquery.oracles import (
    ApproximateValueOracle,
    MembershipOracle,
    RoundingOracle,
    ValueOracle,
    query_hash,
)

D = 5


@pytest.fixture
def head():
    return random_head(D, seed=3)


@pytest.fixture
def X():
    return np.random.default_rng(0).standard_normal((2000, 2, D))


def test_uniform_noise_is_bounded_deterministic_and_spread(head, X):
    o = ApproximateValueOracle(head, D, 1e-3, random_state=7)
    y1 = o(X)
    noise = y1 - head(X)
    assert np.all(np.abs(noise) <= 1e-3)
    # the same query gets the same noise, in another batch and in another order (the box's own
    # answer may differ in its last bit with the batch: BLAS kernels sum in batch-dependent order)
    assert np.array_equal(o(X[::-1])[::-1] - head(X[::-1])[::-1], noise)
    assert np.array_equal(o(X[5:6])[0] - head(X[5:6])[0], noise[5])
    assert np.allclose(o(X[5:6])[0], y1[5], rtol=0, atol=1e-15)
    assert o.n_queries == 2 * len(X) + 2
    # a fresh oracle with the same seed answers alike; another seed does not
    assert np.array_equal(ApproximateValueOracle(head, D, 1e-3, random_state=7)(X), y1)
    assert not np.allclose(ApproximateValueOracle(head, D, 1e-3, random_state=8)(X), y1)
    # spread over the whole interval, mean near 0 (uniform: sd tau / sqrt(3))
    assert noise.max() > 0.99e-3 and noise.min() < -0.99e-3
    assert abs(noise.mean()) < 5 * 1e-3 / np.sqrt(3 * len(X))
    assert np.std(noise) == pytest.approx(1e-3 / np.sqrt(3), rel=0.1)


def test_noise_of_distinct_queries_is_uncorrelated(head):
    # queries that differ only by a scale (the oversampling probes) get independent noise
    c = np.linspace(0.5, 1.0, 4000)
    X = np.zeros((c.size, 1, D))
    X[:, 0, 0] = c
    o = ApproximateValueOracle(head, D, 1.0, random_state=1)
    noise = o(X) - head(X)
    assert abs(np.corrcoef(noise[:-1], noise[1:])[0, 1]) < 0.08


def test_hash_ignores_the_sign_of_zero():
    a = np.zeros((1, 2, 3))
    b = -a
    assert query_hash(a, 1)[0] == query_hash(b, 1)[0]
    assert query_hash(a, 1)[0] != query_hash(a, 2)[0]
    assert query_hash(a, 1)[0] != query_hash(np.zeros((1, 3, 2)), 1)[0]


def test_adversarial_noise_pushes_the_weight_estimate_to_saturation(head, X):
    o = ApproximateValueOracle(head, D, 1e-2, noise="adversarial")
    y = o(X)
    f = head(X)
    assert np.allclose(np.abs(y - f), 1e-2)
    # the learner's estimate (y - x2.v) / ((x1 - x2).v) moves away from 1/2
    x1v, x2v = X[:, 0] @ head.v, X[:, 1] @ head.v
    den = x1v - x2v
    a_true = (f - x2v) / den
    a_est = (y - x2v) / den
    assert np.all(np.abs(a_est - 0.5) > np.abs(a_true - 0.5))
    # one-row queries move towards 0 (shrinking |v_i|)
    e = np.eye(D)[:, None, :].copy()
    assert np.all(np.abs(o(e)) < np.abs(head(e)))
    # deterministic as well
    assert np.array_equal(o(X), y)


@pytest.mark.parametrize("tau", [0.0, -1e-3, np.nan, np.inf, "x"])
def test_bad_tau_is_refused(head, tau):
    with pytest.raises(QueryError, match="tau"):
        ApproximateValueOracle(head, D, tau)
    with pytest.raises(AssumptionViolation, match="tau"):
        ApproximateValueOracle(head, D, tau)


def test_bad_noise_model_is_refused(head):
    with pytest.raises(QueryError, match="noise"):
        ApproximateValueOracle(head, D, 1e-3, noise="gaussian")


def test_budget_applies_to_noisy_oracles(head):
    o = ApproximateValueOracle(head, D, 1e-3, budget=3)
    with pytest.raises(BudgetExceededError):
        o(np.ones((4, 1, D)))
    assert o.n_queries == 0


def test_rounding_to_significant_digits(head, X):
    f = head(X)
    for k in (2, 5, 9):
        y = RoundingOracle(head, D, digits=k)(X)
        ref = np.array([float(f"{v:.{k - 1}e}") for v in f[:200]])
        assert np.allclose(y[:200], ref, rtol=1e-15, atol=0)
        assert np.all(np.abs(y - f) <= 0.5 * 10.0 ** (1 - k) * np.abs(f) * (1 + 1e-12))


def test_rounding_to_float16_and_bfloat16(head, X):
    f = head(X)
    y16 = RoundingOracle(head, D, dtype="float16")(X)
    assert np.array_equal(y16, f.astype(np.float16).astype(np.float64))
    ob = RoundingOracle(head, D, dtype="bfloat16")
    yb = ob(X)
    assert np.all(np.abs(yb - f) <= ob.relative_tau * np.abs(f))
    # bfloat16 keeps 8 significant bits: 1/3 -> 0.333984375
    third = RoundingOracle(lambda Z: np.full(Z.shape[0], 1 / 3), 1, dtype="bfloat16")
    assert third(np.ones((1, 1, 1)))[0] == 0.333984375
    eff = RoundingOracle(head, D, dtype="float16").effective_digits
    assert eff == pytest.approx(4.01, abs=0.01)


def test_rounding_needs_exactly_one_mode(head):
    with pytest.raises(QueryError, match="exactly one"):
        RoundingOracle(head, D)
    with pytest.raises(QueryError, match="exactly one"):
        RoundingOracle(head, D, digits=3, dtype="float16")
    with pytest.raises(QueryError, match="digits"):
        RoundingOracle(head, D, digits=0)
    with pytest.raises(QueryError, match="dtype"):
        RoundingOracle(head, D, dtype="float8")


def test_membership_oracle_answers_the_sign_and_counts(head, X):
    o = MembershipOracle(head, D)
    y = o(X)
    assert set(np.unique(y)) == {0.0, 1.0}
    assert np.array_equal(y, (head(X) > 0).astype(float))
    assert o.n_queries == len(X) and o.kind == "membership"
    assert MembershipOracle(lambda Z: np.zeros(Z.shape[0]), 2)(np.ones((3, 1, 2))).sum() == 0


def test_kinds():
    h = random_head(2, seed=0)
    assert ApproximateValueOracle(h, 2, 1e-3).kind == "approximate value"
    assert RoundingOracle(h, 2, digits=3).kind == "rounded value"
    assert ValueOracle(h, 2).kind == "value"
