"""The rotary figure's claims, checked on rows produced by the experiment itself, and refuted
by contrary data."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attnquery.experiments import expand_cells, run_cells
from attnquery.figures.rotary import expected_queries, rotary_claims
from attnquery.learners.rotary import rotary_query_count
from attnquery.results import rows_to_table

SECTION = {"seeds": 1, "d": [16, 32, 64], "head_fraction": [0.25], "rope_base": [1e4, 1e6],
           "routes": ["dense", "lowrank"]}


@pytest.fixture(scope="module")
def frame():
    rows, _ = run_cells(expand_cells("rotary", SECTION), 20260122)
    return rows_to_table(rows).to_pandas()


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
