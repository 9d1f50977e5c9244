"""Provenance recorded with every result row: versions, git commit, config hash."""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["provenance", "config_hash", "git_commit", "library_versions"]


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


def config_hash(obj) -> str:
    """A stable hash of a JSON-serialisable configuration."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def provenance(config_section) -> dict:
    """Provenance columns for rows produced under ``config_section``."""
    return {**library_versions(), "git_commit": git_commit(),
            "config_hash": config_hash(config_section)}
