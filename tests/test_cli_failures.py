"""The command line on every input it must refuse: exit status, one line naming the problem, and
never a traceback.

Exit statuses: 2 for a usage error (bad option, unknown name, missing learner parameter, an input
file that is not what it should be, an --out that cannot be written), 1 for a failure (the black
box raised or answered badly, the answers are not what the learner assumes, writing failed),
130 for an interruption.
"""

import errno
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnquery.cli import main
from attnquery.realheads import load_head, save_head
from tests.fixtures import HEAD8, SOME_HEAD

BOX = ["extract", "--oracle", "tests.fixtures:head8", "--d", "8", "--no-progress"]


@pytest.fixture
def files(tmp_path):
    """Broken input files and an unwritable place."""
    good = tmp_path / "good.npz"
    save_head(good, HEAD8)
    data = good.read_bytes()
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.npz").write_text("v = [1, 2, 3]\n")
    np.save(tmp_path / "single.npy", np.ones(3))
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "bad.yaml").write_text("experiments: [\n  exact: {d: [2, 4]\n")
    res = tmp_path / "results"
    res.mkdir()
    pq.write_table(pa.table({"status": ["ok"]}), res / "exact.parquet")
    pq.write_table(pa.table({"wall_time_s": [1.0]}), res / "exact.timing.parquet")
    return tmp_path


# (arguments, exit status, what the one line must say); {tmp} is the files fixture's folder
CASES = [
    # the answers are not what the learner assumes
    (["extract", "--oracle", "tests.fixtures:two_heads_box", "--d", "8"], 1,
     "differ from a single attention head"),
    (BOX + ["--method", "sketch", "--rank", "1"], 1, "differ from a single head of rank 1"),
    (["extract", "--oracle", "tests.fixtures:noisy_head8", "--d", "8"], 1,
     "ModelMismatchError"),
    (BOX + ["--method", "nuclear", "--rank", "1", "--param", "n_measurements=20"], 1,
     "raise n_measurements"),
    (["extract", "--oracle", "tests.fixtures:noisy_head8", "--d", "8", "--method", "noisy",
      "--tau", "1e-9", "--param", "W_bound=4", "--param", "mu=0.01"], 1,
     "the answers may be off by more than tau = 1e-09"),
    # bad numbers, unknown names, missing learner parameters
    (BOX + ["--param", "max_logit=abc"], 2, "max_logit must be a number in [1, 30]; got 'abc'"),
    (BOX + ["--param", "verify=2.5"], 2, "verify must be an integer in [0, "),
    (BOX + ["--param", "colour=red"], 2, "takes no parameter 'colour'"),
    (BOX + ["--param", "max_logit"], 2, "--param must be KEY=VALUE"),
    (BOX + ["--method", "noisy", "--tau", "1e-6"], 2,
     "needs 'W_bound', 'mu': give --param W_bound=VALUE --param mu=VALUE"),
    (BOX + ["--method", "noisy"], 2, "needs --tau"),
    (BOX + ["--tau", "-1"], 2, "argument --tau: must be a positive number"),
    (BOX + ["--probes", "sobol"], 2, "probes must be one of"),
    (BOX + ["--method", "magic"], 2, "argument --method: invalid choice: 'magic'"),
    (BOX + ["--noise", "pink"], 2, "argument --noise: invalid choice: 'pink'"),
    (["extract", "--oracle", "tests.fixtures:head8", "--d", "0"], 2,
     "argument --d: must be >= 1; got 0"),
    (["extract", "--oracle", "tests.fixtures:head8", "--d", "eight"], 2,
     "argument --d: expected an integer, got 'eight'"),
    (BOX + ["--budget", "-5"], 2, "argument --budget: must be >= 0"),
    (BOX + ["--seed", "-1"], 2, "argument --seed: must be >= 0"),
    (["extract", "--oracle", "tests.fixtures:head8"], 2, "--d is required"),
    (["extract", "--oracle", "tests.fixtures:missing", "--d", "8"], 2,
     "has no attribute 'missing'"),
    # input files that are not head files
    (["extract", "--model", "{tmp}/empty.npz"], 2, "is not a head file"),
    (["extract", "--model", "{tmp}/truncated.npz"], 2, "is not a head file"),
    (["extract", "--model", "{tmp}/text.npz"], 2, "is not a head file"),
    (["extract", "--model", "{tmp}/single.npy"], 2, "holds a single array"),
    (["extract", "--model", "{tmp}/no_such_file.npz"], 2, "does not exist"),
    (["extract", "--model", "{tmp}"], 2, "is a folder"),
    # --out that cannot be written: refused before any query
    (BOX + ["--out", "{tmp}"], 2, "cannot write there ("),
    (BOX + ["--out", "{tmp}/a_file/head.npz"], 2, "is not a folder"),
    # the black box misbehaves
    (["extract", "--oracle", "tests.fixtures:complex_head8", "--d", "8"], 1,
     "complex answers"),
    (["extract", "--oracle", "tests.fixtures:exiting_head", "--d", "8"], 1,
     "the black box raised SystemExit(3)"),
    (["extract", "--oracle", "tests.fixtures:interrupted_head", "--d", "8"], 130,
     "interrupted (KeyboardInterrupt)"),
    (["extract", "--oracle", "tests.fixtures:failing_head", "--d", "8"], 1,
     "the black box raised RuntimeError"),
    # validate and info
    (["validate", "{tmp}/results", "--config", "config/quick.yaml"], 1, "missing columns"),
    (["validate", "{tmp}/results", "--config", "{tmp}/bad.yaml"], 2, "is not valid YAML"),
    (["info", "--config", "{tmp}/bad.yaml"], 2, "is not valid YAML"),
    (["info", "--config", "{tmp}"], 2, "cannot be read"),
    (["validate", "{tmp}/results", "--config", "{tmp}/none.yaml"], 2, "does not exist"),
    (["heads", "{tmp}/empty.npz", "--layer", "0", "--head", "0", "--out", "{tmp}"], 2,
     "cannot write there"),
    (["heads", "{tmp}/empty.npz", "--layer", "-1", "--head", "0", "--out", "{tmp}/h.npz"], 2,
     "argument --layer: must be >= 0"),
]


