"""An appendix a paper can include, generated from a run's results (``make appendix``).

:func:`write_appendix` writes ``appendix/body.tex`` (every figure with its caption and its
claims' verdicts, every table of ``results/tables/``, the table of the numbers the findings state,
the study's configuration and the versions that produced the results) and
``appendix/appendix.tex``, a standalone document that loads the numbers' macros
(``results/numbers.tex``) and inputs the body. Paths are relative to the repository root, where
it is compiled (:func:`compile_appendix`: ``latexmk -pdf -outdir=appendix``).

In a paper: ``\\input{results/numbers.tex}`` in the preamble gives every number as a macro
(``\\exactQueryExponent``), and ``\\input{appendix/body.tex}`` the appendix, whose figures and
tables are labelled ``fig:<figure>`` and ``tab:<experiment>``. Figures, tables and numbers come
in the paper's order (:data:`attnquery.figures.PAPER_ORDER`: Theorem 4.1 first, the results
beyond the paper last), each figure under the result of the paper it measures.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from ..figures import experiment_order, paper_order, paper_section
from .findings import load_numbers, macro_name

__all__ = ["latex_text", "fit_table", "appendix_body", "appendix_document", "write_appendix",
           "compile_appendix", "VERSION_COLUMNS", "PREAMBLE_PACKAGES"]

#: result columns that say which code and libraries produced the results
VERSION_COLUMNS = ("package_version", "git_commit", "python_version", "numpy_version",
                   "scipy_version", "cvxpy_version")
#: LaTeX packages the standalone appendix loads (a paper including the body needs them too)
PREAMBLE_PACKAGES = ("graphicx", "booktabs", "longtable", "float", "pdflscape")

_SPECIAL = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&",
            "#": r"\#", "%": r"\%", "_": r"\_", "^": r"\^{}", "~": r"\~{}", "<": r"$<$",
            ">": r"$>$", "|": r"$|$"}


#: plain-text math of captions and claims set as math: a letter with a superscript or a
#: subscript (``d^2``, ``W_h``, ``W_{h}``), ``$...$`` as written
_MATH = re.compile(r"\$[^$]+\$|(?<![\w\\])[A-Za-z]"
                   r"(?:\^(?:\{[^}]*\}|[\w.]+?)|_(?:\{[^}]*\}|[A-Za-z0-9]+))(?![\w])")


def _math(m: str) -> str:
    """A plain-text math token as LaTeX math (``d^2`` -> ``$d^{2}$``)."""
    if m.startswith("$"):
        return m
    base, op, arg = m[0], m[1], m[2:]
    arg = arg[1:-1] if arg.startswith("{") else arg
    return f"${base}{op}{{{arg}}}$"


def _plain(text: str) -> str:
    out = "".join(_SPECIAL.get(ch, ch) for ch in text)
    return out.replace("\x00", r"$\le$").replace("\x01", r"$\ge$").replace("\x02", r"$\|$")


def latex_text(text: str) -> str:
    """Plain or reStructuredText ``text`` as LaTeX, one paragraph: special characters escaped,
    ``**bold**``, ``*italic*`` and ````code```` kept as such, math written as text (``d^2``,
    ``W_h``, ``$...$``) set as math, the report's Jinja expressions (``{{ ... }}``) left out."""
    text = re.sub(r"\{\{.*?\}\}|\{%.*?%\}", "", text, flags=re.S)  # the report's Jinja
    text = " ".join(text.split())  # one paragraph: a caption or an item holds no \par
    text = text.replace("<=", "\x00").replace(">=", "\x01").replace("||", "\x02")
    parts = []
    for i, chunk in enumerate(re.split(r"(``.+?``)", text)):
        if i % 2:  # code: escaped as it is
            parts.append(r"\texttt{" + _plain(chunk[2:-2]) + "}")
            continue
        at = 0
        for m in _MATH.finditer(chunk):
            parts.append(_plain(chunk[at:m.start()]))
            parts.append(_math(m.group(0)))
            at = m.end()
        parts.append(_plain(chunk[at:]))
    out = "".join(parts)
    out = re.sub(r"\*\*(.+?)\*\*", r"\\textbf{\1}", out)
    out = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"\\emph{\1}", out)
    return out


