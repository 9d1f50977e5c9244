"""ValueOracle: counting, budget, and every kind of bad query or answer."""

import numpy as np
import pytest

from attnquery.errors import (
    AnswerError,
    BudgetExceededError,
    OracleFailure,
    QueryError,
)
from attnquery.models import random_head
from attnquery.oracles import ValueOracle


@pytest.fixture
def oracle():
    return ValueOracle(random_head(4, seed=0), 4)


def test_counts_every_query_in_a_batch(oracle):
    assert oracle.n_queries == 0
    y = oracle(np.ones((7, 3, 4)))
    assert y.shape == (7,) and oracle.n_queries == 7 and oracle.n_calls == 1
    oracle(np.ones((1, 1, 4)))
    assert oracle.n_queries == 8


def test_answers_are_the_models_outputs(oracle):
    head = random_head(4, seed=0)
    X = np.random.default_rng(1).standard_normal((5, 2, 4))
    np.testing.assert_array_equal(oracle(X), head(X))


def test_budget_is_enforced_before_anything_is_spent():
    o = ValueOracle(random_head(3, seed=0), 3, budget=10)
    o(np.ones((6, 2, 3)))
    with pytest.raises(BudgetExceededError, match="4 of the budget of 10 remain"):
        o(np.ones((5, 2, 3)))
    assert o.n_queries == 6 and o.remaining == 4
    o(np.ones((4, 2, 3)))
    assert o.remaining == 0


@pytest.mark.parametrize(
    "X, match",
    [
        ([[[1.0, 2.0, 3.0, 4.0]]], "numpy array"),
        (np.ones((2, 3, 4), dtype=np.float32), "float64"),
        (np.ones((2, 3, 4), dtype=np.int64), "float64"),
        (np.ones((3, 4)), r"shape \(B, N, d\)"),
        (np.ones((2, 3, 5)), "d = 4"),
        (np.ones((2, 0, 4)), "N >= 1"),
        (np.ones((0, 2, 4)), "B >= 1"),
        (np.array([[[1.0, np.nan, 0, 0]]]), "finite"),
        (np.array([[[1.0, np.inf, 0, 0]]]), "finite"),
    ],
)
def test_bad_queries_are_rejected_with_a_clear_message(oracle, X, match):
    with pytest.raises(QueryError, match=match):
        oracle(X)
    assert oracle.n_queries == 0


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda X: np.zeros((X.shape[0], 1)), r"shape \(2,\)"),
        (lambda X: np.zeros(X.shape[0] + 1), r"shape \(2,\)"),
        (lambda X: np.full(X.shape[0], np.nan), "non-finite"),
        (lambda X: np.full(X.shape[0], np.inf), "non-finite"),
        (lambda X: ["a"] * X.shape[0], "not real numbers"),
        (lambda X: np.ones(X.shape[0]) + 1e-3j, "complex answers"),
        (lambda X: np.array([1.0, 1j], dtype=object), "complex answers"),
        (lambda X: [[1.0], [1.0, 2.0]], "non-numeric"),
    ],
)
def test_bad_answers_are_rejected(fn, match):
    o = ValueOracle(fn, 3)
    with pytest.raises(AnswerError, match=match):
        o(np.ones((2, 2, 3)))
    assert o.n_queries == 0


def test_a_black_box_that_raises_is_reported():
    def broken(X):
        raise RuntimeError("service unavailable")

    o = ValueOracle(broken, 3)
    with pytest.raises(OracleFailure, match="raised RuntimeError.*service unavailable"):
        o(np.ones((1, 1, 3)))


def test_the_black_box_cannot_modify_the_queries():
    def mutate(X):
        X[...] = 0.0
        return np.zeros(X.shape[0])

    with pytest.raises(OracleFailure, match="read-only"):
        ValueOracle(mutate, 2)(np.ones((1, 1, 2)))


@pytest.mark.parametrize("kw", [{"d": 0}, {"d": 2.5}, {"d": True}, {"d": 3, "budget": -1}])
def test_bad_constructor_arguments(kw):
    with pytest.raises(QueryError):
        ValueOracle(lambda X: X[:, 0, 0], **kw)


def test_fn_must_be_callable():
    with pytest.raises(QueryError, match="callable"):
        ValueOracle(np.eye(3), 3)


def test_the_oracle_exposes_no_model_parameters(oracle):
    public = [a for a in dir(oracle) if not a.startswith("_")]
    assert set(public) <= {"d", "n_queries", "n_calls", "budget", "remaining", "check_budget",
                           "query", "kind"}
    assert not hasattr(oracle, "__dict__")
