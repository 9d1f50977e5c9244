"""The learner core: the query ledger, the scalar check, keyword-only constructors and short
functions (measured with ast)."""

from __future__ import annotations

import ast
import inspect
import numbers
import pathlib

import numpy as np
import pytest

import attnquery.learners as learners
from attnquery.errors import AssumptionViolation, BudgetExceededError, ConfigError
from attnquery.learners._base import QueryLedger, check_scalar
from attnquery.models import AttentionHead, random_head, random_transformer
from attnquery.oracles import (
    ApproximateValueOracle,
    MembershipOracle,
    RoundingOracle,
    ValueOracle,
)

LEARNERS_DIR = pathlib.Path(learners.__file__).parent
#: the longest function the learners may have, and the longest ``fit`` body (docstring aside)
MAX_FUNCTION_LINES = 80
MAX_FIT_LINES = 40


def _functions():
    for path in sorted(LEARNERS_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield path.relative_to(LEARNERS_DIR), node


def _body_lines(node) -> int:
    """Lines of a function's body, its docstring left out."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_no_learner_function_is_longer_than_80_lines():
    long = [f"{p}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p, n in _functions() if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


def test_every_fit_reads_as_a_list_of_steps():
    fits = [(p, n) for p, n in _functions() if n.name == "fit"]
    assert len(fits) >= len(learners.__all__)
    long = [f"{p}:{n.lineno} ({_body_lines(n)} lines)" for p, n in fits
            if _body_lines(n) > MAX_FIT_LINES]
    assert not long, long


@pytest.mark.parametrize("name", learners.__all__)
def test_constructors_are_keyword_only_with_random_state_last(name):
    cls = getattr(learners, name)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert all(p.kind is p.KEYWORD_ONLY for p in params), name
    assert params[-1].name == "random_state", name
    with pytest.raises(TypeError):
        cls(1)


# -- the ledger ---------------------------------------------------------------------------------
def _oracle(budget=None):
    return ValueOracle(AttentionHead(np.ones(3), W=np.eye(3)), 3, budget=budget)


def test_ledger_counts_what_the_oracle_counts_per_stage():
    oracle = _oracle()
    oracle(np.zeros((2, 1, 3)))  # before the ledger: not counted
    ledger = QueryLedger(oracle, ("a", "b", "c"))
    ledger.ask(np.zeros((4, 1, 3)), "a")
    with ledger.stage("b"):
        oracle(np.zeros((2, 1, 3)))  # a helper given the raw oracle
        ledger(np.zeros((1, 1, 3)))  # the ledger as an oracle: the current stage
        with ledger.stage("a"):  # nested: counted once, in the inner stage
            oracle(np.zeros((5, 1, 3)))
        oracle(np.zeros((3, 2, 3)))
    assert ledger.counts() == {"a": 9, "b": 6, "c": 0}
    assert ledger.total == 15 == oracle.n_queries - 2 == sum(ledger.counts().values())
    assert ledger.d == 3 and ledger.kind == "value" and ledger.n_queries == oracle.n_queries


def test_ledger_checks_the_budget_before_asking():
    oracle = _oracle(budget=5)
    ledger = QueryLedger(oracle, ("a",), what="the test")
    ledger.ask(np.zeros((3, 1, 3)), "a")
    with pytest.raises(BudgetExceededError, match="the test's a stage needs 4 queries"):
        ledger.ask(np.zeros((4, 1, 3)), "a")
    assert oracle.n_queries == 3 and ledger.remaining == 2


def test_ledger_counts_are_set_when_a_fit_raises():
    head = random_head(4, 0, rank=1)
    est = learners.SketchLowRankLearner(rank=1, random_state=0)
    with pytest.raises(BudgetExceededError):
        est.fit(ValueOracle(head, 4, budget=3))
    assert sum(est.n_queries_by_stage_.values()) == 0
    m = learners.MembershipLearner()
    with pytest.raises(AttributeError):
        assert m.n_queries_v_ is None  # a fitted attribute, before fit: never reached


def _fits():
    """One small fit per learner, with the stages it must report."""
    d = 5
    head = random_head(d, 1)
    tf = random_transformer(4, 3, 2)
    yield (learners.ExactValueQueryLearner(random_state=0), ValueOracle(head, d),
           {"constants": d, "W": d * d})
    yield (learners.ExactValueQueryLearner(fit_bias=True, random_state=0),
           ValueOracle(random_head(d, 2, key_bias=0.5), d), {"constants": 2 * d + 1})
    yield (learners.SketchLowRankLearner(rank=1, random_state=0),
           ValueOracle(random_head(8, 3, rank=1), 8), {"constants": 8})
    yield (learners.NuclearNormROPLearner(rank=1, n_measurements=40, random_state=0),
           ValueOracle(random_head(6, 4, rank=1), 6), {"v": 6, "measurements": 40})
    yield (learners.NoisyValueQueryLearner(W_bound=4.0, mu=0.1, random_state=0),
           ApproximateValueOracle(random_head(4, 5, mu=0.3, W_fro=2.0), 4, 1e-9,
                                  random_state=0), {"v": 4, "W": 16})
    yield (learners.MembershipLearner(eps=1e-2, mu=0.2, random_state=0),
           MembershipOracle(random_head(3, 6, mu=0.4, W_fro=2.0), 3), {})
    yield (learners.LowPrecisionValueQueryLearner(n_queries=800, random_state=0),
           RoundingOracle(random_head(6, 7), 6, digits=6), {"v": 6})
    yield (learners.TransformerLearner(random_state=0), ValueOracle(tf, 4),
           {"attention": 2 * (16 + 4)})
    yield (learners.ReLUNetworkLearner(random_state=0), ValueOracle(tf, 4), {})


@pytest.mark.parametrize("case", list(range(9)))
def test_every_learner_reports_its_queries_by_stage(case):
    est, oracle, expected = list(_fits())[case]
    est.fit(oracle)
    stages = est.n_queries_by_stage_
    assert sum(stages.values()) == est.n_queries_ == oracle.n_queries
    assert stages["verify"] == est.n_verify_queries_ > 0
    for stage, n in expected.items():
        assert stages[stage] == n, (stage, stages)
    if isinstance(est, learners.MembershipLearner):
        assert (est.n_queries_v_, est.n_queries_W_) == (stages["v"], stages["W"])
        plan = est.planned_queries(3)
        assert plan["W"] <= est.n_queries_W_ <= plan["W"] + est.n_extra_queries_
    if isinstance(est, learners.TransformerLearner):
        assert est.n_queries_ffn_ == stages["ffn"] > 0


# -- the scalar check ---------------------------------------------------------------------------
def test_check_scalar_names_the_parameter_and_its_range():
    assert check_scalar(3, "n", numbers.Integral, min_val=1) == 3
    assert isinstance(check_scalar(np.int64(3), "n", numbers.Integral), int)
    assert check_scalar(None, "r", numbers.Integral, allow_none=True) is None
    assert check_scalar(0.5, "x", min_val=0, max_val=1, include_boundaries="neither") == 0.5
    bad = [((0, "n", numbers.Integral), {"min_val": 1}, "n must be an integer >= 1; got 0"),
           ((True, "n", numbers.Integral), {}, "n must be an integer; got True"),
           ((2.0, "n", numbers.Integral), {}, "n must be an integer; got 2.0"),
           ((np.nan, "x"), {}, "x must be a number; got nan"),
           ((1.0, "x"), {"min_val": 0, "max_val": 1, "include_boundaries": "left"},
            r"x must be a number in \[0, 1\); got 1.0"),
           ((None, "x"), {}, "x must be a number; got None"),
           (("1", "x"), {"allow_none": True}, "x must be a number or None; got '1'")]
    for args, kw, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            check_scalar(*args, **kw)
    with pytest.raises(AssumptionViolation, match="mu must be in"):
        check_scalar(2.0, "mu", max_val=1, exc=AssumptionViolation, what="in (0, 1]")


# -- the one budget: QueryLedger(cap=, reserve=), left() and need() ------------------------------
def test_ledger_cap_and_reserve_bound_what_a_fit_may_ask():
    d = 4
    oracle = ValueOracle(random_head(d, seed=0), d, budget=50)
    oracle(np.zeros((5, 2, d)))                      # 5 spent before the fit: 45 remain
    ledger = QueryLedger(oracle, ("a", "check"), "L", cap=30, reserve=8)
    assert ledger.left() == 22 and ledger.left(reserved=True) == 30
    ledger.need(22, "the a pass")                     # fits, reserve kept
    with pytest.raises(BudgetExceededError, match=r"the a pass needs 23 queries but only 22 of "
                       r"L's budget of 30 remain \(0 spent, 8 kept for later stages\)"):
        ledger.need(23, "the a pass")
    assert oracle.n_queries == 5                      # refused before anything was asked
    ledger.ask(np.zeros((22, 2, d)), "a")
    assert ledger.left() == 0 and ledger.left(reserved=True) == 8
    ledger.ask(np.zeros((8, 2, d)), "check")          # the reserve is the check's
    assert ledger.left(reserved=True) == 0
    with pytest.raises(BudgetExceededError):
        ledger.ask(np.zeros((1, 2, d)), "check")
    assert ledger.counts() == {"a": 22, "check": 8} and oracle.n_queries == 35


def test_ledger_without_cap_follows_the_oracles_budget():
    d = 3
    assert QueryLedger(ValueOracle(random_head(d, seed=1), d)).left() is None
    oracle = ValueOracle(random_head(d, seed=1), d, budget=10)
    ledger = QueryLedger(oracle, reserve=4)
    assert ledger.left() == 6
    with pytest.raises(BudgetExceededError, match="kept for later stages"):
        ledger.need(7, "step")
    with pytest.raises(BudgetExceededError, match="only 10 of the budget of 10 remain"):
        ledger.need(11, "step", reserved=True)
