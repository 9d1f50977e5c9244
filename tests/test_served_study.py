"""The served experiment, its figure and its claims (claims fail on contrary data)."""

import json

import numpy as np
import pandas as pd
import pytest

from attnquery.experiments import expand_cells, get_experiment
from attnquery.figures.served import GOALS, served, served_claims
from attnquery.realheads import write_test_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_test_checkpoint(tmp_path_factory.mktemp("served_study") / "m.safetensors",
                                     n_layers=1, n_heads=4, d=32, seed=0))


def test_cells_and_run(ckpt):
    cfg = {"checkpoint": ckpt, "n_heads": 4, "layers": [0], "heads": [1],
           "precisions": ["float32", "bfloat16"],
           "queries_per_unknown": {"float32": [6], "bfloat16": [10]}}
    cells = expand_cells("served", cfg)
    assert sorted((c["rounding"], c["queries_per_unknown"]) for c in cells) == [
        ("bfloat16", 10.0), ("float32", 6.0)]
    exp = get_experiment("served")
    for cell in cells:
        m = exp.run(cell, np.random.default_rng(0))  # cell_rng would hash the temporary path
        extra = m["extra"]
        assert extra["n_overflow"] == 0 and m["rank_found"] == 8
        assert m["n_queries"] <= cell["queries_per_unknown"] * (32 * 32 + 2 * 32 + 1)
        if cell["rounding"] == "float32":  # float32 weights: no floor (v: r is rounded)
            assert max(extra["floor_W"], extra["floor_c"]) < 1e-12 and extra["floor_v"] < 1e-7
            assert m["rel_err_W"] < 1e-6
        else:  # bfloat16: above its floor, within a few times it; c and v near theirs
            assert 2e-3 < extra["floor_W"] < m["rel_err_W"] < 3 * extra["floor_W"]
            for q in "cv":
                assert 5e-4 < extra[f"floor_{q}"] < 1e-2
                assert 0.5 * extra[f"floor_{q}"] < m[f"rel_err_{q}"] < 4 * extra[f"floor_{q}"]
        assert m["success"] == (m["rel_err_W"] <= extra["goal_W"])


def _frame(rows):
    base = {"experiment": "served", "status": "ok", "n_heads": 12, "layer": 0, "head": 0,
            "seed": 0}
    out = []
    for r in rows:
        r = {**base, **r}
        extra = {"floor_W": r.pop("floor"), "n_overflow": r.pop("overflow", 0),
                 "spent_per_unknown": r["queries_per_unknown"]}
        extra.update({k: r.pop(k) for k in ("floor_c", "floor_v") if k in r})
        r["extra"] = json.dumps(extra)
        out.append(r)
    return pd.DataFrame(out)


GOOD = [
    {"rounding": "float32", "queries_per_unknown": 3.0, "rel_err_W": 2e-7, "floor": 0.0},
    {"rounding": "float16", "queries_per_unknown": 50.0, "rel_err_W": 5e-4, "floor": 3e-4},
    {"rounding": "bfloat16", "queries_per_unknown": 10.0, "rel_err_W": 3e-3, "floor": 2.4e-3},
]


def _claims(rows):
    return {c.name: c for c in served_claims(_frame(rows))}


def test_claims_pass_on_good_data_and_render():
    claims = _claims(GOOD)
    assert set(claims) == {"served_runs", "served_no_overflow", "served_floor",
                           *(f"served_goal_{p}" for p in GOALS)}
    assert all(c.passed for c in claims.values()), [str(c) for c in claims.values()]
    fig, _ = served(_frame(GOOD))
    assert len(fig.axes) == 2


