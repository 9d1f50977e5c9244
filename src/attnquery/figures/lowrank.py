"""Figures of the low-rank experiments: phase transition, query counts, wall time."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .. import theory
from ..claims import (
    ROUNDING_FACTOR,
    Claim,
    ClaimSet,
    Number,
    fit_number,
    ok_rows,
    threshold_claim,
)
from ..metrics import fit_power_law
from ..theory import PHASE_TOL, SKETCH_TOL, lowrank_floor
from ._core import register_figure
from ._joined import learner_label

#: interval the fitted exponent of the smallest successful m against r d must fall in
LINEAR_RANGE = (0.85, 1.15)
#: interval the fitted exponent of m_50 against the statistical dimension delta(d, r) must fall
#: in, and the interval its 95% confidence interval must lie inside
STATDIM_RANGE = (0.85, 1.15)
STATDIM_CI_RANGE = (0.8, 1.2)
#: largest c_50 = m_50 / (r 2d) allowed at any (d, r) (Theorem 5.1's O(r d), constant measured):
#: 20 seeds give at most 2.93 (d = 32, r = 1) on d <= 32, r <= 4; 4 seeds scatter it by +-0.3
C50_MAX = 3.5
#: the sketch learner must use at most this multiple of r (2d - r) + d queries for d >= SKETCH_MIN_D
SKETCH_FACTOR = 1.05
SKETCH_MIN_D = 256


#: markers of the other registered learners a config lists (sketch and exact have their own)
OTHER_MARKERS = "vDP*Xh<>p"


def _other_learners(sc) -> list[str]:
    """The learners of ``lowrank_scale`` rows other than sketch and exact, sorted."""
    return sorted(set(sc["learner"]) - {"sketch", "exact"})


def _phase_rows(df):
    rows = df[df["experiment"] == "lowrank_phase"]
    return rows[rows["status"] == "ok"]


def success_table(df) -> pd.DataFrame:
    """Success rate per (d, rank, c): columns d, rank, c, rate, n (over seeds and solvers)."""
    rows = _phase_rows(df)
    if rows.empty:
        return pd.DataFrame(columns=["d", "rank", "c", "rate", "n"])
    g = rows.assign(s=rows["success"].fillna(False).astype(float))
    t = g.groupby(["d", "rank", "c"])["s"].agg(["mean", "size"]).reset_index()
    return t.rename(columns={"mean": "rate", "size": "n"})


def transition_points(df) -> pd.DataFrame:
    """The empirical 50% point of each (d, r): ``c_50`` and ``m_50 = c_50 r (2d)``.

    ``c_50`` interpolates linearly between the last grid value of c with success rate below 1/2
    and the first at or above it. Rows where the rate never reaches 1/2 get NaN; rows where it
    is already reached at the smallest c are flagged ``censored``.
    """
    out = []
    for (d, r), g in success_table(df).groupby(["d", "rank"]):
        g = g.sort_values("c")
        c, p = g["c"].to_numpy(float), g["rate"].to_numpy(float)
        above = np.flatnonzero(p >= 0.5)
        censored = False
        if above.size == 0:
            c50 = np.nan
        elif above[0] == 0:
            c50, censored = c[0], True
        else:
            i = above[0]
            c0, c1, p0, p1 = c[i - 1], c[i], p[i - 1], p[i]
            c50 = c0 + (0.5 - p0) * (c1 - c0) / (p1 - p0)
        out.append({"d": int(d), "rank": int(r), "c50": c50, "m50": c50 * r * 2 * d,
                    "censored": censored})
    cols = {"d": int, "rank": int, "c50": float, "m50": float, "censored": bool}
    return pd.DataFrame(out, columns=list(cols)).astype(cols)


@cache
def _statdim(d: int, r: int) -> float:
    return theory.nuclear_statdim(d, r)


def statdim_table(pairs) -> pd.DataFrame:
    """``delta(d, r)`` (:func:`attnquery.theory.nuclear_statdim`) for each (d, r) in ``pairs``.

    Columns d, rank, delta and ``c_delta = delta / (r 2d)``, the 50% point of Gaussian
    measurements on the axis of the phase diagram.
    """
    pairs = sorted({(int(d), int(r)) for d, r in pairs})
    delta = [_statdim(d, r) for d, r in pairs]
    out = pd.DataFrame(pairs, columns=["d", "rank"]).astype(int)
    out["delta"] = np.asarray(delta, dtype=float)
    out["c_delta"] = out["delta"] / (2 * out["rank"] * out["d"])
    return out


@dataclass(frozen=True)
class LowrankData:
    """What the claims of the low-rank experiments read: the result rows and the 50% points of
    the phase diagram (:func:`transition_points`)."""

    df: pd.DataFrame
    points: pd.DataFrame


def lowrank_data(df) -> LowrankData:
    """The :class:`LowrankData` of the result rows ``df``."""
    return LowrankData(df, transition_points(df))


#: every claim of the low-rank figures (one function each, named as the claim)
CLAIMS = ClaimSet(lowrank_data)


def _fit_points(tp):
    """The 50% points inside the c grid (crossed, not censored)."""
    return tp[np.isfinite(tp["m50"]) & ~tp["censored"]]


@CLAIMS
def nuclear_linear(data: LowrankData) -> Claim:
    """The smallest successful m of the nuclear-norm learner grows linearly in r d (exponent in
    LINEAR_RANGE)."""
    fit_rows = _fit_points(data.points)
    rd = fit_rows["d"] * fit_rows["rank"]
    if len(fit_rows) < 3 or rd.nunique() < 2:
        return Claim(
            "nuclear_linear", "the smallest successful m grows linearly in r d", False,
            f"only {len(fit_rows)} (d, r) points with a 50% crossing inside the c grid",
        )
    fit = fit_power_law(rd, fit_rows["m50"])
    return Claim(
        "nuclear_linear",
        "the smallest successful m of the nuclear-norm learner grows linearly in r d "
        f"(fitted exponent in [{LINEAR_RANGE[0]}, {LINEAR_RANGE[1]}])",
        bool(LINEAR_RANGE[0] <= fit.slope <= LINEAR_RANGE[1]),
        f"exponent {fit} over {len(fit_rows)} (d, r) points; "
        f"C = m_50 / (r (2d)) from {fit_rows['c50'].min():.2f} to "
        f"{fit_rows['c50'].max():.2f}",
        numbers=(fit_number("nuclearLinearExponent", fit,
                            "lowrank_phase, 50% points against r d"),),
    )


@CLAIMS
def nuclear_statdim(data: LowrankData) -> Claim:
    """m_50 follows the statistical dimension delta(d, r) (exponent in STATDIM_RANGE, its
    interval inside STATDIM_CI_RANGE)."""
    fit_rows = _fit_points(data.points)
    delta = statdim_table(zip(fit_rows["d"], fit_rows["rank"], strict=True))
    fit_rows = fit_rows.merge(delta, on=["d", "rank"], how="left")
    statement = (
        "m_50 follows the statistical dimension delta(d, r) of the nuclear-norm descent cone "
        f"(exponent of m_50 against delta in [{STATDIM_RANGE[0]}, {STATDIM_RANGE[1]}], its "
        f"95% interval inside [{STATDIM_CI_RANGE[0]}, {STATDIM_CI_RANGE[1]}])"
    )
    if len(fit_rows) < 3 or fit_rows["delta"].nunique() < 2:
        return Claim(
            "nuclear_statdim", statement, False,
            f"only {len(fit_rows)} (d, r) points with a 50% crossing inside the c grid",
        )
    fit = fit_power_law(fit_rows["delta"], fit_rows["m50"])
    ratio = fit_rows["m50"] / fit_rows["delta"]
    return Claim(
        "nuclear_statdim", statement,
        bool(STATDIM_RANGE[0] <= fit.slope <= STATDIM_RANGE[1]
             and STATDIM_CI_RANGE[0] <= fit.lo and fit.hi <= STATDIM_CI_RANGE[1]),
        f"exponent {fit} over {len(fit_rows)} (d, r) points; m_50 / delta from "
        f"{ratio.min():.2f} to {ratio.max():.2f}",
        numbers=(fit_number("nuclearStatdimExponent", fit,
                            "lowrank_phase, 50% points against delta(d, r)"),
                 Number("nuclearMfiftyOverDeltaMin", float(ratio.min()), "ratio", ".2f",
                        rows="lowrank_phase, 50% points"),
                 Number("nuclearMfiftyOverDeltaMax", float(ratio.max()), "ratio", ".2f",
                        rows="lowrank_phase, 50% points")),
    )


@CLAIMS
def nuclear_order_rd(data: LowrankData) -> Claim:
    """c_50 = m_50 / (r 2d) <= C50_MAX at every (d, r): Theorem 5.1's O(r d), its constant
    measured (a (d, r) without a 50% point counts against)."""
    tp = data.points
    statement = (
        f"c_50 = m_50 / (r 2d) <= {C50_MAX:g} at every (d, r), i.e. m_50 <= {2 * C50_MAX:g} r d "
        "(Theorem 5.1's O(r d) with its constant measured)"
    )
    crossed = tp[np.isfinite(tp["c50"])]
    missing = tp[~np.isfinite(tp["c50"])]
    if not len(crossed) or not missing.empty:
        where = ", ".join(f"(d={int(d)}, r={int(r)})"
                          for d, r in zip(missing["d"], missing["rank"], strict=True))
        return Claim(
            "nuclear_order_rd", statement, False,
            f"no 50% crossing inside the c grid at {where}" if len(missing)
            else "no lowrank_phase rows",
        )
    worst = crossed.loc[crossed["c50"].idxmax()]
    return Claim(
        "nuclear_order_rd", statement, bool((crossed["c50"] <= C50_MAX).all()),
        f"c_50 from {crossed['c50'].min():.2f} to {worst['c50']:.2f} (d = "
        f"{int(worst['d'])}, r = {int(worst['rank'])}) over {len(crossed)} (d, r) points",
        numbers=(Number("nuclearCfiftyMin", float(crossed["c50"].min()), "c = m / (r 2d)",
                        ".2f", rows="lowrank_phase, 50% points"),
                 Number("nuclearCfiftyMax", float(worst["c50"]), "c = m / (r 2d)", ".2f",
                        rows="lowrank_phase, 50% points"),
                 Number("nuclearPoints", len(crossed), "(d, r) points", "d",
                        rows="lowrank_phase, (d, r) with a 50% point")),
    )


@CLAIMS
def nuclear_transition(data: LowrankData) -> Claim | None:
    """For every (d, r) the success rate rises from <= 10% at the smallest c to >= 90% at the
    largest (no claim without phase rows)."""
    st = success_table(data.df)
    if st.empty:
        return None
    lo = st.loc[st.groupby(["d", "rank"])["c"].idxmin()]
    hi = st.loc[st.groupby(["d", "rank"])["c"].idxmax()]
    ok = bool((lo["rate"] <= 0.1).all() and (hi["rate"] >= 0.9).all())
    return Claim(
        "nuclear_transition",
        "for every (d, r) the success rate rises from <= 10% at the smallest c to >= 90% "
        "at the largest",
        ok,
        f"smallest c: max rate {lo['rate'].max():.2f}; largest c: min rate "
        f"{hi['rate'].min():.2f}",
        numbers=(Number("nuclearRuns", int(len(_phase_rows(data.df))), "runs", "d",
                        rows="lowrank_phase, status ok"),
                 Number("nuclearRateSmallestC", float(lo["rate"].max()), "success rate",
                        ".2f", rows="lowrank_phase, largest rate at the smallest c"),
                 Number("nuclearRateLargestC", float(hi["rate"].min()), "success rate",
                        ".2f", rows="lowrank_phase, smallest rate at the largest c")),
    )


def _sketch_rows(df):
    """Every lowrank_scale row of the sketch learner, and those with status ok."""
    sk_all = df[(df["experiment"] == "lowrank_scale") & (df["learner"] == "sketch")]
    return sk_all, sk_all[sk_all["status"] == "ok"]


@CLAIMS
def sketch_success(data: LowrankData) -> Claim | None:
    """The sketch learner recovers every head within SKETCH_TOL (no claim without its rows)."""
    sk_all, sk = _sketch_rows(data.df)
    if not len(sk_all):
        return None
    succ = sk["success"].fillna(False).astype(bool)
    return Claim(
        "sketch_success",
        f"the sketch learner recovers every head to relative error <= {SKETCH_TOL:g}",
        bool(len(sk) == len(sk_all) and succ.all()),
        f"{int(succ.sum())}/{len(sk_all)} runs; worst {sk['rel_err_W'].max():.2e}",
        numbers=(Number("sketchRuns", len(sk_all), "runs", "d",
                        rows="lowrank_scale, learner sketch"),
                 Number("sketchWorstError", float(sk["rel_err_W"].max()),
                        "relative error of W", ".2g",
                        rows="lowrank_scale, learner sketch, status ok",
                        factor=ROUNDING_FACTOR)) if len(sk) else (),
    )


@CLAIMS
def sketch_floor(data: LowrankData) -> Claim | None:
    """The sketch learner uses at most SKETCH_FACTOR (r (2d - r) + d) queries at d >=
    SKETCH_MIN_D (no claim without its rows)."""
    sk_all, sk = _sketch_rows(data.df)
    if not len(sk_all):
        return None
    big = sk[sk["d"] >= SKETCH_MIN_D]
    floor = [lowrank_floor(int(d), int(r)) for d, r in zip(big["d"], big["rank"],
                                                           strict=True)]
    ratio = big["n_queries"] / np.asarray(floor, dtype=float)
    return threshold_claim(
        "sketch_floor",
        f"the sketch learner uses <= {SKETCH_FACTOR} (r (2d - r) + d) queries whenever "
        f"d >= {SKETCH_MIN_D}",
        ratio <= SKETCH_FACTOR, worst=ratio.max() if len(big) else float("nan"),
        worst_label="largest ratio", fmt=".4f",
        numbers=(Number("sketchFloorRatioMax", float(ratio.max()), "queries / floor",
                        ".3f", rows=f"lowrank_scale, learner sketch, d >= {SKETCH_MIN_D}"),
                 ) if len(big) else ())


def lowrank_claims(df) -> list[Claim]:
    """Every claim of the low-rank figures (:data:`CLAIMS`), checked on the rows."""
    return CLAIMS.of_rows(df)


LOWRANK_PHASE_CAPTION = """\
Success probability of the nuclear-norm learner of Theorem 5.1 (m Gaussian rank-one projections,
min ||W||_* with cvxpy, then polishing: truncation to the rank the spectrum shows and
Gauss-Newton on the measurements) over c = m / (r 2d) and the head shape (d, r), over seeds (and
solvers where several are configured). Success: relative Frobenius error of W <= 1e-6 after
polishing; a solution whose spectrum shows no rank (no drop of 1e3) is not polished. White line:
the empirical 50% point c_50 of each (d, r), interpolated between grid values of c. Red crosses:
delta(d, r) / (r 2d), where delta(d, r) is the statistical dimension of the nuclear-norm descent
cone at a rank-r d x d matrix (Amelunxen, Lotz, McCoy and Tropp 2014; Monte Carlo,
``attnquery.theory.nuclear_statdim``), the 50% point of Gaussian measurements; it rises
towards 3 only slowly with d (2.2 at d = 32, r = 1). Claims: the rate rises from <= 10% at the
smallest c to >= 90% at the largest, for every (d, r); m_50 = c_50 r 2d grows linearly in r d
(exponent in [0.85, 1.15]); m_50 follows delta(d, r) (exponent of m_50 against delta in
[0.85, 1.15] with its 95% interval inside [0.8, 1.2]); c_50 <= 3.5 at every (d, r), i.e.
m_50 <= 7 r d.
"""

LOWRANK_QUERIES_CAPTION = """\
Queries counted by the oracle against r d (log-log): the nuclear-norm learner at its empirical
50% point m_50 (plus the d queries for v), delta(d, r) + d for the (d, r) of the phase grid
(crosses, dotted along fixed r; delta is the statistical dimension of the nuclear-norm descent
cone, the 50% point of Gaussian measurements), the sketch learner (rank found from the answers),
the exact learner of Theorem 4.1 (d^2 + d) on the same heads, and the degrees-of-freedom floor
r (2d - r) + d. Exponents are least-squares fits on log-log axes with 95% intervals; the
nuclear-norm label gives the exponent of m_50 against r d and against delta. Claims: m_50 grows
linearly in r d (exponent in [0.85, 1.15]); m_50 follows delta(d, r) (exponent in
[0.85, 1.15], 95% interval inside [0.8, 1.2]); c_50 = m_50 / (r 2d) <= 3.5 at every (d, r); the
sketch learner recovers every head to relative error <= 1e-8 and uses at most 1.05 times the
floor whenever d >= 256.
"""

LOWRANK_TIME_CAPTION = """\
Wall time per run against d (oracle simulation included): the nuclear-norm learner for each
configured solver (median over its grid of c and seeds) and the sketch and exact learners for
each head dimension r (median over seeds). Measured on a shared CPU, so the times are upper
bounds; the sketch learner costs O(d r^2) besides the oracle, the convex program has d^2 unknowns.
"""


@register_figure(
    "lowrank_phase",
    experiments=["lowrank_phase"],
    category="Low-rank recovery",
    caption=LOWRANK_PHASE_CAPTION,
)
def lowrank_phase(df):
    """Success probability of the nuclear-norm learner over c = m / (r 2d) and (d, r)."""
    st = success_table(df)
    tp = transition_points(df)
    claims = [c for c in lowrank_claims(df) if c.name.startswith("nuclear")]
    fig, ax = plt.subplots(figsize=(6.75, 3.4))
    if st.empty:
        ax.text(0.5, 0.5, "no lowrank_phase rows", ha="center", transform=ax.transAxes)
        return fig, claims
    pairs = sorted({(int(d), int(r)) for d, r in zip(st["d"], st["rank"], strict=True)},
                   key=lambda p: (p[1], p[0]))
    cs = np.sort(st["c"].unique())
    grid = np.full((len(pairs), cs.size), np.nan)
    for i, (d, r) in enumerate(pairs):
        g = st[(st["d"] == d) & (st["rank"] == r)]
        for c, p in zip(g["c"], g["rate"], strict=True):
            grid[i, np.searchsorted(cs, c)] = p
    im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=1,
                   extent=(-0.5, cs.size - 0.5, -0.5, len(pairs) - 0.5))
    # the empirical 50% line, in grid coordinates (c interpolated between columns), per r
    first = True
    for r_val in sorted({r for _, r in pairs}):
        xs, ys = [], []
        for i, (d, r) in enumerate(pairs):
            row = tp[(tp["d"] == d) & (tp["rank"] == r)]
            if r == r_val and len(row) and np.isfinite(row["c50"].iloc[0]):
                xs.append(np.interp(row["c50"].iloc[0], cs, np.arange(cs.size)))
                ys.append(i)
        ax.plot(xs, ys, "w-o", ms=3, lw=1.2, label="empirical 50% success" if first else None)
        first = False
    # the Gaussian-measurement 50% point delta(d, r) / (r 2d) of each row (inside the c grid)
    cd = statdim_table(pairs).set_index(["d", "rank"]).loc[pairs, "c_delta"].to_numpy()
    inside = (cd >= cs[0]) & (cd <= cs[-1])
    ax.plot(np.interp(cd[inside], cs, np.arange(cs.size)), np.flatnonzero(inside), "x",
            color="#ff3b30", ms=5, mew=1.5,
            label=r"$\delta(d, r) / (r \cdot 2d)$: statistical dimension")
    ax.set_xticks(np.arange(cs.size), [f"{c:g}" for c in cs])
    ax.set_yticks(np.arange(len(pairs)), [f"d={d}, r={r}" for d, r in pairs])
    ax.set_xlabel(r"$c = m / (r \cdot 2d)$, $m$ = number of rank-one measurements")
    ax.set_ylabel("head (d, r)")
    n = int(st["n"].max())
    ax.set_title("Nuclear-norm learner (Thm 5.1): success = rel. Frobenius error of $W$ "
                 f"$\\leq$ {PHASE_TOL:g} after polishing (up to {n} runs per cell)",
                 fontsize=7)
    fig.colorbar(im, ax=ax, label="success probability")
    ax.legend(loc="upper right", fontsize=6.5, framealpha=0.8)
    return fig, claims


@register_figure(
    "lowrank_queries",
    experiments=["lowrank_scale"],
    optional=["lowrank_phase"],
    category="Low-rank recovery",
    caption=LOWRANK_QUERIES_CAPTION,
)
def lowrank_queries(df):
    """Queries against r d: nuclear (smallest successful m + d), sketch, exact, every other
    learner the rows have (labelled by its spec), the floor."""
    claims = lowrank_claims(df)
    fig, ax = plt.subplots(figsize=(6.75, 3.6))
    tp = transition_points(df)
    tp = tp[np.isfinite(tp["m50"]) & ~tp["censored"]]
    series = []  # (label, x, y, marker, values the exponent is fitted on or None)
    if len(tp):
        x = tp["d"] * tp["rank"]
        series.append(("nuclear norm at its 50% point: $m_{50} + d$", x, tp["m50"] + tp["d"],
                       "o", tp["m50"]))
    sc = ok_rows(df, "lowrank_scale")
    g = sc[sc["learner"] == "sketch"]
    if len(g):
        series.append(("sketch, rank found", g["d"] * g["rank"], g["n_queries"], "s",
                       g["n_queries"]))
    g = sc[sc["learner"] == "exact"]
    if len(g):
        series.append(("exact (Thm 4.1), $d^2 + d$", g["d"] * g["rank"], g["n_queries"], "^",
                       None))
    for i, name in enumerate(_other_learners(sc)):
        g = sc[sc["learner"] == name]
        series.append((learner_label(name), g["d"] * g["rank"], g["n_queries"],
                       OTHER_MARKERS[i % len(OTHER_MARKERS)], g["n_queries"]))
    st = success_table(df)
    sd = statdim_table(zip(st["d"], st["rank"], strict=True))
    sd = sd.assign(rd=sd["d"] * sd["rank"])

    def plot_statdim():
        # delta(d, r) + d for every (d, r) of the phase grid, joined along fixed r
        for i, (_, g) in enumerate(sd.sort_values(["rank", "d"]).groupby("rank")):
            ax.plot(g["rd"], g["delta"] + g["d"], "k:", lw=0.9, marker="x", ms=4,
                    label=(r"$\delta(d, r) + d$, $\delta$ = statistical dimension of the "
                           "nuclear-norm cone (dotted: fixed r, r = 1 on top)")
                    if i == 0 else None)

    pts = pd.concat([tp[["d", "rank"]], sc[["d", "rank"]]]).drop_duplicates()
    for label, x, y, mk, fit_y in series:
        txt = ""
        if fit_y is not None and pd.Series(x).nunique() >= 2 and len(x) >= 3:
            fit = fit_power_law(x, fit_y)
            txt = f"\n  exponent {fit.slope:.2f} [{fit.lo:.2f}, {fit.hi:.2f}]"
            if mk == "o":
                delta = tp.merge(sd, on=["d", "rank"], how="left")["delta"].to_numpy()
                fd = fit_power_law(delta, fit_y)
                txt = (f"\n  $m_{{50}}$ exponent {fit.slope:.2f} [{fit.lo:.2f}, {fit.hi:.2f}] "
                       f"against $r d$, {fd.slope:.2f} [{fd.lo:.2f}, {fd.hi:.2f}] against "
                       r"$\delta$")
        ax.plot(x, y, mk, alpha=0.7, label=label + txt)
        if mk == "o":
            plot_statdim()
    if not any(mk == "o" for _, _, _, mk, _ in series):
        plot_statdim()
    if len(pts):
        pts = pts.assign(rd=pts["d"] * pts["rank"]).sort_values("rd")
        fl = pts["rank"] * (2 * pts["d"] - pts["rank"]) + pts["d"]
        ax.plot(pts["rd"], fl, "k_", ms=10, mew=1.2, label="floor $r(2d - r) + d$")
    ax.set(xscale="log", yscale="log", xlabel=r"$r \cdot d$ (rank $\times$ width)",
           ylabel="queries (counted by the oracle)")
    ax.set_title("Queries against $r d$ (exponents: log-log fits with 95% intervals)",
                 fontsize=8)
    ax.legend(loc="upper left", fontsize=6.5)
    return fig, claims


@register_figure(
    "lowrank_time",
    experiments=["lowrank_scale"],
    optional=["lowrank_phase"],
    category="Low-rank recovery",
    caption=LOWRANK_TIME_CAPTION,
    uses_timing=True,
)
def lowrank_time(df):
    """Wall time against d: nuclear norm (per solver) and each learner of the rows (per r)."""
    claims = []
    fig, ax = plt.subplots(figsize=(6.75, 3.4))
    ph = _phase_rows(df)
    if "wall_time_s" in df.columns and len(ph):
        for (solver, g), mk in zip(ph.groupby("solver"), ("o-", "D-"), strict=False):
            agg = g.groupby("d")["wall_time_s"].median()
            ax.plot(agg.index, agg.values, mk, color="k",
                    label=f"nuclear norm, {solver} (median over c)")
    sc = ok_rows(df, "lowrank_scale")
    if "wall_time_s" in df.columns and len(sc):
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        ranks = sorted(sc["rank"].unique())
        others = _other_learners(sc)
        for (learner, r), g in sc.groupby(["learner", "rank"]):
            agg = g.groupby("d")["wall_time_s"].median()
            ls = {"sketch": "s--", "exact": "^:"}.get(learner)
            name = learner
            if ls is None:  # another registered learner: its spec's label
                ls = OTHER_MARKERS[others.index(learner) % len(OTHER_MARKERS)] + "-."
                name = learner_label(learner)
            ax.plot(agg.index, agg.values, ls, color=colors[ranks.index(r) % len(colors)],
                    label=f"{name}, r = {r}")
    ax.set(xscale="log", yscale="log", xlabel="dimension $d$",
           ylabel="wall time per run (s), oracle included")
    ax.set_title("Wall time against $d$ (shared CPU: times are upper bounds)", fontsize=8)
    ax.legend(loc="upper left", fontsize=6, ncol=2)
    return fig, claims
