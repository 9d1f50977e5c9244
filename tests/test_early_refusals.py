"""Refusals before the first query: every registered learner's ``n_queries`` (the whole fit's
cap, the check's queries included) too small for its plan is refused before the oracle is asked
anything; a cap equal to what a fit spends without one pays for that fit, bit for bit, and no
cap is ever passed; and the float64 vector layer's budget is exact (a budget equal to the fit's
spend pays for it; one query less is refused before the first query). The boxes are plain numpy,
written from the formulas, or the library's random models."""

import numpy as np
import pytest

from attnquery.errors import AttnQueryError, BudgetExceededError, ConfigError
from attnquery.learners import VectorLayerLearner, registry
from attnquery.learners.vector._layer import VectorLayerRoute
from attnquery.learners.vector._split import EXACT, ROWS, split_queries
from attnquery.models import (
    MultiHeadAttention,
    orthogonal_subspace_multihead,
    random_head,
    random_multihead,
    random_rotary_head,
    random_transformer,
)
from attnquery.oracles import (
    ApproximateValueOracle,
    MembershipOracle,
    RoundingOracle,
    ValueOracle,
    VectorOracle,
)
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


#: per registered learner (every one has ``n_queries``), a box it fits and the parameters it
#: needs: the vector learner's routes by name (the dense least squares of one head and of a
#: layer, from every token's outputs and the last token's, and the shared-token route of one
#: head and of a layer); the transformer's FFN budget too
BUDGETED = {
    "exact": [(lambda: ValueOracle(value_head(4), 4), {})],
    "sketch": [(lambda: ValueOracle(value_head(6), 6), {"rank": 1})],
    "nuclear": [(lambda: ValueOracle(value_head(5), 5), {"rank": 1})],
    "noisy": [(lambda: ApproximateValueOracle(value_head(4), 4, 1e-9, random_state=0),
               {"W_bound": 4.0, "mu": 0.1})],
    "membership": [(lambda: MembershipOracle(lambda X: value_head(4)(X) > 0, 4), {})],
    "layer": [(lambda: ValueOracle(value_head(8), 8), {"n_heads": 2}),
              (lambda: ValueOracle(value_head(8), 8), {"n_heads": 2, "route": "served"})],
    "rotary": [(lambda: ValueOracle(rope_head(8), 8), {})],
    "lowprecision": [(lambda: ValueOracle(value_head(4), 4), {})],
    "relu": [(lambda: ValueOracle(lambda X: np.maximum(np.asarray(X)[:, -1].sum(1), 0), 4), {})],
    "transformer": [(lambda: ValueOracle(value_head(4), 4), "ffn_params"),
                    (lambda: ValueOracle(value_head(4), 4), {})],
    "orthogonal": [(lambda: ValueOracle(value_head(6), 6), {"n_heads": 2})],
    "multihead": [(lambda: ValueOracle(value_head(6), 6), {"n_heads": 2})],
    "vector": [(lambda d=d, H=H, o=o: VectorOracle(vector_layer(d, H, o), d, o), {"n_heads": H})
               for d, H, o in ((8, 1, "all"), (8, 1, "last"), (8, 2, "all"), (8, 2, "last"),
                               (80, 1, "all"), (128, 4, "all"))],
}