#: the tables' text block (landscape, 2 cm margins on letter paper) and an upper bound on the
#: width of a character of their \\tiny font and of a column's padding, in points
TABLE_WIDTH_PT = 680.0
CHAR_PT = 3.6
COLUMN_PT = 5.0


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)&", line.strip().removesuffix(r"\\"))]


def _shown(cell: str) -> int:
    """An upper bound on the characters a table cell prints (math markup left out)."""
    cell = re.sub(r"\\times\s*", "x", cell)
    cell = re.sub(r"\\[a-zA-Z]+|[${}^]|\\(?=[ %_&#])", "", cell)
    return len(cell)


def fit_table(tex: str, width_pt: float = TABLE_WIDTH_PT) -> str:
    """A table of ``results/tables/`` (one ``tabular`` with booktabs rules) that fits
    ``width_pt``: columns empty in every row (``--``) left out, and the metric columns (``r``)
    split over as many tables as needed, each with every key column (``l``)."""
    lines = tex.splitlines()
    begin = next(i for i, ln in enumerate(lines) if ln.startswith(r"\begin{tabular}"))
    spec = re.match(r"\\begin\{tabular\}\{([lcr]+)\}", lines[begin]).group(1)
    mid = lines.index(r"\midrule")
    bottom = lines.index(r"\bottomrule")
    header = _cells(" ".join(lines[begin + 2:mid]))
    rows = [_cells(ln) for ln in lines[mid + 1:bottom] if ln.strip()]
    cols = [j for j in range(len(spec))
            if not rows or not all(r[j] in ("--", "") for r in rows if len(r) == len(spec))]
    width = {j: COLUMN_PT + CHAR_PT * max(_shown(c[j]) for c in [header, *rows]
                                          if len(c) == len(spec)) for j in cols}
    keys = [j for j in cols if spec[j] != "r"]
    room = width_pt - sum(width[j] for j in keys)
    parts, part = [], []
    for j in (j for j in cols if spec[j] == "r"):
        if part and sum(width[k] for k in part) + width[j] > room:
            parts.append(part)
            part = []
        part.append(j)
    parts.append(part)
    out = [ln for ln in lines[:begin]]
    for n, part in enumerate(parts):
        use = keys + part
        if len(parts) > 1:
            out.append(f"\\par\\smallskip\\noindent Part {n + 1} of {len(parts)}.\\par")
        out += [f"\\begin{{tabular}}{{{''.join(spec[j] for j in use)}}}", r"\toprule",
                " & ".join(header[j] for j in use) + r" \\", r"\midrule"]
        out += [" & ".join(r[j] for j in use) + r" \\" for r in rows if len(r) == len(spec)]
        out += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(out) + "\n"


def _figure(rec: dict, figure_dir: str) -> list[str]:
    name = rec["figure"]
    lines = [r"\begin{figure}[H]", r"\centering",
             f"\\includegraphics[width=\\textwidth]{{{figure_dir}/{name}.pdf}}",
             f"\\caption{{{latex_text(rec['caption'])}}}", f"\\label{{fig:{name}}}",
             r"\end{figure}", ""]
    if rec["claims"]:
        lines.append(f"\\noindent Claims of Figure~\\ref{{fig:{name}}}, checked on the data:")
        lines.append(r"\begin{itemize}")
        for c in rec["claims"]:
            lines.append(f"\\item \\textbf{{{latex_text(c['verdict'])}}}: "
                         f"{latex_text(c['statement'])} ({latex_text(c['detail'])})")
        lines.append(r"\end{itemize}")
    else:
        lines.append(f"\\noindent Figure~\\ref{{fig:{name}}} states no claim.")
    lines.append("")
    return lines


