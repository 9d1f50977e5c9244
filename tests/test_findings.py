"""The findings' numbers: collected from the claims, written as JSON and LaTeX macros, rendered
into templates, compared exactly with the committed ones and published."""

from __future__ import annotations

import json
import re

import pytest

from attnquery.claims import Claim, Number, fit_number, number_name
from attnquery.findings import (
    README_BEGIN,
    README_END,
    collect_numbers,
    compare_numbers,
    figure_record,
    macro_name,
    main,
    numbers_tex,
    publish,
    render_template,
)
from attnquery.metrics import fit_power_law


def _claims():
    fit = fit_power_law([16, 32, 64, 128], [272, 1056, 4160, 16512])
    return [
        Claim("a", "queries grow as d^2", True, f"exponent {fit}",
              numbers=(fit_number("exactQueryExponent", fit, "exact, d >= 16"),
                       Number("exactRuns", 4, "runs", "d"))),
        Claim("b", "errors are small", True, "worst 1.2e-13",
              numbers=(Number("worstFloat16", 1.234e-13, "relative error", ".2g"),
                       Number("layerSeconds", 7.53, "s", ".1f", timing=True))),
    ]


def _numbers():
    return collect_numbers([figure_record("fig", _claims(), ["results/exact.parquet"])])


def test_numbers_carry_value_interval_unit_rows_and_origin():
    n = _numbers()
    assert list(n) == sorted(n)
    e = n["exactQueryExponent"]
    assert e["text"] == f"{e['value']:.3f}" and e["interval"] == f"[{e['lo']:.3f}, {e['hi']:.3f}]"
    assert e["lo"] < e["value"] < e["hi"] and 1.9 < e["value"] < 2.0
    assert e["figure"] == "fig" and e["claim"] == "a" and e["verdict"] == "supported"
    assert e["tables"] == ["results/exact.parquet"] and "exact, d >= 16" in e["rows"]
    assert n["exactRuns"]["value"] == 4 and n["exactRuns"]["text"] == "4"
    assert n["worstFloat16"]["text"] == "1.2e-13"
    assert n["layerSeconds"]["timing"] and not n["exactRuns"]["timing"]


def test_bad_names_and_conflicting_values_are_refused():
    with pytest.raises(ValueError, match="camelCase"):
        Number("exact_runs", 1)
    assert number_name("lowprecisionGoal", "digits=3") == "lowprecisionGoalDigits3"
    rec = figure_record("fig", _claims(), [])
    other = figure_record("other", [Claim("c", "s", True, "", numbers=(
        Number("exactRuns", 5, "runs", "d"),))], [])
    with pytest.raises(ValueError, match="exactRuns is stated twice"):
        collect_numbers([rec, other])
    same = figure_record("same", [Claim("c", "s", True, "", numbers=(
        Number("exactRuns", 4, "runs", "d"),))], [])
    assert len(collect_numbers([rec, same])) == 4


def test_every_number_is_one_latex_macro():
    tex = numbers_tex(_numbers())
    defined = re.findall(r"\\newcommand\{\\([A-Za-z]+)\}", tex)
    assert "exactQueryExponent" in defined and "exactQueryExponentLo" in defined
    assert "worstFloatOneSix" in defined and macro_name("float16x2") == "floatOneSixxTwo"
    assert all(re.fullmatch(r"[A-Za-z]+", m) for m in defined)
    assert len(defined) == len(set(defined)) == 4 + 2
    assert "(wall clock)" in tex.splitlines()[[i for i, line in enumerate(tex.splitlines())
                                               if "layerSeconds" in line][0]]


def test_templates_render_numbers_and_name_what_is_missing():
    text, missing = render_template(
        "exponent {{exactQueryExponent}} {{ exactQueryExponent.interval }}, from "
        "{{exactQueryExponent.lo}}; {{nowhere}} and {{exactRuns}} runs", _numbers())
    n = _numbers()["exactQueryExponent"]
    assert text == (f"exponent {n['text']} {n['interval']}, from {n['interval'][1:].split(',')[0]}"
                    "; (missing: nowhere) and 4 runs")
    assert missing == ["nowhere"]


