"""The findings' numbers: collected from the claims, written as JSON and LaTeX macros, rendered
into templates, compared exactly with the committed ones and published."""

from __future__ import annotations

import json
import re

import pytest

from attnquery.claims import (
    Claim,
    Number,
    fit_number,
    format_interval,
    format_number,
    number_name,
)
from attnquery.metrics import fit_power_law
from attnquery.study.findings import (
    README_BEGIN,
    README_END,
    collect_numbers,
    compare_numbers,
    figure_record,
    last_digit,
    macro_name,
    main,
    numbers_tex,
    printed_format,
    publish,
    render_template,
)


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
    # four numbers, one interval (Lo, Hi) and the machine of the wall-clock numbers
    assert len(defined) == len(set(defined)) == 4 + 2 + 1 and "findingsMachine" in defined
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


def _restated(numbers, name, **parts):
    """A copy of ``numbers`` with ``name``'s value / lo / hi replaced and printed as a run prints
    them (its text and interval from its fmt)."""
    out = json.loads(json.dumps(numbers))
    entry = out[name]
    entry.update(parts)
    entry["text"] = format_number(entry["value"], entry["fmt"])
    entry["interval"] = format_interval(entry["lo"], entry["hi"], entry["fmt"])
    return out


def test_numbers_differing_in_their_last_bits_are_reproduced_and_listed_apart():
    old = _numbers()
    exponent = old["exactQueryExponent"]
    new = _restated(old, "worstFloat16", value=old["worstFloat16"]["value"] * (1 + 4e-16))
    new = _restated(new, "exactQueryExponent", lo=exponent["lo"] * (1 + 1e-15))
    new = _restated(new, "layerSeconds", value=9.9)  # wall clock: not compared
    ok, report = compare_numbers(old, new)
    head, *rest = report.splitlines()
    assert ok, report
    assert head == ("findings reproduced: all 3 numbers of the committed findings "
                    "(docs/numbers.json) reproduced as printed, 1 of them bit-identical; "
                    "1 wall-clock numbers not compared")
    assert rest[0] == ("  2 numbers differ below their printed digits (last bits), all print "
                       "the same:")
    listed = "\n".join(rest[1:])
    assert re.search(r"^    worstFloat16 1\.2e-13 \(value 1\.234e-13 -> ", listed, re.M)
    assert re.search(rf"^    exactQueryExponent {exponent['text']} \[.*; lo {exponent['lo']!r} -> ",
                     listed, re.M)
    # the wall-clock number is listed apart, not compared
    assert "differs" not in report
    assert [line for line in report.splitlines() if "layerSeconds" in line] == [
        "    layerSeconds: measured on another machine: 7.5 s; here: 9.9 s"]
    ok, report = compare_numbers(old, json.loads(json.dumps(old)))
    assert ok and "3 of them bit-identical" in report and "last bits" not in report


def test_a_count_off_by_one_is_not_reproduced():
    old = _numbers()
    ok, report = compare_numbers(old, _restated(old, "exactRuns", value=5))
    assert not ok
    assert report.splitlines()[0].startswith(
        "findings NOT reproduced: 1 of 3 numbers of the committed findings print differently or "
        "are missing (exactRuns); 2 reproduced as printed, 2 of them bit-identical")
    assert "  differs: exactRuns committed 4, now 5 (value 4 -> 5)" in report.splitlines()
    # a count is not a float: a tolerance cannot be declared for it, and half a unit is no excuse
    with pytest.raises(ValueError, match="count .* takes no tol"):
        Number("exactRuns", 4, "runs", "d", tol=1)
    counts = collect_numbers([figure_record("f", [Claim("c", "s", True, "", numbers=(
        Number("n", 1000, "runs", "d"),))], [])])
    assert not compare_numbers(counts, _restated(counts, "n", value=1000.4))[0]


def test_a_float_differing_at_its_printed_digits_is_not_reproduced_and_named():
    old = _numbers()
    ok, report = compare_numbers(old, _restated(old, "worstFloat16", value=1.334e-13))
    assert not ok and "(worstFloat16)" in report.splitlines()[0]
    assert ("  differs: worstFloat16 committed 1.2e-13, now 1.3e-13 (value 1.234e-13 -> 1.334e-13)"
            in report.splitlines())
    e = old["exactQueryExponent"]
    hi = round(e["hi"], 3) + 0.002  # two units of the last printed digit
    ok, report = compare_numbers(old, _restated(old, "exactQueryExponent", hi=hi))
    assert not ok
    assert (f"  differs: exactQueryExponent committed {e['text']} {e['interval']}, now "
            f"{e['text']} [{e['lo']:.3f}, {hi:.3f}]") in report


