"""Figure membership_cost: queries and error of recovery from membership queries (App. B)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..claims import Claim, ClaimSet, Number, ok_rows
from ..metrics import fit_linear
from ..theory import membership_target as target_queries
from ._core import register_figure, tight_layout

#: the target: counted queries within this factor of d^2 log2(2 W d / eps) + d log2(1/eps)
TARGET_FACTOR = 1.2
#: ... for eps at or below this (at larger eps the v stage's d log2(W d / mu) overhead shows)
TARGET_MAX_EPS = 1e-3
#: R^2 a linear fit of queries against log2(1/eps) must reach
LINEAR_R2 = 0.99
#: bisection for v must use at least this many times fewer queries than sampling ...
V_RATIO = 100.0
#: ... at this eps
V_RATIO_EPS = 1e-3


def _count_rows(df):
    rows = ok_rows(df, "membership")
    return rows[rows["variant"] == "count"]


#: the claims of the membership experiment (one function each, named as the claim), checked on
#: the result rows
CLAIMS = ClaimSet()


@CLAIMS
def membership_linear_log_eps(df) -> Claim:
    """Queries grow linearly in log2(1/eps): a linear fit's R^2 >= LINEAR_R2 at every d."""
    r2s, fits = [], []
    for d, g in _count_rows(df).groupby("d", sort=True):
        x = np.log2(1.0 / g["eps"].astype(float))
        if x.nunique() < 2 or len(g) < 3:
            continue
        fit = fit_linear(x, g["n_queries"].astype(float))
        r2 = float(np.corrcoef(x, g["n_queries"].astype(float))[0, 1] ** 2)
        r2s.append(r2)
        fits.append(f"d={d}: {fit.slope:.1f}/bit (d^2 = {d * d}), R^2 {r2:.4f}")
    return Claim(
        "membership_linear_log_eps",
        f"queries grow linearly in log2(1/eps) (linear fit R^2 >= {LINEAR_R2} at every d)",
        bool(r2s and min(r2s) >= LINEAR_R2), "; ".join(fits) or "too few points",
        numbers=(Number("membershipMinRsquared", min(r2s), "R^2", ".3f",
                        rows="membership, variant count, linear fit per d"),) if r2s else ())


@CLAIMS
def membership_target(df) -> Claim:
    """Queries within TARGET_FACTOR of the target count for eps <= TARGET_MAX_EPS."""
    cnt = _count_rows(df)
    small = cnt[cnt["eps"] <= TARGET_MAX_EPS]
    ratio = small["n_queries"] / [target_queries(int(d), float(e), float(w)) for d, e, w in
                                  zip(small["d"], small["eps"], small["W_bound"], strict=True)]
    all_ratio = cnt["n_queries"] / [target_queries(int(d), float(e), float(w)) for d, e, w in
                                    zip(cnt["d"], cnt["eps"], cnt["W_bound"], strict=True)]
    return Claim(
        "membership_target",
        f"queries within {TARGET_FACTOR}x of d^2 log2(2Wd/eps) + d log2(1/eps) for eps <= "
        f"{TARGET_MAX_EPS:g}",
        bool((ratio <= TARGET_FACTOR).all()),
        f"ratio in [{ratio.min():.3f}, {ratio.max():.3f}] over {len(small)} runs; over all eps "
        f"[{all_ratio.min():.3f}, {all_ratio.max():.3f}]" if len(small) else "no runs",
        n_runs=len(small),
        numbers=(Number("membershipTargetRatioMax", float(ratio.max()), "ratio", ".2f",
                        rows=f"membership, variant count, eps <= {TARGET_MAX_EPS:g}"),
                 Number("membershipTargetRatioMaxAll", float(all_ratio.max()), "ratio", ".2f",
                        rows="membership, variant count")) if len(small) else ())


@CLAIMS
def membership_error(df) -> Claim:
    """Every run (of variant count) reaches ||W_hat - W||_F <= eps; failed runs count against."""
    cnt = _count_rows(df)
    succ = cnt["abs_err_W"] <= cnt["eps"]
    every = df[(df["experiment"] == "membership") & (df["variant"] == "count")]
    return Claim(
        "membership_error", "every run reaches ||W_hat - W||_F <= eps",
        bool(succ.all() and len(cnt) == len(every)),
        f"{int(succ.sum())}/{len(every)} runs; largest "
        f"error/eps {(cnt['abs_err_W'] / cnt['eps']).max():.3g}" if len(cnt) else "no runs",
        n_runs=len(cnt),
        numbers=(Number("membershipRuns", len(every), "runs", "d",
                        rows="membership, variant count"),
                 Number("membershipRunsWithinEps", int(succ.sum()), "runs", "d",
                        rows="membership, variant count, abs_err_W <= eps")))


