"""The plug-in example (examples/plugin), installed for real with pip and attnquery's files left
untouched: its learner ``lsq`` is in the registry and the docs' table, ``attnquery extract
--method lsq`` recovers a head, and a study config that lists it runs and draws it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.fresh import REPO, fresh_clone, user_env

PLUGIN = REPO / "examples" / "plugin"

#: what the plug-in may not change (it is added with one package, nothing of attnquery's)
ATTNQUERY_FILES = ["src", "config", "workflow", "Snakefile", "pyproject.toml", "examples"]


def _status() -> str:
    return subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--",
                           *ATTNQUERY_FILES], capture_output=True, text=True, check=True,
                          env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"}).stdout


def _builds_wheels_offline() -> bool:
    """Whether this environment's setuptools builds a wheel by itself (setuptools >= 70.1, or
    an older one with the wheel package): pip then builds the plug-in with it
    (--no-build-isolation) instead of fetching a build backend from its index."""
    return (importlib.util.find_spec("setuptools") is not None
            and (importlib.util.find_spec("setuptools.command.bdist_wheel") is not None
                 or importlib.util.find_spec("wheel") is not None))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The plug-in installed with pip into a folder of its own (``--target``), from a copy of
    examples/plugin (a build writes build/ and *.egg-info beside its sources)."""
    before = _status()
    tmp = tmp_path_factory.mktemp("plugin")
    shutil.copytree(PLUGIN, tmp / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
           str(tmp / "site")]
    if _builds_wheels_offline():
        cmd.append("--no-build-isolation")
    proc = subprocess.run([*cmd, str(tmp / "src")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (tmp / "site" / "attnquery_lsq.py").is_file()
    yield tmp / "site"
    assert _status() == before, "installing or using the plug-in changed attnquery's files"


def _env(site) -> dict:
    return {**user_env(), "PYTHONPATH": str(site)}


def _run(args, site, cwd=REPO, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=_env(site), capture_output=True, text=True,
                          timeout=timeout)


def _attnquery() -> str:
    return os.path.join(os.path.dirname(sys.executable), "attnquery")


def test_the_plugin_is_registered_and_in_the_learner_table(site):
    proc = _run([sys.executable, "-c", "from attnquery.learners import learner_table, registry\n"
                 "e = registry()['lsq']\n"
                 "print(e.plugin, e.target, e.distribution, e.spec.oracle, e.spec.returns)\n"
                 "print(learner_table())"], site)
    assert proc.returncode == 0, proc.stderr
    first, table = proc.stdout.split("\n", 1)
    assert first == "True attnquery_lsq:LeastSquaresLearner attnquery-lsq value head"
    assert ("| `lsq` | `LeastSquaresLearner` (plug-in `attnquery_lsq`) | value | head | least "
            "squares from random Gaussian one- and two-token queries") in table
    # without the plug-in on the path: not registered
    proc = _run([sys.executable, "-c", "from attnquery.learners import registry\n"
                 "print('lsq' in registry())"], site.parent / "no-plugin-here")
    assert proc.stdout.strip() == "False", proc.stderr


def test_extract_recovers_a_head_with_the_plugin(site, tmp_path):
    import examples.black_boxes as boxes
    from attnquery.realheads import load_head

    out = tmp_path / "head.npz"
    proc = _run([_attnquery(), "extract", "--oracle", "examples.black_boxes:some_head", "--d",
                 "16", "--method", "lsq", "--json", "--out", str(out)], site)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["method"] == "lsq" and summary["learner"].startswith("LeastSquaresLearner(")
    # v from 2 d one-token queries, W from 2 d^2 two-token queries, 8 check queries
    assert summary["n_queries"] == 2 * (16 + 16 * 16) + 8 and summary["n_verify_queries"] == 8
    head, _ = load_head(out)
    W, v = boxes._W16, boxes._V16
    assert np.linalg.norm(head.W - W) <= 1e-9 * np.linalg.norm(W)
    assert np.linalg.norm(head.v - v) <= 1e-9 * np.linalg.norm(v)
    # the command line offers it, and says what it is
    proc = _run([_attnquery(), "extract", "--help"], site)
    assert "lsq" in proc.stdout.split("--method", 1)[1].split("}", 1)[0]
    proc = _run([_attnquery(), "info", "--json", "--config", "examples/plugin/study.yaml"], site)
    info = json.loads(proc.stdout)
    assert info["methods"]["lsq"]["available"] is True
    assert info["experiments"]["lowrank_scale"]["cells"] == 12


@pytest.mark.slow
@pytest.mark.e2e  # a real study in a fresh clone: `make test-e2e`
def test_a_study_config_lists_the_plugin_and_its_figure_draws_it(site, tmp_path):
    # the study of examples/plugin/study.yaml in a fresh clone, 1 core (about 40 s)
    clone = fresh_clone(tmp_path / "clone")
    proc = _run(["snakemake", "--cores", "1", "--configfile", "examples/plugin/study.yaml"],
                site, cwd=clone, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (clone / "figures" / "lowrank_queries.png").stat().st_size > 10_000
    # the figure, drawn from the study's rows as the workflow drew it, has the plug-in's label
    proc = _run([sys.executable, "-c", "import pandas as pd\n"
                 "from attnquery.figures.lowrank import lowrank_queries, lowrank_time\n"
                 "df = pd.read_parquet('results/lowrank_scale.parquet')\n"
                 "t = pd.read_parquet('results/lowrank_scale.timing.parquet')\n"
                 "ok = df[df.learner == 'lsq']\n"
                 "print(len(ok), int(ok.success.sum()), float(ok.rel_err_W.max()))\n"
                 "df = df.merge(t, on=['experiment', 'cell_id'], how='left')\n"
                 "for f in (lowrank_queries, lowrank_time):\n"
                 "    fig, _ = f(df)\n"
                 "    print([x.get_text().split(chr(10))[0]\n"
                 "           for x in fig.axes[0].get_legend().get_texts()])"], site, cwd=clone)
    assert proc.returncode == 0, proc.stderr
    counts, queries, times = proc.stdout.strip().split("\n")
    n, n_ok, worst = counts.split()
    assert int(n) == 6 and int(n_ok) == 6 and float(worst) < 1e-9
    assert "least squares" in queries and "sketch, rank found" in queries
    assert "least squares, r = 1" in times and "least squares, r = 2" in times
