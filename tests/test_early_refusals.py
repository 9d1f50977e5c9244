"""Refusals before the first query: every registered learner's ``n_queries`` too small for its
plan is refused before the oracle is asked anything, and the float64 vector layer's budget is
exact (a budget equal to the fit's spend pays for it; one query less is refused before the
first query). The boxes are plain numpy, written from the formulas."""

import numpy as np
import pytest

from attnquery.errors import BudgetExceededError, ConfigError
from attnquery.learners import VectorLayerLearner, registry
from attnquery.learners.vector._layer import VectorLayerRoute
from attnquery.learners.vector._split import EXACT, ROWS, split_queries
from attnquery.oracles import MembershipOracle, ValueOracle, VectorOracle
from tests.boxes import rope


def softmax(s: np.ndarray) -> np.ndarray:
    s = s - np.max(s, axis=-1, keepdims=True)
    e = np.exp(s)
    return e / np.sum(e, axis=-1, keepdims=True)


def value_head(d: int, seed: int = 0):
    """A single head ``softmax_i(x_i^T W x_N) . X v``, W of norm about 1."""
    rng = np.random.default_rng(seed)
    W, v = rng.standard_normal((d, d)) / d, rng.standard_normal(d)

    def box(X):
        X = np.asarray(X, dtype=np.float64)
        return np.einsum("bn,bn->b", softmax(np.einsum("bnd,bd->bn", X, X[:, -1] @ W.T)), X @ v)

    return box


def rope_head(d: int, seed: int = 0, base: float = 1e4):
    """A head with rotary positions (RoPE of ``base``, rotate-half): scores
    ``rope(K x_i, i)^T rope(Q x_N, N) / sqrt(d)``, output ``alpha . X v``."""
    rng = np.random.default_rng(seed)
    Q, K, v = (rng.standard_normal((d, d)), rng.standard_normal((d, d)),
               rng.standard_normal(d))

    def box(X):
        X = np.asarray(X, dtype=np.float64)
        pos = np.arange(X.shape[1])
        k = rope(X @ K.T, pos, base)
        q = rope(X[:, -1:] @ Q.T, pos[-1:], base)[:, 0]
        return np.einsum("bn,bn->b", softmax(np.einsum("bnr,br->bn", k, q) / np.sqrt(d)),
                         X @ v)

    return box


def vector_layer(d: int, H: int, outputs: str = "all", seed: int = 0):
    """H heads of d / H with a key bias and an output bias, every token's output vector
    (``outputs="all"``) or the last token's: ``sum_h softmax(Q_h x_n . (K_h x_i + b_h))
    V_h x_i O_h + beta``."""
    rng = np.random.default_rng(seed)
    dh = d // H
    Q, K, Vv = (rng.standard_normal((3, H, d, dh)) / np.sqrt(d))
    O = rng.standard_normal((H, dh, d)) / np.sqrt(dh)
    bk, beta = 0.3 * rng.standard_normal((H, dh)), 0.1 * rng.standard_normal(d)

    def box(X):
        X = np.asarray(X, dtype=np.float64)
        out = beta + sum(softmax(np.einsum("bnk,bmk->bnm", X @ Q[h], X @ K[h] + bk[h]))
                         @ (X @ Vv[h]) @ O[h] for h in range(H))
        return out if outputs == "all" else out[:, -1]

    return box


#: per registered learner with a budget, a box it fits and the parameters it needs: the
#: vector learner's routes by name (the dense least squares of one head and of a layer, from
#: every token's outputs and the last token's, and the shared-token route of one head and of
#: a layer)
BUDGETED = {
    "membership": [(lambda: MembershipOracle(lambda X: value_head(4)(X) > 0, 4), {})],
    "layer": [(lambda: ValueOracle(value_head(8), 8), {"n_heads": 2})],
    "rotary": [(lambda: ValueOracle(rope_head(8), 8), {})],
    "lowprecision": [(lambda: ValueOracle(value_head(4), 4), {})],
    "relu": [(lambda: ValueOracle(lambda X: np.maximum(np.asarray(X)[:, -1].sum(1), 0), 4), {})],
    "transformer": [(lambda: ValueOracle(value_head(4), 4), "ffn_params")],
    "vector": [(lambda d=d, H=H, o=o: VectorOracle(vector_layer(d, H, o), d, o), {"n_heads": H})
               for d, H, o in ((8, 1, "all"), (8, 1, "last"), (8, 2, "all"), (8, 2, "last"),
                               (80, 1, "all"), (128, 4, "all"))],
}


def test_every_budgeted_learner_has_a_case():
    budgeted = {name for name, entry in registry().items()
                if {"n_queries", "ffn_params"} & set(entry.parameters())}
    assert budgeted == set(BUDGETED), "a learner with a budget needs a box in BUDGETED"


@pytest.mark.parametrize("name,case", [(n, i) for n, cases in BUDGETED.items()
                                       for i in range(len(cases))])
@pytest.mark.parametrize("n", [1, 2])
def test_too_few_queries_are_refused_before_the_first(name, case, n):
    make, params = BUDGETED[name][case]
    oracle = make()
    params = {"ffn_params": {"n_queries": n}} if params == "ffn_params" else \
        {**params, "n_queries": n}
    with pytest.raises((ConfigError, BudgetExceededError),
                       match=rf"n_queries ?= ?{n}\b|budget of {n}\b"):
        registry()[name].make(random_state=0, **params).fit(oracle)
    assert oracle.n_queries == 0


@pytest.mark.parametrize("d,H,outputs", [(16, 4, "last"), (16, 4, "all"), (8, 2, "last"),
                                         (8, 1, "last"), (8, 1, "all")])
def test_a_vector_layers_budget_is_exact(d, H, outputs):
    box = vector_layer(d, H, outputs, seed=1)
    free = VectorLayerLearner(n_heads=H, random_state=0).fit(VectorOracle(box, d, outputs))
    spend = free.n_queries_
    # the fit spends exactly its plan: the split's (at most, its retries included), what it
    # leaves asked in the attention stage
    route = VectorLayerRoute(n_heads=H)
    N, n = route._plan_size(d, d, H, outputs, route._all_fill, route._last_fill)
    split = split_queries(d, H, ROWS if outputs == "all" else EXACT) if H > 1 else 0
    assert spend == d + 1 + split + n + 8 == sum(free.n_queries_by_stage_.values())
    X = np.random.default_rng(5).standard_normal((3, 7, d))
    assert np.max(np.abs(free.predict(X) - box(X))) <= 1e-9 * np.max(np.abs(box(X)))
    paid = VectorLayerLearner(n_heads=H, random_state=0).fit(
        VectorOracle(box, d, outputs, budget=spend))
    assert paid.n_queries_ == spend
    np.testing.assert_array_equal(paid.W_, free.W_)
    np.testing.assert_array_equal(paid.V_, free.V_)
    short = VectorOracle(box, d, outputs, budget=spend - 1)
    with pytest.raises(BudgetExceededError, match=f"needs {spend} queries"):
        VectorLayerLearner(n_heads=H, random_state=0).fit(short)
    assert short.n_queries == 0
