"""The workflow end to end on config/quick.yaml, in a temporary folder.

One run (a module-scoped fixture) serves every check here: schema and row counts of every
result table, every figure, the claims of the exact experiment, and the recovery after a
SIGKILL in the middle of a second run.
"""

import os
import signal
import subprocess
import time

import pyarrow.parquet as pq
import pytest

from attnquery.config import check_config, load_config
from attnquery.figures.exact import exact_claims
from attnquery.reproducible import compare_dirs, run_study, snakemake_command
from attnquery.results import RESULT_SCHEMA, TIMING_SCHEMA, read_results

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick(repo, tmp_path_factory):
    d = tmp_path_factory.mktemp("quick")
    t0 = time.perf_counter()
    with open(d / "snakemake.out", "w") as log:
        run_study(repo / "config" / "quick.yaml", d, 2, log=log)
    return d, time.perf_counter() - t0


@pytest.fixture(scope="module")
def cells(repo):
    return check_config(load_config(repo / "config" / "quick.yaml"))


def test_quick_study_is_quick(quick):
    _, seconds = quick
    assert seconds < 240, f"config/quick.yaml took {seconds:.0f} s"


def test_every_experiment_has_one_row_per_cell_with_the_schema(quick, cells):
    d, _ = quick
    for name, expected in cells.items():
        t = pq.read_table(d / "results" / f"{name}.parquet")
        assert t.schema.equals(RESULT_SCHEMA, check_metadata=True), name
        assert pq.read_table(d / "results" / f"{name}.timing.parquet").schema.equals(
            TIMING_SCHEMA, check_metadata=True)
        ids = t.column("cell_id").to_pylist()
        assert sorted(ids) == sorted(c["cell_id"] for c in expected), name
        assert len(ids) == len(set(ids)), name
    merged = pq.read_table(d / "results" / "all.parquet")
    assert merged.num_rows == sum(len(c) for c in cells.values())


def test_every_figure_is_written(quick, repo):
    d, _ = quick
    out = subprocess.run(snakemake_command(repo / "config" / "quick.yaml", d, 1,
                                           "--list-target-rules"),
                         capture_output=True, text=True, check=True)
    plot_rules = [r for r in out.stdout.split() if r.startswith("plot_")]
    assert plot_rules
    for rule in plot_rules:
        name = rule.removeprefix("plot_")
        for ext in ("pdf", "png"):
            f = d / "figures" / f"{name}.{ext}"
            assert f.exists() and f.stat().st_size > 5000, f
    assert (d / "figures" / "exact_queries.pdf").read_bytes()[:5] == b"%PDF-"


def test_exact_claims_hold_on_the_quick_study(quick):
    d, _ = quick
    df = read_results(d / "results" / "exact.parquet")
    claims = exact_claims(df)
    assert claims and all(c.passed for c in claims), [str(c) for c in claims]


def test_a_killed_run_resumes_without_losing_or_duplicating_cells(quick, repo, tmp_path):
    ref, _ = quick
    run = tmp_path / "killed"
    run.mkdir()
    cmd = snakemake_command(repo / "config" / "quick.yaml", run, 2)
    with open(tmp_path / "first.out", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if any((run / "results").rglob("shards/*.parquet")):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with open(tmp_path / "second.out", "w") as log:
        # a SIGKILL leaves Snakemake's lock behind: release it, then resume (as the README says)
        run_study(repo / "config" / "quick.yaml", run, 1, "--unlock", log=log)
        run_study(repo / "config" / "quick.yaml", run, 2, "--rerun-incomplete", log=log)
    problems = compare_dirs(ref, run)
    assert not problems, problems


def test_report_contains_every_figure_with_its_claims(quick, repo):
    d, _ = quick
    subprocess.run(snakemake_command(repo / "config" / "quick.yaml", d, 1, "--report",
                                     str(d / "report.html")),
                   check=True, capture_output=True, text=True)
    html = (d / "report.html").read_text(encoding="utf-8", errors="ignore")
    figures = sorted(p.stem for p in (d / "figures").glob("*.pdf"))
    assert figures
    for name in figures:
        assert f"{name}.pdf" in html, f"{name} is not in the report"
        claims = (d / "figures" / "claims" / f"{name}.rst").read_text()
        assert "supported" in claims or "states no claim" in claims
