"""The layer learner's routes: ExactLayerLearner, ServedLayerLearner and RotaryLayerLearner, each
its own estimator, and AttentionLayerLearner, which picks one from its parameters and takes its
fitted attributes."""

import inspect

import numpy as np
import pytest

from attnquery.errors import BudgetExceededError, ConfigError
from attnquery.learners import AttentionLayerLearner, registry
from attnquery.learners.multihead_generic import (
    ExactLayerLearner,
    RotaryLayerLearner,
    ServedLayerLearner,
    layer_dof,
)
from attnquery.learners.multihead_generic._route import fitted_attributes
from attnquery.learners.multihead_generic.rotary_layer import fit_rotary_layer
from attnquery.models import MultiHeadAttention, random_head, random_rotary_layer
from attnquery.oracles import ValueOracle
from attnquery.realheads import ModuleBlackBox

D, H = 32, 4
DOF = layer_dof(D, H, D // H)
ROUTES = (ExactLayerLearner, ServedLayerLearner, RotaryLayerLearner)


def _served(layer_ckpt, budget=None):
    return ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D, budget=budget)


def _layer(d, n_heads, seed):
    heads = [random_head(d, [seed, h], rank=d // n_heads, key_bias=0.5)
             for h in range(n_heads)]
    return MultiHeadAttention(heads, offset=0.3)


def _same(a: dict, b: dict):
    """Two dicts of fitted attributes hold the same names and bit-identical values."""
    assert sorted(a) == sorted(b)
    for name in a:
        x, y = a[name], b[name]
        if name == "heads_":
            x, y = [vars(h) for h in x], [vars(h) for h in y]
        np.testing.assert_equal(x, y, err_msg=name)


@pytest.mark.parametrize("kw, cls", [
    ({}, ExactLayerLearner),
    ({"route": "exact", "n_queries": 5000}, ExactLayerLearner),
    ({"route": "served", "n_queries": 5000, "noise": "measured"}, ServedLayerLearner),
    ({"positions": "rotary", "fit_bias": False, "n_kv_heads": 2}, RotaryLayerLearner),
    ({"route": "rotary", "positions": "rotary", "fit_bias": False}, RotaryLayerLearner),
])
def test_the_route_parameter_picks_the_route(kw, cls):
    est = AttentionLayerLearner(n_heads=4, rank=3, n_grid=100, random_state=7, **kw)
    route = est.route_estimator()
    assert type(route) is cls
    params = est.get_params()
    assert route.get_params() == {k: params[k] for k in route.get_params()}
    # each route takes only its own parameters
    assert ("n_queries" in route.get_params()) == (cls is ServedLayerLearner)
    assert ("n_kv_heads" in route.get_params()) == (cls is RotaryLayerLearner)
    assert ("fit_bias" in route.get_params()) == (cls is not RotaryLayerLearner)


@pytest.mark.parametrize("kw, match", [
    ({"route": "served"}, "route='served' spends a budget: give n_queries"),
    ({"route": "rotary"}, "route='rotary' does not apply with positions='none'"),
    ({"route": "exact", "positions": "rotary", "fit_bias": False},
     "route='exact' does not apply with positions='rotary'"),
    ({"route": "served", "n_queries": 5000, "positions": "rotary", "fit_bias": False},
     "route='served' does not apply with positions='rotary'"),
    ({"route": "dense"}, "route must be one of"),
])
def test_a_route_that_does_not_apply_is_refused_by_name(kw, match):
    oracle = ValueOracle(_layer(8, 2, 0), 8)
    with pytest.raises(ConfigError, match=match):
        AttentionLayerLearner(n_heads=2, random_state=0, **kw).fit(oracle)
    assert oracle.n_queries == 0


def test_exact_route_fits_as_the_entry_bit_for_bit():
    model = _layer(24, 3, 1)
    direct = ExactLayerLearner(n_heads=3, random_state=2).fit(ValueOracle(model, 24))
    entry = AttentionLayerLearner(n_heads=3, random_state=2).fit(ValueOracle(model, 24))
    assert entry.route_ == "exact"
    _same({k: v for k, v in fitted_attributes(entry).items() if k != "route_"},
          fitted_attributes(direct))
    # n_queries caps the exact route (it no longer picks the served one): the same fit
    capped = AttentionLayerLearner(n_heads=3, random_state=2, n_queries=direct.n_queries_)
    capped.fit(ValueOracle(model, 24))
    assert capped.route_ == "exact" and capped.n_queries_ == direct.n_queries_
    _same(fitted_attributes(capped), fitted_attributes(entry))
    assert direct.n_queries_ == sum(direct.n_queries_by_stage_.values())
    assert direct.n_passes_ == direct.n_missing_passes_ == 1 and direct.noise_level_ is None
    X = np.random.default_rng(0).standard_normal((4, 5, 24))
    np.testing.assert_array_equal(direct.predict(X), entry.predict(X))
    assert max(np.abs(direct.predict(X) - model(X))) <= 1e-9 * max(np.abs(model(X)))


def test_served_route_spends_its_ledger_and_plans_from_what_it_leaves(layer_ckpt):
    fits = {}
    for k in (10, 20):
        oracle = _served(layer_ckpt)
        fits[k] = ServedLayerLearner(n_heads=H, n_queries=k * DOF, random_state=0).fit(oracle)
        assert fits[k].n_queries_ == oracle.n_queries <= k * DOF
        assert fits[k].n_queries_by_stage_["verify"] == fits[k].n_verify_queries_ == 8
    # twice the budget pays for more passes over the same probes
    assert fits[20].n_passes_ > fits[10].n_passes_ >= 1
    entry = AttentionLayerLearner(n_heads=H, route="served", n_queries=10 * DOF, random_state=0)
    got = fitted_attributes(entry.fit(_served(layer_ckpt)))
    assert got.pop("route_") == "served"
    _same(fitted_attributes(fits[10]), got)


def test_served_budget_is_the_ledgers_cap(layer_ckpt):
    # below what any fit asks besides its circle scan: refused before the first query
    least = ServedLayerLearner(n_heads=H, n_queries=1).least_queries(D, H, D // H)
    oracle = _served(layer_ckpt)
    with pytest.raises(ConfigError, match=f"n_queries = {least - 1} does not pay .* at least "
                       f"{least} queries besides the circle scan's"):
        AttentionLayerLearner(n_heads=H, route="served", n_queries=least - 1,
                              random_state=0).fit(oracle)
    assert oracle.n_queries == 0
    # enough for that, not for the scan too: refused when the scan has spent it
    est = AttentionLayerLearner(n_heads=H, route="served", n_queries=least, random_state=0)
    with pytest.raises(BudgetExceededError, match=f"of the layer's budget of {least} remain|"
                       "queries are left after the circle scan"):
        est.fit(oracle)
    assert oracle.n_queries <= least
    # the entry holds what the route had set when it was refused
    assert est.n_queries_by_stage_["circle"] > 0 and est.answer_format_ == "float32"
    assert sum(est.n_queries_by_stage_.values()) == oracle.n_queries


def test_served_route_refuses_an_oracle_budget_below_n_queries(layer_ckpt):
    oracle = _served(layer_ckpt, budget=5000)
    with pytest.raises(BudgetExceededError,
                       match=rf"AttentionLayerLearner\(route='served', n_queries={10 * DOF}\) "
                       "needs"):
        ServedLayerLearner(n_heads=H, n_queries=10 * DOF, random_state=0).fit(oracle)
    assert oracle.n_queries == D + 1  # V and beta only: refused before the noise is measured


def test_rotary_route_fits_as_the_entry_and_the_former_function():
    L = random_rotary_layer(24, 4, 2, 7, rope_base=1e4)
    kw = {"n_heads": 4, "n_kv_heads": 2, "random_state": 0}
    direct = RotaryLayerLearner(**kw).fit(ValueOracle(L, 24))
    entry = AttentionLayerLearner(positions="rotary", fit_bias=False, **kw)
    got = fitted_attributes(entry.fit(ValueOracle(L, 24)))
    assert got.pop("route_") == "rotary"
    _same(fitted_attributes(direct), got)
    former = AttentionLayerLearner(positions="rotary", fit_bias=False, **kw)
    fit_rotary_layer(former, ValueOracle(L, 24), 24, 4, 6)
    _same(fitted_attributes(direct), fitted_attributes(former))
    assert direct.n_kv_heads_ == 2 and sorted(np.bincount(direct.kv_groups_)) == [2, 2]


@pytest.mark.parametrize("make, match", [
    (lambda: ServedLayerLearner(n_heads=2, n_queries=None), "n_queries must be"),
    (lambda: ServedLayerLearner(n_heads=2, n_queries=100, noise="none"), "noise must be"),
    (lambda: RotaryLayerLearner(n_heads=4, n_kv_heads=3), "n_kv_heads must divide"),
    (lambda: ExactLayerLearner(n_heads=2, min_logit=20.0, max_logit=10.0),
     "min_logit must be below"),
])
def test_routes_refuse_bad_parameters_by_name(make, match):
    with pytest.raises(ConfigError, match=match):
        make()._validate_params()


@pytest.mark.parametrize("cls", ROUTES)
def test_routes_stay_off_the_command_line(cls):
    assert cls.spec.command_line is False and cls.spec.returns == "layer"
    assert cls.spec.name not in registry()
    assert set(cls.spec.stages) <= set(AttentionLayerLearner.spec.stages)


@pytest.mark.parametrize("cls", ROUTES)
def test_routes_follow_the_learner_conventions(cls):
    # not in learners.__all__, so test_learner_core and test_params do not iterate them
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert all(p.kind is p.KEYWORD_ONLY for p in params) and params[-1].name == "random_state"
    assert {p.name for p in params} == set(cls._parameter_constraints)
    with pytest.raises(ConfigError, match="n_heads must be"):
        cls(n_heads=0, **({"n_queries": 10} if cls is ServedLayerLearner else {})).fit(
            ValueOracle(_layer(8, 2, 0), 8))
