"""Helpers of the workflow tests: fresh clones of the repository, commands run as a user types
them, and the jobs a Snakemake dry run plans."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: the test environment's own executables (python, snakemake, pip), as an activated venv has them
TEST_BIN = Path(sys.executable).parent


#: author, committer and date of the temporary commit that holds uncommitted changes: fixed, so
#: the same working tree always gives the same commit (results record it, and tests compare the
#: results of two clones byte for byte)
_SNAPSHOT_ENV = {"GIT_AUTHOR_NAME": "attnquery tests", "GIT_AUTHOR_EMAIL": "tests@attnquery",
                 "GIT_COMMITTER_NAME": "attnquery tests", "GIT_COMMITTER_EMAIL": "tests@attnquery",
                 "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
                 "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000"}


def _git(*args, cwd=REPO, env=None) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                          check=True, env={**os.environ, **(env or {})}).stdout.strip()


def snapshot_commit() -> str:
    """The commit a user's clone of this working tree would check out: ``HEAD`` when the working
    tree is clean, otherwise a temporary commit (child of ``HEAD``) of every tracked file as it
    is and every untracked file git does not ignore, made through a temporary index so that the
    repository's own index, branches and working tree are left alone."""
    head = _git("rev-parse", "HEAD")
    # no optional lock on the repository's index: tests in parallel may ask at once
    if not _git("status", "--porcelain", "--untracked-files=all",
                env={"GIT_OPTIONAL_LOCKS": "0"}):
        return head
    with tempfile.TemporaryDirectory() as tmp:
        env = {**_SNAPSHOT_ENV, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git("read-tree", head, env=env)
        _git("add", "-A", ".", env=env)
        tree = _git("write-tree", env=env)
        return _git("commit-tree", tree, "-p", head, "-m",
                    "tests: the working tree as it was (uncommitted changes)", env=env)


def fresh_clone(dest: Path) -> Path:
    """A fresh clone of the repository at ``dest``, made with ``git clone``, as a user makes one.

    It checks out :func:`snapshot_commit`: the committed ``HEAD``, or, when the working tree has
    uncommitted changes or untracked files that are not ignored, a temporary commit holding them
    (published to the clone under a temporary ref of the repository, removed afterwards). So
    tracked symlinks, file modes and ignored files come out exactly as in a user's clone: nothing
    ignored comes along (no ``.venv``, ``results/``, ``data/`` or ``.snakemake/``), and a symlink
    is a symlink, dangling or not.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    commit = snapshot_commit()
    ref = f"refs/attnquery-tests/fresh-{os.getpid()}-{time.monotonic_ns()}"
    _git("update-ref", ref, commit)
    try:
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(REPO), str(dest)],
                       capture_output=True, text=True, check=True)
        _git("fetch", "--quiet", "origin", f"+{ref}:refs/remotes/origin/tested", cwd=dest)
        _git("checkout", "--quiet", "--detach", commit, cwd=dest)
    finally:
        _git("update-ref", "-d", ref)
    return dest


def user_env(venv: Path | None = None) -> dict:
    """The environment of a user's shell with ``venv`` activated (by default the test's own
    environment, which has the package and its pins installed)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "SNAKEMAKE_")) and k != "PYTHONPATH"}
    bin_dir = Path(venv) / "bin" if venv else TEST_BIN
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    return env


def shell(command: str, cwd: Path, env: dict, timeout: float = 600,
          log: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` in bash, as typed, from ``cwd``; output captured (and copied to ``log``)."""
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    proc.seconds = time.perf_counter() - t0
    if log is not None:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"$ {command}\n{proc.stdout}{proc.stderr}\n"
                     f"[exit {proc.returncode} after {proc.seconds:.1f} s]\n")
    return proc


_JOB = re.compile(r"^(?:local)?rule (\w+):\n(.*?)(?=^\S|\Z)", re.M | re.S)


def planned_jobs(output: str) -> list[tuple[str, dict]]:
    """The jobs a dry run (``snakemake -n``) printed: ``(rule, {field: value})`` each, with the
    fields ``wildcards`` (a dict) and ``resources`` (a dict) when printed."""
    jobs = []
    for m in _JOB.finditer(output):
        fields = {}
        for line in m.group(2).splitlines():
            key, sep, value = line.strip().partition(": ")
            if not sep:
                continue
            if key in ("wildcards", "resources"):
                fields[key] = dict(kv.split("=", 1) for kv in value.split(", ") if "=" in kv)
            else:
                fields[key] = value
        jobs.append((m.group(1), fields))
    return jobs
