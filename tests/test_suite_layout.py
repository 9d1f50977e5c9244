"""The suite as a laptop runs it: `make test` leaves the end-to-end checks (marker e2e) and the
long ones (marker slow) to `make test-e2e`, which CI runs too, and the README names both."""

from __future__ import annotations

import re

from .fresh import REPO


def _recipe(target: str) -> str:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    m = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", text, re.M)
    assert m, f"the Makefile has no target {target}"
    return m.group(1)


def test_make_test_leaves_out_the_end_to_end_checks_and_make_test_e2e_runs_them():
    assert 'pytest' in _recipe("test") and '-m "not e2e and not slow"' in _recipe("test")
    assert re.search(r'pytest .*-m "e2e or slow"', _recipe("test-e2e"))
    markers = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"e2e: ' in markers and '"slow: ' in markers  # declared in pyproject.toml


def test_ci_runs_both_and_the_readme_names_both():
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
    assert ci.index("make test") < ci.index("make test-e2e")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "make test-e2e" in readme and "`e2e`" in readme


def test_the_fresh_clone_study_checks_are_end_to_end():
    pipeline = (REPO / "tests" / "test_pipeline.py").read_text(encoding="utf-8")
    assert re.search(r"^pytestmark = \[.*pytest\.mark\.e2e.*\]", pipeline, re.M)
    plugin = (REPO / "tests" / "test_plugin.py").read_text(encoding="utf-8")
    assert re.search(r"@pytest\.mark\.e2e[^\n]*\ndef test_a_study_config_lists_the_plugin",
                     plugin)
