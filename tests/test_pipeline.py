"""The workflow as users run it: every command of the README's "Quick start" and "Direct use"
sections, typed verbatim in the root of a fresh clone.

One module fixture makes the clone, runs the README's commands in order (the install, the smoke
study on config/quick.yaml and its report for real; the default and the cluster-sized study as
dry runs; every `make` target the sections name as `make -n`), and keeps what each printed. The
other checks reuse that run: result tables and figures, claims, incremental reruns (what a dry
run schedules after an edit), a config that leaves a section out, and the recovery after a
SIGKILL.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time

import pyarrow.parquet as pq
import pytest
import yaml

from attnquery.figures import figures_for
from attnquery.figures.exact import exact_claims
from attnquery.results import RESULT_SCHEMA, TIMING_SCHEMA, read_results
from attnquery.study.config import check_config, load_config
from attnquery.study.findings import macro_name
from attnquery.study.reproducible import compared_files

from .fresh import REPO, fresh_clone, planned_jobs, shell, user_env

# a fresh clone, a real install and the smoke study: `make test-e2e` (CI), not `make test`
pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SECTIONS = ("Quick start", "Direct use")
INSTALL = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]'"
QUICK = "snakemake --cores all --configfile config/quick.yaml"

#: how this test runs each command of those sections: "real", "dry" (with -n) or "make -n"
HOW = {
    "make reproduce": "make -n",
    "make test": "make -n",
    "make test-e2e": "make -n",
    INSTALL: "real",
    "snakemake --cores all": "dry",
    QUICK: "real",
    "snakemake --cores all --configfile config/paper.yaml": "dry",
    "snakemake --report report.html --configfile config/quick.yaml": "real",
    "make figures": "make -n",
    "make findings": "make -n",
    "make appendix": "make -n",
    "make report": "make -n",
    "make bench": "make -n",
    "make check-reproducible": "make -n",
    "make cluster-test": "make -n",
}


def readme_commands() -> list[str]:
    """Commands of the README's sections in SECTIONS: the lines of their bash blocks (comments
    dropped) and the `make TARGET` the prose names, in order."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    commands = []
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        if title.strip() not in SECTIONS:
            continue
        for block in re.findall(r"```bash\n(.*?)```", body, re.S):
            for line in block.splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and line not in commands:
                    commands.append(line)
        prose = re.sub(r"```.*?```", "", body, flags=re.S)
        for target in re.findall(r"`make ([\w-]+)`", prose):
            if f"make {target}" not in commands:
                commands.append(f"make {target}")
    return commands


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """A fresh clone with every README command run in it: (clone, venv env, {command: result},
    seconds the smoke study took)."""
    clone = fresh_clone(tmp_path_factory.mktemp("clone") / "attnquery")
    log = clone.parent / "commands.log"
    env = user_env()
    results, quick_s = {}, None
    for command in readme_commands():
        how = HOW.get(command)
        if how is None:
            continue  # reported by test_every_readme_command_is_tested
        if how == "dry":
            run = f"{command} -n"
        elif how == "make -n":
            run = command.replace("make ", "make -n ", 1)
        else:
            run = command
        results[command] = shell(run, clone, env, timeout=900, log=log)
        if command == QUICK:
            quick_s = results[command].seconds
        if command == INSTALL:  # later commands run in the environment it made, activated
            env = user_env(clone / ".venv")
    return clone, env, results, quick_s


def test_every_readme_command_is_tested():
    commands = readme_commands()
    assert INSTALL in commands and QUICK in commands, commands
    unknown = [c for c in commands if c not in HOW]
    assert not unknown, f"README commands this test does not know how to run: {unknown}"
    stale = [c for c in HOW if c not in commands]
    assert not stale, f"commands no longer in the README: {stale}"


def test_every_readme_command_succeeds(readme_run):
    _, _, results, _ = readme_run
    failed = {c: (r.stdout + r.stderr)[-3000:] for c, r in results.items() if r.returncode}
    assert not failed, failed