@pytest.mark.parametrize("argv, status, message", CASES,
                         ids=[" ".join(c[0][:4]) + f" {c[0][-1]}" for c in CASES])
def test_failure_is_one_line_with_its_exit_status(argv, status, message, files, capsys,
                                                  monkeypatch, repo):
    monkeypatch.chdir(repo)
    argv = [a.replace("{tmp}", str(files)) for a in argv]
    try:
        got = main(argv)
    except SystemExit as exc:  # argparse's usage errors exit
        got = exc.code
    out = capsys.readouterr()
    assert got == status, out.err
    assert "Traceback" not in out.err + out.out
    if argv[0] == "validate" and status == 1:  # the problems found, one per line, on stdout
        assert message in out.out and out.out.splitlines()[0].endswith("problem(s):")
        return
    assert message in out.err
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"attnquery {argv[0]}"), out.err


def test_out_is_checked_before_any_query(files, capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    calls = []
    monkeypatch.setattr("tests.fixtures.HEAD8", _Counting(HEAD8, calls))
    assert main(BOX + ["--out", str(files / "a_file" / "x.npz")]) == 2
    assert calls == [] and "cannot write there" in capsys.readouterr().err
    # a read-only file system (simulated: root can write anywhere else)
    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(files))

    monkeypatch.setattr("attnquery.results.tempfile.mkstemp", read_only)
    assert main(BOX + ["--out", str(files / "head.npz")]) == 2
    err = capsys.readouterr().err
    assert "cannot write there (read-only file system" in err and calls == []


class _Counting:
    def __init__(self, head, calls):
        self.head, self.calls = head, calls

    def __call__(self, X):
        self.calls.append(X.shape[0])
        return self.head(X)


def test_a_full_disk_leaves_the_old_file_whole(files, capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    out = files / "head.npz"
    save_head(out, SOME_HEAD)
    before = out.read_bytes()

    def full_disk(fh, **arrays):
        fh.write(b"PK partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("attnquery.realheads.io.np.savez", full_disk)
    assert main(BOX + ["--out", str(out), "--force"]) == 1
    err = capsys.readouterr().err
    assert "writing the head failed (no space left on the device)" in err
    assert "Traceback" not in err
    assert out.read_bytes() == before  # untouched, and no temporary file left beside it
    assert sorted(p.name for p in files.iterdir() if p.name.startswith(".head.npz")) == []
    monkeypatch.undo()
    monkeypatch.chdir(repo)
    assert main(BOX + ["--out", str(out), "--json", "--force"]) == 0
    assert load_head(out)[0].d == 8


def _run(args, cwd):
    exe = os.path.join(os.path.dirname(sys.executable), "attnquery")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_process_never_prints_a_traceback(repo):
    for args, status, message in [
        (["extract", "--oracle", "tests.fixtures:exiting_head", "--d", "4"], 1, "SystemExit(3)"),
        (["extract", "--oracle", "tests.fixtures:two_heads_box", "--d", "8"], 1,
         "ModelMismatchError"),
        (["extract", "--oracle", "tests.fixtures:head8", "--d", "0"], 2, "--d: must be >= 1"),
    ]:
        p = _run(args, repo)
        assert p.returncode == status, p.stderr
        assert message in p.stderr and "Traceback" not in p.stderr + p.stdout


def test_a_module_of_the_user_never_shadows_the_tools_imports(tmp_path):
    (tmp_path / "tqdm.py").write_text("raise RuntimeError('the user tqdm was imported')\n")
    (tmp_path / "box.py").write_text(
        "from attnquery.models import random_head\nH = random_head(4, seed=1)\n"
        "def f(X):\n    return H(X)\n")
    p = _run(["extract", "--oracle", "box:f", "--d", "4", "--json"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["n_queries"] == 4 * 4 + 4 + 8
    # a module named like an installed one is the installed one; the message says how to
    # give the user's by path, and the path form loads the user's file
    p = _run(["extract", "--oracle", "tqdm:f", "--d", "4"], tmp_path)
    assert p.returncode == 2 and "given by path (--oracle ./tqdm.py:f)" in p.stderr
    p = _run(["extract", "--oracle", "./tqdm.py:f", "--d", "4"], tmp_path)
    assert p.returncode == 2 and "the user tqdm was imported" in p.stderr
    assert "Traceback" not in p.stderr
