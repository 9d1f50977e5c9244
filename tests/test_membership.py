"""MembershipLearner (Appendix B) and the membership experiment's claims."""

import numpy as np
import pytest

from attnquery.errors import (
    AssumptionViolation,
    BudgetExceededError,
    ConfigError,
    NotIdentifiableError,
    VacuousCheckWarning,
)
from attnquery.experiments import expand_cells, run_cells
from attnquery.figures.membership import membership_claims
from attnquery.learners import MembershipLearner
from attnquery.learners.membership import sphere_constant
from attnquery.models import AttentionHead, membership_head
from attnquery.oracles import MembershipOracle, ValueOracle
from attnquery.results import rows_to_table
from attnquery.theory import membership_target as target_queries

from .vacuous import fit_noting_vacuous


@pytest.mark.parametrize("d", [1, 2, 5, 9])
@pytest.mark.parametrize("eps", [1e-2, 1e-5])
def test_bisection_recovers_W_and_the_direction_of_v(d, eps):
    head = membership_head(d, d, 4.0, 0.05)
    o = MembershipOracle(head, d)
    m = MembershipLearner(eps=eps, v_method="bisection", W_bound=4.0, mu=0.05).fit(o)
    assert np.linalg.norm(m.W_ - head.W) <= eps
    assert np.linalg.norm(m.v_) == pytest.approx(1.0)
    assert np.linalg.norm(m.v_ - head.v) <= eps
    assert m.n_verify_queries_ == 64  # membership check queries: one bit each
    assert m.n_queries_ == o.n_queries == (m.planned_queries(d)["total"] + m.n_extra_queries_
                                           + m.n_verify_queries_)
    # extra: d when every v_i < 0; one per entry at the edge |W_ij| = W_bound (d = 1 here)
    at_edge = int(np.sum(np.abs(head.W) > 4.0 - eps / d))
    assert m.n_extra_queries_ == (d if np.all(head.v < 0) else 0) + at_edge
    assert m.n_queries_v_ + m.n_queries_W_ + m.n_verify_queries_ == m.n_queries_



def test_only_the_direction_of_v_is_identifiable():
    head = membership_head(4, 0, 4.0, 0.1)
    scaled = AttentionHead(head.v * 7.5, W=head.W)
    a = MembershipLearner(eps=1e-4, W_bound=4.0, mu=0.1).fit(MembershipOracle(head, 4))
    b = MembershipLearner(eps=1e-4, W_bound=4.0, mu=0.1).fit(MembershipOracle(scaled, 4))
    assert np.array_equal(a.W_, b.W_) and np.array_equal(a.v_, b.v_)
    assert np.linalg.norm(b.v_ - scaled.v / np.linalg.norm(scaled.v)) < 1e-4


def test_query_count_is_near_the_target_and_linear_in_log_eps():
    d = 6
    head = membership_head(d, 1, 4.0, 0.1)
    counts = []
    for k in (4, 8, 12, 16, 20):
        o = MembershipOracle(head, d)
        m = MembershipLearner(eps=2.0**-k, W_bound=4.0, mu=0.1).fit(o)
        counts.append(o.n_queries - m.n_verify_queries_)
        if k >= 10:
            assert counts[-1] <= 1.2 * target_queries(d, 2.0**-k, 4.0)
    steps = np.diff(counts)  # about d^2 + d - 1 queries per 4 bits... per bit: d^2 + (d - 1)
    assert np.all(steps >= 4 * d * d) and np.all(steps <= 4 * (d * d + d))


def test_sampling_estimates_the_direction():
    head = membership_head(3, 2, 4.0, 0.2)
    m = MembershipLearner(eps=1e-2, v_method="sampling", W_bound=4.0, mu=0.2, eps_v=0.1,
                          random_state=0)
    k = m.sampling_queries(3)
    R = sphere_constant(3)
    assert R == pytest.approx(0.5)  # E|x_1| on the 2-sphere
    assert k == int(np.ceil(2 / (0.1**2 * R**2) * np.log(2 * 3 / 0.05)))
    o = MembershipOracle(head, 3)
    fit_noting_vacuous(m, o)  # eps_v = 0.1: a check of signs that cannot fail here, and says so
    assert m.n_queries_v_ == k == m.n_samples_
    assert np.max(np.abs(m.v_ - head.v)) <= 0.1


