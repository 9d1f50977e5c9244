"""The rotary figure's claims, checked on rows produced by the experiment itself, and refuted
by contrary data."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attnquery.experiments import expand_cells, run_cells
from attnquery.experiments.rotary import layer_shapes
from attnquery.figures.rotary import (
    expected_queries,
    rotary_claims,
    rotary_layer_claims,
    rotary_served_claims,
)
from attnquery.learners.rotary import rotary_query_count
from attnquery.results import rows_to_table
from attnquery.schema import section_with_defaults

SECTION = {"seeds": 1, "d": [16, 32, 64], "head_fraction": [0.25], "rope_base": [1e4, 1e6],
           "routes": ["dense", "lowrank"]}


def _table(cells):
    """The result table of the rotary cells ``cells``, run with the study's seed."""
    rows, _ = run_cells(cells, 20260122)
    return rows_to_table(rows).to_pandas()


def _variant(section, variant):
    """The rotary cells of ``section`` of the variant ``variant``."""
    return [c for c in expand_cells("rotary", section) if c["variant"] == variant]


@pytest.fixture(scope="module")
def frame():
    return _table(expand_cells("rotary", SECTION))


def _claims(df):
    return {c.name: c for c in rotary_claims(df)}


def test_the_experiment_supports_every_claim(frame):
    assert len(frame) == 12 and (frame["status"] == "ok").all()
    claims = _claims(frame)
    assert all(c.passed for c in claims.values()), [str(c) for c in claims.values()]
    # the figure's count is the learner's
    for d, r in ((64, 16), (32, 8)):
        assert expected_queries("lowrank", d, r) == rotary_query_count(d, r)
    assert expected_queries("dense", 64, 16) == rotary_query_count(64)


def _with_extra(df, i, **kw):
    df = df.copy()
    extra = json.loads(df.loc[i, "extra"])
    extra.update(kw)
    df.loc[i, "extra"] = json.dumps(extra)
    return df


@pytest.mark.parametrize("name, mutate", [
    ("rotary_count", lambda df: df.assign(n_queries=df["n_queries"] + (df.index == 0))),
    ("rotary_exponent", lambda df: df.assign(
        n_queries=np.where(df["variant"] == "dense", df["d"] ** 2.3, df["n_queries"]))),
    ("rotary_frequencies", lambda df: _with_extra(df, 1, freq_err=1e-10)),
    ("rotary_length", lambda df: df.assign(func_err=np.where(df.index == 2, 2e-7,
                                                             df["func_err"]))),
    ("rotary_checked", lambda df: df.assign(verified=df.index != 3)),
    ("rotary_length", lambda df: pd.concat([df, df.iloc[:1].assign(status="error")])),
])
def test_contrary_data_refute_the_claim(frame, name, mutate):
    assert _claims(frame)[name].passed
    assert not _claims(mutate(frame))[name].passed


# --- whole GQA layers (variant "layer") -------------------------------------------------------

LAYERS = {**SECTION, "d": [16], "routes": ["dense"], "rope_base": [1e4],
          "layers": {"d": [16, 32], "n_heads": [4, 8], "n_kv_heads": [1, 3, "n_heads"],
                     "shapes": [[16, 4, 4]]}}


@pytest.fixture(scope="module")
def layers():
    return _table(_variant(LAYERS, "layer"))


def _layer_claims(df):
    return {c.name: c for c in rotary_layer_claims(df)}


def test_layer_cells_cover_the_grid_once():
    section = section_with_defaults("rotary", LAYERS)["layers"]
    assert section["seeds"] == 1 and section["rope_base"] == [1e4]
    # G = 3 divides no H; "n_heads" is G = H; the listed shape is the grid's (16, 4, 4), once
    assert layer_shapes(section) == [(16, 4, 1), (16, 4, 4), (16, 8, 1), (16, 8, 8),
                                     (32, 4, 1), (32, 4, 4), (32, 8, 1), (32, 8, 8)]
    assert not any(c["variant"] == "layer" for c in expand_cells("rotary", SECTION))


