"""Parameters are refused by name before the first query (issue 30).

Every learner declares its parameters' constraints in ``_parameter_constraints``
(``attnquery.learners._params``); ``fit`` checks them, and the rules joining several
parameters, before it asks anything, and a bad value raises ConfigError naming the parameter,
what it may be and the value given.
"""

import ast
import inspect
import math
import numbers
import re
import textwrap

import numpy as np
import pytest

from attnquery import learners
from attnquery.cli import main
from attnquery.errors import AssumptionViolation, ConfigError
from attnquery.learners import (
    AttentionLayerLearner,
    ExactValueQueryLearner,
    LowPrecisionValueQueryLearner,
    NoisyValueQueryLearner,
    RotaryValueQueryLearner,
    TransformerLearner,
)
from attnquery.learners._base import MAX_VERIFY, check_scalar
from attnquery.learners._params import (
    INT64_MAX,
    Interval,
    Lengths,
    Options,
    describe_constraints,
    make_constraint,
    validate_parameter_constraints,
)
from attnquery.models import random_head
from attnquery.models.vector import random_vector_layer
from attnquery.oracles import MembershipOracle, ValueOracle, VectorOracle

D = 4
HUGE = 10**30

#: every learner with parameters that make it valid, and whether it asks a membership oracle
VALID = {
    "ExactValueQueryLearner": ({}, False),
    "NuclearNormROPLearner": ({}, False),
    "SketchLowRankLearner": ({}, False),
    "NoisyValueQueryLearner": ({"W_bound": 4.0, "mu": 0.1}, False),
    "LowPrecisionValueQueryLearner": ({"n_queries": 10**4}, False),
    "MembershipLearner": ({}, True),
    "TransformerLearner": ({}, False),
    "ReLUNetworkLearner": ({}, False),
    "OrthogonalSubspaceLearner": ({"n_heads": 2}, False),
    "MultiHeadLearner": ({}, False),
    "AttentionLayerLearner": ({"n_heads": 2}, False),
    "RotaryValueQueryLearner": ({}, False),
    "VectorLayerLearner": ({}, "vector"),
}


def _oracle(membership=False):
    """The oracle a learner of VALID takes: value, membership (True) or vector ("vector")."""
    head = random_head(D, seed=0)
    if membership == "vector":
        layer = random_vector_layer(D, n_heads=1, seed=0)
        return VectorOracle(layer, D, outputs="all")
    return MembershipOracle(head, D) if membership else ValueOracle(head, D)


def _refused(learner, oracle, name, value=None):
    """Fit; assert a ConfigError naming ``name`` (and ``value``, when given) before any query.
    Returns the message."""
    with pytest.raises(ConfigError, match=re.escape(name)) as info:
        learner.fit(oracle)
    assert oracle.n_queries == 0
    if value is not None:
        assert repr(value) in str(info.value)
    return str(info.value)


# -- every learner declares every parameter, and checks them first ------------------------------
def test_every_learner_is_listed():
    assert set(VALID) == set(learners.__all__)


@pytest.mark.parametrize("name", sorted(VALID))
def test_constraints_cover_every_parameter(name):
    cls = getattr(learners, name)
    kwargs, _ = VALID[name]
    params = cls(**kwargs).get_params()
    missing = sorted(set(params) - set(cls._parameter_constraints))
    assert not missing, f"{name} declares no constraint for {missing}"
    # each is described in words (for a registry and the docs)
    described = cls.parameter_constraints()
    assert set(described) == set(params)
    assert all(isinstance(t, str) and t for t in described.values())