def test_compare_is_exact_leaves_out_timing_and_names_what_differs():
    old = _numbers()
    ok, report = compare_numbers(old, json.loads(json.dumps(old)))
    assert ok and "all 3 numbers" in report and "1 wall-clock" in report
    new = json.loads(json.dumps(old))
    new["layerSeconds"]["value"] = 9.9  # timing: not compared
    new["worstFloat16"]["value"] *= 1 + 4e-16  # printed the same, still differs
    del new["exactRuns"]
    new["extra"] = {**old["exactRuns"], "name": "extra"}
    ok, report = compare_numbers(old, new)
    assert not ok
    assert "1 of 3 numbers" in report
    assert re.search(r"differs: worstFloat16 .*printed the same", report)
    assert "missing: exactRuns" in report and "new: extra" in report
    assert "layerSeconds" not in report


def test_compare_command_reports_and_fails_only_when_strict(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"schema": 1, "numbers": _numbers()}))
    changed = _numbers()
    changed["exactRuns"]["value"] = 5
    b.write_text(json.dumps({"schema": 1, "numbers": changed}))
    assert main(["compare", str(a), str(a)]) == 0
    assert "reproduced exactly" in capsys.readouterr().out
    assert main(["compare", str(a), str(b)]) == 0
    assert "differs: exactRuns" in capsys.readouterr().out
    assert main(["compare", str(a), str(b), "--strict"]) == 1
    assert main(["compare", str(a), str(tmp_path / "none.json")]) == 0
    assert "no numbers" in capsys.readouterr().out


def test_publish_writes_readme_table_findings_page_and_committed_numbers(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "results" / "findings").mkdir(parents=True)
    (tmp_path / "README.md").write_text(f"# x\n\n{README_BEGIN}\nold table\n{README_END}\nend\n")
    (tmp_path / "docs" / "numbers.json").write_text(json.dumps(
        {"schema": 1, "numbers": {"gone": {**_numbers()["exactRuns"], "name": "gone"}}}))
    (tmp_path / "results" / "numbers.json").write_text(json.dumps(
        {"schema": 1, "numbers": _numbers()}))
    (tmp_path / "results" / "findings" / "readme_table.md").write_text("| a |\n|---|\n| 4 |\n")
    (tmp_path / "results" / "findings" / "findings.md").write_text("# Findings\n(missing: q)\n")
    lines = publish(tmp_path)
    readme = (tmp_path / "README.md").read_text()
    assert readme == f"# x\n\n{README_BEGIN}\n| a |\n|---|\n| 4 |\n{README_END}\nend\n"
    assert (tmp_path / "docs" / "findings.md").read_text().startswith("# Findings")
    assert json.loads((tmp_path / "docs" / "numbers.json").read_text())["numbers"] == _numbers()
    text = "\n".join(lines)
    assert "gone: gone" in text and "new: exactRuns" in text and "no number for q" in text


def test_captions_and_claims_become_latex():
    from attnquery.appendix import latex_text

    assert latex_text("**Exact.** ``fit_bias`` costs d^2 + 2d + 1 (50% of |v_i|) & *more*") == (
        r"\textbf{Exact.} \texttt{fit\_bias} costs d\^{}2 + 2d + 1 (50\% of $|$v\_i$|$) \& "
        r"\emph{more}")
    assert latex_text("x < 1e-3, {a} ~ $b # <= >=\n\n||W||") == (
        r"x $<$ 1e-3, \{a\} \~{} \$b \# $\le$ $\ge$ $\|$W$\|$")
    assert latex_text("Wall times.\n\n{{ snakemake.params.claims }}\n") == "Wall times."