def test_the_layers_support_every_claim_and_map_their_failures(layers, frame):
    assert len(layers) == 8
    failed = layers[layers["status"] != "ok"]
    # the failure map: refused (SearchLimitError at the circle) exactly where H / G > d_h
    per_group = layers["n_heads"] // layers["n_kv_heads"]
    assert list(failed.index) == list(layers.index[per_group > layers["rank"]])
    shapes = zip(failed["d"], failed["n_heads"], failed["n_kv_heads"], strict=True)
    assert sorted(shapes) == [(16, 8, 1), (32, 8, 1)]
    assert failed["message"].str.startswith("SearchLimitError").all()
    ok = layers[layers["status"] == "ok"]
    assert (ok["func_err"] < 1e-8).all() and ok["success"].all()
    assert all(json.loads(e)["groups_found"] for e in ok["extra"])
    claims = _layer_claims(layers)
    assert set(claims) == {"rotary_layers", "rotary_layers_refused", "rotary_layers_map"}
    assert all(c.passed for c in claims.values()), [str(c) for c in claims.values()]
    numbers = {n.name: n.value for c in claims.values() for n in c.numbers}
    assert numbers["rotaryLayers"] == 8 and numbers["rotaryLayersRecovered"] == 6
    assert numbers["rotaryLayersRefused"] == 2 and numbers["rotaryLayersWorstError"] < 1e-8
    # the head claims read the head rows only
    both = pd.concat([frame, layers], ignore_index=True)
    assert [str(c) for c in rotary_claims(both)] == [str(c) for c in rotary_claims(frame)]


def _first(df, status="ok"):
    return df.index[df["status"] == status][0]


@pytest.mark.parametrize("name, mutate", [
    ("rotary_layers", lambda df: df.assign(func_err=np.where(df.index == _first(df), 2e-8,
                                                             df["func_err"]))),
    ("rotary_layers", lambda df: _with_extra(df, _first(df), groups_found=False)),
    ("rotary_layers", lambda df: _with_extra(df, _first(df), freq_err=1e-9)),
    ("rotary_layers_refused", lambda df: df.assign(message=np.where(
        df.index == _first(df, "error"), "ValueError: boom", df["message"]))),
    ("rotary_layers_refused", lambda df: df.assign(status=np.where(
        df.index == _first(df, "error"), "timeout", df["status"]))),
    ("rotary_layers_map", lambda df: df.assign(status=np.where(
        df.index == _first(df), "error", df["status"]))),
])
def test_contrary_layer_data_refute_the_claim(layers, name, mutate):
    assert _layer_claims(layers)[name].passed
    assert not _layer_claims(mutate(layers))[name].passed


def test_the_goal_claim_reads_the_goal_shapes(layers):
    i = layers.index[(layers["status"] == "ok") & (layers["d"] == 32)][0]
    goal = layers.copy()
    goal.loc[i, ["d", "n_heads", "n_kv_heads", "rank"]] = [128, 8, 2, 16]
    claim = _layer_claims(goal)["rotary_layers_goal"]
    assert claim.passed and "(128, 8, 2)" in claim.statement
    goal.loc[i, "func_err"] = 2e-8
    assert not _layer_claims(goal)["rotary_layers_goal"].passed


def test_layers_with_biases_are_refused_by_name_and_mapped(layers):
    section = {**LAYERS, "layers": {"d": [16], "n_heads": [4], "n_kv_heads": [1],
                                    "biases": [False, True]}}
    cells = _variant(section, "layer")
    plain = [c for c in cells if "biases" not in c]
    # a cell without biases is the same cell as in a section that does not name biases
    assert {c["cell_id"] for c in plain} <= set(layers["cell_id"])
    biased = [c for c in cells if c.get("biases")]
    assert len(biased) == 1
    row = _table(biased)
    assert row["status"].iloc[0] == "error"
    assert row["message"].iloc[0].startswith("SearchLimitError")
    both = pd.concat([layers, row], ignore_index=True)
    claims = _layer_claims(both)
    assert all(c.passed for c in claims.values()), [str(c) for c in claims.values()]
    assert {n.name: n.value for n in claims["rotary_layers_refused"].numbers} == {
        "rotaryLayersRefused": 3}
    # a biased layer said to be recovered contradicts the map
    wrong = both.copy()
    i, good = wrong.index[-1], _first(layers)
    wrong.loc[i, ["status", "func_err", "extra"]] = ["ok", 1e-12, layers.loc[good, "extra"]]
    assert not _layer_claims(wrong)["rotary_layers_map"].passed


