"""Figure lowprecision: what answers rounded to low precision cost an attacker (beyond the paper).

Panels: the relative error of W against the queries per unknown actually spent (queries counted
by the oracle over ``d^2 + d``), one curve per precision, for random heads and for real heads;
the queries per unknown each precision needs for a relative error of ``1e-2``; and the learner's
own error estimate against the measured error (the estimate is what lets it say, from the
residuals, that a precision is too low for a budget).
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..claims import (
    ROUNDING_FACTOR,
    Claim,
    ClaimSet,
    Number,
    extra_values,
    fit_number,
    number_name,
    ok_rows,
)
from ..theory import LOWPRECISION_GOAL_QUERIES_PER_UNKNOWN as GOAL_QUERIES_PER_UNKNOWN
from ..theory import LOWPRECISION_GOALS as GOALS
from ..theory import LOWPRECISION_TARGET as TARGET_REL_ERR
from ._common import SLOPE_FROM_PASSES, queries_needed, slope_fits
from ._core import register_figure, tight_layout

__all__ = ["CLAIMS", "lowprecision_claims", "lowprecision_frame", "slope_fits", "queries_needed",
           "lowprecision", "SLOPE_RANGE", "PRECISION_SLOPE_RANGE", "ESTIMATE_RANGE",
           "ESTIMATE_SHARE", "FLOAT64_MAX_ERR"]

#: interval the exponent of the error against queries, pooled over precisions, must fall in
SLOPE_RANGE = (-0.6, -0.4)
#: interval each precision's exponent must fall in
PRECISION_SLOPE_RANGE = (-0.75, -0.25)
#: measured error / the learner's estimate must lie in this range ...
ESTIMATE_RANGE = (0.5, 2.0)
#: ... in at least this share of the runs
ESTIMATE_SHARE = 0.95
#: float64 answers: the error stays at rounding level (no slope to fit there)
FLOAT64_MAX_ERR = 1e-12
FAMILIES = {"random": "random heads", "real": "real heads"}
#: target errors whose cost panel (c) draws, and their markers
TARGETS = (1e-2, 1e-3, 1e-4)
TARGET_MARKS = ("^", "o", "s")


def lowprecision_frame(df) -> pd.DataFrame:
    """The experiment's rows with ``spent`` (queries per unknown counted), ``estimate``,
    ``digits`` (effective significant digits) and ``unit`` (one head: family, d or layer and
    head, seed) added."""
    rows = df[df["experiment"] == "lowprecision"].copy()
    d = extra_values(rows, "d", np.nan).astype(float)
    rows["spent"] = rows["n_queries"].astype(float) / (d * d + d)
    rows["estimate"] = extra_values(rows, "W_error_estimate", np.nan).astype(float)
    rows["digits"] = extra_values(rows, "effective_digits", np.nan).astype(float)
    rows["passes"] = extra_values(rows, "n_passes", 0).astype(int)
    rows["unit"] = [f"{f}|{dd}|{la}|{he}|{s}" for f, dd, la, he, s in zip(
        rows["family"], rows["d"], rows["layer"], rows["head"], rows["seed"], strict=True)]
    return rows


def _order(rows) -> list[str]:
    """Precisions from the most to the fewest digits."""
    dig = rows.groupby("rounding")["digits"].first()
    return list(dig.sort_values(ascending=False).index)


def _frames(df):
    """The experiment's frame (every run) and its ok runs."""
    every = lowprecision_frame(df)
    return every, ok_rows(every)


@dataclass(frozen=True)
class LowprecisionData:
    """What the claims of the low-precision experiment read: every run's frame
    (:func:`lowprecision_frame`), its ok runs and their exponent fits (:func:`slope_fits`)."""

    every: pd.DataFrame
    rows: pd.DataFrame
    fits: dict


def lowprecision_data(df) -> LowprecisionData | None:
    """The :class:`LowprecisionData` of the result rows ``df`` (None without a low-precision
    row: the figure then states no claim)."""
    every, rows = _frames(df)
    if every.empty:
        return None
    return LowprecisionData(every, rows, slope_fits(rows) if len(rows) else {})


