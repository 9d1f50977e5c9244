"""Figure defence_rounding: output rounding as a defence (beyond the paper, after Sec. 6)."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from ..claims import Claim, ClaimSet, Number, extra_values
from ..metrics import fit_linear
from ..theory import USEFUL_REL_ERR, precision_digits
from ._common import inf_to, queries_needed, slope_fits
from ._core import register_figure, tight_layout

__all__ = ["CLAIMS", "rounding_claims", "useful_digits", "rounding_costs", "defence_rounding"]

DEFENCE_ROUNDING_CAPTION = """\
**Output rounding as a defence.** The API returns f(X) rounded to k significant decimal digits, or
cast to float16 or bfloat16 (open markers, placed at the digits with the same worst-case relative
error: about 4.0 and 3.1). Median relative Frobenius error of the recovered W over seeds against
the digits kept, for Theorem 4.1's exact learner, Theorem 6.1's noisy learner (given ``W_bound =
||W||_F`` and ``mu = min |v_i|``, assumption check off because rounding error is relative) and the
low-rank sketch learner (rank known). The heads have rank ``rank`` so that all three apply. Dotted
vertical lines: the fewest digits from which every median error is <= 0.1 ("useful" extraction). A
learner that fails (an answer no single head can give) is drawn at the top.
"""


# ---------------------------------------------------------------------------------------------
#: targets of the cost panel of defence_rounding
COST_TARGETS = (1e-2, 1e-4, 1e-6)


def _curve(learner, q) -> str:
    """The curve a rounding row belongs to: its learner, and the low-precision learner's budget."""
    return f"lowprecision@{q:g}" if learner == "lowprecision" else learner


def _rounding_rows(df):
    """Every rounding row with its ``curve`` and effective digits (``eff``); a failed run
    (status not ok) counts as an infinite error."""
    rows = df[df["experiment"] == "rounding"].copy()
    err = rows["rel_err_W"].astype(float)
    rows["rel_err_W"] = np.where(rows["status"] == "ok", err, np.inf)
    q = rows["queries_per_unknown"] if "queries_per_unknown" in rows else np.nan
    rows["curve"] = [_curve(ln, qq) for ln, qq in
                     zip(rows["learner"], np.broadcast_to(q, len(rows)), strict=True)]
    rows["eff"] = rows["rounding"].map(precision_digits).astype(float)
    return rows


def useful_digits(df) -> dict:
    """Per curve (learner, and budget for the low-precision learner): the fewest digits from
    which every median relative error of W is <= 0.1 (failed runs count as infinite errors)."""
    return _useful_digits(_rounding_rows(df))


def _useful_digits(rows) -> dict:
    """:func:`useful_digits` on the rows of :func:`_rounding_rows`."""
    rows = rows[rows["rounding"].str.startswith("digits=")]
    out = {}
    for lname, g in rows.groupby("curve", sort=True):
        k = g["rounding"].str.split("=").str[1].astype(int)
        med = g.assign(k=k).groupby("k")["rel_err_W"].median().sort_index()
        good = med <= USEFUL_REL_ERR
        first = None
        for kk in med.index[::-1]:
            if good[kk]:
                first = int(kk)
            else:
                break
        out[lname] = first
    return out


def rounding_costs(df, target: float) -> dict:
    """Queries per unknown the low-precision learner needs for a median relative error of W of
    ``target`` at each rounding (see :func:`attnquery.figures.lowprecision.queries_needed`;
    heads of every d pooled): rounding -> (queries per unknown, kind)."""
    return _rounding_costs(_rounding_rows(df), (target,))[target]


def _rounding_costs(rows, targets) -> dict:
    """target -> :func:`rounding_costs` for each of ``targets``, on the rows of
    :func:`_rounding_rows` (the frame and its slope fits built once)."""
    lp = rows[(rows["learner"] == "lowprecision") & (rows["status"] == "ok")]
    if lp.empty:
        return {t: {} for t in targets}
    d = lp["d"].astype(float)
    lp = lp.assign(family="rounding", spent=lp["n_queries"] / (d * d + d),
                   unit=lp["d"].astype(str) + "|" + lp["seed"].astype(str),
                   passes=extra_values(lp, "n_passes", 0).astype(int))
    fits = slope_fits(lp)
    return {t: {spec: v for (_, spec), v in queries_needed(lp, t, fits=fits).items()}
            for t in targets}


