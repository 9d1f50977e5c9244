"""Every registered figure: drawn from its tables only, never from learners, oracles or
experiments; drawn without data too, and then it claims nothing (no evidence, no success)."""

from __future__ import annotations

import pandas as pd
import pytest

from attnquery.claims import Claim
from attnquery.figures import all_figures, render, with_evidence
from attnquery.results import RESULT_SCHEMA, TIMING_COLUMNS, rows_to_table
from attnquery.study import PACKAGE_DIR, figure_sources

FIGURES = sorted(all_figures())


def _empty():
    df = rows_to_table([], RESULT_SCHEMA).to_pandas()
    for col in TIMING_COLUMNS:
        df[col] = pd.Series(dtype=float)
    return df


@pytest.mark.parametrize("name", FIGURES)
def test_a_figure_imports_no_learner_oracle_or_experiment(name):
    sources = [str(p.relative_to(PACKAGE_DIR)) for p in figure_sources(name)
               if p.suffix == ".py"]
    banned = [s for s in sources
              if s.startswith(("learners/", "experiments/", "models/", "oracles/"))]
    assert not banned, f"figure {name} depends on {banned}"


@pytest.mark.parametrize("name", FIGURES)
def test_a_figure_without_data_is_drawn_and_supports_nothing(name, tmp_path):
    claims = render(name, _empty(), tmp_path / f"{name}.pdf", tmp_path / f"{name}.png")
    assert (tmp_path / f"{name}.pdf").stat().st_size > 1000
    assert not any(c.passed for c in claims), [str(c) for c in claims]
    assert all(c.verdict == "not supported (no data)" for c in claims)


def test_a_claim_on_no_run_is_never_supported():
    c = Claim("x", "every run is exact", True, "0/0 runs", n_runs=0)
    assert not c.passed and c.verdict == "not supported (no data)"
    assert "not supported (no data)" in str(c)
    assert Claim("x", "s", True, "3/3 runs", n_runs=3).verdict == "supported"
    assert Claim("x", "s", False, "2/3 runs", n_runs=3).verdict == "NOT supported"


def test_claims_of_a_study_whose_cells_all_failed_have_no_data():
    rows = pd.DataFrame({"experiment": ["exact"] * 3, "status": ["error", "timeout", "error"]})
    claims = [Claim("exact_count", "every run uses d^2 + d queries", True, "0/0 runs")]
    out = with_evidence("exact_queries", rows, claims)
    assert [c.verdict for c in out] == ["not supported (no data)"]
    assert "none with status ok" in out[0].detail
    ok = rows.assign(status=["ok", "error", "error"])
    assert with_evidence("exact_queries", ok, claims) == claims


def test_a_slope_fit_within_groups_has_n_minus_groups_minus_one_degrees_of_freedom():
    import numpy as np
    import scipy.stats

    from attnquery.figures._common import fit_within

    rng = np.random.default_rng(0)
    x = np.tile([1e-6, 1e-5, 1e-4, 1e-3], 3)
    cell = np.repeat([0, 1, 2], 4)
    y = x * np.exp(cell + 0.05 * rng.standard_normal(x.size))
    fit = fit_within(pd.DataFrame({"tau": x, "err": y, "cell": cell}), "tau", "err", ("cell",))
    lx, ly = np.log(x), np.log(y)
    cx = lx - pd.Series(lx).groupby(cell).transform("mean").to_numpy()
    cy = ly - pd.Series(ly).groupby(cell).transform("mean").to_numpy()
    slope = cx @ cy / (cx @ cx)
    resid = cy - slope * cx
    dof = x.size - 3 - 1  # n - G - 1: one constant per group and the slope
    half = scipy.stats.t.ppf(0.975, dof) * np.sqrt(resid @ resid / dof / (cx @ cx))
    assert abs(fit.slope - 1.0) < 0.1 and np.isclose(fit.slope, slope)
    assert np.isclose(fit.hi - fit.slope, half) and np.isclose(fit.slope - fit.lo, half)


def test_a_threshold_claim_counts_its_runs():
    from attnquery.claims import threshold_claim

    c = threshold_claim("x", "every run is exact", [True, True, False], worst=3e-9)
    assert not c.passed and c.detail == "2/3 runs; worst 3.00e-09" and c.n_runs == 3
    assert threshold_claim("x", "s", [True, True], of=3).detail == "2/3 runs"
    assert not threshold_claim("x", "s", [True, True], of=3).passed  # a run failed
    assert threshold_claim("x", "s", [True], runs="runs with m <= d").passed
    assert threshold_claim("x", "s", []).verdict == "not supported (no data)"
