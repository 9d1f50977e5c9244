"""The README's examples are true when run: every console block's command is run and every line
the README shows is compared with what it printed; the library example runs as a doctest; the
Makefile's default is every core of the machine."""

from __future__ import annotations

import doctest
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")

#: numbers (with their sign, decimals and exponent; thousands separators kept)
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")
#: labels of output lines whose numbers depend on the machine: the wall clock (any value), and
#: the check's disagreement (rounding errors: the same order of magnitude)
WALL_CLOCK = ("time",)
ROUNDING = ("check",)


def console_blocks(text: str = README) -> list[tuple[str, list[str]]]:
    """``(command, lines shown)`` of every console block: the ``$`` line and the lines after it."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        lines = block.rstrip("\n").splitlines()
        assert lines[0].startswith("$ "), lines[0]
        out.append((lines[0][2:], lines[1:]))
    return out


def _float(token: str) -> float:
    return float(token.replace(",", ""))


def same_line(shown: str, printed: str) -> str | None:
    """Why ``printed`` is not the line the README ``shown`` (None when it is): the same text
    between numbers, integers equal, decimals equal at the README's printed precision (on the
    machine-dependent lines, see WALL_CLOCK and ROUNDING, less)."""
    label = shown.split()[0] if shown.split() else ""
    if NUMBER.sub("#", shown).split() != NUMBER.sub("#", printed).split():
        return "the words differ"
    for a, b in zip(NUMBER.findall(shown), NUMBER.findall(printed), strict=True):
        if label in WALL_CLOCK:
            continue
        x, y = _float(a), _float(b)
        if label in ROUNDING and ("e" in a.lower() or "." in a):
            if not (x > 0 and y > 0 and abs(math.log10(y / x)) <= 1):
                return f"{b} is not of the order of {a}"
            continue
        decimals = len(re.split("[eE]", a)[0].partition(".")[2])
        if "e" in a.lower():
            if f"{y:.{decimals}e}" != f"{x:.{decimals}e}":
                return f"{b} does not print as {a}"
        elif round(y, decimals) != round(x, decimals):
            return f"{b} does not print as {a}"
    return None


def test_the_line_comparison_fails_on_a_wrong_line():
    shown = "  queries        280 (counted by the oracle, 11 batches: 272 to learn)"
    assert same_line(shown, shown) is None
    assert same_line(shown, shown.replace("11", "5")) == "5 does not print as 11"
    assert same_line(shown, shown.replace("learn", "check")) == "the words differ"
    check = "  check          answers and the result agree to 8.7e-15 (relative) on 8 queries"
    assert same_line(check, check.replace("8.7e-15", "3.8e-15")) is None  # rounding
    assert same_line(check, check.replace("8.7e-15", "3.8e-12")) is not None
    assert same_line(check, check.replace("on 8", "on 9")) is not None
    assert same_line("  time           0.02 s", "  time           1.50 s") is None
    assert same_line("  ||W||_F        4.24487", "  ||W||_F        4.24488") is not None


def test_the_readme_has_its_examples():
    commands = [c for c, _ in console_blocks()]
    assert any(c.startswith("attnquery extract") for c in commands), commands


@pytest.mark.parametrize("command,shown", console_blocks(),
                         ids=[c.split(" --")[0] for c, _ in console_blocks()])
def test_every_console_example_prints_the_lines_the_readme_shows(command, shown, tmp_path):
    assert command.startswith("attnquery "), command
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "attnquery.cli", *command.split()[1:]]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.rstrip("\n").splitlines()
    assert len(printed) == len(shown), (shown, printed)
    wrong = {s: (p, why) for s, p in zip(shown, printed, strict=True)
             if (why := same_line(s, p)) is not None}
    assert not wrong, wrong


def test_the_library_example_returns_what_the_readme_shows():
    part = README.split("\n## Library\n", 1)[1]
    block = re.search(r"```python\n(.*?)```", part, re.S).group(1)
    test = doctest.DocTestParser().get_doctest(block, {}, "README Library", "README.md", 0)
    assert len(test.examples) >= 7
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    out = []
    result = runner.run(test, out=out.append)
    assert result.failed == 0, "".join(out)


def _make_n(*args) -> str:
    return subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True,
                          check=True, timeout=60).stdout


def test_make_uses_every_core_unless_cores_is_given():
    assert "snakemake --cores all --configfile config/config.yaml --report report.html" in \
        _make_n("reproduce")
    assert "snakemake --cores 3 --configfile" in _make_n("reproduce", "CORES=3")
    # the reproducibility check's second run takes every core by default (os.cpu_count)
    check = [line for line in _make_n("check-reproducible").splitlines()
             if "attnquery.study.reproducible" in line]
    assert check and "--cores" not in check[0]
    assert "--cores 3" in _make_n("check-reproducible", "CORES=3")
    # the README's commands say so
    assert "snakemake --cores all  " in README and "--cores 8" not in README