def appendix_body(records, tables, numbers, config: dict, versions: dict,
                  figure_dir: str = "figures", table_dir: str | None = None) -> str:
    """The appendix's body: figures and claims, tables, numbers, configuration, versions.

    ``records`` are the figures' claim records (``figures/claims/<figure>.json``), ``tables`` the
    paths of ``results/tables/<experiment>.tex``, ``numbers`` the entries of
    ``results/numbers.json``, ``versions`` column -> the distinct values in the results;
    ``table_dir``, where given, holds the tables fitted to the page (:func:`fit_table`), which
    are input instead.
    """
    lines = ["% The appendix of an attnquery study: written by `make appendix` "
             "(attnquery.appendix) from a run's results.",
             "% Needs the packages " + ", ".join(PREAMBLE_PACKAGES)
             + " and the macros of results/numbers.tex.", "",
             r"\section{Figures and the claims they support}", ""]
    by_name = {rec["figure"]: rec for rec in records}
    section = None
    for name in paper_order(by_name):
        if paper_section(name)[1] != section:
            section = paper_section(name)[1]
            lines += [f"\\subsection*{{{latex_text(section)}}}",
                      f"\\addcontentsline{{toc}}{{subsection}}{{{latex_text(section)}}}", ""]
        lines += _figure(by_name[name], figure_dir)
    lines += [r"\clearpage", r"\begin{landscape}", r"\section{Tables}", "",
              "Each row is a grid point of the experiment; each metric is its median "
              "[interquartile range] over seeds.", ""]
    by_stem = {Path(path).stem: path for path in tables}
    for name in experiment_order(by_stem):
        path = by_stem[name]
        lines += [r"\begingroup\tiny\setlength{\tabcolsep}{2pt}",
                  r"\let\tabular\longtable\let\endtabular\endlongtable",
                  f"\\noindent\\textbf{{Table~\\refstepcounter{{table}}\\thetable\\label{{tab:"
                  f"{name}}}.}} Experiment \\texttt{{{latex_text(name)}}} "
                  f"(\\texttt{{{latex_text(str(path))}}}).", "",
                  f"\\input{{{Path(table_dir or Path(path).parent) / name}}}", r"\endgroup", ""]
    lines += [r"\end{landscape}", r"\clearpage", r"\section{Numbers}", "",
              r"{\sloppy Every number the findings state, as the check of its claim computed it; "
              "each is "
              "the macro named (from \\texttt{results/numbers.tex}). Intervals are 95\\% "
              "confidence intervals; wall-clock numbers are marked.\\par}", "",
              r"\begingroup\scriptsize",
              r"\begin{longtable}{@{}p{0.37\linewidth}p{0.16\linewidth}p{0.13\linewidth}"
              r"p{0.26\linewidth}@{}}", r"\toprule",
              r"macro & value & unit & figure, claim \\", r"\midrule", r"\endhead"]
    rank = {fig: i for i, fig in enumerate(paper_order({n["figure"] for n in numbers.values()}))}
    for name, n in sorted(numbers.items(), key=lambda kv: (rank[kv[1]["figure"]], kv[0])):
        m = macro_name(name)
        value = f"\\{m}" + (f" [\\{m}Lo, \\{m}Hi]" if n.get("interval") else "")
        unit = latex_text(n["unit"] + (" (wall clock)" if n["timing"] else ""))
        lines.append(f"\\texttt{{\\textbackslash {m}}} & {value} & {unit} & "
                     f"{latex_text(n['figure'])}, {latex_text(n['claim'])} \\\\")
    lines += [r"\bottomrule", r"\end{longtable}", r"\endgroup", "",
              r"\section{Study configuration and versions}", "",
              "The results were produced by:", "", r"\begin{itemize}"]
    for col, vals in versions.items():
        lines.append(f"\\item \\texttt{{{latex_text(col)}}}: "
                     f"{latex_text(', '.join(str(v) for v in vals))}")
    lines += [r"\end{itemize}", "", "The study's configuration:", "", r"\begingroup\scriptsize",
              r"\begin{verbatim}",
              yaml.safe_dump(config, sort_keys=True, default_flow_style=False, width=90).rstrip(),
              r"\end{verbatim}", r"\endgroup", ""]
    return "\n".join(lines)


