"""The benchmark tables: a refused cell of the vector benchmark is a row with its status (the
other cells still run), and a table shows every row's columns."""

import dataclasses
import io

from attnquery import experiments
from attnquery.errors import ModelMismatchError
from attnquery.study import bench


def test_a_table_shows_every_rows_columns_and_a_dash_where_a_row_has_none():
    out = io.StringIO()
    bench.print_table("t", [{"d": 4, "status": "ok", "error": 0.5}, {"d": 8, "status": "no"}],
                      file=out)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("|")]
    assert lines[0] == "| d | status | error |"
    assert lines[2:] == ["| 4 | ok | 0.5 |", "| 8 | no | - |"]


def test_a_refused_vector_cell_is_a_row_with_its_status(monkeypatch):
    calls = []

    def refuse(cell, rng):
        calls.append(cell)
        raise ModelMismatchError("not a layer", error=1.0, allowed=0.0)

    real = experiments.get_experiment
    refusing = dataclasses.replace(real("vector"), run=refuse)
    monkeypatch.setattr(experiments, "get_experiment",
                        lambda name: refusing if name == "vector" else real(name))
    rows = bench.bench_vector()
    assert len(rows) == len(calls) > 1  # every cell ran, none stopped the table
    assert all(r["status"].startswith("ModelMismatchError: not a layer") for r in rows)
    assert {r["case"] for r in rows} >= {c["name"] for c in bench.VECTOR_CASES}