@pytest.mark.parametrize("name", sorted(VALID))
def test_fit_checks_the_parameters_first(name):
    cls = getattr(learners, name)
    fit = ast.parse(textwrap.dedent(inspect.getsource(cls.fit))).body[0]
    body = [s for s in fit.body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    assert ast.unparse(body[0]) == "self._validate_params()"


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_parameters_pass(name):
    kwargs, _ = VALID[name]
    getattr(learners, name)(**kwargs)._validate_params()


# -- the cases measured on main -----------------------------------------------------------------
@pytest.mark.parametrize("lengths", ["abc", 64, [], [4, 0], [4, 2.5], [True, 4]])
def test_rotary_verify_lengths(lengths):
    _refused(RotaryValueQueryLearner(verify_lengths=lengths), _oracle(), "verify_lengths",
             lengths)


def test_rotary_verify_lengths_valid_forms():
    for lengths in ([2, 4096], (8,), np.array([2, 16])):
        RotaryValueQueryLearner(verify_lengths=lengths)._validate_params()


@pytest.mark.parametrize("kw, name", [({"verify": None}, "verify"),
                                      ({"block_bytes": None}, "block_bytes")])
def test_layer_none_parameters(kw, name):
    est = AttentionLayerLearner(n_heads=2, route="served", n_queries=20000, **kw)
    _refused(est, _oracle(), name, kw[name])


@pytest.mark.parametrize("make, name", [
    (lambda: LowPrecisionValueQueryLearner(n_queries=HUGE), "n_queries"),
    (lambda: AttentionLayerLearner(n_heads=HUGE), "n_heads"),
    (lambda: AttentionLayerLearner(n_heads=2, route="served", n_queries=HUGE), "n_queries"),
    (lambda: ExactValueQueryLearner(block_bytes=HUGE), "block_bytes"),
    (lambda: ExactValueQueryLearner(verify=HUGE), "verify"),
    (lambda: NoisyValueQueryLearner(W_bound=4.0, mu=0.1, oversample=HUGE), "oversample"),
])
def test_huge_counts(make, name):
    msg = _refused(make(), _oracle(), name, HUGE)
    assert "beyond int64" in msg or str(MAX_VERIFY) in msg


def test_check_scalar_takes_huge_integers():
    assert check_scalar(HUGE, "x", min_val=0) == float(HUGE)  # a number: a Python int is fine
    with pytest.raises(ConfigError, match="n must be an integer >= 1; got 1000"):
        check_scalar(HUGE, "n", numbers.Integral, min_val=1)
    with pytest.raises(ConfigError, match="x must be a number; got 1000"):
        check_scalar(10**400, "x")  # too large for a float


def test_verify_beyond_its_cap():
    msg = _refused(ExactValueQueryLearner(verify=MAX_VERIFY + 1), _oracle(), "verify")
    assert f"[0, {MAX_VERIFY}]" in msg
    ExactValueQueryLearner(verify=MAX_VERIFY)._validate_params()


@pytest.mark.parametrize("name", [n for n in sorted(VALID)
                                  if "block_bytes" in getattr(learners, n)._parameter_constraints])
@pytest.mark.parametrize("bad", [-1, 0, True, 2.5])
def test_block_bytes(name, bad):
    kwargs, membership = VALID[name]
    _refused(getattr(learners, name)(**kwargs, block_bytes=bad), _oracle(membership),
             "block_bytes", bad)


def test_n_kv_heads_needs_rotary_positions():
    msg = _refused(AttentionLayerLearner(n_heads=2, n_kv_heads=1), _oracle(), "n_kv_heads")
    assert "positions='rotary'" in msg
    _refused(AttentionLayerLearner(n_heads=4, n_kv_heads=3, positions="rotary", fit_bias=False),
             _oracle(), "n_kv_heads must divide")
    _refused(AttentionLayerLearner(n_heads=2, n_kv_heads=4, positions="rotary", fit_bias=False),
             _oracle(), "n_kv_heads must divide")
    AttentionLayerLearner(n_heads=4, n_kv_heads=2, positions="rotary",
                          fit_bias=False)._validate_params()


def test_transformer_ffn_params_are_checked_by_the_ffn_learner():
    _refused(TransformerLearner(ffn_params={"n_grid": 2}), _oracle(), "ffn_params: n_grid", 2)
    _refused(TransformerLearner(ffn_params={"colour": 1}), _oracle(), "'colour'")
    _refused(TransformerLearner(ffn_params={"random_state": 1}), _oracle(), "'random_state'")
    _refused(TransformerLearner(ffn_params=[("n_grid", 8)]), _oracle(), "ffn_params")


def test_assumption_parameters_stay_assumption_violations():
    for kw in ({"W_bound": "4"}, {"mu": np.nan}, {"tau": True}):
        est = NoisyValueQueryLearner(**{"W_bound": 4.0, "mu": 0.1, **kw})
        with pytest.raises(AssumptionViolation, match=next(iter(kw))):
            est.fit(_oracle())


# -- every declared number, every kind of bad value ---------------------------------------------
BAD_VALUES = ["abc", None, True, HUGE, -1, math.nan, math.inf]


def _numeric_cases():
    for name in sorted(VALID):
        cls = getattr(learners, name)
        for param, constraints in cls._parameter_constraints.items():
            allowed = [make_constraint(c) for c in constraints]
            if not any(isinstance(c, Interval) for c in allowed):
                continue
            for bad in BAD_VALUES:
                # None is a valid value where declared, and a real parameter unbounded above
                # takes 10**30
                if not any(c.is_satisfied_by(bad) for c in allowed):
                    yield pytest.param(name, param, bad, id=f"{name}-{param}-{bad!r:.12}")


@pytest.mark.parametrize("name, param, bad", list(_numeric_cases()))
def test_bad_numbers_are_refused_before_any_query(name, param, bad):
    kwargs, membership = VALID[name]
    est = getattr(learners, name)(**{**kwargs, param: bad})
    oracle = _oracle(membership)
    with pytest.raises(ConfigError, match=rf"\b{param} must be") as info:
        est.fit(oracle)
    assert oracle.n_queries == 0
    assert repr(bad) in str(info.value)


def test_every_kind_of_bad_value_is_tried():
    """A string, True, nan and inf are refused by every declared integer and real parameter,
    10**30 by every integer one: the parametrization above skips only what is valid."""
    declared = [make_constraint(c) for name in VALID
                for cs in getattr(learners, name)._parameter_constraints.values() for c in cs]
    numeric = [c for c in declared if isinstance(c, Interval)]
    tried = [case.values[2] for case in _numeric_cases()]
    for bad in ("abc", True, math.nan, math.inf):
        same = [v for v in tried if type(v) is type(bad) and
                (v == bad or (isinstance(v, float) and math.isnan(v) and math.isnan(bad)))]
        assert len(same) == len(numeric), bad
    assert tried.count(HUGE) >= sum(c.integral for c in numeric)


# -- the vocabulary --------------------------------------------------------------------------
def test_interval():
    count = Interval(numbers.Integral, 1, None, closed="left")
    assert count.describe() == "an integer >= 1"
    assert count.is_satisfied_by(1) and count.is_satisfied_by(np.int64(7))
    assert count.is_satisfied_by(INT64_MAX) and not count.is_satisfied_by(INT64_MAX + 1)
    for bad in (0, True, np.True_, 2.0, "3", None, np.nan):
        assert not count.is_satisfied_by(bad)
    share = Interval(numbers.Real, 0, 1, closed="neither")
    assert share.describe() == "a number in (0, 1)"
    assert share.is_satisfied_by(0.5) and share.is_satisfied_by(np.float32(0.5))
    for bad in (0, 1, 0.0, True, np.nan, "0.5", None):
        assert not share.is_satisfied_by(bad)
    big = Interval(numbers.Real, 0, None, closed="neither")
    assert big.is_satisfied_by(HUGE) and not big.is_satisfied_by(10**400)
    assert not big.is_satisfied_by(math.inf)
    noted = Interval(numbers.Integral, 0, 8, closed="both", note="0: off")
    assert noted.describe() == "an integer in [0, 8] (0: off)"
    with pytest.raises(TypeError):
        Interval(int, 0, 1, closed="both")
    with pytest.raises(ValueError):
        Interval(numbers.Real, 0, 1, closed="open")


def test_options_lengths_and_shorthands():
    probes = Options({"basis", "gaussian"})
    assert probes.describe() == "one of 'basis', 'gaussian'"
    assert probes.is_satisfied_by("basis") and not probes.is_satisfied_by("Basis")
    assert not probes.is_satisfied_by(["basis"])  # unhashable: no crash
    assert Options({"auto"}).describe() == "'auto'"
    assert Lengths().describe() == "a non-empty sequence of integers >= 1"
    assert describe_constraints([Options({"auto"}), "boolean"]) == "'auto' or True or False"
    assert describe_constraints([Interval(numbers.Integral, 1, None, closed="left"), None]) == \
        "an integer >= 1 or None"
    assert make_constraint(callable).is_satisfied_by(len)
    mapping = make_constraint(dict)
    assert mapping.is_satisfied_by({}) and not mapping.is_satisfied_by([])
    assert mapping.describe() == "a dict"
    assert make_constraint("array-like").is_satisfied_by([np.eye(2)])
    with pytest.raises(TypeError, match="unknown parameter constraint"):
        make_constraint("positive")


def test_random_state_is_checked_without_drawing():
    seeds = make_constraint("random_state")
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    for ok in (None, 0, 2**70, [1, 2], rng, np.random.SeedSequence(3)):
        assert seeds.is_satisfied_by(ok)
    assert rng.bit_generator.state == state
    for bad in (True, 1.5, "0", -1, [1.5]):
        assert not seeds.is_satisfied_by(bad)


def test_message_names_parameter_allowed_values_and_value():
    count = [Interval(numbers.Integral, 1, None, closed="left"), None]
    with pytest.raises(ConfigError) as info:
        validate_parameter_constraints({"n": count}, {"n": True})
    assert str(info.value) == "n must be an integer >= 1 or None; got True"
    with pytest.raises(ConfigError) as info:
        validate_parameter_constraints({"n": count}, {"n": HUGE})
    assert str(info.value) == f"n must be an integer >= 1 or None; got {HUGE} (beyond int64)"
    validate_parameter_constraints({"n": count}, {"n": None, "other": "anything"})


# -- the command line ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, name", [
    (["--oracle", "tests.fixtures:head8", "--d", "8", "--param", "verify=abc"], "verify"),
    (["--oracle", "tests.fixtures:head8", "--d", "8", "--param", "block_bytes=-1"],
     "block_bytes"),
    (["--oracle", "tests.fixtures:rotary_head", "--d", "16", "--method", "rotary", "--param",
      "verify_lengths=abc"], "verify_lengths"),
    (["--oracle", "tests.fixtures:head8", "--d", "8", "--method", "layer", "--param",
      "n_heads=2", "--param", "n_kv_heads=2"], "n_kv_heads"),
])
def test_cli_bad_param_exits_2_naming_it(argv, name, capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    assert main(["extract", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnquery extract: error: ")
    assert f"{name} " in lines[0] and "unexpected" not in lines[0]
