"""Helpers of the workflow tests: fresh clones of the repository, commands run as a user types
them, and the jobs a Snakemake dry run plans."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: the test environment's own executables (python, snakemake, pip), as an activated venv has them
TEST_BIN = Path(sys.executable).parent


def fresh_clone(dest: Path) -> Path:
    """A fresh clone of the repository at ``dest``: the files git tracks and the untracked ones
    it does not ignore, as they are in the working tree, with the repository's ``.git`` (so the
    results record the same commit). Nothing ignored comes along: no ``.venv``, ``results/``,
    ``data/`` or ``.snakemake/``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard",
                             "-z"], capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    shutil.copytree(REPO / ".git", dest / ".git", symlinks=True)
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
