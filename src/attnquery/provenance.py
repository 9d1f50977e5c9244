"""Provenance recorded with every result row: versions and git commit.

The per-cell provenance (``config_hash``, ``code_version``, ``cell_key``) is computed by
:mod:`attnquery.study`.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["provenance", "git_commit", "library_versions", "versions", "REPORTED_PACKAGES"]


def _version(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the source tree attnquery is imported from ("unknown" outside git)."""
    root = Path(__file__).resolve().parents[2]
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
    from . import __version__

    return {"attnquery": __version__, "python": platform.python_version(),
            **{pkg: _version(pkg) for pkg in packages}}


def provenance() -> dict:
    """Provenance columns shared by the rows a process computes (versions, git commit)."""
    return {**library_versions(), "git_commit": git_commit()}
