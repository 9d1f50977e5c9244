"""``--out`` never replaces one of the command's inputs, in any form they are named (issue 30),
and the folders it needs appear only when the run writes its result."""

import errno
import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from attnquery.cli import main
from attnquery.realheads import load_head, write_test_checkpoint
from tests.test_cli_refusals import run

#: a user's black box, as a user writes one (like examples/black_boxes.py): a seeded attention
#: head on d = 4 tokens. Importing it leaves a mark, so a test sees whether it was run.
USER_BOX = '''"""A black box of the user's: one attention head on d = 4 tokens."""
from pathlib import Path

import numpy as np

Path(__file__).with_name(__name__ + ".imported").touch()
W = np.random.default_rng(4).standard_normal((4, 4)) / 2
V = np.random.default_rng(5).standard_normal(4)


def box(X):
    X = np.asarray(X, dtype=np.float64)
    s = np.einsum("bnd,bd->bn", X, X[:, -1, :] @ W.T)
    a = np.exp(s - s.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    return np.einsum("bn,bn->b", a, X @ V)
'''


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """``tmp_path`` as the current folder, holding ``mybox.py`` and the package
    ``pkg`` (``pkg/__init__.py`` and ``pkg/box.py``), each a black box; ``sys.path`` and the
    user's modules are put back afterwards (the command appends the current folder)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "pkg").mkdir()
    for name in USER_FILES:
        (tmp_path / name).write_text(USER_BOX)
    importlib.invalidate_caches()
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


USER_FILES = ("mybox.py", "pkg/__init__.py", "pkg/box.py")


def _contents(folder):
    return {name: (folder / name).read_bytes() for name in USER_FILES}


#: each form of --oracle, and a file of the user's it runs
FORMS = [("mybox:box", "mybox.py"),                 # module
         ("pkg.box:box", "pkg/box.py"),             # package
         ("pkg.box:box", "pkg/__init__.py"),        # the package's __init__, run first
         ("pkg:box", "pkg/__init__.py"),            # a package itself
         ("./mybox.py:box", "mybox.py")]            # path (refused before this issue too)


def _name_it(how, target, folder):
    """``target`` (relative to ``folder``) named as ``how`` says: itself, a link to it, a
    hard link to it, or its path through a link to its folder."""
    if how == "itself":
        return target
    if how == "symlink":
        link = folder / ("link_to_" + target.replace("/", "_"))
        if not link.is_symlink():
            link.symlink_to(folder / target)
        return link.name
    if how == "hard link":
        link = folder / ("hard_" + target.replace("/", "_"))
        if not link.exists():
            os.link(folder / target, link)
        return link.name
    alias = folder / "alias"
    if not alias.exists():
        alias.symlink_to(folder)
    return f"alias/{target}"


@pytest.mark.parametrize("how", ["itself", "symlink", "hard link", "linked folder"])
def test_out_is_never_the_file_the_oracle_runs(how, user_dir, capsys):
    before = _contents(user_dir)
    for oracle, target in FORMS:
        out = _name_it(how, target, user_dir)
        status, line = run(["extract", "--oracle", oracle, "--d", "4", "--no-progress",
                            "--out", out], capsys)
        assert status == 2 and f"--out {out} is the input" in line, (oracle, out, line)
        assert line.endswith("refusing to replace it: give another file name")
    assert _contents(user_dir) == before  # every file's bytes as they were
    assert not list(user_dir.glob("**/*.imported"))  # no user code ran, so no query either


def test_a_package_already_imported_is_found_where_it_was_imported(user_dir, capsys):
    sys.path.append(str(user_dir))  # as the command's own search path
    importlib.import_module("pkg")  # as a box imported by an earlier run in this process
    status, line = run(["extract", "--oracle", "pkg.box:box", "--d", "4", "--out",
                        "pkg/box.py"], capsys)
    assert status == 2 and "is the input" in line
    assert (user_dir / "pkg" / "box.py").read_text() == USER_BOX
    assert not (user_dir / "pkg" / "pkg.box.imported").exists()  # the module never ran


@pytest.fixture
def bare_ckpt(tmp_path):
    """A small BERT-style checkpoint with no config.json beside it (--n-heads gives it)."""
    return write_test_checkpoint(tmp_path / "m" / "model.safetensors", n_layers=1, n_heads=2,
                                 d=8, seed=3, write_config=False)


def test_out_is_never_the_checkpoint_or_the_config_beside_it(bare_ckpt, tmp_path, capsys):
    folder = bare_ckpt.parent
    (tmp_path / "alias").symlink_to(folder)
    os.link(bare_ckpt, tmp_path / "hard.safetensors")
    before = bare_ckpt.read_bytes()
    commands = (["extract", "--module", str(bare_ckpt), "--layer", "0", "--head", "0",
                 "--n-heads", "2", "--no-progress"],
                ["heads", str(bare_ckpt), "--layer", "0", "--head", "0", "--n-heads", "2"])
    # the config.json it would read, not there yet, named through a link to its folder
    for argv in commands:
        status, line = run([*argv, "--out", str(tmp_path / "alias" / "config.json")], capsys)
        assert status == 2 and "is the input" in line and "config.json" in line, line
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]
    # the checkpoint through a hard link, and the config.json once it is there, by a link
    (folder / "config.json").write_text('{"num_attention_heads": 2}')
    (tmp_path / "cfg.json").symlink_to(folder / "config.json")
    for argv in commands:
        for out in (tmp_path / "hard.safetensors", tmp_path / "cfg.json"):
            status, line = run([*argv, "--out", str(out)], capsys)
            assert status == 2 and f"--out {out} is the input" in line, line
    assert bare_ckpt.read_bytes() == before
    assert (folder / "config.json").read_text() == '{"num_attention_heads": 2}'


def _failing_write(monkeypatch):
    """The disk is full when the result is flushed (after the folders were made)."""
    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)


def test_a_failed_run_leaves_no_folder_it_created(bare_ckpt, tmp_path, capsys, monkeypatch,
                                                 repo):
    monkeypatch.chdir(repo)
    (tmp_path / "existing").mkdir()
    for out in (tmp_path / "new" / "sub" / "h.npz", tmp_path / "existing" / "sub" / "h.npz"):
        # the black box fails at its first query (exit 1)
        status, line = run(["extract", "--oracle", "tests.fixtures:failing_head", "--d", "4",
                            "--no-progress", "--out", str(out)], capsys)
        assert status == 1 and "OracleFailure" in line
        # a usage error found after --out was checked: no such layer (exit 2)
        status, line = run(["heads", str(bare_ckpt), "--layer", "7", "--head", "0",
                            "--n-heads", "2", "--out", str(out)], capsys)
        assert status == 2 and "layer" in line
    _failing_write(monkeypatch)
    for out in (tmp_path / "new" / "sub" / "h.npz", tmp_path / "existing" / "a" / "b" / "h.npz",
                tmp_path / "existing" / "h.npz"):
        status, line = run(["extract", "--oracle", "tests.fixtures:head8", "--d", "8",
                            "--no-progress", "--out", str(out)], capsys)
        assert status == 1 and "no space left on the device" in line and "OutputError" in line
        status, line = run(["heads", str(bare_ckpt), "--layer", "0", "--head", "0",
                            "--n-heads", "2", "--out", str(out)], capsys)
        assert status == 1 and "no space left on the device" in line
    # only the folders that were there before, empty as they were
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "existing", "m", "m/model.safetensors"]


def test_folders_appear_only_with_the_result(user_dir, capsys):
    out = user_dir / "new" / "a" / "b" / "head.npz"
    # refused after --out was checked (no --d): nothing created
    status, line = run(["extract", "--oracle", "mybox:box", "--no-progress", "--out",
                        str(out)], capsys)
    assert status == 2 and "--d is required" in line
    assert not (user_dir / "new").exists()
    assert main(["extract", "--oracle", "mybox:box", "--d", "4", "--no-progress", "--out",
                 str(out), "--json"]) == 0
    capsys.readouterr()
    head, _ = load_head(out)
    truth = sys.modules["mybox"]
    assert np.linalg.norm(head.W - truth.W) <= 1e-8 * np.linalg.norm(truth.W)
    assert np.linalg.norm(head.v - truth.V) <= 1e-8 * np.linalg.norm(truth.V)
    assert sorted(p.name for p in (user_dir / "new" / "a" / "b").iterdir()) == ["head.npz"]


def test_black_box_files_names_what_an_import_would_run_without_running_it(user_dir):
    from attnquery.extraction import black_box_files

    def found(spec):
        return [p.resolve() for p in black_box_files(spec)]

    pkg = user_dir.resolve() / "pkg"
    assert found("pkg.box:box") == [pkg / "__init__.py", pkg / "box.py"]
    assert found("mybox:box") == [user_dir.resolve() / "mybox.py"]
    assert black_box_files("sub/other.py:box") == [Path("sub/other.py")]  # the path, as given
    assert black_box_files("no_module_of_that_name:box") == []
    assert found("mybox.box:box") == [user_dir.resolve() / "mybox.py"]  # not a package: stops
    assert not list(user_dir.glob("**/*.imported"))
    assert "pkg" not in sys.modules and "mybox" not in sys.modules