def test_make_targets_exist_and_name_their_commands(readme_run):
    _, _, results, _ = readme_run
    expected = {"make reproduce": "snakemake --cores", "make test": '-m "not e2e and not slow"',
                "make test-e2e": '-m "e2e or slow"',
                "make figures": "snakemake figures", "make report": "--report report.html",
                "make findings": "attnquery.study.findings publish",
                "make appendix": "attnquery.study.appendix",
                "make bench": "attnquery.study.bench", "make check-reproducible": "reproducible",
                "make cluster-test": "run_cluster_test.sh"}
    for target, text in expected.items():
        assert text in results[target].stdout, (target, results[target].stdout[-2000:])


def test_dry_runs_plan_the_whole_studies(readme_run):
    _, _, results, _ = readme_run
    for command, config in (("snakemake --cores all", "config.yaml"),
                            ("snakemake --cores all --configfile config/paper.yaml", "paper.yaml")):
        cfg = load_config(REPO / "config" / config)
        jobs = planned_jobs(results[command].stdout)
        plotted = sorted(w["wildcards"]["figure"] for r, w in jobs if r == "plot_figure")
        assert plotted == figures_for(cfg["experiments"]), command
        computed = {w["wildcards"]["experiment"] for r, w in jobs if r == "run_shard"}
        assert computed == set(check_config(cfg)), command


def test_quick_study_runs_to_the_end(readme_run):
    # its wall-clock time is not a test's business (a loaded machine takes longer): `make bench`
    clone, _, results, _ = readme_run
    assert results[QUICK].returncode == 0
    assert (clone / "results" / "validation.txt").read_text().startswith("valid")


def test_every_experiment_has_one_row_per_cell_with_the_schema(readme_run):
    clone, _, _, _ = readme_run
    cells = check_config(load_config(REPO / "config" / "quick.yaml"))
    for name, expected in cells.items():
        t = pq.read_table(clone / "results" / f"{name}.parquet")
        assert t.schema.equals(RESULT_SCHEMA, check_metadata=True), name
        assert pq.read_table(clone / "results" / f"{name}.timing.parquet").schema.equals(
            TIMING_SCHEMA, check_metadata=True)
        ids = t.column("cell_id").to_pylist()
        assert sorted(ids) == sorted(c["cell_id"] for c in expected), name
        assert len(ids) == len(set(ids)), name
        assert "ok" in t.column("status").to_pylist(), name
    merged = pq.read_table(clone / "results" / "all.parquet")
    assert merged.num_rows == sum(len(c) for c in cells.values())


def test_every_figure_its_claims_and_the_report_are_written(readme_run):
    clone, _, _, _ = readme_run
    cfg = load_config(REPO / "config" / "quick.yaml")
    names = figures_for(cfg["experiments"])
    html = (clone / "report.html").read_text(encoding="utf-8", errors="ignore")
    for name in names:
        for ext in ("pdf", "png"):
            f = clone / "figures" / f"{name}.{ext}"
            assert f.exists() and f.stat().st_size > 5000, f
        claims = (clone / "figures" / "claims" / f"{name}.rst").read_text()
        assert re.search(r"^- \*\*(supported|NOT supported|not supported \(no data\))\*\*",
                         claims, re.M) or "states no claim" in claims, name
        assert f"{name}.pdf" in html, f"{name} is not in the report"
    assert (clone / "figures" / "exact_queries.pdf").read_bytes()[:5] == b"%PDF-"


def test_exact_claims_hold_on_the_quick_study(readme_run):
    clone, _, _, _ = readme_run
    claims = exact_claims(read_results(clone / "results" / "exact.parquet"))
    assert claims and all(c.passed for c in claims), [str(c) for c in claims]
    text = (clone / "figures" / "claims" / "exact_queries.rst").read_text()
    assert text.count("**supported**") == len(claims), text


