"""Whole-layer cells of the served experiment, the figure served_layers and its claims (the
claims fail on contrary data)."""

import json

import numpy as np
import pandas as pd
import pytest

from attnquery.experiments import expand_cells, get_experiment
from attnquery.figures.served import served_claims
from attnquery.figures.served_layers import served_layer_claims, served_layers
from attnquery.learners.multihead_generic import layer_dof


def test_layer_cells_and_run(layer_ckpt):
    cfg = {"checkpoint": str(layer_ckpt), "n_heads": 4, "layers": [0], "heads": [1],
           "precisions": ["float32"], "queries_per_unknown": {"float32": [6]},
           "layer_budgets": {"float32": [20]}}
    cells = expand_cells("served", cfg)
    layer = [c for c in cells if c.get("variant") == "layer"]
    assert len(cells) == 2 and len(layer) == 1 and layer[0]["queries_per_unknown"] == 20.0
    # a fixed stream: cell_rng would hash the cell's checkpoint path, a new temporary directory
    # in every pytest session, and the layer learner's error varies from seed to seed
    m = get_experiment("served").run(layer[0], np.random.default_rng(0))
    extra = m["extra"]
    dof = layer_dof(32, 4, 8)
    assert extra["dof"] == dof and m["n_queries"] + m["verify_queries"] <= 20 * dof
    assert len(extra["err_W_heads"]) == 4 and max(extra["err_W_heads"]) == m["rel_err_W"]
    assert m["rel_err_W"] < 3e-4 and m["func_err"] < 3e-5 and m["n_heads_found"] == 4
    assert not m["success"]  # 20 dof is beyond the goal's 4
    # no layer cells unless asked for
    cfg.pop("layer_budgets")
    assert all(c.get("variant") != "layer" for c in expand_cells("served", cfg))


def _frame(rows):
    base = {"experiment": "served", "status": "ok", "message": "", "variant": "layer",
            "n_heads": 12, "head": None, "seed": 0, "rounding": "float32",
            "queries_per_unknown": 4.0}
    out = []
    for r in rows:
        r = {**base, **r}
        r["extra"] = json.dumps({"spent_per_dof": r.pop("spent", r["queries_per_unknown"]),
                                 "err_W_heads": [r["rel_err_W"]] * 3})
        out.append(r)
    return pd.DataFrame(out)


GOOD = [{"layer": k, "rel_err_W": 4e-6, "func_err": 2e-6} for k in range(3)] + [
    {"layer": 0, "rounding": "bfloat16", "status": "error", "rel_err_W": None,
     "func_err": None, "message": "SearchLimitError: no circle of 6 tried separated"}]


def _claims(rows):
    return {c.name: c for c in served_layer_claims(_frame(rows))}


def test_claims_pass_on_good_data_and_render():
    claims = _claims(GOOD)
    assert set(claims) == {"served_layer_runs", "served_layer_goal_float32",
                           "served_layer_refusals_named"}
    assert all(c.passed for c in claims.values()), [str(c) for c in claims.values()]
    nums = {n.name: n.value for c in claims.values() for n in c.numbers}
    assert nums["servedLayersMet"] == 3 and nums["servedLayerWorstW"] == 4e-6
    fig, _ = served_layers(_frame(GOOD))
    assert len(fig.axes) == 2
    # the head claims ignore the layer rows
    assert served_claims(_frame(GOOD)) == []


@pytest.mark.parametrize("index,change,broken", [
    (0, {"rel_err_W": 3e-5}, "served_layer_goal_float32"),
    (1, {"func_err": 2e-5}, "served_layer_goal_float32"),
    (2, {"spent": 4.5}, "served_layer_goal_float32"),
    (1, {"status": "error", "message": "SearchLimitError: no circle"}, "served_layer_runs"),
    (3, {"message": "ValueError: math domain error"}, "served_layer_refusals_named"),
])
def test_claims_fail_on_contrary_data(index, change, broken):
    rows = [dict(r) for r in GOOD]
    rows[index].update(change)
    claims = _claims(rows)
    assert not claims[broken].passed
    if rows[index].get("status") != "error":
        assert [n for n, c in claims.items() if not c.passed] == [broken]


def test_figure_without_layer_cells_draws_no_legend_and_no_warning():
    import warnings

    heads = pd.DataFrame([{"experiment": "served", "status": "ok", "rounding": "float32",
                           "variant": None, "rel_err_W": 2e-7, "queries_per_unknown": 3.0,
                           "extra": "{}"}])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the legend of an empty axis
        fig, claims = served_layers(heads)
    assert claims == [] and all(a.get_legend() is None for a in fig.axes)


def test_claims_without_any_refusal():
    """Every layer cell ok (as in the quick study): the refusal claim holds with 0 of 0."""
    claims = _claims(GOOD[:3])
    assert claims["served_layer_refusals_named"].passed
    assert "0/0 refusals named" in str(claims["served_layer_refusals_named"])
    fig, _ = served_layers(_frame(GOOD[:3]))
    assert len(fig.axes) == 2


def test_no_layer_within_the_goal_budget_states_no_nan():
    """Layer cells only beyond the goal's budget (the quick study's 20 dof): the goal claim
    counts 0 layers and states no worst error (a NaN number would be a silent hole)."""
    rows = [{**r, "queries_per_unknown": 20.0} for r in GOOD[:3]]
    claims = _claims(rows)
    nums = {n.name: n.value for c in claims.values() for n in c.numbers}
    assert nums["servedLayersMeasured"] == 0 and "servedLayerWorstW" not in nums
    assert not any(isinstance(v, float) and v != v for v in nums.values())
