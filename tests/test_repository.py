"""The repository works on any machine: no tracked path leads out of it.

A tracked symlink must be relative and resolve inside the repository (an absolute link, or one
that climbs out, dangles in every other clone), and no tracked text file may name an absolute
path of a developer's machine (a home directory, a scratch folder, a checkout's location).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .fresh import REPO

#: absolute paths that belong to one machine: home folders, a checkout's location, scratch space
MACHINE_PATH = re.compile(
    r"(?<![\w.~$}/-])/(?:work|root|home/[\w.-]+|Users/[\w.-]+|tmp|mnt|scratch)/[\w.$-]*")
#: generic paths the project names on purpose (the test cluster's state folder and scratch
#: folders, created by its scripts on whatever machine runs them)
ALLOWED = ("/tmp/attnquery-",)


def tracked(repo: Path) -> list[tuple[str, str]]:
    """``(mode, path)`` of every file git tracks in ``repo``."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-s", "-z"], capture_output=True,
                         check=True).stdout.decode()
    entries = []
    for line in filter(None, out.split("\0")):
        meta, _, path = line.partition("\t")
        entries.append((meta.split()[0], path))
    return entries


def paths_leaving(repo: Path) -> list[str]:
    """Every tracked path of ``repo`` that leads out of it, each with the reason."""
    repo = Path(repo).resolve()
    problems = []
    for mode, rel in tracked(repo):
        path = repo / rel
        if mode == "120000":
            target = os.readlink(path)
            inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
            if os.path.isabs(target):
                problems.append(f"{rel}: a symlink to the absolute path {target}")
            elif inside == ".." or inside.startswith("../"):
                problems.append(f"{rel}: a symlink to {target}, outside the repository")
            continue
        if mode == "160000" or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            for m in MACHINE_PATH.finditer(line):
                if not m.group(0).startswith(ALLOWED):
                    problems.append(f"{rel}:{n}: names the machine path {m.group(0)}")
    return problems


def test_no_tracked_path_leaves_the_repository():
    problems = paths_leaving(REPO)
    assert not problems, "\n".join(problems)


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


#: the root folder, apart, so that this file names no machine path itself
_R = "/"


@pytest.mark.parametrize("link, text, expected", [
    (f"{_R}somewhere/else/data", "", "absolute path"),
    ("../../outside", "", "outside the repository"),
    (None, f"weights are in {_R}home/alice/ckpt/model.bin\n", "home/alice/ckpt"),
    (None, f"cd {_R}work/main && make\n", "work/main"),
    (None, f"see {_R}tmp/scratch42/out\n", "tmp/scratch42"),
])
def test_the_check_finds_a_path_that_leaves(tmp_path, link, text, expected):
    _git(tmp_path, "init", "-q")
    (tmp_path / "ok.md").write_text("relative paths (data/minilm), /tmp/attnquery-slurm and "
                                    "https://example.org/home/x are fine\n")
    (tmp_path / "sub").mkdir()
    os.symlink("../ok.md", tmp_path / "sub" / "fine")
    if link is not None:
        os.symlink(link, tmp_path / "sub" / "bad")
    else:
        (tmp_path / "bad.txt").write_text(text)
    _git(tmp_path, "add", "-A")
    problems = paths_leaving(tmp_path)
    assert len(problems) == 1 and expected in problems[0], problems
