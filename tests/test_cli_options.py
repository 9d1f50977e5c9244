"""``attnquery extract``: what ``--out`` may replace (never a file the black box's import read,
a file that exists only with ``--force``), options refused where they do not apply (one table),
and learners chosen by their spec (a plug-in of vector answers, a plug-in that returns a layer)."""

import importlib
import importlib.util
import shlex
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from attnquery import learners
from attnquery.cli import main
from attnquery.cli._extract_options import OPTIONS
from attnquery.realheads import load_head, write_test_checkpoint
from tests.test_cli_refusals import run

#: a user's box package, as a user writes one: ``vbox/__init__.py`` imports the helper module
#: ``vhelper.py`` beside it and loads ``weights.npz`` when it is imported; the head's W is the
#: file's. Importing it leaves a mark, so a test sees whether it ran.
VBOX = '''"""A black box of the user's: one head whose W is read from weights.npz at import."""
from pathlib import Path

import numpy as np

import vhelper

Path(__file__).parent.with_name("vbox.imported").touch()
W = np.load(Path(__file__).parent.with_name("weights.npz"))["W"]


def head(X):
    return vhelper.attend(np.asarray(X, dtype=np.float64), W)
'''

VHELPER = '''import numpy as np

V = np.linspace(-1.0, 1.0, 4)


def attend(X, W):
    s = np.einsum("bnd,bd->bn", X, X[:, -1, :] @ W.T)
    a = np.exp(s - s.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    return np.einsum("bn,bn->b", a, X @ V)
'''


