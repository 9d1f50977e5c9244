"""The one budget: every learner's budget is its ``n_queries``, read through its fit's query
ledger (:class:`attnquery.learners._base.QueryLedger`); the old names warn and still work."""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import attnquery
from attnquery.errors import BudgetExceededError, ConfigError, SearchLimitError
from attnquery.extraction import DeclaredApproximateOracle, ProgressOracle
from attnquery.learners import MembershipLearner, ReLUNetworkLearner, TransformerLearner
from attnquery.learners._registry import learner_parameters, registry
from attnquery.models import membership_head, random_transformer
from attnquery.oracles import MembershipOracle, ValueOracle

SRC = Path(attnquery.__file__).parent
#: the one place budget arithmetic lives: the ledger (learners/_ledger.py, re-exported by
#: learners/_base.py), the check of an estimate that asks through it, and the oracles, whose
#: ``budget=`` is the box's (oracles/_base.py: the bases and check_budget, the way to it)
BUDGET_MODULES = {"learners/_base.py", "learners/_ledger.py", "learners/_check.py",
                  "oracles/__init__.py", "oracles/_base.py"}
#: converted to the ledger on their own branches (none left: every learner reads the ledger)
PENDING = ()
#: what budget arithmetic of its own looks like: checking or reading an oracle's budget, and
#: the mechanisms the ledger replaced
OWN_BUDGET = {
    # (a ledger's own check_budget is its need(n, what, reserved=True))
    r"(?<!ledger\.)\bcheck_budget\(": "checks an oracle's budget itself (ledger.need)",
    r"\.remaining\b|[\"']remaining[\"']": "reads an oracle's remaining budget (ledger.left)",
    r"\b(_CappedFunction|Capped|_budget_left|_check_served_budget|_served_left)\b":
        "a budget mechanism of its own",
    r"\b(sample_budget|max_queries)\s*[-+<>]|[-+<>]=?\s*[\w.]*\b(sample_budget|max_queries)\b":
        "budget arithmetic on an old budget name",
}


def test_no_module_outside_the_ledger_does_budget_arithmetic():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in BUDGET_MODULES or rel.startswith(PENDING):
            continue
        for k, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{rel}:{k} {why}: {line.strip()}" for pat, why in OWN_BUDGET.items()
                      if re.search(pat, line)]
    assert not found, "\n".join(found)


def test_the_scan_sees_budget_arithmetic():
    # the patterns catch what was there before the ledger (the test above can fail)
    before = ["        check_budget(oracle, d * d + d, 'exact recovery')",
              "        left = getattr(self.oracle, 'remaining', None)",
              "        f = _CappedFunction(oracle, self.query_cap_)",
              "        if plan['v'] > self.sample_budget:",
              "        oracle.check_budget(n, 'the W pass')"]
    assert all(any(re.search(p, line) for p in OWN_BUDGET) for line in before)
    assert not any(re.search(p, "        run.ledger.check_budget(n, 'the values')")
                   for p in OWN_BUDGET)


def test_max_queries_is_n_queries_under_its_old_name():
    tf = random_transformer(4, 12, seed=0)
    counts = {}
    for name in ("n_queries", "max_queries"):
        oracle = ValueOracle(tf, 4)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(SearchLimitError, match="cap of 500 queries"):
                ReLUNetworkLearner(random_state=0, **{name: 500}).fit(oracle)
        future = [w for w in seen if issubclass(w.category, FutureWarning)]
        assert len(future) == (name == "max_queries")
        if future:
            assert "max_queries is deprecated" in str(future[0].message)
            assert "n_queries=500" in str(future[0].message)
            assert future[0].filename == __file__  # it names the line that called fit
        counts[name] = oracle.n_queries
    assert counts["n_queries"] == counts["max_queries"] <= 500
    est = ReLUNetworkLearner(n_queries=123)
    assert est.query_cap(4) == 123 != ReLUNetworkLearner().query_cap(4)


def test_the_ffn_cap_is_its_ledgers():
    tf = random_transformer(4, 3, seed=0)
    free = ReLUNetworkLearner(random_state=0).fit(ValueOracle(tf, 4))
    spent = free.n_queries_  # the check's queries included: n_queries caps the whole fit
    # exactly what the fit needs is enough, and gives the same network; one less is refused
    est = ReLUNetworkLearner(random_state=0, n_queries=spent).fit(ValueOracle(tf, 4))
    assert est.query_cap_ == spent and est.n_queries_ == free.n_queries_
    np.testing.assert_array_equal(est.A_, free.A_)
    oracle = ValueOracle(tf, 4)
    with pytest.raises(SearchLimitError, match=f"cap of {spent - 1} queries"):
        ReLUNetworkLearner(random_state=0, n_queries=spent - 1).fit(oracle)
    assert oracle.n_queries <= spent - 1