@dataclass(frozen=True)
class RoundingData:
    """What the claims of the rounding experiment read: its rows (:func:`_rounding_rows`) and
    each curve's useful digits (:func:`useful_digits`)."""

    rows: object
    useful: dict


def rounding_data(df) -> RoundingData:
    """The :class:`RoundingData` of the result rows ``df``."""
    rows = _rounding_rows(df)
    return RoundingData(rows, _useful_digits(rows))


#: the claims of the rounding experiment (one function each, named as the claim; the per-curve
#: claim is named ``rounding_<curve>``)
CLAIMS = ClaimSet(rounding_data)


@CLAIMS
def rounding(data: RoundingData) -> list[Claim]:
    """Per curve (learner, and budget of the low-precision learner): the error of W falls as
    more digits are kept (slope of log10 error against digits < 0)."""
    dig = data.rows[(data.rows["status"] == "ok")
                    & data.rows["rounding"].str.startswith("digits=")]
    claims = []
    for lname, g in dig.groupby("curve", sort=True):
        k = g["rounding"].str.split("=").str[1].astype(float)
        y = np.log10(np.clip(g["rel_err_W"].astype(float), 1e-300, 1e300))
        try:
            fit = fit_linear(k, y)
            ok = fit.hi < 0
            detail = (f"log10 error per digit {fit}; useful (median rel. error <= "
                      f"{USEFUL_REL_ERR:g}) from {data.useful.get(lname)} digits")
        except Exception as exc:
            ok, detail = False, f"no fit: {exc}"
        claims.append(Claim(
            f"rounding_{lname.replace('@', '_')}",
            f"{lname}: the error of W falls as more digits are kept (slope of log10 error "
            "against digits < 0)", bool(ok), detail))
    return claims


@CLAIMS
def rounding_lowprecision_useful(data: RoundingData) -> Claim | None:
    """At its smallest budget the low-precision learner extracts useful heads from fewer digits
    than Theorem 4.1's learner (no claim without both curves)."""
    useful = data.useful
    lp = {c: k for c, k in useful.items() if c.startswith("lowprecision@")}
    if not lp or "exact" not in useful:
        return None
    q, k = min(lp.items(), key=lambda kv: float(kv[0].split("@")[1]))
    ex = useful["exact"]
    return Claim(
        "rounding_lowprecision_useful",
        f"at its smallest budget ({q.split('@')[1]} queries per unknown) the low-precision "
        "learner extracts useful heads from fewer digits than Theorem 4.1's learner",
        bool(k is not None and (ex is None or k < ex)),
        f"useful from {k} digits against {ex} (exact learner, 1 query per unknown)",
        numbers=tuple(Number(n, v, "significant digits", "d",
                             rows=f"rounding, smallest digits with median relative error "
                             f"<= {USEFUL_REL_ERR:g}")
                      for n, v in (("roundingUsefulDigitsLowprecision", k),
                                   ("roundingUsefulDigitsExact", ex)) if v is not None))