def test_a_missing_number_is_not_reproduced_a_missing_wall_clock_one_is():
    old = _numbers()
    new = json.loads(json.dumps(old))
    del new["exactRuns"], new["layerSeconds"]
    new["extra"] = {**old["exactRuns"], "name": "extra"}
    ok, report = compare_numbers(old, new)
    assert not ok and "(exactRuns)" in report.splitlines()[0]
    assert "  missing: exactRuns (committed 4; the run states no such number)" in report
    assert ("missing: layerSeconds (committed 7.5; the run states no such number; wall clock"
            in report)
    assert "new: extra = 4" in report
    ok, report = compare_numbers(old, {**new, "exactRuns": old["exactRuns"]})
    assert ok and "missing: layerSeconds" in report and "missing: exactRuns" not in report


def _one(value, fmt, tol=None, factor=None):
    return collect_numbers([figure_record("f", [Claim("c", "s", True, "", numbers=(
        Number("x", value, "relative error", fmt, tol=tol, factor=factor),))], [])])


def test_a_rounding_boundary_is_crossed_within_half_a_unit_of_the_last_digit():
    old = _one(4.44999, ".1f")
    ok, report = compare_numbers(old, _restated(old, "x", value=4.45001))
    assert ok, report
    assert ("  1 numbers print differently at a rounding boundary, within half a unit of their "
            "last printed digit (reproduced):") in report
    assert "    x committed 4.4, now 4.5 (value 4.44999 -> 4.45001)" in report
    assert not compare_numbers(old, _restated(old, "x", value=4.50001))[0]  # a whole unit off
    # significant digits: the unit of the last digit scales with the number
    old = _one(4.4499e-15, ".2g")
    assert compare_numbers(old, _restated(old, "x", value=4.4501e-15))[0]
    assert not compare_numbers(old, _restated(old, "x", value=4.3e-15))[0]
    assert last_digit(4.4785e-15, ".2g") == pytest.approx(1e-16)
    assert last_digit(1.984, ".3f") == pytest.approx(1e-3)
    assert last_digit(773931.7, ".1e") == pytest.approx(1e4)
    # only zero prints as zero at significant digits
    assert last_digit(0.0, ".2g") == 0
    old = _one(0.0, ".2g")
    ok, report = compare_numbers(old, _restated(old, "x", value=1e-17))
    assert not ok and "differs: x committed 0, now 1e-17" in report


def test_a_declared_tolerance_accepts_a_printed_difference_within_it():
    old = _one(0.0, ".2g", tol=1e-15)
    assert old["x"]["tol"] == 1e-15 and old["x"]["fmt"] == ".2g"
    ok, report = compare_numbers(old, _restated(old, "x", value=1e-17))
    assert ok, report
    assert "  1 numbers print differently within the tolerance or factor their claims declare " \
        "(reproduced):" in report and "x committed 0, now 1e-17 (value 0.0 -> 1e-17, tol 1e-15)" \
        in report
    assert not compare_numbers(old, _restated(old, "x", value=2e-15))[0]
    # the run's declaration counts: the committed findings may predate it
    undeclared = _one(0.0, ".2g")
    assert compare_numbers(undeclared, _restated(old, "x", value=1e-17))[0]
    assert fit_number("e", fit_power_law([2, 4, 8], [4, 16, 64]), tol=0.01).tol == 0.01
    for bad in (-1e-3, float("nan"), float("inf"), "1e-3"):
        with pytest.raises(ValueError, match="tol must be a finite number >= 0"):
            Number("x", 1.0, fmt=".2g", tol=bad)


