"""Provenance recorded with every result row: versions and git commit; and the machine a run's
wall-clock numbers were measured on (:func:`machine`).

The per-cell provenance (``config_hash``, ``code_version``, ``cell_key``) is computed by
:mod:`attnquery.study`.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["provenance", "git_commit", "library_versions", "versions", "REPORTED_PACKAGES",
           "machine", "machine_text"]


def _version(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the source tree attnquery is imported from ("unknown" outside git)."""
    root = Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def library_versions() -> dict[str, str]:
    """Versions of the libraries that results depend on."""
    return {
        "package_version": _version("attnquery"),
        "python_version": platform.python_version(),
        "numpy_version": _version("numpy"),
        "scipy_version": _version("scipy"),
        "cvxpy_version": _version("cvxpy"),
    }


#: libraries ``attnquery info`` reports beside attnquery and Python
REPORTED_PACKAGES = ("numpy", "scipy", "cvxpy", "pyarrow", "pandas", "safetensors", "snakemake",
                     "matplotlib")


def versions(packages=REPORTED_PACKAGES) -> dict[str, str]:
    """attnquery's, Python's and ``packages``' versions, by name ("not installed" if absent)."""
    from .._version import __version__

    return {"attnquery": __version__, "python": platform.python_version(),
            **{pkg: _version(pkg) for pkg in packages}}


def provenance() -> dict:
    """Provenance columns shared by the rows a process computes (versions, git commit)."""
    return {**library_versions(), "git_commit": git_commit()}


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine() -> dict:
    """The machine a run measures its wall-clock numbers on: ``cpu`` (model name), ``cores``
    (those this process may use), ``system`` and the ``git_commit`` of the run's code."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cores": int(cores or 1), "system": platform.system(),
            "git_commit": git_commit()}


def machine_text(m: dict | None) -> str:
    """``"AMD EPYC, 2 cores, run 43b8d8b"``: a machine of :func:`machine` for a reader
    (``"a machine not recorded"`` for None)."""
    if not m:
        return "a machine not recorded"
    run = str(m.get("git_commit") or "")
    return (f"{m.get('cpu', 'unknown CPU')}, {m.get('cores', '?')} cores"
            + (f", run {run[:7]}" if run and run != "unknown" else ""))