def test_goal_claims_carry_the_numbers_of_each_heads_best_cell():
    rows = [dict(r) for r in GOOD] + [
        # head 0: a worse bfloat16 cell beside the good one; head 1: a second head
        {"rounding": "bfloat16", "queries_per_unknown": 3.0, "rel_err_W": 9e-3,
         "floor": 2.4e-3},
        {"rounding": "bfloat16", "queries_per_unknown": 10.0, "rel_err_W": 3.3e-3,
         "floor": 2.2e-3, "head": 1},
        {"rounding": "float32", "queries_per_unknown": 3.0, "rel_err_W": 2.9e-7, "floor": 0.0,
         "head": 1}]
    for r in rows:
        r.update(rel_err_c=1.5 * r["rel_err_W"], rel_err_v=0.5 * r["rel_err_W"],
                 floor_c=r["floor"], floor_v=r["floor"])
    claims = _claims(rows)
    n = {x.name: x.value for c in claims.values() for x in c.numbers}
    assert n["servedBfloat16Heads"] == n["servedBfloat16HeadsMet"] == 2
    assert n["servedBfloat16WorstRatioW"] == pytest.approx(1.5)  # 3.3e-3 / 2.2e-3, not 9e-3
    assert n["servedBfloat16MedianRatioW"] == pytest.approx((1.25 + 1.5) / 2)
    assert n["servedBfloat16WorstRatioC"] == pytest.approx(2.25)
    assert n["servedBfloat16WorstRatioV"] == pytest.approx(0.75)
    assert n["servedFloat32WorstErrorW"] == pytest.approx(2.9e-7)
    assert n["servedFloat32MedianErrorW"] == pytest.approx(2.45e-7)
    assert n["servedFloat32WorstErrorC"] == pytest.approx(1.5 * 2.9e-7)
    assert n["servedFloat16HeadsMet"] == 1
    # a head that misses the goal shows in the counts and the worst ratio
    rows[-2].update(rel_err_W=4.4e-3)
    n = {x.name: x.value for c in _claims(rows).values() for x in c.numbers}
    assert n["servedBfloat16HeadsMet"] == 1 and n["servedBfloat16WorstRatioW"] == pytest.approx(2.0)


@pytest.mark.parametrize("index,change,broken", [
    (0, {"rel_err_W": 9e-7}, "served_goal_float32"),
    (1, {"rel_err_W": 9e-4}, "served_goal_float16"),
    (2, {"rel_err_W": 4e-3}, "served_goal_bfloat16"),
    (1, {"rel_err_W": 1e-4}, "served_floor"),  # below the format's floor: impossible
    (2, {"overflow": 3}, "served_no_overflow"),
    (1, {"status": "error"}, "served_runs"),
])
def test_claims_fail_on_contrary_data(index, change, broken):
    rows = [dict(r) for r in GOOD]
    rows[index].update(change)
    claims = _claims(rows)
    assert not claims[broken].passed
    others = [n for n, c in claims.items() if n != broken and not c.passed]
    if change.get("status") != "error":
        assert not others or broken == "served_no_overflow", others


def test_goal_is_per_head_within_its_budget():
    # a small budget that misses the goal beside a larger one that meets it: supported
    rows = [dict(r) for r in GOOD] + [
        {"rounding": "float16", "queries_per_unknown": 10.0, "rel_err_W": 9e-4, "floor": 3e-4}]
    assert _claims(rows)["served_goal_float16"].passed
    # a second head that misses it at every budget: not supported
    rows.append({"rounding": "float16", "queries_per_unknown": 50.0, "rel_err_W": 9e-4,
                 "floor": 3e-4, "head": 1})
    assert not _claims(rows)["served_goal_float16"].passed
    # beyond the goal's budget nothing counts
    late = [dict(r) for r in GOOD]
    late[1]["queries_per_unknown"] = 60.0
    assert "served_goal_float16" not in _claims(late)


def test_bad_config_is_refused(ckpt):
    from attnquery.errors import ConfigError

    with pytest.raises(ConfigError, match="precisions"):
        expand_cells("served", {"checkpoint": ckpt, "n_heads": 4, "layers": [0], "heads": [0],
                                "precisions": ["float64"],
                                "queries_per_unknown": {"float64": [3]}})
    with pytest.raises(ConfigError, match="budget"):
        expand_cells("served", {"checkpoint": ckpt, "n_heads": 4, "layers": [0], "heads": [0],
                                "precisions": ["float16"], "queries_per_unknown": {}})
    assert np.isfinite(GOALS["float32"][1])
