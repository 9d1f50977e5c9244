"""Figure "served": heads with their biases extracted from served answers (beyond the paper).

Drawn from the rows of the ``served`` experiment only: the relative error of W against the
queries spent per unknown ``(d^2 + 2d + 1)``, per precision, beside the floor set by the format
(the error of W from the weights rounded to it), and the error over that floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

from ..claims import NOISE_FACTOR, Claim, ClaimSet, Number, extra_values, number_name
from ._core import register_figure

#: the issue's goals: precision -> (largest budget in (d^2 + 2d + 1), goal on W). float32: the
#: error itself; float16 and bfloat16: the error over the format's floor
GOALS = {"float32": (3.0, 3e-7), "float16": (50.0, 2.0), "bfloat16": (10.0, 1.5)}
#: a fit scored against the checkpoint stays above this fraction of the format's floor
FLOOR_SLACK = 0.9
COLORS = {"float32": "C0", "float16": "C1", "bfloat16": "C2"}
#: errors are drawn no lower than this on log axes
LOW = 1e-12


def _rows(df):
    rows = df[df["experiment"] == "served"]
    if "variant" in rows:  # whole layers: figures/served_layers.py
        rows = rows[rows["variant"] != "layer"]
    return rows, rows[rows["status"] == "ok"]


@dataclass(frozen=True)
class ServedData:
    """What the claims of the served experiment read: its head rows and those that ran to an
    answer."""

    rows: pd.DataFrame
    ok: pd.DataFrame


def served_data(df) -> ServedData | None:
    """The :class:`ServedData` of the result rows ``df`` (None without a served head row: the
    figure then states no claim)."""
    rows, ok = _rows(df)
    return ServedData(rows, ok) if len(rows) else None


#: the claims of the served experiment (one function each, named as the claim; the goals are
#: named ``served_goal_<format>``)
CLAIMS = ClaimSet(served_data)


@CLAIMS
def served_runs(data: ServedData) -> Claim:
    """Every served head is extracted with its biases (no refusal)."""
    ok, rows = data.ok, data.rows
    return Claim("served_runs", "every served head is extracted with its biases (no refusal)",
                 bool(len(ok) == len(rows)), f"{len(ok)}/{len(rows)} cells ok", n_runs=len(ok))


@CLAIMS
def served_no_overflow(data: ServedData) -> Claim:
    """No query of the learner makes the served box overflow."""
    ok = data.ok
    overflow = extra_values(ok, "n_overflow", 0).astype(float)
    return Claim("served_no_overflow", "no query of the learner makes the served box overflow "
                 "(every answer finite)", bool((overflow == 0).all()),
                 f"{int(overflow.sum())} answers not finite over {len(ok)} cells", n_runs=len(ok))


@CLAIMS
def served_floor(data: ServedData) -> Claim:
    """In float16 and bfloat16 no error of W is below FLOOR_SLACK times its format's floor."""
    ok = data.ok
    floor = extra_values(ok, "floor_W").astype(float)
    eW = ok["rel_err_W"].astype(float)
    narrow = ok["rounding"] != "float32"
    above = (eW[narrow] >= FLOOR_SLACK * floor[narrow])
    return Claim("served_floor", f"in float16 and bfloat16 no error of W is below {FLOOR_SLACK} "
                 "times the floor of its format (the error of the rounded weights): the format, "
                 "not the learner, bounds what served answers reveal",
                 bool(above.all()), f"{int(above.sum())}/{int(narrow.sum())} cells",
                 n_runs=int(narrow.sum()))


@CLAIMS
def served_goal(data: ServedData) -> list[Claim]:
    """Per format with cells within its goal's budget (GOALS): every head meets the goal in some
    cell within the budget, no answer overflowing."""
    rows, ok = data.rows, data.ok
    claims = []
    for prec, (budget, goal) in GOALS.items():
        # per head: met when some cell within the goal's budget meets it (a smaller budget
        # that does not, beside a larger one that does, contradicts nothing)
        mine = rows[(rows["rounding"] == prec) & (rows["queries_per_unknown"] <= budget)]
        if not len(mine):
            continue
        sel = ok[(ok["rounding"] == prec) & (ok["queries_per_unknown"] <= budget)]
        e = sel["rel_err_W"].astype(float)
        if prec == "float32":
            val, what = e, f"relative error of W at most {goal:g}"
        else:
            val = e / extra_values(sel, "floor_W").astype(float)
            what = f"error of W within {goal:g} times the format's floor"
        good = (val <= goal) & (extra_values(sel, "n_overflow", 0).astype(float) == 0)
        keys = ["layer", "head", "seed"]
        heads = mine.groupby(keys).size().index
        met = set(sel[good.to_numpy()].set_index(keys).index)
        n_met = sum(k in met for k in heads)
        best = (pd.Series(val.to_numpy(), index=sel.set_index(keys).index)
                .groupby(level=[0, 1, 2]).min() if len(sel) else pd.Series(dtype=float))
        worst = float(best.max()) if len(best) else float("nan")
        claims.append(Claim(
            f"served_goal_{prec}",
            f"{prec}-served heads with biases: {what} at <= {budget:g} (d^2 + 2d + 1) queries, "
            "no answer overflowing, on every head",
            bool(n_met == len(heads)),
            f"{n_met}/{len(heads)} heads (worst best-cell value {worst:.3g})",
            n_runs=len(sel), numbers=_goal_numbers(prec, budget, sel, val, len(heads), n_met)))
    return claims


