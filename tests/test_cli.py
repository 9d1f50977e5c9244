"""The attnquery command line: extract, heads, validate, info."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from attnquery.cli import main
from attnquery.extraction import METHODS, ProgressOracle
from attnquery.oracles import ValueOracle
from attnquery.realheads import (
    ModuleBlackBox,
    load_head,
    load_layer,
    write_test_checkpoint,
)
from tests.fixtures import LOW_RANK_HEAD, SOME_HEAD


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def run_json(argv, capsys):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_extract_exact_recovers_the_fixture(tmp_path, capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    out = tmp_path / "head.npz"
    assert main(["extract", "--oracle", "tests.fixtures:some_head", "--d", "16", "--method",
                 "exact", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "queries        280 (counted by the oracle" in text
    assert "272 to learn, 8 to check the result" in text
    assert "rank found     16" in text
    head, meta = load_head(out)
    assert rel(head.W, SOME_HEAD.W) < 1e-10
    assert rel(head.v, SOME_HEAD.v) < 1e-12
    assert meta["method"] == "exact" and meta["n_queries"] == 16 * 16 + 16 + 8


def test_extract_json_and_budget(capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    s = run_json(["extract", "--oracle", "examples.black_boxes:some_head", "--d", "16"], capsys)
    assert s["n_queries"] == 280 and s["method"] == "exact" and s["rank_found"] == 16
    assert s["n_verify_queries"] == 8 and s["verify_error"] < 1e-12
    assert main(["extract", "--oracle", "tests.fixtures:some_head", "--d", "16",
                 "--budget", "279"]) == 1
    err = capsys.readouterr().err
    assert "needs 280 queries" in err and "--budget" in err


@pytest.mark.parametrize("spec, message", [
    ("tests.fixtures", "must be MODULE:FUNCTION"),
    ("tests.nonexistent_module:f", "cannot import module 'tests.nonexistent_module'"),
    ("tests.fixtures:missing", "has no attribute 'missing'"),
    ("tests.fixtures:NOT_CALLABLE", "is not callable"),
])
def test_bad_oracle_is_named(spec, message, capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    assert main(["extract", "--oracle", spec, "--d", "16"]) == 2
    assert message in capsys.readouterr().err


def test_black_box_failures_are_reported(capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    assert main(["extract", "--oracle", "tests.fixtures:failing_head", "--d", "4"]) == 1
    assert "the black box raised RuntimeError" in capsys.readouterr().err
    # the wrong d: the black box answers with an error that names the shape
    assert main(["extract", "--oracle", "tests.fixtures:some_head", "--d", "8"]) == 1
    assert "black box raised" in capsys.readouterr().err
    assert main(["extract", "--oracle", "tests.fixtures:some_head"]) == 2
    assert "--d is required" in capsys.readouterr().err


def test_extract_file_path_oracle(tmp_path, capsys, repo):
    s = run_json(["extract", "--oracle", f"{repo / 'examples' / 'black_boxes.py'}:some_head",
                  "--d", "16"], capsys)
    assert s["n_queries"] == 280


def test_heads_then_extract_model(tmp_path, capsys):
    ckpt = write_test_checkpoint(tmp_path / "m.safetensors", style="gpt2", n_layers=2,
                                 n_heads=4, d=32, seed=3, prefix="transformer.")
    h = run_json(["heads", str(ckpt), "--layer", "1", "--head", "2", "--out",
                  str(tmp_path / "h.npz"), "--readout", "ones"], capsys)
    assert (h["style"], h["d"], h["rank"], h["d_head"], h["readout"]) == ("gpt2", 32, 8, 8,
                                                                         "ones")
    s = run_json(["extract", "--model", str(tmp_path / "h.npz"), "--method", "exact",
                  "--out", str(tmp_path / "learned.npz")], capsys)
    assert s["n_queries"] - s["n_verify_queries"] == 32 * 32 + 32
    assert s["rel_err_W"] < 1e-10 and s["rel_err_v"] < 1e-12 and s["func_err"] < 1e-10
    truth, _ = load_head(tmp_path / "h.npz")
    learned, _ = load_head(tmp_path / "learned.npz")
    assert rel(learned.W, truth.W) == pytest.approx(s["rel_err_W"])
    assert main(["extract", "--model", str(tmp_path / "h.npz"), "--d", "16"]) == 2
    assert "does not match" in capsys.readouterr().err
    # human-readable summaries
    assert main(["heads", str(ckpt), "--layer", "0", "--head", "0", "--out",
                 str(tmp_path / "h0.npz"), "--readout", "5"]) == 0
    out = capsys.readouterr().out
    assert "gpt2-style, 2 layers x 4 heads, d = 32" in out and "coordinate" in out
    assert main(["extract", "--model", str(tmp_path / "h0.npz")]) == 0
    assert "rel. error W" in capsys.readouterr().out
    # no such layer: a usage error, as for extract --module (issue 20: it was exit 1)
    assert main(["heads", str(ckpt), "--layer", "2", "--head", "0", "--out",
                 str(tmp_path / "x.npz")]) == 2
    assert "layer must be in [0, 2)" in capsys.readouterr().err


@pytest.fixture
def bert(tmp_path):
    """A small BERT-style checkpoint with every bias: 2 layers of 4 heads, d = 32."""
    return write_test_checkpoint(tmp_path / "bert" / "model.safetensors", n_layers=2,
                                 n_heads=4, d=32, seed=5)


def test_extract_module_head_with_its_biases(bert, tmp_path, capsys):
    out = tmp_path / "h.npz"
    s = run_json(["extract", "--module", str(bert), "--layer", "1", "--head", "2",
                  "--out", str(out)], capsys)
    d = 32
    # d^2 + d of Theorem 4.1, d more for the key bias, one for the offset, then the check
    assert s["method"] == "exact" and s["fit_bias"]
    assert s["n_queries"] - s["n_verify_queries"] == d * d + 2 * d + 1
    assert s["rel_err_W"] < 1e-11 and s["rel_err_v"] < 1e-12
    assert s["rel_err_c"] < 1e-9 and s["rel_err_offset"] < 1e-9
    learned, meta = load_head(out)
    assert learned.has_bias and meta["method"] == "exact"
    # the learned head against the module itself, computed as the framework computes it
    box = ModuleBlackBox(bert, 1, 2)
    X = np.random.default_rng(1).standard_normal((50, 5, d))
    assert np.max(np.abs(learned(X) - box(X))) < 1e-10 * np.max(np.abs(box(X)))
    # the sketch learner fits the biases too; without biases any method runs
    s = run_json(["extract", "--module", str(bert), "--layer", "1", "--head", "2",
                  "--method", "sketch"], capsys)
    assert s["rel_err_W"] < 1e-9 and s["rel_err_c"] < 1e-9
    s = run_json(["extract", "--module", str(bert), "--layer", "0", "--head", "1",
                  "--no-biases", "--method", "sketch", "--readout", "ones"], capsys)
    assert not s["fit_bias"] and s["rel_err_W"] < 1e-9 and "without biases" in s["source"]


def test_extract_module_whole_layer(bert, tmp_path, capsys):
    out = tmp_path / "layer.npz"
    s = run_json(["extract", "--module", str(bert), "--layer", "0", "--out", str(out)], capsys)
    assert s["method"] == "layer" and s["n_heads"] == 4 and s["rank_found"] == 8
    assert sorted(s["matched"]) == [0, 1, 2, 3]
    assert s["rel_err_W"] < 1e-6 and s["rel_err_c"] < 1e-6 and s["func_err"] < 1e-8
    layer, meta = load_layer(out)
    assert layer.n_heads == 4 and meta["method"] == "layer"
    box = ModuleBlackBox(bert, 0)
    X = np.random.default_rng(2).standard_normal((50, 4, 32))
    assert np.max(np.abs(layer(X) - box(X))) < 1e-8 * np.max(np.abs(box(X)))
    assert main(["extract", "--module", str(bert), "--layer", "0"]) == 0
    text = capsys.readouterr().out
    assert "a layer of 4 heads of rank 8" in text and "(worst head, matched)" in text


@pytest.mark.parametrize("argv, message", [
    (["--layer", "0", "--method", "exact"], "without --head the box is the whole layer"),
    (["--layer", "0", "--head", "0", "--method", "noisy", "--tau", "1e-3"],
     "does not fit: use --method exact or sketch, or drop the biases with --no-biases"),
    (["--layer", "0", "--head", "0", "--method", "layer"], "leave out --head"),
    (["--head", "0"], "--module needs --layer"),
    (["--layer", "2"], "--module: layer must be in [0, 2)"),
    (["--layer", "0", "--head", "4"], "--module: head must be in [0, 4)"),
    (["--layer", "0", "--d", "16"], "--d 16 does not match the module (d = 32)"),
])
def test_extract_module_usage_errors(bert, argv, message, capsys):
    assert main(["extract", "--module", str(bert), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_module_options_need_a_module(capsys, repo, monkeypatch):
    monkeypatch.chdir(repo)
    assert main(["extract", "--oracle", "tests.fixtures:some_head", "--d", "16", "--head",
                 "1", "--no-biases"]) == 2
    assert "--head, --no-biases: only with --module" in capsys.readouterr().err


def test_sketch_and_noisy_methods(capsys, monkeypatch, repo, tmp_path):
    monkeypatch.chdir(repo)
    d, r = LOW_RANK_HEAD.d, LOW_RANK_HEAD.rank
    s = run_json(["extract", "--oracle", "tests.fixtures:low_rank_head", "--d", str(d),
                  "--method", "sketch", "--rank", str(r), "--out", str(tmp_path / "s.npz")],
                 capsys)
    assert s["rank_found"] == r
    assert s["n_queries"] - s["n_verify_queries"] <= 1.05 * (r * (2 * d - r) + d)
    head, _ = load_head(tmp_path / "s.npz")
    assert rel(head.W, LOW_RANK_HEAD.W) < 1e-8
    # noisy, simulated against a saved head (uniform noise of size tau)
    from attnquery.realheads import save_head

    save_head(tmp_path / "t.npz", SOME_HEAD)
    w_fro = float(np.linalg.norm(SOME_HEAD.W))
    mu = float(np.abs(SOME_HEAD.v).min())
    args = ["extract", "--model", str(tmp_path / "t.npz"), "--method", "noisy",
            "--param", f"W_bound={max(2.0, w_fro)}", "--param", f"mu={mu}"]
    errs = [run_json([*args, "--tau", str(tau)], capsys)["rel_err_W"] for tau in (1e-9, 1e-6)]
    assert errs[0] < 1e-5 and errs[1] > 10 * errs[0]
    assert main(args) == 2
    assert "needs --tau" in capsys.readouterr().err
    # noisy against a user's black box: its answers are taken as within +-tau, nothing is added
    s = run_json(["extract", "--oracle", "tests.fixtures:some_head", "--d", "16", "--method",
                  "noisy", "--tau", "1e-9", "--param", f"W_bound={max(2.0, w_fro)}",
                  "--param", f"mu={mu}", "--out", str(tmp_path / "n.npz")], capsys)
    assert s["n_queries"] == 16 * 16 + 16 + s["n_verify_queries"]
    assert rel(load_head(tmp_path / "n.npz")[0].W, SOME_HEAD.W) < 1e-5
    assert main(["extract", "--oracle", "tests.fixtures:some_head", "--d", "16", "--method",
                 "exact", "--rank", "3"]) == 2
    assert "--rank: only with a learner with a rank parameter (sketch or nuclear" in \
        capsys.readouterr().err


def test_nuclear_method(tmp_path, capsys):
    from attnquery.models import random_head
    from attnquery.realheads import save_head

    truth = random_head(10, seed=1, rank=2)
    save_head(tmp_path / "lr.npz", truth)
    s = run_json(["extract", "--model", str(tmp_path / "lr.npz"), "--method", "nuclear",
                  "--rank", "2", "--param", "n_measurements=70"], capsys)
    assert s["rank_found"] == 2 and s["rel_err_W"] < 1e-8
    assert s["n_queries"] == 10 + 70 + 8  # fewer than the exact learner's 110 (+ 8 checks)


def test_membership_method(tmp_path, capsys):
    from attnquery.models import AttentionHead, random_head, random_v
    from attnquery.realheads import save_head

    v = random_v(8, 5, mu=0.5)
    v /= np.linalg.norm(v)
    truth = AttentionHead(v, W=random_head(8, seed=5, W_fro=1.5).W)
    save_head(tmp_path / "m.npz", truth)
    s = run_json(["extract", "--model", str(tmp_path / "m.npz"), "--method", "membership",
                  "--eps", "1e-4", "--param", "W_bound=2", "--param",
                  f"mu={np.abs(v).min() * 0.9}"], capsys)
    assert s["v_compared"].startswith("direction")
    assert s["abs_err_W"] < 1e-4 and s["err_v"] < 1e-3
    assert s["n_queries"] > 8 * 8


def test_query_count_cannot_silently_read_zero(monkeypatch):
    from attnquery.errors import AttnQueryError
    from attnquery.extraction import ExtractionSpec, Method, run_extraction

    monkeypatch.setitem(METHODS, "fake", Method("tests.fixtures", "NoQueryLearner", "value", ""))
    with pytest.raises(AttnQueryError, match="counted 0 queries"):
        run_extraction(ExtractionSpec("fake", SOME_HEAD, 16))
    with pytest.raises(AttnQueryError, match="reports 5 queries but the oracle counted 1"):
        run_extraction(ExtractionSpec("fake", SOME_HEAD, 16, params={"n_queries_": 5}))


def test_progress_oracle_delegates_and_counts():
    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    inner = ValueOracle(SOME_HEAD, 16, budget=10)
    o = ProgressOracle(inner, bar)
    o(np.zeros((3, 2, 16)))
    assert (bar.n, o.n_queries, o.remaining, o.d, o.kind) == (3, 3, 7, 16, "value")


def test_info(capsys, repo, monkeypatch):
    monkeypatch.chdir(repo)
    info = run_json(["info"], capsys)
    assert info["versions"]["numpy"] == np.__version__
    assert info["methods"]["exact"]["available"] is True
    assert "exact" in info["experiments"] and info["experiments"]["exact"]["cells"] > 0
    assert set(info["methods"]) == set(METHODS)
    assert main(["info"]) == 0
    assert "methods:" in capsys.readouterr().out


def test_every_command_has_help(capsys):
    for cmd in ([], ["extract"], ["heads"], ["validate"], ["info"], ["bench"],
                ["check-reproducible"]):
        with pytest.raises(SystemExit) as exc:
            main([*cmd, "--help"])
        assert exc.value.code == 0
        assert "usage: attnquery" in capsys.readouterr().out


def test_console_script_runs_from_the_repo_root(repo):
    exe = os.path.join(os.path.dirname(sys.executable), "attnquery")
    out = subprocess.run([exe, "extract", "--oracle", "tests.fixtures:some_head", "--d", "16",
                          "--method", "exact", "--json"], cwd=repo, capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout)["n_queries"] == 280


def test_bench_subcommand_runs_the_named_benchmarks(capsys, monkeypatch):
    from attnquery.study import bench

    ran = []
    monkeypatch.setitem(bench.BENCHMARKS, "tiny", lambda: ran.append("tiny") or [{"d": 4}])
    monkeypatch.setitem(bench.BENCHMARKS, "other", lambda: ran.append("other") or [])
    assert main(["bench", "tiny"]) == 0
    assert ran == ["tiny"] and "### tiny" in capsys.readouterr().out
    assert main(["bench", "tiny", "nonesuch"]) == 2  # refused before anything runs
    err = capsys.readouterr().err
    assert ran == ["tiny"] and "unknown benchmark 'nonesuch'" in err
    assert err.startswith("attnquery bench: error:") and len(err.splitlines()) == 1


def test_check_reproducible_subcommand(tmp_path, capsys, monkeypatch, repo):
    import subprocess

    from attnquery.study import reproducible

    monkeypatch.chdir(repo)
    outputs = {"cores1": b"same", "cores3": b"same"}

    def fake_run(config, directory, cores, *extra, log=None):
        (directory / "results").mkdir(parents=True)
        (directory / "results" / "t.parquet").write_bytes(outputs[directory.name])

    monkeypatch.setattr(reproducible, "run_study", fake_run)
    argv = ["check-reproducible", "--config", "config/quick.yaml", "--cores", "3"]
    assert main([*argv, "--workdir", str(tmp_path / "a")]) == 0
    assert "reproducible: 1 result tables and figures are byte-identical" in \
        capsys.readouterr().out
    outputs["cores3"] = b"different"
    assert main([*argv, "--workdir", str(tmp_path / "b")]) == 1
    assert "differs: results/t.parquet" in capsys.readouterr().out

    def failing_run(config, directory, cores, *extra, log=None):
        raise subprocess.CalledProcessError(1, ["snakemake"])

    monkeypatch.setattr(reproducible, "run_study", failing_run)
    assert main([*argv, "--workdir", str(tmp_path / "c")]) == 1
    assert "the workflow failed with exit status 1" in capsys.readouterr().err
    assert main(["check-reproducible", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["check-reproducible", "--cores", "0"])
    assert exc.value.code == 2


def test_module_source_leaves_the_arguments_unchanged(bert):
    from attnquery.cli._extract_options import choose
    from attnquery.cli.app import build_parser
    from attnquery.cli.extract import _module_source

    for extra, method, rank in ((["--layer", "0"], "layer", 8),
                                (["--layer", "1", "--head", "2"], "exact", None)):
        args = build_parser().parse_args(["extract", "--module", str(bert), *extra])
        before = dict(vars(args))
        source = _module_source(args, choose(args))
        assert vars(args) == before
        assert (source.method, source.rank, source.d) == (method, rank, 32)


def test_extraction_spec_and_expected_queries():
    from attnquery import theory
    from attnquery.errors import ConfigError
    from attnquery.extraction import ExtractionSpec, expected_queries, run_extraction

    assert expected_queries("exact", 16, n_check=8) == theory.exact_queries(16) + 8 == 280
    assert expected_queries("sketch", 24, 3, n_check=8) == theory.lowrank_floor(24, 3) + 8
    assert expected_queries("sketch", 24) is None and expected_queries("nuclear", 24, 3) is None
    with pytest.raises(ConfigError, match="unknown method 'magic'"):
        ExtractionSpec("magic", SOME_HEAD, 16)
    summary, learned = run_extraction(ExtractionSpec("exact", SOME_HEAD, 16, truth=SOME_HEAD))
    assert summary["n_queries"] == 280 and rel(learned.W, SOME_HEAD.W) < 1e-10
    assert summary["rel_err_W"] < 1e-10


def test_the_library_never_imports_the_command_line():
    code = ("import sys, attnquery.extraction, attnquery.study.bench, "
            "attnquery.study.reproducible; "
            "print(sorted(m for m in sys.modules if m.startswith('attnquery.cli')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_python_dash_m_runs_the_command_line(repo):
    out = subprocess.run([sys.executable, "-m", "attnquery.cli", "extract", "--oracle",
                          "tests.fixtures:head8", "--d", "8", "--json"], cwd=repo,
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["n_queries"] == 8 * 8 + 8 + 8


def test_the_reference_names_every_subcommand_and_option(repo):
    import argparse

    from attnquery.cli import build_parser

    text = (repo / "docs" / "cli.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, parser in sub.choices.items():
        if f"attnquery {name}" not in text:
            missing.append(name)
        for action in parser._actions:
            missing += [f"{name} {o}" for o in action.option_strings
                        if o.startswith("--") and o != "--help" and f"`{o}" not in text]
    assert not missing, f"docs/cli.md does not document {missing}"
