"""Paper tables: one booktabs LaTeX table per experiment, summarising it over seeds.

Each row of a table is a grid point (the cell parameters other than the seed); each metric is
shown as its median with the interquartile range over seeds, ``median [q1, q3]``. The number of
runs, the success rate and the failures (rows whose status is not ok) are given per row, so a
table never hides a failed cell.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..results import METRIC_COLUMNS, PARAM_COLUMNS, atomic_write_bytes

__all__ = ["summary_frame", "latex_table", "write_table_tex"]

#: metrics summarised in tables, in order, with their column headings
TABLE_METRICS = {
    "n_queries": "queries",
    "rel_err_W": r"rel.\ err.\ $W$",
    "rel_err_v": r"rel.\ err.\ $v$",
    "func_err": "func.\\ err.",
}


def _grid_columns(df: pd.DataFrame) -> list[str]:
    cols = ["learner"] + [c for c in PARAM_COLUMNS if c in df and df[c].notna().any()]
    return [c for c in cols if df[c].nunique(dropna=False) > 1 or c in ("learner", "d")]


def summary_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Median and interquartile range over seeds of each metric, per grid point."""
    group = _grid_columns(df)
    rows = []
    for key, g in df.groupby(group, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(group, key, strict=True))
        ok = g[g["status"] == "ok"]
        row["runs"] = len(g)
        row["failed"] = int((g["status"] != "ok").sum())
        for m in TABLE_METRICS:
            vals = pd.to_numeric(ok[m], errors="coerce").dropna() if m in ok else pd.Series([])
            if len(vals):
                q1, med, q3 = np.percentile(vals, [25, 50, 75])
                row[m] = (float(med), float(q1), float(q3))
            else:
                row[m] = None
        if "success" in ok and ok["success"].notna().any():
            row["success"] = float(ok["success"].fillna(False).astype(bool).mean())
        else:
            row["success"] = None
        rows.append(row)
    return pd.DataFrame(rows)


def _num(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "--"
    if isinstance(x, float | np.floating):
        if x == 0:
            return "0"
        if abs(x) >= 1e4 or abs(x) < 1e-2:
            mant, exp = f"{x:.2e}".split("e")
            return f"${mant}\\times 10^{{{int(exp)}}}$"
        return f"{x:.3g}"
    return str(x)


def _tex_escape(s: str) -> str:
    return (str(s).replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("%", r"\%")
            .replace("&", r"\&").replace("#", r"\#"))


def _metric_cell(v, integer: bool = False) -> str:
    if v is None:
        return "--"
    med, q1, q3 = v
    if integer and med == q1 == q3 and float(med).is_integer():
        return f"{int(med)}"
    if med == q1 == q3:
        return _num(med)
    return f"{_num(med)} [{_num(q1)}, {_num(q3)}]"


def latex_table(df: pd.DataFrame, experiment: str) -> str:
    """A booktabs table summarising ``experiment``'s rows of ``df``."""
    rows = df[df["experiment"] == experiment]
    s = summary_frame(rows)
    group = _grid_columns(rows)
    metrics = [m for m in TABLE_METRICS if m in s and s[m].notna().any()]
    extra = ["success"] if s["success"].notna().any() else []
    heads = ([_tex_escape(c) for c in group] + [TABLE_METRICS[m] for m in metrics]
             + ["success"] * bool(extra) + ["runs", "failed"])
    lines = [
        f"% attnquery: experiment {experiment}; median [interquartile range] over seeds",
        r"\begin{tabular}{" + "l" * len(group) + "r" * (len(heads) - len(group)) + "}",
        r"\toprule",
        " & ".join(heads) + r" \\",
        r"\midrule",
    ]
    for _, r in s.iterrows():
        cells = [_tex_escape(_num(r[c]) if not isinstance(r[c], str) else r[c]) if r[c] is not None
                 and not (isinstance(r[c], float) and math.isnan(r[c])) else "--" for c in group]
        cells = [c.replace(r"\textbackslash{}", "\\") if c.startswith("$") else c for c in cells]
        cells += [_metric_cell(r[m], integer=(METRIC_COLUMNS.get(m) is not None
                                              and str(METRIC_COLUMNS[m]) == "int64"))
                  for m in metrics]
        if extra:
            cells.append("--" if r["success"] is None or (isinstance(r["success"], float)
                                                           and math.isnan(r["success"]))
                         else f"{100 * r['success']:.0f}\\%")
        cells += [str(int(r["runs"])), str(int(r["failed"]))]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)


def write_table_tex(df: pd.DataFrame, experiment: str, path) -> None:
    """Write ``experiment``'s table to ``path`` atomically."""
    atomic_write_bytes(path, latex_table(df, experiment).encode())
