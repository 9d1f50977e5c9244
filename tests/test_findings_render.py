"""The findings pages as a reader sees them, rendered from the committed numbers
(docs/numbers.json) with the templates of docs/templates/: no degenerate range, short table cells
with units, and every wall-clock number naming the machine it was measured on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from attnquery.study.findings import (
    collapse_ranges,
    compare_numbers,
    load_machine,
    load_numbers,
    numbers_tex,
    render_template,
    write_numbers,
)
from attnquery.study.provenance import machine, machine_text

REPO = Path(__file__).resolve().parents[1]
NUMBERS = REPO / "docs" / "numbers.json"
TEMPLATES = REPO / "docs" / "templates"
#: the most characters a cell of the README's findings table may hold (the detail is in
#: docs/findings.md, which each row links to)
CELL_LIMIT = 360
#: a printed number
NUM = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"


def rendered(name: str, machine_=None) -> str:
    text, missing = render_template((TEMPLATES / name).read_text(encoding="utf-8"),
                                    load_numbers(NUMBERS), machine_)
    assert not missing, missing
    return text


def table_cells(text: str) -> list[str]:
    """The 'measured' cell of every row of the rendered README table."""
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    return [row.split(" | ")[1] for row in rows]


@pytest.mark.parametrize("name", ["readme_table.md", "findings.md"])
def test_no_range_collapses_to_one_value_and_no_count_of_one(name):
    text = rendered(name)
    same = re.findall(rf"(?<![\w.])({NUM})(?: \(median\))? to \1(?![\w.])", text)
    assert not same, same
    assert not re.search(r"(?<![\w.,])1 of 1\b", text)


def test_the_table_cells_are_short_with_units_and_link_their_detail():
    text = rendered("readme_table.md", machine())
    cells = table_cells(text)
    assert len(cells) >= 14
    long = {c[:60]: len(c) for c in cells if len(c) > CELL_LIMIT}
    assert not long, long
    # a bound on queries says in what unit ("at <= 10" alone says nothing)
    bare = re.findall(r"at <= [\d.]+(?![\d.])(?! \(d\^2| times| queries)", text)
    assert not bare, bare
    # the cells cut short link to the sections with the detail
    for section in ("served-heads", "rotary-heads-and-grouped-query-layers", "vector-answers"):
        assert f"[details](docs/findings.md#{section})" in text
    findings = (REPO / "docs" / "templates" / "findings.md").read_text(encoding="utf-8")
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^## (.+)$", findings, re.M)}
    for link in re.findall(r"docs/findings\.md#([\w-]+)", text):
        assert link in anchors, link


@pytest.mark.parametrize("name", ["readme_table.md", "findings.md"])
def test_every_wall_clock_number_names_its_machine(name):
    """Each paragraph (or table row) of a template that shows a wall-clock number names the
    machine, and renders the one docs/numbers.json records."""
    numbers = load_numbers(NUMBERS)
    timed = {k for k, v in numbers.items() if v.get("timing")}
    assert timed
    text = (TEMPLATES / name).read_text(encoding="utf-8")
    for block in re.split(r"\n\s*\n|\n(?=\| )", text):
        used = set(re.findall(r"\{\{\s*(\w+)", block)) & timed
        if used:
            assert "{{machine}}" in block, (used, block[:200])
    here = {"cpu": "Test CPU 9000", "cores": 3, "git_commit": "0123456789abcdef"}
    assert "Test CPU 9000, 3 cores, run 0123456" in rendered(name, here)


def test_collapse_ranges():
    assert collapse_ranges("v by bisection 7.7e+05 to 7.7e+05 times cheaper") == \
        "v by bisection 7.7e+05 times cheaper"
    assert collapse_ranges("c_50 from 1.25 to 1.25") == "c_50 1.25"
    assert collapse_ranges("W 5.76e-08 (median) to 5.76e-08;") == "W 5.76e-08;"
    assert collapse_ranges("from 1.25 to 2.83, 1 to 4,096 tokens, 1.5 to 1.55") == \
        "from 1.25 to 2.83, 1 to 4,096 tokens, 1.5 to 1.55"
    assert collapse_ranges("1 of 1 heads within; 12 of 12 layers; 3 of 4 runs; 25 of 25 as") == \
        "the one head within; all 12 layers; 3 of 4 runs; 25 of 25 as"


def _entry(value, text, timing=False, unit="s"):
    return {"value": value, "lo": None, "hi": None, "text": text, "interval": None,
            "unit": unit, "timing": timing, "fmt": ".2g"}


def test_the_verdict_lists_wall_clock_numbers_apart_with_their_machines():
    committed = {"reallayerWallTimeMedian": _entry(5.5, "6", timing=True),
                 "exactWorstError": _entry(1.8e-11, "1.8e-11", unit="relative error")}
    new = {"reallayerWallTimeMedian": _entry(108.0, "108", timing=True),
           "exactWorstError": _entry(1.8e-11, "1.8e-11", unit="relative error")}
    there = {"cpu": "AMD EPYC", "cores": 2, "git_commit": "43b8d8b000"}
    here = {"cpu": "Intel Xeon", "cores": 16, "git_commit": "abcdef0000"}
    ok, report = compare_numbers(committed, new, (there, here))
    assert ok
    assert "measured on AMD EPYC, 2 cores, run 43b8d8b; here on Intel Xeon, 16 cores" in report
    assert "reallayerWallTimeMedian: measured on another machine: 6 s; here: 108 s" in report
    _, same = compare_numbers(committed, new, (there, {**there, "git_commit": "x"}))
    assert "measured on this machine's kind: 6 s; here: 108 s" in same
    _, unknown = compare_numbers(committed, new)
    assert "measured on a machine not recorded" in unknown


def test_a_run_records_its_machine_in_numbers_json_and_tex(tmp_path):
    rec = {"figure": "f", "tables": [], "claims": [{"name": "c", "verdict": "supported",
                                                    "numbers": [{"name": "fWall", **_entry(
                                                        2.0, "2", timing=True)}]}]}
    (tmp_path / "f.json").write_text(json.dumps(rec))
    write_numbers([tmp_path / "f.json"], tmp_path / "numbers.json", tmp_path / "numbers.tex")
    m = load_machine(tmp_path / "numbers.json")
    assert m == machine() and m["cores"] >= 1 and m["cpu"]
    tex = (tmp_path / "numbers.tex").read_text()
    assert "\\newcommand{\\findingsMachine}{" + machine_text(m) in tex.replace("\\_", "_")
    assert "\\findingsMachine" in numbers_tex({}, None)
    assert machine_text(None) == "a machine not recorded"