def appendix_document(body_path: str = "appendix/body.tex",
                      numbers_path: str = "results/numbers.tex") -> str:
    """The standalone document around the body."""
    return "\n".join([
        r"\documentclass[10pt]{article}",
        r"\usepackage[margin=2cm]{geometry}",
        r"\usepackage[T1]{fontenc}",
        *(f"\\usepackage{{{p}}}" for p in PREAMBLE_PACKAGES),
        f"\\input{{{Path(numbers_path).with_suffix('')}}}",
        r"\title{attnquery: the study's figures, tables and numbers}",
        r"\date{}",
        r"\begin{document}",
        r"\maketitle",
        r"\tableofcontents",
        r"\clearpage",
        f"\\input{{{Path(body_path).with_suffix('')}}}",
        r"\end{document}", ""])


def write_appendix(records, tables, numbers_json, results_all, config: dict, out_dir,
                   numbers_tex: str = "results/numbers.tex") -> Path:
    """Write ``out_dir/body.tex`` and ``out_dir/appendix.tex``; returns the latter."""
    import pyarrow.parquet as pq

    from ..results import atomic_write_bytes

    recs = [json.loads(Path(p).read_text(encoding="utf-8")) if not isinstance(p, dict) else p
            for p in records]
    cols = pq.read_schema(results_all).names
    table = pq.read_table(results_all, columns=[c for c in VERSION_COLUMNS if c in cols])
    versions = {c: sorted({str(v) for v in table.column(c).to_pylist()})
                for c in table.column_names}
    out_dir = Path(out_dir)
    for path in tables:
        atomic_write_bytes(out_dir / "tables" / Path(path).name,
                           fit_table(Path(path).read_text(encoding="utf-8")).encode())
    body = out_dir / "body.tex"
    atomic_write_bytes(body, appendix_body(recs, tables, load_numbers(numbers_json), config,
                                           versions, table_dir=str(out_dir / "tables")).encode())
    doc = out_dir / "appendix.tex"
    atomic_write_bytes(doc, appendix_document(str(body), numbers_tex).encode())
    return doc


def compile_appendix(tex="appendix/appendix.tex", cwd=".") -> tuple[bool, str]:
    """Compile ``tex`` to PDF with latexmk, from ``cwd`` (the repository root) into the .tex's
    folder; returns whether a PDF was written and a line saying what happened."""
    tex = Path(tex)
    if shutil.which("latexmk") is None or shutil.which("pdflatex") is None:
        return False, (f"wrote {tex}; no TeX installation (latexmk, pdflatex) found, so no PDF: "
                       "install one (Debian: apt-get install latexmk texlive-latex-recommended "
                       "texlive-latex-extra) and run `make appendix` again")
    proc = subprocess.run(["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error",
                           f"-outdir={tex.parent}", str(tex)], cwd=cwd, capture_output=True,
                          text=True)
    pdf = tex.with_suffix(".pdf")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        return False, f"latexmk failed on {tex} (log: {tex.with_suffix('.log')}):\n{tail}"
    return True, f"wrote {tex} and {pdf}"


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m attnquery.study.appendix",
                                     description="compile appendix/appendix.tex with latexmk")
    parser.add_argument("tex", nargs="?", default="appendix/appendix.tex")
    args = parser.parse_args(argv)
    if not Path(args.tex).is_file():
        print(f"{args.tex} does not exist: run `make appendix`")
        return 1
    ok, message = compile_appendix(args.tex)
    print(message)
    return 0 if ok or "no TeX" in message else 1


if __name__ == "__main__":
    raise SystemExit(main())