def test_the_numbers_of_the_findings_come_from_the_claims(readme_run):
    """results/numbers.json holds the numbers every figure's claims computed (the same values as
    figures/claims/<figure>.json), results/numbers.tex one macro each, and the findings pages are
    rendered from them with no number missing that the smoke study computes."""
    clone, _, _, _ = readme_run
    numbers = json.loads((clone / "results" / "numbers.json").read_text())["numbers"]
    records = [json.loads(p.read_text()) for p in (clone / "figures" / "claims").glob("*.json")]
    stated = {n["name"]: n for r in records for c in r["claims"] for n in c["numbers"]}
    assert stated and set(stated) == set(numbers)
    assert all(numbers[k]["value"] == v["value"] for k, v in stated.items())
    exact = exact_claims(read_results(clone / "results" / "exact.parquet"))
    fit = next(c for c in exact if c.name == "exact_exponent").numbers[0]
    assert numbers["exactQueryExponent"]["value"] == fit.value
    assert numbers["exactQueryExponent"]["tables"] == ["results/exact.parquet"]
    tex = (clone / "results" / "numbers.tex").read_text()
    assert f"\\newcommand{{\\exactQueryExponent}}{{{fit.text}}}" in tex
    # one macro per number, two more per interval, and the machine the run came from
    assert len(re.findall(r"^\\newcommand(?!\{\\findingsMachine\})", tex, re.M)) == len(
        numbers) + 2 * sum(
        1 for n in numbers.values() if n["interval"])
    table = (clone / "results" / "findings" / "readme_table.md").read_text()
    assert f"{fit.text} {fit.interval}" in table
    # the committed findings name each number the smoke study does not compute, none it does
    missing = set(re.findall(r"\(missing: (\w+)\)", table))
    assert not missing & set(numbers)


def test_the_appendix_names_only_files_the_run_produced(readme_run):
    """`snakemake appendix` writes appendix/appendix.tex and body.tex (no TeX needed): every
    \\includegraphics and \\input names a file of the run, every macro used is defined."""
    from attnquery.study.appendix import PREAMBLE_PACKAGES

    clone, env, _, _ = readme_run
    out = shell("snakemake appendix --cores 2 --configfile config/quick.yaml", clone, env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    doc = (clone / "appendix" / "appendix.tex").read_text()
    body = (clone / "appendix" / "body.tex").read_text()
    files = re.findall(r"\\(?:includegraphics(?:\[[^\]]*\])?|input)\{([^}]+)\}", doc + body)
    assert "results/numbers" in files and "appendix/body" in files
    assert not [f for f in files if not (clone / f).is_file() and not (clone / f"{f}.tex")
                .is_file()], files
    cfg = load_config(REPO / "config" / "quick.yaml")
    figures = figures_for(cfg["experiments"])
    assert sorted(f.split("/")[-1][:-4] for f in files if f.startswith("figures/")) == figures
    assert sorted(f.split("/")[-1] for f in files if f.startswith("appendix/tables/")) == sorted(
        check_config(cfg))
    # every macro the appendix and its tables use is a number's or LaTeX's own
    defined = set(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}",
                             (clone / "results" / "numbers.tex").read_text()))
    latex = {"documentclass", "usepackage", "input", "title", "date", "begin", "end",
             "maketitle", "tableofcontents", "addcontentsline", "sloppy", "par", "smallskip",
             "linewidth", "section", "subsection", "centering", "includegraphics", "textwidth",
             "caption",
             "label", "noindent", "ref", "item", "textbf", "texttt", "emph", "clearpage",
             "begingroup", "endgroup", "tiny", "scriptsize", "footnotesize", "setlength",
             "tabcolsep",
             "let", "tabular", "endtabular", "longtable", "endlongtable", "refstepcounter",
             "thetable", "le", "ge", "toprule", "midrule", "bottomrule", "endhead", "textbackslash",
             "times", "_", "%", "&", "#", "$", "{", "}", "^", "~"}
    tables = "".join((clone / "results" / "tables" / f"{n}.tex").read_text()
                     for n in check_config(cfg))
    used = set(re.findall(r"\\([A-Za-z]+|[_%&#${}^~])", doc + body + tables))
    assert not used - defined - latex, sorted(used - defined - latex)
    assert all(f"\\usepackage{{{p}}}" in doc for p in PREAMBLE_PACKAGES)
    numbers = json.loads((clone / "results" / "numbers.json").read_text())["numbers"]
    assert all(f"\\{macro_name(n)}" in body for n in numbers)