def test_the_layer_figure_is_byte_identical_across_hash_seeds(layers, tmp_path):
    """The failure map annotates the refused layers; its PDF must not depend on the order of a
    set of strings (PYTHONHASHSEED differs between processes, so between runs of a study)."""
    import os
    import subprocess
    import sys

    assert (layers["status"] != "ok").sum() >= 2  # at least two annotations to order
    table = tmp_path / "rows.parquet"
    layers.to_parquet(table)
    code = ("import sys, pandas as pd; from attnquery.figures import render; "
            "render('rotary_layers', pd.read_parquet(sys.argv[1]), sys.argv[2])")
    out = []
    for seed in ("1", "2", "3"):
        pdf = tmp_path / f"fig{seed}.pdf"
        subprocess.run([sys.executable, "-c", code, str(table), str(pdf)], check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed})
        out.append(pdf.read_bytes())
    assert out[0] == out[1] == out[2]


# --- served heads (variant "served") ----------------------------------------------------------

SERVED = {**SECTION, "d": [16], "routes": ["dense"], "rope_base": [1e4],
          "served": {"d": [16], "head_fraction": [0.25, 0.5, 1.0], "rope_base": [1e4, 1e6],
                     "precisions": ["float32", "float16", "bfloat16"]}}


@pytest.fixture(scope="module")
def served():
    return _table(_variant(SERVED, "served"))


def _served_claims(df):
    return {c.name: c for c in rotary_served_claims(df)}


def test_served_cells_cover_the_grid_and_leave_the_head_cells_alone():
    section = section_with_defaults("rotary", SERVED)["served"]
    assert section["seeds"] == 1 and section["queries_per_unknown"] == [8]
    cells = _variant(SERVED, "served")
    assert len(cells) == 3 * 2 * 3
    assert sorted({c["rank"] for c in cells}) == [4, 8, 16]
    assert {c["rounding"] for c in cells} == {"float32", "float16", "bfloat16"}
    # the head cells are the same cells as in a section without "served"
    heads = {c["cell_id"] for c in expand_cells("rotary", SERVED) if c["variant"] != "served"}
    plain = {k: v for k, v in SERVED.items() if k != "served"}
    assert heads == {c["cell_id"] for c in expand_cells("rotary", plain)}


