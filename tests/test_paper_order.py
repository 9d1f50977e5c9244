"""The paper's order (attnquery.figures.PAPER_ORDER): the appendix's figures, tables and numbers
and the findings pages' sections follow it, Theorem 4.1 first, the results beyond the paper
last."""

from __future__ import annotations

import fnmatch
import pkgutil
import re

import pytest

import attnquery.figures as figures_pkg
from attnquery.errors import ConfigError
from attnquery.figures import (
    FIGURES,
    PAPER_ORDER,
    all_figures,
    experiment_order,
    paper_order,
    paper_section,
    register_figure,
)
from attnquery.study.appendix import appendix_body
from attnquery.study.findings import macro_name

from .fresh import REPO


def test_every_figure_module_has_one_place_in_the_paper_order():
    modules = {m.name for m in pkgutil.iter_modules(figures_pkg.__path__)
               if not m.name.startswith("_")}
    placed = [module for module, _ in PAPER_ORDER]
    assert len(placed) == len(set(placed)), placed
    assert set(placed) == modules, (sorted(modules - set(placed)), sorted(set(placed) - modules))
    order = paper_order(all_figures())
    assert order[0] == "exact_queries" and paper_section(order[0])[1].startswith("Theorem 4.1")
    # the paper's sections before the results beyond it
    beyond = [paper_section(f)[1].startswith("Beyond the paper") for f in order]
    assert beyond == sorted(beyond) and any(beyond) and not all(beyond)


def test_a_figure_module_without_a_place_is_refused_by_name():
    def draw(df):  # pragma: no cover - never drawn
        raise AssertionError

    draw.__module__ = "attnquery.figures.unplaced"
    register_figure("unplaced_figure", experiments=["exact"], category="x", caption="x")(draw)
    try:
        with pytest.raises(ConfigError, match="'unplaced'.*PAPER_ORDER"):
            paper_order(["exact_queries", "unplaced_figure"])
    finally:
        del FIGURES["unplaced_figure"]


def _records(names):
    return [{"figure": n, "caption": f"Figure {n}.", "claims": []} for n in names]


def test_the_appendix_follows_the_paper_not_the_file_names():
    names = sorted(all_figures())  # alphabetical: defence_rounding first
    experiments = sorted({e for n in names for e in FIGURES[n].experiments})
    tables = [f"results/tables/{e}.tex" for e in experiments]
    numbers = {f"n{i}": {"figure": n, "claim": "c", "unit": "u", "timing": False,
                         "interval": None} for i, n in enumerate(names)}
    body = appendix_body(_records(names), tables, numbers, {}, {})
    shown = re.findall(r"\\label\{fig:(\w+)\}", body)
    assert shown == paper_order(names) and shown[0] == "exact_queries"
    # Section 4.1 (the one-layer transformer) right after Theorem 4.1, before Theorem 5.1
    assert shown.index("transformer_recovery") < shown.index("lowrank_phase") < shown.index(
        "noise_scaling") < shown.index("defence_rounding") < shown.index(
        "membership_cost") < shown.index("multihead")
    assert shown.index("multihead_generic") < shown.index("realheads") < shown.index("served")
    # each figure under the result of the paper it measures, each section once, in order
    sections = re.findall(r"\\subsection\*\{(.*?)\}", body)
    assert len(sections) == len(set(sections)) and sections[0].startswith("Theorem 4.1")
    in_order = [s for _, s in PAPER_ORDER]
    assert [in_order.index(s.replace(r"\_", "_")) for s in sections] == sorted(
        in_order.index(s.replace(r"\_", "_")) for s in sections)
    # the tables in the order of the figures that read them, the numbers in their figures' order
    listed = re.findall(r"\\label\{tab:(\w+)\}", body)
    assert listed == experiment_order(experiments) and listed[0] == "exact"
    assert listed.index("lowrank_scale") < listed.index("noise") < listed.index("rounding")
    by_macro = {macro_name(k): k for k in numbers}
    macros = re.findall(r"^\\texttt\{\\textbackslash (\w+)\}", body, re.M)
    assert [numbers[by_macro[m]]["figure"] for m in macros] == shown


def _sections(text):
    """``(heading, figures named)`` of each ``##`` section of a findings page."""
    known = sorted(all_figures())
    out = []
    for block in re.split(r"(?m)^(?=## )", text)[1:]:
        named = re.findall(r"figures/([\w*]+)\.pdf", block)
        out.append((block.splitlines()[0][3:],
                    [f for pattern in named for f in fnmatch.filter(known, pattern)]))
    return out


def test_the_findings_sections_and_the_readme_table_follow_the_paper():
    page = (REPO / "docs" / "templates" / "findings.md").read_text(encoding="utf-8")
    sections = _sections(page)
    assert all(figs for _, figs in sections), [h for h, figs in sections if not figs]
    ranks = [[paper_section(f)[0] for f in figs] for _, figs in sections]
    for (a, ra), (b, rb) in zip(zip(sections, ranks, strict=True),
                                zip(sections[1:], ranks[1:], strict=True), strict=False):
        assert max(ra) <= min(rb), f"findings: {a[0]!r} ({a[1]}) comes before {b[0]!r} " \
            f"({b[1]}), against attnquery.figures.PAPER_ORDER"
    assert sections[0][0] == "Exact recovery"
    # the README's table: its rows in the order of the sections they link to
    from .test_docs import slug

    position = {slug(h): i for i, (h, _) in enumerate(sections)}
    table = (REPO / "docs" / "templates" / "readme_table.md").read_text(encoding="utf-8")
    rows = re.findall(r"\(docs/findings\.md#([\w-]+)\)", table)
    assert rows and set(rows) <= set(position), set(rows) - set(position)
    at = [position[r] for r in rows]
    assert at == sorted(at), rows