def test_a_declared_factor_accepts_a_rounding_error_of_the_same_order_of_magnitude():
    # a worst float64 rounding error as two BLAS kernels gave it (docs/reproducibility.md)
    old = _one(5.357666551722975e-09, ".2g", factor=10)
    assert old["x"]["factor"] == 10.0 and old["x"]["tol"] is None
    ok, report = compare_numbers(old, _restated(old, "x", value=9.969961306273025e-09))
    assert ok, report
    assert ("    x committed 5.4e-09, now 1e-08 (value 5.357666551722975e-09 -> "
            "9.969961306273025e-09, factor 10.0)") in report
    # either way, up to the factor and no further
    assert compare_numbers(old, _restated(old, "x", value=5.4e-10))[0]
    assert not compare_numbers(old, _restated(old, "x", value=5.3e-10))[0]
    assert not compare_numbers(old, _restated(old, "x", value=5.4e-08))[0]
    # a change of sign, a zero or a nan is no ratio
    for bad in (-5.4e-09, 0.0, float("nan")):
        assert not compare_numbers(old, _restated(old, "x", value=bad))[0]
    # the interval's ends are judged too; without a declaration the digits must print the same
    fit = fit_power_law([2, 4, 8], [4, 16, 64])
    assert fit_number("e", fit, factor=1.5).factor == 1.5
    interval = collect_numbers([figure_record("f", [Claim("c", "s", True, "", numbers=(
        Number("y", 1e-12, "relative error", ".2g", 5e-13, 2e-12, factor=2),))], [])])
    assert compare_numbers(interval, _restated(interval, "y", lo=3e-13))[0]
    assert not compare_numbers(interval, _restated(interval, "y", hi=5e-12))[0]
    undeclared = _one(5.357666551722975e-09, ".2g")
    assert not compare_numbers(undeclared, _restated(undeclared, "x", value=1e-8))[0]
    # the run's declaration counts: the committed findings may predate it
    assert compare_numbers(undeclared, _restated(old, "x", value=1e-8))[0]


def test_a_factor_is_at_least_one_and_no_count_takes_one():
    with pytest.raises(ValueError, match="count .* takes no factor"):
        Number("exactRuns", 4, "runs", "d", factor=2)
    for bad in (0.5, -2.0, float("nan"), float("inf"), "2", True):
        with pytest.raises(ValueError, match="factor must be a finite number >= 1"):
            Number("x", 1.0, fmt=".2g", factor=bad)


def test_committed_numbers_without_a_format_are_judged_at_the_format_that_printed_them():
    old = _one(0.5, ".3g")
    assert old["x"]["text"] == "0.5"
    for entry in (old["x"],):
        del entry["fmt"], entry["tol"]
    # the run's format prints 0.5 as "0.5": three significant digits, not one decimal
    assert printed_format(old["x"], ".3g") == ".3g"
    assert not compare_numbers(old, _restated(_one(0.5, ".3g"), "x", value=0.54))[0]
    # a run whose format changed, or none known: the digits of the text
    assert printed_format(old["x"], ".2e") == ".1f"
    assert printed_format({"value": 7.7e5, "text": "7.7e+05", "interval": ""}) == ".1e"
    exponent = {"value": -0.4996, "text": "-0.500", "lo": -0.509, "hi": -0.49,
                "interval": "[-0.509, -0.490]"}
    assert printed_format(exponent) == ".3f" and printed_format(exponent, ".3f") == ".3f"
    share = {"value": 0.125, "text": "12.5%", "interval": ""}
    assert printed_format(share) == ".1%" and last_digit(0.125, ".1%") == pytest.approx(1e-3)
    assert printed_format({"value": 1024.0, "text": "1,024", "interval": ""}) == ",.0f"


def test_compare_command_reports_and_fails_only_when_strict(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"schema": 1, "numbers": _numbers()}))
    b.write_text(json.dumps({"schema": 1, "numbers": _restated(_numbers(), "exactRuns", value=5)}))
    assert main(["compare", str(a), str(a)]) == 0
    assert "findings reproduced: all 3 numbers" in capsys.readouterr().out
    assert main(["compare", str(a), str(b)]) == 0
    assert "differs: exactRuns" in capsys.readouterr().out
    assert main(["compare", str(a), str(b), "--strict"]) == 1
    assert "findings NOT reproduced" in capsys.readouterr().out
    last_bits = _numbers()
    last_bits["worstFloat16"]["value"] *= 1 + 4e-16
    b.write_text(json.dumps({"schema": 1, "numbers": last_bits}))
    assert main(["compare", str(a), str(b), "--strict"]) == 0
    assert "1 numbers differ below their printed digits" in capsys.readouterr().out
    assert main(["compare", str(a), str(tmp_path / "none.json")]) == 0
    assert "no numbers" in capsys.readouterr().out
    assert main(["compare", str(a), str(tmp_path / "none.json"), "--strict"]) == 1


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
    from attnquery.study.appendix import latex_text

    assert latex_text("**Exact.** ``fit_bias`` costs d^2 + 2d + 1 (50% of |v_i|) & *more*") == (
        r"\textbf{Exact.} \texttt{fit\_bias} costs $d^{2}$ + 2d + 1 (50\% of $|$$v_{i}$$|$) \& "
        r"\emph{more}")
    assert latex_text("x < 1e-3, {a} ~ $b # <= >=\n\n||W||") == (
        r"x $<$ 1e-3, \{a\} \~{} \$b \# $\le$ $\ge$ $\|$W$\|$")
    assert latex_text("Wall times.\n\n{{ snakemake.params.claims }}\n") == "Wall times."