def test_sampling_refuses_a_sample_larger_than_its_budget_before_spending():
    head = membership_head(4, 0, 4.0, 0.1)
    o = MembershipOracle(head, 4)
    m = MembershipLearner(eps=1e-3, v_method="sampling", W_bound=4.0, mu=0.1)
    need = m.sampling_queries(4)
    assert need > 10**15  # Theorem B.1's eps_v = eps mu^3 / (40 W d)
    with pytest.raises(BudgetExceededError, match=str(need)):
        m.fit(o)
    assert o.n_queries == 0


def test_an_oracle_budget_too_small_is_reported_before_any_query():
    head = membership_head(4, 0, 4.0, 0.1)
    o = MembershipOracle(head, 4, budget=100)
    with pytest.raises(BudgetExceededError, match="needs"):
        MembershipLearner(eps=1e-3, W_bound=4.0, mu=0.1).fit(o)
    assert o.n_queries == 0


def test_v_zero_is_not_identifiable():
    zero = AttentionHead(np.zeros(3), W=np.eye(3))
    for method, kw in (("bisection", {}), ("sampling", {"eps_v": 0.3})):
        with pytest.raises(NotIdentifiableError, match="never|all"):
            MembershipLearner(v_method=method, **kw).fit(MembershipOracle(zero, 3))


def test_norm_bound_violation_is_detected():
    head = membership_head(3, 0, 4.0, 0.1)
    big = AttentionHead(head.v, W=head.W * 5)
    with pytest.raises(AssumptionViolation, match="W_bound"):
        MembershipLearner(eps=1e-3, W_bound=4.0, mu=0.1).fit(MembershipOracle(big, 3))


@pytest.mark.parametrize("kw,match", [
    ({"eps": 0.0}, "eps"), ({"mu": 2.0}, "mu"), ({"W_bound": 1.0}, "W_bound"),
    ({"v_method": "grid"}, "v_method"), ({"delta": 1.0}, "delta"),
])
def test_bad_parameters(kw, match):
    head = membership_head(2, 0, 4.0, 0.1)
    with pytest.raises(ConfigError, match=match):
        MembershipLearner(**kw).fit(MembershipOracle(head, 2))


@pytest.mark.parametrize("kw", [{"mu": 0.0}, {"W_bound": 1.5}])
def test_assumption_parameters_are_also_assumption_violations(kw):
    head = membership_head(2, 0, 4.0, 0.1)
    with pytest.raises(AssumptionViolation):
        MembershipLearner(**kw).fit(MembershipOracle(head, 2))


def test_value_oracles_are_refused():
    head = membership_head(2, 0, 4.0, 0.1)
    with pytest.raises(ConfigError, match="membership"):
        MembershipLearner().fit(ValueOracle(head, 2))


def test_membership_experiment_claims_hold():
    # the grid's loosest cells (eps 0.3) check nothing that could fail: they warn, rows say so
    with pytest.warns(VacuousCheckWarning, match="could not fail"):
        rows, _ = run_cells(expand_cells("membership", {
            "d": [2, 4, 8], "eps": [1e-1, 1e-2, 1e-3, 1e-4, 1e-6], "seeds": 2, "W_bound": 4.0,
            "mu": 0.05, "compare": {"d": [3], "eps": [0.3, 0.1, 1e-3], "seeds": 1},
        }), 20260122)
    df = rows_to_table(rows).to_pandas()
    assert df["verify_vacuous"].any() and not df[df["eps"] <= 1e-3]["verify_vacuous"].any()
    assert (df["status"] == "ok").all()
    claims = {c.name: c for c in membership_claims(df)}
    for name in ("membership_linear_log_eps", "membership_target", "membership_error",
                 "membership_v_ratio"):
        assert claims[name].passed, claims[name]
    samp = df[(df["v_method"] == "sampling") & (df["eps"] == 1e-3)]
    assert samp["queries_computed"].all() and samp["abs_err_W"].isna().all()
    ran = df[(df["v_method"] == "sampling") & (df["eps"] == 0.3)]
    assert (~ran["queries_computed"].astype(bool)).all()
    # the claim can fail: inflate bisection's v-stage count
    bad = df.copy()
    bad.loc[bad["v_method"] == "bisection", "n_queries_v"] *= 10**6
    assert not {c.name: c for c in membership_claims(bad)}["membership_v_ratio"].passed