def test_served_heads_are_measured_and_refused_by_name(served):
    assert len(served) == 18
    f32 = served[served["rounding"] == "float32"]
    goal = f32[2 * f32["rank"] <= f32["d"]]
    assert len(goal) == 4 and (goal["status"] == "ok").all()
    # the oracle's count, the check included, within the budget the learner was given
    total = goal["n_queries"] + goal["verify_queries"]
    budget = np.array([json.loads(e)["budget"] for e in goal["extra"]])
    assert (budget == 8 * (16 * 16 + 16)).all() and (total <= budget).all()
    assert (goal["rel_err_W"] < 1e-5).all()  # M_{-1} against the exact float64 head
    for e, err in zip(goal["extra"], goal["func_err"], strict=True):
        extra = json.loads(e)
        by = extra["func_err_by_length"]
        assert sorted(by, key=int) == ["1", "16", "256", "4096"] and max(by.values()) == err
        assert err < 1e-5 and extra["freq_err"] < 1e-8 and extra["answer_precision"] == "float32"
        assert 1e-8 < extra["noise_level"] < 1e-5 and extra["long_offset"] > 1000
        # the served box is itself about float32's rounding away from the exact head
        assert 1e-9 < max(extra["floor_by_length"].values()) < 1e-5
    low = served[served["rounding"] != "float32"]
    assert (low["status"] == "error").all()
    assert low["message"].str.startswith("AssumptionViolation").all()
    claims = _served_claims(served)
    assert set(claims) == {"rotary_served_goal", "rotary_served_refused", "rotary_served_map"}
    assert all(c.passed for c in claims.values()), [str(c) for c in claims.values()]
    numbers = {n.name: n.value for c in claims.values() for n in c.numbers}
    assert numbers["rotaryServedHeads"] == numbers["rotaryServedMet"] == 4
    assert numbers["rotaryServedSixteenBit"] == 12 and numbers["rotaryServedSquare"] == 2
    assert numbers["rotaryServedWorstError"] == goal["func_err"].max()
    assert numbers["rotaryServedMostQueries"] == pytest.approx(total.max() / (16 * 16 + 16))
    # the other claims of the experiment read their own rows only
    both = pd.concat([served, served.iloc[:0]], ignore_index=True)
    assert not any(c.n_runs for c in rotary_claims(both))
    assert not any(c.n_runs for c in rotary_layer_claims(both))


def _first_goal(df):
    return df.index[(df["rounding"] == "float32") & (2 * df["rank"] <= df["d"])][0]


def _first_low(df):
    return df.index[df["rounding"] != "float32"][0]


@pytest.mark.parametrize("name, mutate", [
    ("rotary_served_goal", lambda df: df.assign(
        func_err=np.where(df.index == _first_goal(df), 2e-5, df["func_err"]))),
    ("rotary_served_map", lambda df: df.assign(
        func_err=np.where(df.index == _first_goal(df), 2e-5, df["func_err"]))),
    ("rotary_served_goal", lambda df: df.assign(
        n_queries=np.where(df.index == _first_goal(df), 9 * (16 * 16 + 16), df["n_queries"]))),
    ("rotary_served_goal", lambda df: df.assign(
        status=np.where(df.index == _first_goal(df), "timeout", df["status"]))),
    ("rotary_served_refused", lambda df: df.assign(
        status=np.where(df.index == _first_goal(df), "timeout", df["status"]))),
    ("rotary_served_refused", lambda df: df.assign(message=np.where(
        df.index == _first_low(df), "ValueError: boom", df["message"]))),
    ("rotary_served_refused", lambda df: df.assign(message=np.where(
        df.index == _first_low(df), "SearchLimitError: no circle", df["message"]))),
    # a 16-bit head returned within the goal contradicts the map (and the refusal claim)
    ("rotary_served_map", lambda df: df.assign(
        status=np.where(df.index == _first_low(df), "ok", df["status"]),
        func_err=np.where(df.index == _first_low(df), 1e-7, df["func_err"]),
        n_queries=np.where(df.index == _first_low(df), 600, df["n_queries"]),
        verify_queries=np.where(df.index == _first_low(df), 8, df["verify_queries"]))),
])
def test_contrary_served_data_refute_the_claim(served, name, mutate):
    assert _served_claims(served)[name].passed
    assert not _served_claims(mutate(served))[name].passed


def test_a_budget_below_the_plan_is_refused_by_name_and_not_claimed(served):
    section = {**SERVED, "served": {"d": [16], "head_fraction": [0.5],
                                    "queries_per_unknown": [2]}}
    row = _table(_variant(section, "served"))
    assert row["status"].iloc[0] == "error"
    assert row["message"].iloc[0].startswith("BudgetExceededError")
    both = pd.concat([served, row], ignore_index=True)
    claims = _served_claims(both)
    assert all(c.passed for c in claims.values()), [str(c) for c in claims.values()]
    numbers = {n.name: n.value for c in claims.values() for n in c.numbers}
    assert numbers["rotaryServedCells"] == 19 and numbers["rotaryServedMapped"] == 18