def test_a_clean_run_and_its_report_print_no_warning(readme_run):
    _, _, results, _ = readme_run
    for command in (QUICK, "snakemake --report report.html --configfile config/quick.yaml"):
        text = results[command].stdout + results[command].stderr
        assert not re.search(r"Warning|was never awaited", text), (command, text[-3000:])


def test_the_run_prints_no_traceback_and_one_outcome_line_per_experiment(readme_run):
    """Refusals are rows, not tracebacks: the console counts each experiment's cells ok,
    refused as designed and failed, as results/validation.txt does."""
    clone, _, results, _ = readme_run
    text = results[QUICK].stdout + results[QUICK].stderr
    assert "Traceback" not in text, text[-3000:]
    validation = (clone / "results" / "validation.txt").read_text()
    for name in check_config(load_config(REPO / "config" / "quick.yaml")):
        line = re.search(rf"^{name}: [\d,]+ ok, [\d,]+ refused as designed.*, 0 failed$",
                         validation, re.M)
        assert line, (name, validation)
        assert line.group(0) in text, name


# ---------------------------------------------------------------------------------------------
# incremental reruns: what a dry run schedules after a change
# ---------------------------------------------------------------------------------------------
def _dry(clone, env, config="config/quick.yaml"):
    out = shell(f"snakemake -n --cores 2 --configfile {config}", clone, env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return [(r, f.get("wildcards", {})) for r, f in planned_jobs(out.stdout)]


def _edited(path, text="\n# an edit\n"):
    """Context: ``path`` with ``text`` appended, restored afterwards."""
    class _Edit:
        def __enter__(self):
            self.old = path.read_bytes()
            path.write_bytes(self.old + text.encode())

        def __exit__(self, *exc):
            path.write_bytes(self.old)
    return _Edit()


def test_a_complete_study_schedules_nothing(readme_run):
    clone, env, _, _ = readme_run
    assert _dry(clone, env) == []


def test_editing_a_figure_module_re_renders_its_figures_only(readme_run):
    clone, env, _, _ = readme_run
    with _edited(clone / "src" / "attnquery" / "figures" / "noise.py"):
        jobs = _dry(clone, env)
    # (the rounding figure has its own module, figures/rounding.py)
    assert sorted(w.get("figure", "") for r, w in jobs if r == "plot_figure") == [
        "noise_scaling"], jobs
    # the claims' numbers are collected again, and the findings pages rendered from them
    assert sorted(r for r, _ in jobs) == ["all", "findings", "numbers", "plot_figure"]
    assert _dry(clone, env) == []  # the content is what counts, not the file's time


def test_adding_a_grid_value_computes_only_the_new_cells(readme_run):
    clone, env, _, _ = readme_run
    cfg = yaml.safe_load((clone / "config" / "quick.yaml").read_text())
    before = check_config(load_config(clone / "config" / "quick.yaml"))["noise"]
    cfg["experiments"]["noise"]["tau"].append(3.0e-4)
    more = clone / "config" / "quick-more-tau.yaml"
    more.write_text(yaml.safe_dump(cfg))
    after = check_config(load_config(more))["noise"]
    new = len(after) - len(before)
    assert new > 0
    jobs = _dry(clone, env, "config/quick-more-tau.yaml")
    shards = [w for r, w in jobs if r == "run_shard"]
    assert {w["experiment"] for w in shards} == {"noise"}
    assert len(shards) == math.ceil(new / cfg["experiments"]["noise"]["cells_per_shard"])
    assert [w["experiment"] for r, w in jobs if r == "aggregate_results"] == ["noise"]
    assert [w["figure"] for r, w in jobs if r == "plot_figure"] == ["noise_scaling"]


def test_editing_a_learner_recomputes_the_experiments_that_use_it(readme_run):
    clone, env, _, _ = readme_run
    with _edited(clone / "src" / "attnquery" / "learners" / "membership.py"):
        jobs = _dry(clone, env)
    assert {w["experiment"] for r, w in jobs if r == "run_shard"} == {"membership"}
    assert {w["figure"] for r, w in jobs if r == "plot_figure"} == {"membership_cost"}


def test_a_section_left_out_is_not_run(readme_run):
    clone, env, _, _ = readme_run
    cfg = yaml.safe_load((clone / "config" / "quick.yaml").read_text())
    del cfg["experiments"]["exact"]
    (clone / "config" / "quick-trimmed.yaml").write_text(yaml.safe_dump(cfg))
    out = shell("snakemake -n --cores 2 --configfile config/quick-trimmed.yaml", clone, env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "exact" not in re.sub(r"lowrank_scale|learner=exact", "", out.stdout), \
        "a config without an exact section still plans exact jobs"
    jobs = planned_jobs(out.stdout)
    # the numbers are collected from one figure fewer (and the findings rendered from them)
    assert {r for r, _ in jobs} == {"merge_results", "validate_results", "numbers", "findings",
                                    "all"}


def test_a_missing_checkpoint_stops_before_any_job(readme_run, tmp_path):
    clone, env, _, _ = readme_run
    cfg = yaml.safe_load((clone / "config" / "quick.yaml").read_text())
    cfg["experiments"] = {"realheads": cfg["experiments"]["realheads"]}
    del cfg["experiments"]["realheads"]["synthetic"]
    cfg["experiments"]["realheads"]["checkpoint"] = "data/nowhere/model.safetensors"
    (clone / "config" / "quick-no-checkpoint.yaml").write_text(yaml.safe_dump(cfg))
    out = shell("snakemake --cores 2 --configfile config/quick-no-checkpoint.yaml", clone, env)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "data/nowhere/model.safetensors does not exist" in text
    assert "fetch" in text and "synthetic" in text
    assert "run_shard" not in text


# ---------------------------------------------------------------------------------------------
# a run killed with SIGKILL resumes without losing, duplicating or recomputing cells
# ---------------------------------------------------------------------------------------------
KILLED = ("exact", "noise", "multihead")  # experiments of several shards, cheap to compute


def test_a_killed_run_resumes_without_losing_or_duplicating_cells(readme_run, tmp_path):
    """config/quick.yaml restricted to a few experiments, killed after two shards, resumed: the
    shards done before the kill are kept, and every table and figure is byte for byte the one
    the full smoke study wrote (shards are named by their cells, so they are the same files)."""
    ref, env, _, _ = readme_run
    clone = fresh_clone(tmp_path / "killed")
    cfg = yaml.safe_load((clone / "config" / "quick.yaml").read_text())
    cfg["experiments"] = {k: cfg["experiments"][k] for k in KILLED}
    (clone / "config" / "killed.yaml").write_text(yaml.safe_dump(cfg))
    command = "snakemake --cores 2 --configfile config/killed.yaml"
    with open(tmp_path / "first.out", "w") as log:
        proc = subprocess.Popen(["bash", "-c", command], cwd=clone, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if len(list((clone / "results").rglob("shards/*.timing.parquet"))) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = {p: p.stat().st_mtime_ns for p in (clone / "results").rglob("shards/*.parquet")
            if p.with_name(p.name.replace(".parquet", ".timing.parquet")).exists()}
    assert done
    # a SIGKILL leaves Snakemake's lock behind: release it, then run the same command again
    unlock = shell("snakemake --unlock --configfile config/killed.yaml", clone, env,
                   log=tmp_path / "second.out")
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    again = shell(command, clone, env, log=tmp_path / "second.out")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    kept = [p for p, t in done.items() if p.exists() and p.stat().st_mtime_ns == t]
    assert len(kept) == len(done), "shards finished before the kill were computed again"
    # the merged table, the validation summary and the findings' numbers cover the whole study
    mine = set(compared_files(clone)) - {"results/all.parquet", "results/validation.txt",
                                         "results/numbers.json"}
    assert {f.split("/")[1].split(".")[0] for f in mine if f.startswith("results/")} >= set(
        KILLED)
    differ = [f for f in sorted(mine) if not (ref / f).is_file()
              or (ref / f).read_bytes() != (clone / f).read_bytes()]
    assert not differ, differ