def rounding_claims(df) -> list[Claim]:
    """The claims of the rounding experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


@register_figure(
    "defence_rounding",
    experiments=["rounding"],
    category="Noisy and sign-only oracles",
    caption=DEFENCE_ROUNDING_CAPTION,
)
def defence_rounding(df):
    """Relative error of W against digits kept, per learner (and budget of the low-precision
    learner), with the usefulness threshold; and the queries each rounding costs an attacker."""
    data = rounding_data(df)
    rows, useful = data.rows, data.useful
    claims = CLAIMS.check(data)
    costs = _rounding_costs(rows, COST_TARGETS)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(6.75, 3.4), width_ratios=(1.6, 1))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    _digits_panel(ax, rows, useful, colors)
    _cost_panel(ax2, rows, costs, colors)
    tight_layout(fig)
    return fig, claims


def _digits_panel(ax, rows, useful, colors) -> None:
    """(a) the median error of W against the digits kept, per curve, with the usefulness
    threshold (failed runs drawn at the top)."""
    finite = rows["rel_err_W"][np.isfinite(rows["rel_err_W"].astype(float))]
    top = max(float(finite.max()) * 10, 10.0) if len(finite) else 10.0
    labels = {"exact": "exact (Thm 4.1)", "noisy": "noisy (Thm 6.1)",
              "lowrank": "low-rank sketch"}
    curves = sorted(rows["curve"].unique(), key=lambda c: (
        c.startswith("lowprecision"), float(c.split("@")[1]) if "@" in c else 0.0, c))
    for c, lname in enumerate(curves):
        g = rows[rows["curve"] == lname]
        col = colors[c % len(colors)]
        label = (labels.get(lname, lname) if "@" not in lname else
                 f"low precision, {lname.split('@')[1]} queries/unknown")
        dg = g[g["rounding"].str.startswith("digits=")]
        agg = dg.groupby("eff")["rel_err_W"].median().sort_index()
        k = useful.get(lname)
        ax.plot(agg.index, inf_to(agg.values, top), "o-", color=col, ms=3, lw=1,
                label=label + (f" (useful from {k})" if k is not None else " (never useful)"))
        for fmt, mk in (("float16", "s"), ("bfloat16", "D")):
            h = g[g["rounding"] == fmt]
            if len(h):
                ax.plot([h["eff"].iloc[0]], [inf_to([h["rel_err_W"].median()], top)[0]], mk,
                        color=col, ms=4.5, mfc="none")
    ax.plot([], [], "ks", mfc="none", label="float16 (at its equivalent digits)")
    ax.plot([], [], "kD", mfc="none", label="bfloat16")
    ax.axhline(USEFUL_REL_ERR, color="k", lw=0.8, ls="--",
               label=f"useful: rel. error <= {USEFUL_REL_ERR:g}")
    ax.set(yscale="log", xlabel="significant decimal digits kept by the API",
           ylabel=r"$\|\hat W - W\|_F / \|W\|_F$")
    if len(rows):
        r0 = rows.iloc[0]
        dl = ", ".join(str(int(x)) for x in sorted(rows["d"].unique()))
        ax.set_title(f"(a) error of W (median; d = {dl}, rank {int(r0['rank'])}, "
                     r"$\|W\|_F$" + f" = {r0['W_bound']:g});\nfailed runs count as infinite "
                     "error", fontsize=7.5)
    ax.legend(fontsize=5.5, loc="lower left", ncol=1)


def _cost_panel(ax2, rows, costs, colors) -> None:
    """(b) what a rounding costs: queries per unknown for each target error."""
    for ti, (tgt, mk) in enumerate(zip(COST_TARGETS, ("o", "s", "^"), strict=True)):
        cost = costs[tgt]
        pts = sorted((precision_digits(s), v) for s, v in cost.items())
        if pts:
            ax2.plot([p[0] for p in pts], [p[1][0] for p in pts], mk + "-", color=colors[ti],
                     ms=3.5, lw=0.9, label=f"error {tgt:g}")
            for x, (q, kind) in pts:
                if kind != "measured":
                    ax2.plot([x], [q], mk, color="w", ms=2)  # hollow: a bound or extrapolated
        for lname in ("exact", "noisy"):
            g = rows[rows["curve"] == lname].groupby("eff")["rel_err_W"].median()
            ok = g[g <= tgt]
            if len(ok):
                ax2.plot(ok.index, np.ones(len(ok)), mk, color="0.5", ms=3.5, mfc="none")
    ax2.plot([], [], "o", color="0.5", mfc="none", ms=3.5,
             label="exact, noisy learners\n(where they reach it)")
    ax2.set(yscale="log", xlabel="significant decimal digits kept by the API",
            ylabel="queries per unknown, counted / $(d^2 + d)$")
    ax2.set_title("(b) queries per unknown for a relative error of W\n(low-precision learner; "
                  "hollow: smallest budget or fewer, or extrapolated)", fontsize=7.5)
    ax2.legend(fontsize=5.5, loc="upper right", title="median head", title_fontsize=5.5)