@CLAIMS
def membership_v_ratio(df) -> Claim:
    """At eps = V_RATIO_EPS, bisection for v uses at least V_RATIO times fewer queries than
    sphere sampling."""
    cmp_rows = ok_rows(df, "membership")
    cmp_rows = cmp_rows[(cmp_rows["variant"] == "v_compare")
                        & np.isclose(cmp_rows["eps"], V_RATIO_EPS)]
    samp = cmp_rows[cmp_rows["v_method"] == "sampling"].groupby("d")["n_queries_v"].min()
    bis = cmp_rows[cmp_rows["v_method"] == "bisection"].groupby("d")["n_queries_v"].max()
    common = samp.index.intersection(bis.index)
    if not len(common):
        return Claim("membership_v_ratio", "bisection vs sampling for v", False,
                     f"no comparison rows at eps = {V_RATIO_EPS:g}")
    r = (samp[common] / bis[common]).astype(float)
    comp = _computed(cmp_rows[cmp_rows["v_method"] == "sampling"])
    return Claim(
        "membership_v_ratio",
        f"at eps = {V_RATIO_EPS:g}, bisection for v uses at least {V_RATIO:g}x fewer "
        "queries than sphere sampling",
        bool((r >= V_RATIO).all()),
        "; ".join(f"d={d}: {samp[d]:.3g} vs {bis[d]} ({r[d]:.3g}x)" for d in common)
        + f" (sampling counts {'computed from the sample size' if comp else 'run'})",
        numbers=(Number("membershipVRatioMin", float(r.min()), "ratio", ".2g",
                        rows=f"membership, variant v_compare, eps = {V_RATIO_EPS:g}"),
                 Number("membershipVRatioMax", float(r.max()), "ratio", ".2g",
                        rows=f"membership, variant v_compare, eps = {V_RATIO_EPS:g}")))