@pytest.fixture
def vbox(tmp_path, monkeypatch):
    """``tmp_path`` as the current folder, holding the package ``vbox``, its helper module
    ``vhelper.py`` and ``weights.npz``; ``sys.path`` and the user's modules are put back
    afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "vbox").mkdir()
    (tmp_path / "vbox" / "__init__.py").write_text(VBOX)
    (tmp_path / "vhelper.py").write_text(VHELPER)
    W = np.random.default_rng(3).standard_normal((4, 4)) / 2
    np.savez(tmp_path / "weights.npz", W=W)
    importlib.invalidate_caches()
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


BOX = ["extract", "--oracle", "vbox:head", "--d", "4", "--no-progress"]


def _bytes(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("target", ["vhelper.py", "weights.npz"])
def test_out_never_replaces_what_the_box_imports_or_loads(vbox, capsys, target, force):
    before = _bytes(vbox)
    status, line = run([*BOX, "--out", target, *force], capsys)
    assert status == 2, line
    after = _bytes(vbox)
    after.pop("vbox.imported", None)  # the box's own mark, when it was imported
    assert after == before  # every file's bytes as they were
    if force:  # found while the box was imported: before any query, even with --force
        assert f"--out {target} is {vbox.resolve() / target}, which --oracle vbox:head read" \
            in line and line.endswith("even with --force: give another file name")
    else:  # refused as a file that exists, before the box ran
        assert line.endswith(f"--out {target} already exists; refusing to replace it: give "
                             "another file name, or --force to replace it")
        assert not (vbox / "vbox.imported").exists()


def test_out_never_replaces_a_cached_module_nor_a_file_the_box_wrote(vbox, capsys):
    # the box's import writes vbox.imported; Python reads vhelper's bytecode where it caches it
    assert main([*BOX, "--out", "unrelated.npz", "--json"]) == 0
    capsys.readouterr()
    # where Python caches vhelper's bytecode (the next import reads it), written or not
    cached = Path(importlib.util.cache_from_source(str(vbox / "vhelper.py")))
    mark = vbox / "vbox.imported"
    for target in (cached, mark):
        before = target.read_bytes() if target.exists() else None
        for name in ("vbox", "vhelper"):  # imported again, as by a new command
            sys.modules.pop(name, None)
        mark.unlink()  # so that the box's import creates it (Path.touch opens a new file)
        status, line = run([*BOX, "--out", str(target), "--force"], capsys)
        assert status == 2 and "read or wrote when it was imported" in line, line
        assert (target.read_bytes() if target.exists() else None) == before
        assert mark.read_bytes() == b""  # the box's mark, never the learned head


def test_force_replaces_an_unrelated_file(vbox, capsys):
    out = vbox / "old.npz"
    out.write_bytes(b"an older result")
    status, line = run([*BOX, "--out", str(out)], capsys)
    assert status == 2 and "already exists" in line
    assert out.read_bytes() == b"an older result"
    assert main([*BOX, "--out", str(out), "--force", "--json"]) == 0
    capsys.readouterr()
    head, _ = load_head(out)
    W = np.load(vbox / "weights.npz")["W"]
    assert np.linalg.norm(head.W - W) <= 1e-8 * np.linalg.norm(W)
    status, line = run(["extract", "--oracle", "vbox:head", "--d", "4", "--force"], capsys)
    assert status == 2 and line.endswith("--force: only with --out (a file that exists) (this "
                                         "run: --oracle --method exact: value oracle, returns "
                                         "a head)")


# -- options that do not apply -----------------------------------------------------------------

@pytest.fixture
def ckpt(tmp_path_factory):
    return write_test_checkpoint(tmp_path_factory.mktemp("ck") / "model.safetensors",
                                 n_layers=1, n_heads=2, d=8, seed=3)


ORACLE = ["--oracle", "mybox.py:box", "--d", "4"]

#: for each option of the table, runs where it does not apply, and what the refusal says it
#: applies to
NOT_APPLYING = {
    "tau": [(ORACLE + ["--tau", "0.1"], "a learner that asks an approximate value oracle "
             "(noisy)"),
            (ORACLE + ["--answers", "all", "--tau", "0.1"], "approximate value oracle")],
    "noise": [(ORACLE + ["--method", "noisy", "--tau", "0.1", "--noise", "uniform"],
               "--model HEAD.npz and a learner that asks an approximate value oracle"),
              (ORACLE + ["--noise", "adversarial"], "--model HEAD.npz")],
    "rank": [(ORACLE + ["--rank", "2"], "a learner with a rank parameter (sketch or nuclear"),
             ("MODULE --answers all --rank 2", "not with --module and --answers")],
    "eps": [(ORACLE + ["--eps", "0.1"], "a learner with an eps parameter (membership)")],
    "probes": [(ORACLE + ["--method", "sketch", "--probes", "gaussian"],
                "a learner with a probes parameter (exact)")],
    "layer": [(ORACLE + ["--layer", "0"],
               "--module or --checkpoint (a checkpoint's attention module)")],
    "head": [(ORACLE + ["--head", "0"], "--module (a checkpoint's attention module)")],
    "box": [(ORACLE + ["--box", "half"], "--checkpoint (a GGUF file's layer)"),
            ("--module --box module", "--checkpoint (a GGUF file's layer)")],
    "no_biases": [(ORACLE + ["--no-biases"], "--module (a checkpoint's attention module)")],
    "n_heads": [(ORACLE + ["--n-heads", "2"], "--module, or --oracle with a learner that has "
                 "an n_heads parameter (layer or vector")],
    "readout": [(ORACLE + ["--readout", "ones"], "--module without --answers"),
                (ORACLE + ["--answers", "all", "--readout", "ones"], "--module without"),
                ("MODULE --answers all --readout 3", "--module without --answers")],
    "readout_seed": [(ORACLE + ["--readout-seed", "1"], "--module without --answers"),
                     ("MODULE --answers last --readout-seed 1", "--module without --answers"),
                     ("MODULE --readout ones --readout-seed 0", "and --readout gaussian, the "
                      "default: the seed of its random r")],
    "force": [(ORACLE + ["--force"], "--out (a file that exists)")],
}


def test_every_option_of_the_table_has_cases():
    assert set(NOT_APPLYING) == {o.dest for o in OPTIONS}


@pytest.mark.parametrize("dest, argv, applies_to", [
    (dest, argv, to) for dest, cases in NOT_APPLYING.items() for argv, to in cases])
def test_an_option_that_does_not_apply_is_refused_before_anything_runs(
        dest, argv, applies_to, ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mybox.py").write_text("from pathlib import Path\nPath('ran').touch()\n"
                                       "def box(X):\n    return X.sum(axis=(1, 2))\n")
    if isinstance(argv, str):
        argv = ["--module", str(ckpt), "--layer", "0", *argv.split()[1:]]
    flag = next(o.flag for o in OPTIONS if o.dest == dest)
    status, line = run(["extract", *argv], capsys)
    assert status == 2, line
    assert f"{flag}: only with " in line or f", {flag}: only with " in line, line
    assert applies_to in line and "(this run: --" in line, line
    assert not (tmp_path / "ran").exists()  # refused before the box was imported


@pytest.mark.parametrize("argv", [
    ORACLE + ["--method", "noisy", "--tau", "0.1"],
    ["--model", "head.npz", "--method", "noisy", "--tau", "0.1", "--noise", "uniform"],
    ORACLE + ["--method", "sketch", "--rank", "2"],
    ORACLE + ["--method", "membership", "--eps", "0.1"],
    ORACLE + ["--probes", "gaussian"],
    ORACLE + ["--method", "layer", "--n-heads", "2"],
    ORACLE + ["--answers", "all", "--n-heads", "2"],
    ORACLE + ["--out", "x.npz", "--force"],
    ["--module", "m.safetensors", "--layer", "0", "--head", "0", "--no-biases", "--readout",
     "ones", "--n-heads", "2", "--method", "sketch", "--rank", "2"],
    ["--module", "m.safetensors", "--layer", "0", "--readout", "gaussian", "--readout-seed",
     "3"],
    ["--module", "m.safetensors", "--layer", "0", "--answers", "all", "--n-heads", "2"],
])
def test_options_that_apply_are_taken(argv):
    from attnquery.cli._extract_options import check_options, choose
    from attnquery.cli.app import build_parser

    args = build_parser().parse_args(["extract", *argv])
    check_options(args, choose(args))  # no error


# -- learners chosen by their spec --------------------------------------------------------------

class _VectorPlugin(learners.VectorLayerLearner):
    """A plug-in of vector answers (the vector learner's spec, inherited)."""


class _LayerPlugin(learners.AttentionLayerLearner):
    """A plug-in that returns a layer (the layer learner's spec, inherited)."""


@pytest.fixture
def plugins(monkeypatch, entry_points):
    mod = types.ModuleType("attnquery_cli_test_plugins")
    mod.VectorPlugin, mod.LayerPlugin = _VectorPlugin, _LayerPlugin
    monkeypatch.setitem(sys.modules, "attnquery_cli_test_plugins", mod)
    entry_points(myvector="attnquery_cli_test_plugins:VectorPlugin",
                 mylayer="attnquery_cli_test_plugins:LayerPlugin")


VECTOR_BOX = '''
from attnquery.models.vector import random_vector_layer

ONE = random_vector_layer(6, 1, 0, bias=0.3)


def every(X):
    return ONE(X)
'''


def test_a_plugin_of_vector_answers_reaches_answers(plugins, tmp_path, capsys):
    box = tmp_path / "vbox_plugin.py"
    box.write_text(VECTOR_BOX)
    argv = ["extract", "--oracle", f"{box}:every", "--d", "6", "--no-progress"]
    assert main([*argv, "--answers", "all", "--method", "myvector"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("extracted a layer of 1 head(s) of dimension d = 6 (d_out = 6)")
    assert "with --method myvector, answers: every token's output" in out
    # and with its options: --n-heads (it has n_heads), not --rank
    status, line = run([*argv, "--answers", "all", "--method", "myvector", "--rank", "2"],
                       capsys)
    assert status == 2 and "--rank: only with a learner with a rank parameter" in line
    status, line = run([*argv, "--method", "myvector"], capsys)
    assert status == 2 and "--method myvector needs --answers all|last" in line
    status, line = run([*argv, "--answers", "last", "--method", "mylayer"], capsys)
    assert status == 2 and "learnt by --method vector (a learner of vector answers), not " \
        "--method mylayer, which asks a value oracle" in line


def test_a_plugin_that_returns_a_layer_gets_a_modules_whole_layer(plugins, ckpt, tmp_path,
                                                                   capsys):
    out = tmp_path / "layer.npz"
    argv = ["extract", "--module", str(ckpt), "--layer", "0", "--no-progress"]
    assert main([*argv, "--method", "mylayer", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "extracted a layer of 2 heads of rank 4" in text and "--method mylayer" in text
    worst = float(text.split("rel. error W   ")[1].split()[0])
    assert worst < 1e-6
    assert out.exists()
    status, line = run([*argv, "--method", "mylayer", "--head", "0"], capsys)
    assert status == 2 and "--method mylayer learns a whole layer: leave out --head" in line


# -- the documented vector example -------------------------------------------------------------

def test_the_documented_vector_example_runs_on_the_shipped_box(repo, tmp_path, capsys,
                                                               monkeypatch):
    text = (repo / "docs" / "cli.md").read_text(encoding="utf-8")
    block = text.split("$ attnquery extract --oracle examples/vector_layer.py:layer")[1]
    command, *expected = block.split("```")[0].strip().splitlines()
    argv = shlex.split("--oracle examples/vector_layer.py:layer " + command)
    assert argv[-2:] == ["--out", "v.npz"]
    monkeypatch.chdir(repo)
    argv[-1] = str(tmp_path / "v.npz")
    assert main(["extract", *argv, "--no-progress"]) == 0
    got = capsys.readouterr().out.splitlines()
    assert len(got) == len(expected)
    for line, want in zip(got, expected, strict=True):
        if line.lstrip().startswith(("time", "check")):  # the clock; the check's rounding
            assert line.split()[0] == want.split()[0]
        else:
            assert line == want.replace("v.npz", argv[-1])
    assert Path(argv[-1]).exists()


# -- a budget below the plan ---------------------------------------------------------------------

@pytest.mark.parametrize("argv, need", [(["--budget", "271"], "271 is below the 272 queries "
                                         "--method exact asks at d = 16 before its check"),
                                        (["--method", "sketch", "--rank", "2", "--budget", "75"],
                                         "75 is below the 76 queries --method sketch asks at "
                                         "d = 16, rank 2")])
def test_a_budget_below_the_plan_is_refused_before_the_box_is_imported(argv, need, tmp_path,
                                                                       capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mybox.py").write_text("from pathlib import Path\nPath('ran').touch()\n"
                                       "def box(X):\n    return X.sum(axis=(1, 2))\n")
    status, line = run(["extract", "--oracle", "mybox.py:box", "--d", "16", *argv], capsys)
    assert status == 1 and need in line and "no query was asked" in line, line
    assert line.endswith("(BudgetExceededError)")
    assert not (tmp_path / "ran").exists()