def served_claims(df) -> list[Claim]:
    """The claims of the served experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


def _goal_numbers(prec, budget, sel, val, n_heads, n_met) -> tuple:
    """The numbers of a ``served_goal_<prec>`` claim: heads, heads meeting the goal, and over
    each head's best cell within the budget (smallest W value) the worst and median error of
    W, c and v (float32) or their worst and median ratios to their formats' floors."""
    what = f"served {prec}, <= {budget:g} (d^2 + 2d + 1) queries, best cell per head"
    out = [Number(number_name("served", prec, "heads"), n_heads, "heads", "d", rows=what),
           Number(number_name("served", prec, "heads met"), n_met, "heads", "d", rows=what)]
    if not len(sel):
        return tuple(out)
    best = (pd.DataFrame({"val": val.to_numpy(), "row": np.arange(len(sel))},
                         index=sel.set_index(["layer", "head", "seed"]).index)
            .sort_values("val", kind="stable").groupby(level=[0, 1, 2]).head(1)["row"])
    b = sel.iloc[np.sort(best.to_numpy())]
    for q in ("W", "c", "v"):
        if f"rel_err_{q}" not in b:
            continue
        e = b[f"rel_err_{q}"].astype(float)
        if prec == "float32":
            x, unit, label, factor = e, "relative error", "error", NOISE_FACTOR
        else:  # bit-identical on the kernels measured (docs/reproducibility.md)
            x = e / extra_values(b, f"floor_{q}", np.nan).astype(float)
            unit, label, factor = "error / floor", "ratio", None
        x = x[np.isfinite(x)]
        if not len(x):
            continue
        out += [Number(number_name("served", prec, "worst", label, q), float(x.max()), unit,
                       ".3g", rows=what, factor=factor),
                Number(number_name("served", prec, "median", label, q), float(x.median()),
                       unit, ".3g", rows=what, factor=factor)]
    return tuple(out)


SERVED_CAPTION = """\
**Heads served in float32, float16 and bfloat16 (beyond the paper).** Each head of the
checkpoint, with its biases, is computed as an engine computes it (weights, inputs and every
operation rounded to the format; ``attnquery.precision``) and extracted by
``LowPrecisionValueQueryLearner(fit_bias=True)``. (a) Relative error of W against the checkpoint's
weights, against the queries spent per unknown (d^2 + 2d + 1); dashed: each format's floor, the
error of W from the weights rounded to the format (0 in float32 for float32 weights). (b) The
error over the floor (float16, bfloat16); dotted: the goals (2x in float16, 1.5x in bfloat16).
One point per run (head and budget); the legends count them: a study with few served cells
draws few points.
"""


@register_figure("served", experiments=["served"], category="Real heads",
                 caption=SERVED_CAPTION)
def served(df):
    """Errors of W against queries per unknown, and over the format's floor."""
    claims = served_claims(df)
    _, ok = _rows(df)
    fig, axes = plt.subplots(1, 2, figsize=(6.75, 2.8), layout="constrained")
    ax, bx = axes
    for prec, color in COLORS.items():
        sel = ok[ok["rounding"] == prec]
        if not len(sel):
            continue
        q = extra_values(sel, "spent_per_unknown").astype(float)
        e = np.maximum(sel["rel_err_W"].astype(float), LOW)
        ax.scatter(q, e, s=12, color=color, label=f"{prec} ({len(sel)} runs)")
        fl = extra_values(sel, "floor_W").astype(float)
        if prec != "float32":
            ax.axhline(float(np.median(fl)), color=color, ls="--", lw=0.8,
                       label=f"{prec}: floor (weights rounded)")
            bx.scatter(q, e / fl, s=12, color=color, label=f"{prec} ({len(sel)} runs)")
            bx.axhline(GOALS[prec][1], color=color, ls=":", lw=0.8,
                       label=f"{prec}: goal {GOALS[prec][1]:g}x")
    if (ok["rounding"] == "float32").any():
        ax.axhline(GOALS["float32"][1], color=COLORS["float32"], ls=":", lw=0.8,
                   label=f"float32: goal {GOALS['float32'][1]:g}")
    ax.set(xscale="log", yscale="log", xlabel="queries / $(d^2 + 2d + 1)$",
           ylabel="relative error of $W$", title="(a) error of $W$")
    bx.set(xscale="log", yscale="log", xlabel="queries / $(d^2 + 2d + 1)$",
           ylabel="error / floor", title="(b) over the format's floor")
    # plain tick labels (1.2, 1.5, ...) on the ratio axis, which spans less than a decade
    plain = matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}")
    bx.yaxis.set_major_formatter(plain)
    bx.yaxis.set_minor_formatter(plain)
    for a in axes:  # the budgets, also less than a decade
        a.xaxis.set_major_formatter(plain)
        a.xaxis.set_minor_formatter(plain)
    for a in axes:
        if a.has_data():
            a.legend(fontsize=6, loc="best", frameon=True)
    return fig, claims