def membership_claims(df) -> list[Claim]:
    """Claims of the membership experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


def _computed(g) -> bool:
    return bool(g["queries_computed"].fillna(False).astype(bool).any())


MEMBERSHIP_COST_CAPTION = """\
**Membership queries (Appendix B).** The oracle says only whether f(X) > 0, so only the direction
of v is identifiable: v_hat has unit norm and is scored against ``v / ||v||``. W is found entry by
entry by bisection over the family X(a) = [(s/a) e_i + a e_j; a e_j] of Appendix B (all d^2 entries
in one batch per step), after the direction of v by bisection on the ratios ``|v_i| / |v_p|`` (sign
flips of ``s_i e_i - t s_p e_p``). (a) Queries counted by the oracle, divided by d^2, against
log2(1/eps) (thin lines: linear fits; dashed: the target ``d^2 log2(2 W d / eps) + d log2(1/eps)``,
divided by d^2). (b) The same against d. (c) The error of W reached against the target eps (dashed:
equality). (d) The v stage: the paper's sphere sampling, with its Hoeffding sample size ceil(2 /
(eps^2 R^2) log(2 d / delta)) for ``||v_hat - v||_inf <= eps``, against bisection. Sampling points
whose sample size exceeds the run budget are open: their counts are computed from the stated sample
size, not run.
"""


@register_figure(
    "membership_cost",
    experiments=["membership"],
    category="Noisy and sign-only oracles",
    caption=MEMBERSHIP_COST_CAPTION,
)
def membership_cost(df):
    """Queries against log2(1/eps) and d; error against eps; sampling vs bisection for v."""
    claims = membership_claims(df)
    cnt = _count_rows(df)
    fig, axes = plt.subplots(2, 2, figsize=(6.75, 5.6))
    (ax1, ax2), (ax3, ax4) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    _eps_panel(ax1, cnt, colors)
    _d_panel(ax2, cnt, colors)
    _error_panel(ax3, cnt, colors)
    _v_compare_panel(ax4, df, claims, colors)
    tight_layout(fig)
    return fig, claims


def _eps_panel(ax1, cnt, colors) -> None:
    """(a) queries / d^2 against log2(1/eps), with the target and linear fits."""
    for c, (d, g) in enumerate(cnt.groupby("d", sort=True)):
        col = colors[c % len(colors)]
        x = np.log2(1.0 / g["eps"].astype(float))
        ax1.plot(x, g["n_queries"] / d**2, "o", color=col, ms=3.5, label=f"d = {d}")
        xs = np.sort(x.unique())
        W = float(g["W_bound"].iloc[0])
        ax1.plot(xs, [target_queries(int(d), 2.0**-t, W) / d**2 for t in xs], "--", color=col,
                 lw=0.8)
        if len(xs) >= 2 and len(g) >= 3:
            fit = fit_linear(x, g["n_queries"].astype(float))
            ax1.plot(xs, (fit.intercept + fit.slope * xs) / d**2, "-", color=col, lw=0.6,
                     alpha=0.6)
    ax1.plot([], [], "k--", lw=0.8,
             label=r"target $(d^2\log_2\frac{2Wd}{\epsilon}+d\log_2\frac{1}{\epsilon})/d^2$")
    ax1.set(xlabel=r"$\log_2(1/\epsilon)$", ylabel="membership queries counted / $d^2$")
    ax1.set_title("(a) queries against $\\log_2(1/\\epsilon)$ (thin lines: linear fits)",
                  fontsize=7)
    ax1.legend(fontsize=6, loc="upper left", ncol=2)


def _d_panel(ax2, cnt, colors) -> None:
    """(b) queries against d for each eps, with the target."""
    for c, (eps, g) in enumerate(cnt.groupby("eps", sort=True)):
        col = colors[c % len(colors)]
        agg = g.groupby("d")["n_queries"].median()
        ax2.plot(agg.index, agg.values, "o-", color=col, ms=3.5, label=rf"$\epsilon$={eps:g}")
        W = float(g["W_bound"].iloc[0])
        ds = np.array(agg.index, dtype=float)
        ax2.plot(ds, [target_queries(int(d), float(eps), W) for d in ds], "--", color=col,
                 lw=0.7)
    title = "(b) queries against d (dashed: target)"
    ax2.set(xscale="log", yscale="log", xlabel="dimension $d$",
            ylabel="membership queries counted")
    if len(cnt):
        ds = np.sort(cnt["d"].unique())
        ax2.set_xticks(ds, [str(int(d)) for d in ds])
        ax2.minorticks_off()
    ax2.set_title(title, fontsize=7)
    ax2.legend(fontsize=6, loc="upper left", ncol=2)


def _error_panel(ax3, cnt, colors) -> None:
    """(c) the error of W reached against the target eps."""
    for c, (d, g) in enumerate(cnt.groupby("d", sort=True)):
        agg = g.groupby("eps")["abs_err_W"].max()
        ax3.plot(agg.index, agg.values, "o-", color=colors[c % len(colors)], ms=3.5,
                 label=f"d = {d} (max over seeds)")
    if len(cnt):
        es = np.sort(cnt["eps"].unique())
        ax3.plot(es, es, "k--", lw=0.8, label=r"target $\epsilon$")
    ax3.set(xscale="log", yscale="log", xlabel=r"target $\epsilon$",
            ylabel=r"$\|\hat W - W\|_F$ reached")
    ax3.set_title("(c) error reached against target")
    ax3.legend(fontsize=6, loc="upper left")


def _v_compare_panel(ax4, df, claims, colors) -> None:
    """(d) the v stage: sphere sampling against bisection (computed counts hollow)."""
    cmp_rows = ok_rows(df, "membership")
    cmp_rows = cmp_rows[cmp_rows["variant"] == "v_compare"]
    dmarks = dict(zip(sorted(cmp_rows["d"].unique()), "osD^v<>", strict=False))
    for c, (meth, g) in enumerate(cmp_rows.groupby("v_method", sort=True)):
        for d, h in g.groupby("d", sort=True):
            mk = dmarks.get(d, "o")
            agg = h.groupby("eps").agg(q=("n_queries_v", "median"),
                                       comp=("queries_computed",
                                             lambda s: bool(s.fillna(False).any())))
            col = colors[c % len(colors)]
            ax4.plot(agg.index, agg["q"], "-", color=col, lw=0.8)
            run = agg[~agg["comp"]]
            cmpd = agg[agg["comp"]]
            ax4.plot(run.index, run["q"], mk, color=col, ms=4,
                     label=f"{meth}, d = {d} (run)")
            if len(cmpd):
                ax4.plot(cmpd.index, cmpd["q"], mk, color=col, ms=4, mfc="none",
                         label=f"{meth}, d = {d} (computed, not run)")
    ax4.set(xscale="log", yscale="log", xlabel=r"target $\|\hat v - v\|_\infty \leq \epsilon$",
            ylabel="queries of the v stage")
    vc = [c for c in claims if c.name == "membership_v_ratio"]
    ax4.set_title("(d) direction of v: sampling vs bisection"
                  + (f"\n{vc[0].detail.split(' (sampling')[0]}" if vc else ""), fontsize=6)
    ax4.legend(fontsize=6, loc="upper right")


__all__ = ["CLAIMS", "membership_claims", "membership_cost"]
