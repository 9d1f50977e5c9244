"""validate_results finds every kind of broken results folder, and passes a good one."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from attnquery.cli import main
from attnquery.experiments import run_cells
from attnquery.results import (
    RESULT_SCHEMA,
    SCHEMA_VERSION,
    rows_to_table,
    write_rows,
    write_table,
)
from attnquery.study.config import check_config, load_config
from attnquery.study.validate import validate_results

CONFIG = {
    "seed": 1,
    "experiments": {
        "exact": {"cells_per_shard": 4, "seeds": 1, "d": [2, 3], "probes": ["gaussian", "basis"]},
    },
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    cfg_path = root / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    cfg = load_config(cfg_path)
    cells = check_config(cfg)["exact"]
    rows, timings = run_cells(cells, cfg["seed"], provenance={"git_commit": "x"})
    assert [r["status"] for r in rows] == ["ok"] * 4
    return cfg, cfg_path, rows, timings


def write(root, rows, timings, schema=RESULT_SCHEMA):
    root.mkdir(exist_ok=True)
    write_rows(rows, timings, root / "exact.parquet", root / "exact.timing.parquet")
    if schema is not RESULT_SCHEMA:
        write_table(rows_to_table(rows, schema), root / "exact.parquet")
    return root


def test_good_results_pass(study, tmp_path):
    cfg, cfg_path, rows, timings = study
    root = write(tmp_path / "results", rows, timings)
    write_table(pq.read_table(root / "exact.parquet"), root / "all.parquet")
    assert validate_results(root, cfg) == []
    assert main(["validate", str(root), "--config", str(cfg_path)]) == 0


def test_missing_cell(study, tmp_path, capsys):
    cfg, cfg_path, rows, timings = study
    root = write(tmp_path / "results", rows[1:], timings[1:])
    problems = validate_results(root, cfg)
    assert len(problems) == 1
    assert "1 cells of experiment exact have no row" in problems[0]
    assert rows[0]["cell_id"] in problems[0]
    assert main(["validate", str(root), "--config", str(cfg_path)]) == 1
    assert rows[0]["cell_id"] in capsys.readouterr().out


def test_duplicate_row(study, tmp_path):
    cfg, _, rows, timings = study
    root = write(tmp_path / "results", [*rows, rows[2]], timings)
    assert validate_results(root, cfg) == [
        f"exact.parquet: cell {rows[2]['cell_id']} of experiment exact has 2 rows"
    ]


def test_nan_metric_in_ok_row(study, tmp_path):
    cfg, _, rows, timings = study
    bad = [dict(r) for r in rows]
    bad[1]["rel_err_W"] = float("nan")
    bad[3]["func_err"] = float("inf")
    problems = validate_results(write(tmp_path / "results", bad, timings), cfg)
    assert problems == [
        f"exact.parquet: cell {bad[1]['cell_id']} has status ok but rel_err_W = nan",
        f"exact.parquet: cell {bad[3]['cell_id']} has status ok but func_err = inf",
    ]


def test_nan_is_allowed_where_the_row_failed_or_the_metric_does_not_apply(study, tmp_path):
    cfg, _, rows, timings = study
    rows2 = [dict(r) for r in rows]
    rows2[0].update(status="error", message="ValueError: boom", rel_err_W=float("nan"),
                    n_queries=None)
    for r in rows2:
        r["bound_W"] = None  # a column no row of the experiment uses
    assert validate_results(write(tmp_path / "results", rows2, timings), cfg) == []


def test_ok_row_needs_queries_and_applicable_metrics(study, tmp_path):
    cfg, _, rows, timings = study
    rows2 = [dict(r) for r in rows]
    rows2[0]["n_queries"] = None
    rows2[2]["rel_err_v"] = None
    rows2[3].update(status="error", message="")
    problems = validate_results(write(tmp_path / "results", rows2, timings), cfg)
    assert f"exact.parquet: cell {rows2[3]['cell_id']} has status error but no message" in problems
    assert f"exact.parquet: cell {rows2[0]['cell_id']} has status ok but no n_queries" in problems
    assert any("rel_err_v is missing in 1 of 3 ok rows" in p for p in problems)


def test_wrong_schema_version_and_columns(study, tmp_path):
    cfg, _, rows, timings = study
    old = RESULT_SCHEMA.with_metadata({b"attnquery_schema_version": b"0"})
    root = write(tmp_path / "results", rows, timings, schema=old)
    assert validate_results(root, cfg) == [
        f"exact.parquet: schema version 0 in the file's metadata, expected {SCHEMA_VERSION}"
    ]
    rows2 = [{**r, "schema_version": 0} for r in rows]
    write_table(rows_to_table(rows2), root / "exact.parquet")
    assert validate_results(root, cfg) == [
        f"exact.parquet: rows with schema_version [0], expected {SCHEMA_VERSION}"
    ]
    t = rows_to_table(rows)
    t = t.set_column(t.schema.get_field_index("n_queries"), pa.field("n_queries", pa.float64()),
                     t.column("n_queries").cast(pa.float64()))
    pq.write_table(t.drop_columns(["rank_found"]), root / "exact.parquet")
    problems = validate_results(root, cfg)
    assert "exact.parquet: missing columns ['rank_found']" in problems
    assert "exact.parquet: column 'n_queries' has type double, expected int64" in problems


def test_missing_table_and_stale_rows(study, tmp_path):
    cfg, _, rows, timings = study
    root = tmp_path / "results"
    root.mkdir()
    assert validate_results(root, cfg) == ["exact.parquet: missing (experiment exact is enabled)"]
    smaller = {**cfg, "experiments": {"exact": {**cfg["experiments"]["exact"], "d": [2]}}}
    write(root, rows, timings)
    problems = validate_results(root, smaller)
    assert len(problems) == 1 and "2 rows of experiment exact are not cells" in problems[0]


def test_a_table_without_one_successful_cell_fails(study, tmp_path, capsys):
    """No evidence, no success: every cell error or timeout is a violation, for the library, the
    command line and the workflow's rule."""
    from attnquery.study.pipeline import validate_study

    cfg, cfg_path, rows, timings = study
    failed = [dict(r, status="error" if i % 2 else "timeout", message="RuntimeError: boom")
              for i, r in enumerate(rows)]
    root = write(tmp_path / "results", failed, timings)
    problems = validate_results(root, cfg)
    assert problems == [
        "exact.parquet: no cell of experiment exact ran to an answer (all 4 rows are error or "
        "timeout; first: RuntimeError: boom)"]
    assert main(["validate", str(root), "--config", str(cfg_path)]) == 1
    assert "no cell of experiment exact ran to an answer" in capsys.readouterr().out
    with pytest.raises(Exception, match="ran to an answer"):
        validate_study([root / "exact.parquet", root / "exact.timing.parquet"], cfg,
                       tmp_path / "validation.txt")
    assert not (tmp_path / "validation.txt").exists()
    # one cell that ran is evidence; the summary counts ok, refused as designed and failed
    some = [dict(rows[0])] + failed[1:]
    root = write(tmp_path / "results2", some, timings)
    assert validate_results(root, cfg) == []
    validate_study([root / "exact.parquet", root / "exact.timing.parquet"], cfg,
                   tmp_path / "validation.txt")
    text = (tmp_path / "validation.txt").read_text()
    assert "exact: 1 ok, 0 refused as designed, 3 failed\n" in text  # exact declares none
    assert text.endswith("failed: 3 cells\n")


def test_the_rule_checks_exactly_the_files_it_declares(study, tmp_path):
    cfg, _, rows, timings = study
    root = write(tmp_path / "results", rows, timings)
    (root / "exact.timing.parquet").unlink()
    problems = validate_results(root, cfg, files=[root / "exact.parquet",
                                                  root / "exact.timing.parquet"])
    assert problems == ["exact.timing.parquet: missing"]
    # a table beside them that the rule does not declare is not read
    (root / "stray.parquet").write_bytes(b"not parquet")
    assert validate_results(root, cfg, files=[root / "exact.parquet"]) == [
        "exact.timing.parquet: missing"]


def test_a_table_without_cell_ids_is_reported_not_a_crash(study, tmp_path):
    cfg, _, rows, timings = study
    root = write(tmp_path / "results", rows, timings)
    t = pq.read_table(root / "exact.parquet").drop_columns(["cell_id"])
    pq.write_table(t, root / "exact.parquet")
    problems = validate_results(root, cfg)
    assert "exact.parquet: missing columns ['cell_id']" in problems
