"""Claims are small named functions, registered with their figure module's ClaimSet: a claim is
found by its name and checked alone, on data of a test's own."""

from __future__ import annotations

import importlib
import pkgutil

import pandas as pd
import pytest

import attnquery.figures as figures
from attnquery.claims import Claim, ClaimSet
from attnquery.results import RESULT_SCHEMA, TIMING_COLUMNS, rows_to_table

#: every ClaimSet of the figure modules: (module, attribute)
SETS = [(m.name, attr)
        for m in pkgutil.iter_modules(figures.__path__)
        for attr, value in vars(importlib.import_module(f"attnquery.figures.{m.name}")).items()
        if isinstance(value, ClaimSet)]


def _empty():
    df = rows_to_table([], RESULT_SCHEMA).to_pandas()
    for col in TIMING_COLUMNS:
        df[col] = pd.Series(dtype=float)
    return df


def _claim(name, passed=True):
    return Claim(name, f"{name} holds", passed, "checked", n_runs=1)


def test_a_claim_set_checks_its_claims_in_order_and_skips_those_not_made():
    claims = ClaimSet(lambda df: len(df))

    @claims
    def first(n):
        return _claim("first", n > 2)

    @claims
    def per_group(n):
        return [_claim(f"per_group_{i}") for i in range(n)]

    @claims
    def never(n):
        return None

    assert claims.names == ("first", "per_group", "never")
    assert claims["first"] is first
    out = claims.of_rows([0, 0])
    assert [c.name for c in out] == ["first", "per_group_0", "per_group_1"]
    assert [c.passed for c in out] == [False, True, True]


def test_a_claim_set_refuses_a_name_twice_and_names_the_known_ones():
    claims = ClaimSet()

    @claims
    def one(df):
        return _claim("one")

    with pytest.raises(ValueError, match="'one' is registered twice"):
        claims(one)
    with pytest.raises(KeyError, match=r"unknown claim 'two'; known: \['one'\]"):
        claims["two"]


def test_a_claim_may_be_named_apart_from_its_function():
    claims = ClaimSet()

    @claims.named("figure_name")
    def figure_name_claim(df):
        return _claim("figure_name")

    assert claims.names == ("figure_name",)
    assert claims["figure_name"] is figure_name_claim


def test_every_figure_module_registers_its_claims_in_a_claim_set():
    modules = {m.name for m in pkgutil.iter_modules(figures.__path__)
               if not m.name.startswith("_")}
    assert modules == {module for module, _ in SETS}
    assert ("rotary", "SERVED_CLAIMS") in SETS and ("reallayer", "TIME_CLAIMS") in SETS


@pytest.mark.parametrize(("module", "attr"), SETS)
def test_each_claim_states_only_claims_of_its_name(module, attr):
    claims = getattr(importlib.import_module(f"attnquery.figures.{module}"), attr)
    data = claims.prepare(_empty())
    for name in claims.names:
        assert claims[name].__doc__, f"claim {name} has no docstring"
        if data is None:  # no claim on empty rows
            continue
        out = claims[name](data)
        made = [out] if isinstance(out, Claim) else list(out or [])
        assert all(c.name == name or c.name.startswith(name + "_") for c in made), \
            (name, [c.name for c in made])


def _exact_rows(n_queries_off=0):
    d = [16, 32, 64]
    return pd.DataFrame({
        "experiment": "exact", "status": "ok", "d": d,
        "n_queries": [x * x + x + n_queries_off for x in d], "probes": "gaussian",
        "verified": True, "verify_queries": 4, "verify_error": 1e-14, "success": True,
        "rel_err_W": 1e-13})


def test_exact_count_fails_on_a_run_that_asked_one_query_too_many():
    from attnquery.figures.exact import CLAIMS, exact_count

    assert exact_count(CLAIMS.prepare(_exact_rows())).passed
    off = exact_count(CLAIMS.prepare(_exact_rows(n_queries_off=1)))
    assert off.verdict == "NOT supported" and off.detail == "0/3 runs"


def test_exact_exponent_fails_on_queries_that_grow_as_d_cubed():
    from attnquery.figures.exact import CLAIMS

    rows = _exact_rows().assign(n_queries=lambda r: r["d"] ** 3)
    claim = CLAIMS["exact_exponent"](CLAIMS.prepare(rows))
    assert not claim.passed and claim.numbers[0].value == pytest.approx(3.0)


def test_lowprecision_float64_fails_on_a_float64_run_beyond_rounding():
    from attnquery.figures.lowprecision import (
        FLOAT64_MAX_ERR,
        LowprecisionData,
        lowprecision_float64,
    )

    rows = pd.DataFrame({"rounding": ["float64", "float64", "float16"],
                         "rel_err_W": [1e-15, 1e-15, 1e-3]})
    assert lowprecision_float64(LowprecisionData(rows, rows, {})).passed
    worse = rows.assign(rel_err_W=[1e-15, 100 * FLOAT64_MAX_ERR, 1e-3])
    claim = lowprecision_float64(LowprecisionData(worse, worse, {}))
    assert claim.verdict == "NOT supported" and claim.numbers[0].value == 100 * FLOAT64_MAX_ERR
    # no float64 run: the claim is not made
    assert lowprecision_float64(LowprecisionData(rows[2:], rows[2:], {})) is None


def test_vector_runs_fails_on_a_refused_cell_and_no_rows_make_no_claims():
    from attnquery.figures.vector import CLAIMS

    rows = pd.DataFrame({"experiment": "vector", "status": ["ok", "error"]})
    claim = CLAIMS["vector_runs"](CLAIMS.prepare(rows))
    assert claim.verdict == "NOT supported" and claim.detail == "1/2 cells ok"
    assert CLAIMS.prepare(rows[rows["experiment"] == "none"]) is None
    assert CLAIMS.of_rows(rows[rows["experiment"] == "none"]) == []
