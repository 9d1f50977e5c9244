"""Low-rank learners (Section 5): the nuclear-norm learner and the sketch learner."""

from __future__ import annotations

import numpy as np
import pytest

from attnquery.errors import (
    AssumptionViolation,
    BudgetExceededError,
    ConfigError,
    ModelMismatchError,
    NotIdentifiableError,
)
from attnquery.learners import NuclearNormROPLearner, SketchLowRankLearner
from attnquery.learners.lowrank import lowrank_floor
from attnquery.metrics import relative_error
from attnquery.models import AttentionHead, random_head
from attnquery.oracles import ValueOracle


def _oracle(head, budget=None):
    return ValueOracle(head, head.d, budget=budget)


# ---------------------------------------------------------------------------------------------
# sketch learner
# ---------------------------------------------------------------------------------------------


def test_sketch_known_rank_uses_exactly_the_floor():
    d, r = 64, 4
    head = random_head(d, 3, rank=r)
    oracle = _oracle(head)
    est = SketchLowRankLearner(rank=r, oversample=0, random_state=0).fit(oracle)
    assert est.n_verify_queries_ == 8 and np.isfinite(est.verify_error_)
    assert oracle.n_queries == est.n_queries_ == lowrank_floor(d, r) + est.n_verify_queries_
    assert est.n_requeried_ == 0
    L, R = est.W_factors_
    assert L.shape == (d, r) and R.shape == (d, r)
    assert relative_error(L @ R.T, head.W) <= 1e-10
    assert relative_error(est.W_, head.W) <= 1e-10
    assert relative_error(est.v_, head.v) == 0.0
    X = np.random.default_rng(0).standard_normal((16, 3, d)) / np.sqrt(d)
    np.testing.assert_allclose(est.predict(X), head(X), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("rank", [None, 4])
@pytest.mark.parametrize("d,r,kw", [(64, 4, {}), (128, 16, {"zero_frac": 0.25}),
                                    (48, 2, {"W_spectral": 200.0})])
def test_sketch_fit_bias_uses_the_floor_plus_d_plus_1(d, r, kw, rank):
    # the zero token gives beta, d probes [kappa a_m; 0] give c, and the sketch itself costs
    # r (2d - r) + d (v included) plus oversampling: r (2d - r) + 2d + 1 + p (d - r) queries
    head = random_head(d, [d, r, 5], rank=r, key_bias=2.0, offset=-0.4, **kw)
    oracle = _oracle(head)
    est = SketchLowRankLearner(rank=None if rank is None else r, oversample=0, random_state=2,
                               fit_bias=True).fit(oracle)
    assert est.rank_ == r
    # only the large head's pilot saturates (asked again at a 100x smaller scale)
    assert (est.n_requeried_ > 0) == ("W_spectral" in kw)
    floor = lowrank_floor(d, r) + d + 1
    n = oracle.n_queries - est.n_requeried_ - est.n_verify_queries_
    if rank is None:  # the rank search's span tests: k + 2 rows for each of the r + 1 tests
        assert floor < n <= floor + (r + 1) * (r + 2)
    else:
        assert n == est.n_queries_ - est.n_requeried_ - est.n_verify_queries_ == floor
    assert relative_error(est.W_, head.W) <= 1e-9
    assert relative_error(est.key_bias_, head.key_bias) <= 1e-12
    assert relative_error(est.v_, head.v) <= 1e-14
    assert abs(est.offset_ - head.offset) <= 1e-15
    X = np.random.default_rng(0).standard_normal((16, 3, d)) / np.sqrt(d)
    np.testing.assert_allclose(est.predict(X), head(X), rtol=1e-9, atol=1e-12)
    # default oversampling: p (d - r) more rows, still within 1.05 (r (2d - r) + d) + d + 1
    oracle = _oracle(head)
    est = SketchLowRankLearner(rank=r, random_state=2, fit_bias=True).fit(oracle)
    learning = oracle.n_queries - est.n_requeried_ - est.n_verify_queries_
    assert learning == floor + est.oversample_ * (d - r)
    assert learning <= 1.05 * lowrank_floor(d, r) + d + 1
    with pytest.raises(ConfigError, match="fit_bias"):
        SketchLowRankLearner(fit_bias=1).fit(_oracle(head))


@pytest.mark.parametrize("r", [1, 3, 16])
def test_sketch_finds_rank_within_105_percent_of_floor(r):
    d = 256
    head = random_head(d, 10 + r, rank=r, zero_frac=0.25)
    oracle = _oracle(head)
    est = SketchLowRankLearner(random_state=1).fit(oracle)
    assert est.rank_ == r
    learning = oracle.n_queries - est.n_verify_queries_
    assert lowrank_floor(d, r) <= learning <= 1.05 * lowrank_floor(d, r)
    L, R = est.W_factors_
    assert relative_error(L @ R.T, head.W) <= 1e-8
    assert relative_error(est.v_, head.v) <= 1e-12


def test_sketch_probes_share_their_last_tokens():
    """Probes are asked grouped by last token (one per right-sketch column, one per coordinate
    of the left sketch), and each group asks its token identically, so a black box that caches
    per-token work evaluates W x_N about r + d times, not once per query."""
    d, r = 128, 6
    head = random_head(d, 4, rank=r)
    tokens = set()

    def box(X):
        tokens.update(row.tobytes() for row in X[:, -1, :])
        return head(X)

    oracle = ValueOracle(box, d)
    est = SketchLowRankLearner(random_state=2).fit(oracle)
    assert est.rank_ == r
    # d one-row queries for v, k + 1 sketch vectors (the last one shows the rank), d - k
    # coordinates for the left sketch; the check queries are random
    assert len(tokens) <= d + (r + 1) + d + est.n_verify_queries_
    assert oracle.n_queries > 6 * len(tokens)  # without the grouping: one token per query


def test_sparse_rows_match_their_dense_form():
    from attnquery.learners._probes import SparseRows, coordinate_rows, probe_logits

    rng = np.random.default_rng(3)
    d = 7
    U = SparseRows((4, d), [2, 0, 3, 0, 1], [1, 4, 6, 2, 0], [0.5, 1.0, -2.0, 3.0, 1.5])
    dense = np.zeros((4, d))
    dense[[2, 0, 3, 0, 1], [1, 4, 6, 2, 0]] = [0.5, 1.0, -2.0, 3.0, 1.5]
    np.testing.assert_array_equal(U.toarray(), dense)
    v = rng.standard_normal(d)
    np.testing.assert_allclose(U @ v, dense @ v, rtol=1e-15)
    mask = np.array([True, False, True, True])
    np.testing.assert_array_equal(U[mask].toarray(), dense[mask])
    np.testing.assert_array_equal(coordinate_rows([3, 0], d).toarray(), np.eye(d)[[3, 0]])
    # the probes built from sparse and broadcast rows are the dense ones
    head = random_head(d, 5)
    c, s = rng.uniform(0.5, 1.0, 4), rng.uniform(0.5, 1.0, 4)
    b = rng.standard_normal(d)
    for Uq, last in ((U, np.broadcast_to(b, (4, d))), (dense, coordinate_rows([1, 1, 2, 5], d))):
        Ud = Uq if isinstance(Uq, np.ndarray) else Uq.toarray()
        Ld = last if isinstance(last, np.ndarray) else last.toarray()
        got = probe_logits(_oracle(head), Uq, None, c, s, head.v, last=last)[0]
        want = probe_logits(_oracle(head), Ud, None, c, s, head.v, last=np.array(Ld))[0]
        np.testing.assert_allclose(got, want, rtol=1e-9)
        np.testing.assert_allclose(got, c * s * np.einsum("kd,de,ke->k", Ud, head.W, Ld),
                                   rtol=1e-8)


def test_sketch_rank_half_d_and_large_scale_head():
    d, r = 64, 32  # r = d / 2 is still allowed
    head = random_head(d, 4, rank=r, W_spectral=200.0)
    oracle = _oracle(head)
    est = SketchLowRankLearner(random_state=2).fit(oracle)
    assert est.rank_ == r
    assert relative_error(est.W_, head.W) <= 1e-8
    # saturated probes were asked again and counted by the oracle
    assert est.n_queries_ == oracle.n_queries


def test_sketch_rank_zero_head():
    d = 16
    v = np.random.default_rng(0).standard_normal(d)
    head = AttentionHead(v, K=np.zeros((1, d)), Q=np.zeros((1, d)))
    est = SketchLowRankLearner(random_state=0).fit(_oracle(head))
    assert est.rank_ == 0
    assert np.all(est.W_ == 0.0)
    assert est.n_queries_ == 2 * d + est.n_verify_queries_


def test_sketch_full_rank_head_is_rejected():
    d = 16
    head = random_head(d, 0)  # dense, full rank
    with pytest.raises(AssumptionViolation, match="rank above d / 2"):
        SketchLowRankLearner(random_state=0).fit(_oracle(head))


def test_sketch_bad_input():
    d = 16
    head = random_head(d, 1, rank=2)
    with pytest.raises(ConfigError, match="larger than d / 2"):
        SketchLowRankLearner(rank=9).fit(_oracle(head))
    with pytest.raises(ConfigError, match="oversample"):
        SketchLowRankLearner(oversample=-1).fit(_oracle(head))
    zero_v = AttentionHead(np.zeros(d), K=head.K, Q=head.Q)
    with pytest.raises(NotIdentifiableError):
        SketchLowRankLearner().fit(_oracle(zero_v))
    oracle = _oracle(head, budget=lowrank_floor(d, 2) + 7)  # the floor and 8 check queries
    with pytest.raises(BudgetExceededError):
        SketchLowRankLearner(rank=2, oversample=0).fit(oracle)
    assert oracle.n_queries == 0


def test_sketch_default_oversampling_keeps_bound_and_error():
    d, r = 384, 24
    head = random_head(d, 7, rank=r)
    oracle = _oracle(head)
    est = SketchLowRankLearner(rank=r, random_state=3).fit(oracle)
    assert est.oversample_ >= 1
    learning = oracle.n_queries - est.n_verify_queries_
    assert learning == lowrank_floor(d, r) + est.oversample_ * (d - r)
    assert learning <= 1.05 * lowrank_floor(d, r)
    assert relative_error(est.W_, head.W) <= 1e-8


# ---------------------------------------------------------------------------------------------
# nuclear-norm learner
# ---------------------------------------------------------------------------------------------


def test_nuclear_recovers_above_the_transition():
    d, r = 10, 1  # m = 80 < d^2: the convex program is solved
    head = random_head(d, 5, rank=r)
    oracle = _oracle(head)
    m = 4 * r * 2 * d
    est = NuclearNormROPLearner(n_measurements=m, rank=r, random_state=0).fit(oracle)
    assert oracle.n_queries == d + m + est.n_verify_queries_ == est.n_queries_
    assert est.solver_status_ == "optimal"
    assert est.polished_ and est.rank_ == r
    assert relative_error(est.W_, head.W) <= 1e-9
    # polishing takes the solver's tolerance down to rounding level
    assert relative_error(est.W_, head.W) < relative_error(est.W_raw_, head.W)
    assert est.solve_time_s_ > 0 and est.solver_iterations_ >= 1


def test_nuclear_fails_below_the_transition():
    d, r = 10, 1
    head = random_head(d, 6, rank=r)
    est = NuclearNormROPLearner(n_measurements=10, rank=r, random_state=0)
    with pytest.raises(ModelMismatchError, match="raise n_measurements"):
        est.fit(_oracle(head))  # the wrong solution is refused, not returned
    assert not est.polished_
    assert relative_error(est.W_, head.W) > 1e-2 and est.verify_error_ > 1e-3


def test_nuclear_clarabel_and_redundant_constraints():
    d, r = 6, 1
    head = random_head(d, 8, rank=r)
    est = NuclearNormROPLearner(n_measurements=36, rank=r, solver="CLARABEL",
                                random_state=0).fit(_oracle(head))
    assert est.solver_status_ == "least_squares"  # m >= d^2: W is determined alone
    assert relative_error(est.W_, head.W) <= 1e-9
    est = NuclearNormROPLearner(n_measurements=30, rank=r, solver="CLARABEL",
                                random_state=0).fit(_oracle(head))
    assert est.solver_status_.startswith("optimal")
    assert relative_error(est.W_, head.W) <= 1e-9


def test_nuclear_bad_input():
    d = 8
    head = random_head(d, 1, rank=1)
    with pytest.raises(ConfigError, match="larger than d / 2"):
        NuclearNormROPLearner(rank=5).fit(_oracle(head))
    with pytest.raises(ConfigError, match="solver"):
        NuclearNormROPLearner(rank=1, solver="MOSEK").fit(_oracle(head))
    for kw, what in (({"max_logit": 100.0}, "max_logit"), ({"min_logit": 20.0}, "min_logit"),
                     ({"initial_logit_scale": 0.0}, "initial_logit_scale")):
        oracle = _oracle(head)
        with pytest.raises(ConfigError, match=what):
            NuclearNormROPLearner(rank=1, **kw).fit(oracle)
        assert oracle.n_queries == 0
    oracle = _oracle(head, budget=d + 40 + 8)
    with pytest.raises(BudgetExceededError):
        NuclearNormROPLearner(n_measurements=41, rank=1).fit(oracle)
    assert oracle.n_queries == 0
    zero_v = AttentionHead(np.zeros(d), K=head.K, Q=head.Q)
    with pytest.raises(NotIdentifiableError):
        NuclearNormROPLearner(rank=1).fit(_oracle(zero_v))
