"""The appendix (`make appendix`): a table of contents, math set as math, tables that fit the
text block, and, where TeX is installed, a build of the quick study's appendix with no overfull
box wider than 10 pt."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from attnquery.figures import PAPER_ORDER, all_figures, paper_order
from attnquery.study.appendix import TABLE_WIDTH_PT, appendix_body, appendix_document, fit_table

from .quick_study import given_study, quick_study

#: the widest overfull box the appendix may have (points)
OVERFULL_PT = 10.0


def _body():
    names = sorted(all_figures())
    records = [{"figure": n, "caption": "costs d^2 + d queries; errors of W_h", "claims": []}
               for n in names]
    return names, appendix_body(records, [], {}, {}, {})


def test_the_appendix_has_a_table_of_contents_of_the_papers_results_in_order():
    names, body = _body()
    assert r"\tableofcontents" in appendix_document()
    toc = re.findall(r"\\addcontentsline\{toc\}\{subsection\}\{(.*?)\}", body)
    order = [s for _, s in PAPER_ORDER]
    assert toc and [order.index(s.replace(r"\_", "_")) for s in toc] == sorted(
        order.index(s.replace(r"\_", "_")) for s in toc)
    assert re.findall(r"\\label\{fig:(\w+)\}", body) == paper_order(names)


def test_captions_show_math_as_math():
    _, body = _body()
    assert "$d^{2}$" in body and "$W_{h}$" in body
    assert r"\^{}" not in body


def _table(n_metrics, cell="$1.27\\times 10^{-3}$ [$1.22\\times 10^{-3}$, $1.32\\times 10^{-3}$]"):
    head = ["learner", "d", "unused", *[f"metric{i}" for i in range(n_metrics)]]
    rows = [["exact", str(d), "--", *[cell] * n_metrics] for d in (4, 8)]
    spec = "lll" + "r" * n_metrics
    return "\n".join(["% a table", f"\\begin{{tabular}}{{{spec}}}", r"\toprule",
                      " & ".join(head) + r" \\", r"\midrule",
                      *(" & ".join(r) + r" \\" for r in rows), r"\bottomrule",
                      r"\end{tabular}"])


def test_a_wide_table_is_split_into_parts_that_keep_the_key_columns():
    out = fit_table(_table(12))
    parts = re.findall(r"\\begin\{tabular\}\{([lr]+)\}", out)
    assert len(parts) > 1 and all(p.startswith("ll") and "lll" not in p for p in parts)
    assert sum(p.count("r") for p in parts) == 12  # every metric, once
    assert "unused" not in out and out.count("exact &") == 2 * len(parts)
    assert fit_table(_table(2)).count(r"\begin{tabular}") == 1
    assert TABLE_WIDTH_PT > 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("latexmk") is None or shutil.which("pdflatex") is None,
                    reason="no TeX installation (latexmk, pdflatex): the appendix is not built")
def test_the_quick_studys_appendix_builds_with_no_box_wider_than_10pt():
    folder = given_study() or quick_study("appendix")
    tex = folder / "appendix" / "appendix.tex"
    assert tex.is_file()
    proc = subprocess.run(["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error",
                           "-outdir=appendix", "appendix/appendix.tex"], cwd=folder,
                          capture_output=True, text=True)
    log = (folder / "appendix" / "appendix.log").read_text(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    assert r"\tableofcontents" in tex.read_text() and (folder / "appendix" / "appendix.toc") \
        .read_text().count("contentsline") > 5
    overfull = [float(w) for w in re.findall(r"Overfull \\hbox \((\d+\.?\d*)pt too wide\)", log)]
    assert not [w for w in overfull if w > OVERFULL_PT], overfull