#: the claims of the low-precision experiment (one function each, named as the claim; the goals
#: are named ``lowprecision_goal_<rounding>``)
CLAIMS = ClaimSet(lowprecision_data)


@CLAIMS
def lowprecision_runs(data: LowprecisionData) -> Claim:
    """Every run returns an estimate that passed its own check."""
    every = data.every
    bad = every[every["status"] != "ok"]
    return Claim(
        "lowprecision_runs", "every run returns an estimate that passed its own check",
        bool(bad.empty),
        f"{len(every) - len(bad)}/{len(every)} runs ok"
        + (f"; failed: {sorted(set(bad['rounding']))}" if len(bad) else ""),
        numbers=(Number("lowprecisionRuns", len(every), "runs", "d", rows="lowprecision"),
                 Number("lowprecisionRunsOk", len(every) - len(bad), "runs", "d",
                        rows="lowprecision, status ok")))


@CLAIMS
def lowprecision_slope(data: LowprecisionData) -> Claim:
    """The error of W falls like queries^(-1/2): the exponent pooled over precisions in
    SLOPE_RANGE."""
    pooled = data.fits.get((None, None))
    whole = slope_fits(data.rows, min_passes=0).get((None, None))
    return Claim(
        "lowprecision_slope",
        f"the error of W falls like queries^(-1/2): exponent pooled over precisions (float64 "
        f"aside), runs with >= {SLOPE_FROM_PASSES} passes over W, in "
        f"[{SLOPE_RANGE[0]}, {SLOPE_RANGE[1]}]",
        bool(pooled is not None and SLOPE_RANGE[0] <= pooled.slope <= SLOPE_RANGE[1]),
        (f"exponent {pooled}" if pooled is not None else "no fit")
        + (f"; on every run {whole}" if whole is not None else ""),
        numbers=tuple(
            [fit_number("lowprecisionSlope", pooled, f"lowprecision, status ok, float64 aside, "
                        f">= {SLOPE_FROM_PASSES} passes over W")] if pooled is not None else [])
        + tuple([fit_number("lowprecisionSlopeAll", whole, "lowprecision, status ok, float64 "
                            "aside, every budget")] if whole is not None else []))


@CLAIMS
def lowprecision_slope_each(data: LowprecisionData) -> Claim:
    """Every precision's exponent lies in PRECISION_SLOPE_RANGE."""
    each = {k[1]: f for k, f in data.fits.items() if k[0] is None and k[1] is not None}
    out = sorted(s for s, f in each.items()
                 if not PRECISION_SLOPE_RANGE[0] <= f.slope <= PRECISION_SLOPE_RANGE[1])
    return Claim(
        "lowprecision_slope_each",
        f"every precision's exponent lies in [{PRECISION_SLOPE_RANGE[0]}, "
        f"{PRECISION_SLOPE_RANGE[1]}]",
        bool(each and not out),
        "; ".join(f"{s}: {f.slope:.3f} [{f.lo:.3f}, {f.hi:.3f}]" for s, f in each.items())
        + (f"; outside: {out}" if out else ""),
        numbers=tuple(fit_number(number_name("lowprecisionSlope", s), f,
                                 f"lowprecision, status ok, rounding = {s}")
                      for s, f in each.items()))


@CLAIMS
def lowprecision_float64(data: LowprecisionData) -> Claim | None:
    """float64 answers: the error of W stays at rounding level (FLOAT64_MAX_ERR) at every
    budget (no claim without float64 runs)."""
    f64 = data.rows[data.rows["rounding"] == "float64"]
    if not len(f64):
        return None
    worst = float(f64["rel_err_W"].max())
    return Claim(
        "lowprecision_float64", f"float64 answers: relative error of W <= "
        f"{FLOAT64_MAX_ERR:g} at every budget", bool(worst <= FLOAT64_MAX_ERR),
        f"worst {worst:.2e}",
        numbers=(Number("lowprecisionFloat64Worst", worst, "relative error of W", ".2g",
                        rows="lowprecision, status ok, rounding = float64",
                        factor=ROUNDING_FACTOR),))