@pytest.mark.filterwarnings("ignore::attnquery.errors.VacuousCheckWarning")
def test_sample_budget_still_bounds_the_sample_with_a_warning():
    head = membership_head(3, 2, 4.0, 0.2)
    kw = dict(eps=1e-2, v_method="sampling", W_bound=4.0, mu=0.2, eps_v=0.1, random_state=0)
    k = MembershipLearner(**kw).sampling_queries(3)
    oracle = MembershipOracle(head, 3)
    with pytest.warns(FutureWarning, match="sample_budget is deprecated.*n_queries"), \
            pytest.raises(BudgetExceededError, match=f"k = {k} sphere queries .* but "
                          f"sample_budget = {k - 1}; no query was spent"):
        MembershipLearner(**kw, sample_budget=k - 1).fit(oracle)
    assert oracle.n_queries == 0
    with pytest.warns(FutureWarning, match="sample_budget"):
        old = MembershipLearner(**kw, sample_budget=k).fit(MembershipOracle(head, 3))
    new = MembershipLearner(**kw).fit(MembershipOracle(head, 3))
    np.testing.assert_array_equal(old.W_, new.W_)
    np.testing.assert_array_equal(old.v_, new.v_)


def test_membership_n_queries_caps_the_whole_fit_before_any_query():
    head = membership_head(3, 2, 4.0, 0.2)
    kw = dict(eps=1e-2, W_bound=4.0, mu=0.2, random_state=0)
    free = MembershipLearner(**kw).fit(MembershipOracle(head, 3))
    need = free.n_queries_
    assert need == sum(MembershipLearner(**kw).planned_queries(3)[s] for s in ("v", "W")) + \
        free.n_verify_queries_ + free.n_extra_queries_
    capped = MembershipLearner(**kw, n_queries=need).fit(MembershipOracle(head, 3))
    np.testing.assert_array_equal(capped.W_, free.W_)
    assert capped.n_queries_by_stage_ == free.n_queries_by_stage_
    oracle = MembershipOracle(head, 3)
    with pytest.raises(BudgetExceededError, match=rf"membership recovery .* needs {need} "
                       rf"queries but only {need - 1} of MembershipLearner's budget of "
                       rf"{need - 1} remain"):
        MembershipLearner(**kw, n_queries=need - 1).fit(oracle)
    assert oracle.n_queries == 0
    # a sample too large for the default bound is one the fit's budget may allow
    big = MembershipLearner(eps=1e-3, v_method="sampling", W_bound=4.0, mu=0.1, n_queries=10)
    assert big.max_samples() is None and MembershipLearner().max_samples() == 10**7
    small = MembershipOracle(membership_head(4, 0, 4.0, 0.1), 4)
    with pytest.raises(ConfigError, match="n_queries=10 is below the 65 queries every fit of "
                       r"MembershipLearner asks at the least \(verify=64 check queries"):
        big.fit(small)
    assert small.n_queries == 0


@pytest.mark.parametrize("make,old", [
    (lambda: ReLUNetworkLearner(n_queries=10, max_queries=10), "max_queries"),
    (lambda: MembershipLearner(n_queries=10, sample_budget=10), "sample_budget"),
    (lambda: TransformerLearner(ffn_params={"n_queries": 10, "max_queries": 10}), "max_queries"),
])
def test_both_names_are_a_clear_error_before_any_query(make, old):
    tf = random_transformer(4, 3, seed=0)
    oracle = MembershipOracle(membership_head(3, 0, 4.0, 0.1), 3) if old == "sample_budget" \
        else ValueOracle(tf, 4)
    with pytest.raises(ConfigError, match=f"{old} and n_queries are both given; {old} is the "
                       "old name of n_queries"):
        make().fit(oracle)
    assert oracle.n_queries == 0


def test_a_bad_budget_names_the_new_parameter_only():
    with pytest.raises(ConfigError, match=r"^n_queries must be an integer >= 1 or None; got 0$"):
        ReLUNetworkLearner(n_queries=0).fit(ValueOracle(random_transformer(4, 3, seed=0), 4))
    # the sentinel of the old name is not offered in the message
    with pytest.raises(ConfigError, match=r"^sample_budget must be an integer >= 1; got 'all'$"):
        MembershipLearner(sample_budget="all").fit(
            MembershipOracle(membership_head(3, 0, 4.0, 0.1), 3))


def test_the_registry_names_every_budget_n_queries():
    names = set()
    for entry in registry().values():
        params = learner_parameters(entry.load())
        assert not {"max_queries", "sample_budget"} & set(params), entry.name
        if "n_queries" in params:
            names.add(entry.name)
    assert {"relu", "membership"} <= names


def test_wrapper_oracles_forward_kind_count_and_budget():
    inner = MembershipOracle(membership_head(3, 0, 4.0, 0.1), 3, budget=5)

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    wrapped = ProgressOracle(inner, bar)
    assert (wrapped.kind, wrapped.remaining, wrapped.d) == ("membership", 5, 3)
    wrapped(np.ones((2, 1, 3)))
    assert (wrapped.n_queries, wrapped.remaining, bar.n) == (2, 3, 2)
    with pytest.raises(BudgetExceededError, match="needs 4 queries but only 3"):
        wrapped.check_budget(4, "the next step")
    declared = DeclaredApproximateOracle(lambda X: X[:, -1, 0], 3, tau=1e-3, budget=4)
    assert (declared.kind, declared.remaining, declared.tau) == ("approximate value", 4, 1e-3)