def _layer(d: int, H: int, seed: int):
    """H random heads of rank d / H with key biases and an offset."""
    return MultiHeadAttention([random_head(d, [seed, h], rank=d // H, key_bias=0.5)
                               for h in range(H)], offset=0.3)


#: per registered learner, a small box it fits (and the parameters it needs): the spend of a
#: fit without a cap is the cap of the second fit
FITS = {
    "exact": (lambda: ValueOracle(random_head(4, 1), 4), {}),
    "sketch": (lambda: ValueOracle(random_head(6, 3, rank=1), 6), {"rank": 1}),
    "nuclear": (lambda: ValueOracle(random_head(5, 4, rank=1), 5),
                {"rank": 1, "n_measurements": 30}),
    "noisy": (lambda: ApproximateValueOracle(random_head(4, 5, mu=0.3, W_fro=2.0), 4, 1e-9,
                                             random_state=0), {"W_bound": 4.0, "mu": 0.1}),
    "membership": (lambda: MembershipOracle(random_head(3, 6, mu=0.4, W_fro=2.0), 3),
                   {"eps": 1e-2, "mu": 0.2}),
    "layer": (lambda: ValueOracle(_layer(8, 2, 1), 8), {"n_heads": 2}),
    "rotary": (lambda: ValueOracle(random_rotary_head(8, 0), 8), {}),
    # its n_queries is the budget it spreads over its passes (required): the cap of the second
    # fit is the first's spend, a plan of its own
    "lowprecision": (lambda: RoundingOracle(random_head(6, 7), 6, digits=6), {"n_queries": 800}),
    "transformer": (lambda: ValueOracle(random_transformer(4, 3, 2), 4), {}),
    "relu": (lambda: ValueOracle(random_transformer(4, 3, 2), 4), {}),
    "orthogonal": (lambda: ValueOracle(orthogonal_subspace_multihead(6, 2, seed=0), 6),
                   {"n_heads": 2}),
    "multihead": (lambda: ValueOracle(random_multihead(6, 2, 1000), 6), {"n_heads": 2}),
    "vector": (lambda: VectorOracle(vector_layer(8, 2, "all"), 8, "all"), {"n_heads": 2}),
}


def _builtin() -> set:
    return {name for name, entry in registry().items() if not entry.plugin}


def test_every_budgeted_learner_has_a_case():
    assert _builtin() <= set(BUDGETED), "a learner needs a box in BUDGETED"
    assert _builtin() <= set(FITS), "a learner needs a box in FITS"
    for name in _builtin():  # one name, one meaning: the whole fit's cap, None by default
        params = registry()[name].parameters()
        assert "n_queries" in params, name
        assert params["n_queries"]["default"] is None or name == "lowprecision", name


def _arrays(est) -> dict:
    """The fitted arrays (and lists of arrays) of ``est``, by name."""
    out = {}
    for k, v in vars(est).items():
        if k.endswith("_") and not k.startswith("_") and k != "query_cap_":
            if isinstance(v, np.ndarray) or (isinstance(v, list) and v and all(
                    isinstance(x, np.ndarray) for x in v)):
                out[k] = v
    return out


@pytest.mark.filterwarnings("ignore::attnquery.errors.VacuousCheckWarning")
@pytest.mark.parametrize("name", sorted(FITS))
def test_a_cap_of_the_free_spend_pays_for_the_fit_and_is_never_passed(name):
    make, params = FITS[name]
    entry = registry()[name]
    free_oracle = make()
    free = entry.make(random_state=0, **params).fit(free_oracle)
    spend = free_oracle.n_queries
    assert free.n_queries_ == spend > free.n_verify_queries_ > 0  # the check's included
    capped_oracle = make()
    capped = entry.make(random_state=0, **{**params, "n_queries": spend}).fit(capped_oracle)
    assert capped.n_queries_ == capped_oracle.n_queries <= spend
    if name != "lowprecision":  # the same fit, bit for bit
        assert capped_oracle.n_queries == spend
        want, got = _arrays(free), _arrays(capped)
        assert want and sorted(want) == sorted(got)
        for k in want:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)
    # one query less: the fit never asks beyond it (it adapts its plan or raises by name,
    # before the first query where it plans them all)
    short = make()
    try:
        est = entry.make(random_state=0, **{**params, "n_queries": spend - 1}).fit(short)
    except AttnQueryError:
        pass
    else:
        assert est.n_queries_ == short.n_queries
    assert short.n_queries <= spend - 1
    # a cap below what any fit asks: refused by name before the first query
    tiny = make()
    with pytest.raises((ConfigError, BudgetExceededError), match=r"n_queries ?= ?2\b"):
        entry.make(random_state=0, **{**params, "n_queries": 2}).fit(tiny)
    assert tiny.n_queries == 0


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