@CLAIMS
def lowprecision_estimate(data: LowprecisionData) -> Claim:
    """The learner knows its error: measured / estimated error in ESTIMATE_RANGE in at least
    ESTIMATE_SHARE of the runs (float64 aside)."""
    est = data.rows[data.rows["rounding"] != "float64"]
    ratio = est["rel_err_W"] / est["estimate"]
    inside = (ratio >= ESTIMATE_RANGE[0]) & (ratio <= ESTIMATE_RANGE[1])
    return Claim(
        "lowprecision_estimate",
        f"the learner knows its error: measured / estimated error of W in "
        f"[{ESTIMATE_RANGE[0]}, {ESTIMATE_RANGE[1]}] in at least {ESTIMATE_SHARE:.0%} of the "
        "runs (float64 aside)",
        bool(len(est) and inside.mean() >= ESTIMATE_SHARE),
        f"{int(inside.sum())}/{len(est)} runs; ratio from {ratio.min():.2f} to "
        f"{ratio.max():.2f}" if len(est) else "no runs",
        numbers=(Number("lowprecisionEstimateRuns", len(est), "runs", "d",
                        rows="lowprecision, status ok, float64 aside"),
                 Number("lowprecisionEstimateRatioMin", float(ratio.min()), "ratio", ".2f",
                        rows="lowprecision, measured / estimated error of W"),
                 Number("lowprecisionEstimateRatioMax", float(ratio.max()), "ratio", ".2f",
                        rows="lowprecision, measured / estimated error of W")) if len(est)
        else ())


@CLAIMS
def lowprecision_target(data: LowprecisionData) -> Claim:
    """Every precision reaches TARGET_REL_ERR on every head within the budgets of the grid."""
    need = queries_needed(data.rows, stat="max", fits=data.fits)
    missing = sorted(f"{f}/{s}" for (f, s), v in need.items() if v[1] == "extrapolated")
    return Claim(
        "lowprecision_target",
        f"every precision reaches a relative error of W <= {TARGET_REL_ERR:g} on every head "
        "within the budgets of the grid",
        bool(need and not missing),
        "; ".join(f"{f}/{s}: {'<= ' if v[1] == 'at most' else ''}{v[0]:.3g}"
                  for (f, s), v in need.items()) + " queries per unknown"
        + (f"; not reached (extrapolated): {missing}" if missing else ""))


@CLAIMS
def lowprecision_goal(data: LowprecisionData) -> list[Claim]:
    """Per rounding of GOALS with real-head runs within GOAL_QUERIES_PER_UNKNOWN: the error of
    W within its goal on every run (a failed run counts against)."""
    real = data.every[data.every["family"] == "real"]
    claims = []
    for spec, goal in GOALS.items():
        g = real[(real["rounding"] == spec)
                 & (real["queries_per_unknown"] <= GOAL_QUERIES_PER_UNKNOWN)]
        if g.empty:
            continue
        okg = g[g["status"] == "ok"]
        worst = float(okg["rel_err_W"].max()) if len(okg) else float("nan")
        claims.append(Claim(
            f"lowprecision_goal_{spec.replace('=', '')}",
            f"real heads, {spec} answers: relative error of W <= {goal:g} with at most "
            f"{GOAL_QUERIES_PER_UNKNOWN:g} (d^2 + d) queries",
            bool(len(okg) == len(g) and worst <= goal),
            f"{len(okg)}/{len(g)} runs ok, worst {worst:.2e} (budgets "
            f"{sorted(set(g['queries_per_unknown']))} queries per unknown)",
            numbers=(Number(number_name("lowprecisionGoal", spec), worst,
                            "relative error of W", ".2g",
                            rows=f"lowprecision, real heads, rounding = {spec}, at most "
                            f"{GOAL_QUERIES_PER_UNKNOWN:g} queries per unknown"),)))
    return claims


