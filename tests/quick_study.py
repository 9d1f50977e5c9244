"""The quick study (config/quick.yaml) run once per test process, for the tests that read its
results, figures or appendix (tests/test_figure_layout.py, tests/test_appendix.py).

``ATTNQUERY_STUDY_DIR`` names a folder where a study already ran (its ``results/``; for example
the default study's, to check its figures): it is read, never written. Without it the quick study
is run into a temporary folder, to the target asked for.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from attnquery.study.reproducible import REPO, run_study

QUICK = REPO / "config" / "quick.yaml"
_RUNS: dict[str, Path] = {}


def given_study() -> Path | None:
    """The folder ``ATTNQUERY_STUDY_DIR`` names (a study that ran there), or None."""
    where = os.environ.get("ATTNQUERY_STUDY_DIR")
    return Path(where).resolve() if where else None


def quick_study(target: str = "figures") -> Path:
    """A folder where the quick study ran to ``target`` (once per process and target)."""
    if target not in _RUNS:
        folder = Path(tempfile.mkdtemp(prefix="attnquery-quick-"))
        with open(folder / "snakemake.log", "w") as log:
            run_study(QUICK, folder, 2, target, log=log)
        _RUNS[target] = folder
    return _RUNS[target]
