"""The low-rank figures' claims, checked on rows produced by the experiments themselves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnquery.experiments import expand_cells, run_cells
from attnquery.figures.lowrank import lowrank_claims, transition_points
from attnquery.results import rows_to_table

SEED = 20260122


def _frame(name, section):
    cells = expand_cells(name, section)
    rows, timings = run_cells(cells, SEED)
    df = rows_to_table(rows).to_pandas()
    t = pd.DataFrame(timings)
    return df.merge(t, on=["experiment", "cell_id"], how="left")


def _claims(df):
    return {c.name: c for c in lowrank_claims(df)}


@pytest.fixture(scope="module")
def scale_rows():
    return _frame("lowrank_scale", {
        "d": [64, 256], "rank": [1, 4, 16], "learners": ["sketch", "exact"], "seeds": 1,
        "exact_max_d": 64,
    })


@pytest.fixture(scope="module")
def phase_rows():
    # (d, r) points with r d from 6 to 32; c brackets the transition of each
    return _frame("lowrank_phase", {
        "d": [6, 8, 12], "rank": [1, 2], "c": [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0],
        "solver": ["SCS"], "seeds": 3,
    })


def test_sketch_claims_hold(scale_rows):
    assert (scale_rows["status"] == "ok").all()
    claims = _claims(scale_rows)
    assert claims["sketch_success"].passed, claims["sketch_success"].detail
    assert claims["sketch_floor"].passed, claims["sketch_floor"].detail
    sk = scale_rows[scale_rows["learner"] == "sketch"]
    assert (sk["rank_found"] == sk["rank"]).all()
    ex = scale_rows[scale_rows["learner"] == "exact"]
    assert (ex["n_queries"] == ex["d"] ** 2 + ex["d"]).all()


def test_sketch_claims_fail_on_contrary_data(scale_rows):
    worse = scale_rows.copy()
    sk = worse["learner"] == "sketch"
    worse.loc[sk, "n_queries"] = (worse.loc[sk, "n_queries"] * 1.1).astype(int)
    assert not _claims(worse)["sketch_floor"].passed
    worse = scale_rows.copy()
    worse.loc[sk & (worse["d"] == 256), "success"] = False
    assert not _claims(worse)["sketch_success"].passed


def test_nuclear_phase_transition_and_linear_growth(phase_rows):
    assert (phase_rows["status"] == "ok").all()
    claims = _claims(phase_rows)
    assert claims["nuclear_transition"].passed, claims["nuclear_transition"].detail
    tp = transition_points(phase_rows)
    assert np.isfinite(tp["c50"]).all()
    assert claims["nuclear_linear"].passed, claims["nuclear_linear"].detail


def test_nuclear_linear_claim_fails_on_quadratic_data(phase_rows):
    # the same rows with m_50 forced to grow as (r d)^2 must be rejected
    tp = transition_points(phase_rows)
    fake = []
    for _, row in tp.iterrows():
        d, r = int(row["d"]), int(row["rank"])
        c50 = 0.05 * r * d
        for c in (c50 / 2, c50 * 2):
            fake.append({"experiment": "lowrank_phase", "status": "ok", "d": d, "rank": r,
                         "c": c, "success": c > c50, "learner": "nuclear"})
    assert not _claims(pd.DataFrame(fake))["nuclear_linear"].passed