def lowprecision_claims(df) -> list[Claim]:
    """Claims of the low-precision experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


LOWPRECISION_CAPTION = """\
**Low-precision answers (beyond the paper).** ``LowPrecisionValueQueryLearner`` against answers
rounded to float32, float16, bfloat16 or k significant digits (float64: answers as they are). (a)
Random dense heads and (b) heads of the real checkpoint: the relative Frobenius error of W against
the queries per unknown the oracle counted (queries / (d^2 + d)), one curve per precision (median
over heads), with the exponent fitted on runs of at least four passes over W and its 95%
interval; averaging the rounding errors of distinct probes gives -1/2. (c) The queries per
unknown each precision needs for a relative error of 1e-2, 1e-3 and 1e-4 (median head; open
markers: extrapolated with the fitted exponent). (d) The learner's own error estimate, from the
residuals of its measurements, against the measured error: the number it gives where a precision
is too low for a budget.
"""


@register_figure(
    "lowprecision",
    experiments=["lowprecision"],
    category="Noisy and sign-only oracles",
    caption=LOWPRECISION_CAPTION,
)
def lowprecision(df):
    """Error against queries per unknown per precision; queries for 1e-2; estimate vs error."""
    data = lowprecision_data(df)
    every, rows, fits = (data.every, data.rows, data.fits) if data else (*_frames(df), {})
    claims = CLAIMS.check(data) if data else []
    fig, axes = plt.subplots(2, 2, figsize=(6.75, 5.8))
    order = _order(rows) if len(rows) else []
    cmap = plt.get_cmap("viridis")
    color = {s: cmap(i / max(1, len(order) - 1)) for i, s in enumerate(order)}
    for ax, fam in zip(axes[0], FAMILIES, strict=True):
        _error_panel(ax, rows[rows["family"] == fam], fam, fits, order, color)
    _cost_panel(axes[1, 0], rows, fits, order)
    _estimate_panel(axes[1, 1], rows, order, color, claims)
    tight_layout(fig)
    return fig, claims


def _error_panel(ax, g, fam, fits, order, color) -> None:
    """(a), (b): the error of W against the queries per unknown spent, one curve per precision
    (median and range over heads), for the heads ``g`` of family ``fam``."""
    for spec in order:
        h = g[g["rounding"] == spec]
        if h.empty:
            continue
        agg = h.groupby("queries_per_unknown").agg(
            spent=("spent", "median"), med=("rel_err_W", "median"),
            lo=("rel_err_W", "min"), hi=("rel_err_W", "max")).sort_index()
        f = fits.get((fam, spec))
        lab = spec + (f" ({f.slope:.2f})" if f is not None else "")
        ax.errorbar(agg["spent"], agg["med"], yerr=[agg["med"] - agg["lo"],
                                                    agg["hi"] - agg["med"]],
                    fmt="o-", ms=3, capsize=1.5, lw=0.9, color=color[spec], label=lab)
    ref = g[(g["rounding"] == "float16") & (g["passes"] >= SLOPE_FROM_PASSES)]
    if len(ref):
        k0 = ref["queries_per_unknown"].min()
        x0 = float(ref[ref["queries_per_unknown"] == k0]["spent"].median())
        y0 = float(ref[ref["queries_per_unknown"] == k0]["rel_err_W"].median())
        xs = np.array([x0, float(g["spent"].max())])
        ax.plot(xs, 3 * y0 * (xs / x0) ** -0.5, "k--", lw=0.7,
                label=r"$\propto$ queries$^{-1/2}$")
    ax.axhline(TARGET_REL_ERR, color="k", lw=0.6, ls=":")
    ax.set(xscale="log", yscale="log", xlabel="queries per unknown, counted / $(d^2 + d)$",
           ylabel=r"$\|\hat W - W\|_F / \|W\|_F$")
    pooled = fits.get((fam, None))
    heads = g["unit"].astype(str).str.rsplit("|", n=1).str[0].nunique()
    desc = (f"d = {', '.join(str(int(x)) for x in sorted(g['d'].dropna().unique()))}"
            if fam == "random" else "d = 384" if len(g) else "")
    ax.set_title(f"({'ab'[list(FAMILIES).index(fam)]}) {FAMILIES[fam]} ({heads} heads"
                 f"{', ' + desc if desc else ''})"
                 + (f"\nexponent {pooled.slope:.3f} [{pooled.lo:.3f}, {pooled.hi:.3f}] "
                    f"(>= {SLOPE_FROM_PASSES} passes)" if pooled is not None else ""),
                 fontsize=7.5)
    if len(g):  # room below the curves for the legend
        lo = float(g["rel_err_W"].min())
        ax.set_ylim(bottom=lo / 10 ** (1.0 + 0.12 * g["rounding"].nunique()))
        ax.legend(fontsize=5.5, ncol=2, loc="lower center", title="precision (exponent)",
                  title_fontsize=5.5,  # above the float64 curve, which lies lowest
                  bbox_to_anchor=(0.5, 0.13 if (g["rounding"] == "float64").any() else 0))


def _cost_panel(ax, rows, fits, order) -> None:
    """(c) what each precision costs: queries per unknown for several target errors."""
    specs = [s for s in order if s != "float64"][::-1]  # fewest digits first
    fam_color = {"random": "C0", "real": "C1"}
    for ti, tgt in enumerate(TARGETS):
        need = queries_needed(rows, tgt, fits=fits) if len(rows) else {}
        for fi, fam in enumerate(FAMILIES):
            pts = [(i + 0.12 * (fi - 0.5), need[(fam, s)]) for i, s in enumerate(specs)
                   if (fam, s) in need]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1][0] for p in pts], "-", color=fam_color[fam],
                    lw=0.5, alpha=0.6)
            for x, (k, kind) in pts:
                ax.plot([x], [k], TARGET_MARKS[ti], color=fam_color[fam], ms=4,
                        mfc=fam_color[fam] if kind == "measured" else "none")
    for fam in FAMILIES:
        ax.plot([], [], "-", color=fam_color[fam], label=FAMILIES[fam])
    for tgt, mk in zip(TARGETS, TARGET_MARKS, strict=True):
        ax.plot([], [], mk, color="k", ms=4, label=f"error {tgt:g}")
    ax.set_xticks(range(len(specs)))
    ax.set_xticklabels(specs, rotation=30, fontsize=6)
    ax.set(yscale="log", ylabel="queries per unknown")
    ax.set_title("(c) queries per unknown for a relative error of W (median head)\nfilled: "
                 "measured; open: smallest budget or fewer / extrapolated", fontsize=7.5)
    ax.legend(fontsize=5.5, loc="upper right", ncol=2)


def _estimate_panel(ax, rows, order, color, claims) -> None:
    """(d) the learner's estimate of its error against the measured error."""
    est = rows[rows["rounding"] != "float64"]
    for spec in order:
        h = est[est["rounding"] == spec]
        if len(h):
            ax.plot(h["estimate"], h["rel_err_W"], "o", ms=2.5, color=color[spec], alpha=0.7)
    if len(est):
        lim = np.array([est[["estimate", "rel_err_W"]].min().min(),
                        est[["estimate", "rel_err_W"]].max().max()])
        ax.plot(lim, lim, "k-", lw=0.7, label="measured = estimated")
        for f in ESTIMATE_RANGE:
            ax.plot(lim, f * lim, "k:", lw=0.6)
        ax.legend(fontsize=6, loc="upper left")
    c = [x for x in claims if x.name == "lowprecision_estimate"]
    ax.set(xscale="log", yscale="log", xlabel="the learner's estimate (from its residuals)",
           ylabel="measured relative error of W")
    ax.set_title("(d) estimated against measured error"
                 + (f"\n{c[0].detail}" if c else ""), fontsize=7.5)
