"""Figures noise_scaling and defence_rounding: learning from approximate answers (Sec. 6)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..claims import Claim, Number, extra_values, fit_number, number_name, ok_rows
from ..metrics import fit_linear
from ..theory import USEFUL_REL_ERR, precision_digits, theorem61_guarantee
from ..theory import theorem61_premise as cell_meets_assumptions
from . import register_figure, tight_layout
from .lowprecision import queries_needed, slope_fits

#: interval the fitted slope of error against tau must fall in
SLOPE_RANGE = (0.9, 1.1)
#: interval the fitted exponent of error against oversampling (uniform noise) must fall in
OVERSAMPLE_RANGE = (-0.65, -0.35)
NOISE_MODELS = ("uniform", "adversarial")


def _tau_rows(df, ok_only=True):
    rows = ok_rows(df, "noise") if ok_only else df[df["experiment"] == "noise"]
    return rows[rows["variant"] == "tau"]


def _met(rows):
    """Rows whose cell meets Theorem 6.1's assumptions (from the cell's parameters)."""
    met = [cell_meets_assumptions(d, t, m, w) for d, t, m, w in
           zip(rows["d"], rows["tau"], rows["mu"], rows["W_bound"], strict=True)]
    return rows[np.array(met, dtype=bool)]


def _centered_slope(g, x="tau", y="abs_err_W", by=("noise", "mu", "W_bound", "d", "seed")):
    """Slope of log y against log x with a fixed effect per group (demeaned within groups)."""
    g = g[(g[y] > 0) & np.isfinite(g[y])]
    lx, ly = np.log(g[x].astype(float)), np.log(g[y].astype(float))
    keys = [g[k] for k in by]
    cx = lx - lx.groupby(keys).transform("mean")
    cy = ly - ly.groupby(keys).transform("mean")
    return fit_linear(cx, cy)


def noise_claims(df) -> list[Claim]:
    """Claims of the noise experiment, checked on its rows."""
    claims = []
    rows = _tau_rows(df)
    every = _tau_rows(df, ok_only=False)
    noisy = rows[(rows["learner"] == "noisy") & (rows["oversample"] == 1)]
    met = noisy[extra_values(noisy, "assumptions_met", False).astype(bool)]
    for model in NOISE_MODELS:
        g = met[met["noise"] == model]
        # every cell meeting the assumptions (any status) must be an ok row within the bound
        cells = _met(every[(every["learner"] == "noisy") & (every["noise"] == model)])
        wb = g["within_bound"].fillna(False).astype(bool)
        claims.append(Claim(
            f"noise_bound_{model}",
            f"{model} noise: every run meeting Theorem 6.1's assumptions is within its guarantee",
            bool(len(g) > 0 and wb.all() and len(g) == len(cells)),
            f"{int(wb.sum())}/{len(cells)} runs; largest error / guarantee "
            f"{(g['abs_err_W'] / g['bound_W']).max():.3g}" if len(g) else "no runs",
            numbers=(Number(number_name("noiseRuns", model), len(cells), "runs", "d",
                            rows=f"noise, learner noisy, {model} noise, assumptions met"),
                     Number(number_name("noiseWithinBound", model), int(wb.sum()), "runs", "d",
                            rows=f"noise, learner noisy, {model} noise, within the bound"),
                     Number(number_name("noiseBoundRatio", model),
                            float((g["abs_err_W"] / g["bound_W"]).max()),
                            "error / guarantee", ".2g",
                            rows=f"noise, learner noisy, {model} noise, largest")) if len(g)
            else (),
        ))
    for model in NOISE_MODELS:
        g = met[met["noise"] == model]
        g = g[extra_values(g, "n_clipped", 0).astype(int) == 0]
        numbers = ()
        try:
            fit = _centered_slope(g)
            ok = SLOPE_RANGE[0] <= fit.slope <= SLOPE_RANGE[1]
            detail = f"slope {fit} (runs with no clipped weight, per-cell intercepts)"
            numbers = (fit_number(number_name("noiseSlope", model), fit,
                                  f"noise, learner noisy, {model} noise, assumptions met, no "
                                  "clipped weight"),)
        except Exception as exc:  # too few points
            ok, detail = False, f"no fit: {exc}"
        claims.append(Claim(
            f"noise_slope_{model}",
            f"{model} noise: ||W_hat - W||_F grows linearly in tau (log-log slope in "
            f"[{SLOPE_RANGE[0]}, {SLOPE_RANGE[1]}])", bool(ok), detail, numbers=numbers))
    unc = _met(every[every["learner"] == "unclipped"])
    und = unc["status"] != "ok"
    claims.append(Claim(
        "noise_unclipped_fails",
        "without clipping the estimate is undefined (sigma^-1 outside (0, 1)) in some runs that "
        "meet the theorem's assumptions",
        bool(len(unc) > 0 and und.any()),
        f"unclipped undefined in {int(und.sum())}/{len(unc)} such runs, at tau >= "
        f"{unc[und]['tau'].min() if und.any() else float('nan'):g}",
        numbers=(Number("noiseUnclippedUndefinedTau", float(unc[und]["tau"].min()), "tau", "g",
                        rows="noise, learner unclipped, smallest tau of an undefined run"),)
        if und.any() else (),
    ))
    ov = ok_rows(df, "noise")
    ov = ov[(ov["variant"] == "oversample") & (ov["noise"] == "uniform")]
    if ov["oversample"].nunique() >= 2:
        fit = _centered_slope(ov, x="oversample", by=("seed",))
        claims.append(Claim(
            "noise_oversample",
            "uniform noise: error falls like oversample^(-1/2) (fitted exponent in "
            f"[{OVERSAMPLE_RANGE[0]}, {OVERSAMPLE_RANGE[1]}])",
            bool(OVERSAMPLE_RANGE[0] <= fit.slope <= OVERSAMPLE_RANGE[1]), f"exponent {fit}",
            numbers=(fit_number("noiseOversampleExponent", fit,
                                "noise, variant oversample, uniform noise"),)))
    return claims


def _inf_to(y, top):
    y = np.asarray(y, dtype=float)
    return np.where(np.isfinite(y), y, top)


NOISE_SCALING_CAPTION = """\
**Approximate value queries (Theorem 6.1).** Every answer is within +-tau of f(X) and deterministic
(uniform noise derived from a hash of the query and a seed; or the adversarial oracle, which moves
every answer by exactly tau: one-row answers towards 0, two-row answers in the direction that
pushes the learner's attention-weight estimate away from 1/2). Heads meet the theorem's
assumptions: ``||W||_F = W_bound``, ``||v|| <= 1``, ``min nonzero |v_i| = mu``, a quarter of v
exactly 0. (a) ``||W_hat - W||_F`` against tau (log-log, largest over seeds; filled: uniform, open:
adversarial) for several mu and W_bound, with the theorem's guarantee 160 W^2 d tau / mu (dashed,
same colour; valid for tau < mu / 2) and the slopes fitted with an intercept per cell on the runs
where no weight was clipped. (b) ``||v_hat - v||`` against its guarantee ``sqrt(d) tau`` (met with
equality by the adversary). (c) The clipped learner against two baselines, the same probes without
clipping (sigma^{-1} of an estimate outside (0, 1) is undefined) and Theorem 4.1's exact learner; a
cross at the top marks a tau where some runs failed. (d) Oversampling: k distinct probes per
unknown and least squares; under uniform noise the error falls about like k^(-1/2) (the extra
probes are smaller than the theorem's, so somewhat less), under adversarial noise it does not fall.
"""

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


@register_figure(
    "noise_scaling",
    experiments=["noise"],
    category="Noisy and sign-only oracles",
    caption=NOISE_SCALING_CAPTION,
)
def noise_scaling(df):
    """Error against tau (with Theorem 6.1's guarantee), baselines, and oversampling."""
    claims = noise_claims(df)
    rows = _tau_rows(df)
    noisy = rows[(rows["learner"] == "noisy") & (rows["oversample"] == 1)]
    fig, axes = plt.subplots(2, 2, figsize=(6.75, 5.6))
    (ax1, ax2), (ax3, ax4) = axes
    dmax = int(noisy["d"].max()) if len(noisy) else 0
    sub = noisy[noisy["d"] == dmax]
    combos = sorted(set(zip(sub["mu"], sub["W_bound"], strict=True)))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    marks = {"uniform": "o", "adversarial": "^"}
    for c, (mu, Wb) in enumerate(combos):
        col = colors[c % len(colors)]
        g = sub[(sub["mu"] == mu) & (sub["W_bound"] == Wb)]
        for model in NOISE_MODELS:
            h = g[g["noise"] == model]
            if h.empty:
                continue
            agg = h.groupby("tau")[["abs_err_W", "err_v"]].max()
            lab = rf"$\mu$={mu:g}, W={Wb:g}" if model == "uniform" else None
            ax1.plot(agg.index, agg["abs_err_W"], marks[model] + "-", color=col, ms=3.5,
                     label=lab, lw=0.9, mfc="none" if model == "adversarial" else col)
            ax2.plot(agg.index, agg["err_v"], marks[model] + "-", color=col, ms=3.5, lw=0.9,
                     mfc="none" if model == "adversarial" else col)
        taus = np.sort(g["tau"].unique())
        bW, _ = theorem61_guarantee(taus, dmax, Wb, mu)
        ax1.plot(taus, bW, "--", color=col, lw=0.8)
    if len(sub):
        taus = np.sort(sub["tau"].unique())
        ax2.plot(taus, np.sqrt(dmax) * taus, "k--", lw=0.8, label=r"guarantee $\sqrt{d}\,\tau$")
    ax1.plot([], [], "k--", lw=0.8, label="Thm 6.1 guarantee")
    ax1.plot([], [], "ko", ms=3.5, label="uniform (max over seeds)")
    ax1.plot([], [], "k^", ms=3.5, mfc="none", label="adversarial")
    slopes = "; ".join(c.detail.split(" (")[0] for c in claims if c.name.startswith("noise_slope"))
    ax1.set(xscale="log", yscale="log", xlabel=r"tolerance $\tau$",
            ylabel=r"$\|\hat W - W\|_F$")
    ax1.set_title(f"(a) W error, d = {dmax}")
    ax1.text(0.98, 0.03, f"fitted slopes (uniform; adversarial):\n{slopes}",
             transform=ax1.transAxes, ha="right", va="bottom", fontsize=6)
    ax1.legend(fontsize=5.5, loc="upper left", ncol=2)
    ax2.set(xscale="log", yscale="log", xlabel=r"tolerance $\tau$",
            ylabel=r"$\|\hat v - v\|_2$")
    ax2.set_title(f"(b) v error, d = {dmax}")
    ax2.legend(fontsize=6, loc="upper left")

    # (c) baselines at one (mu, W_bound), all d pooled
    every = _tau_rows(df, ok_only=False)
    if len(rows):
        mu0, W0 = float(rows["mu"].min()), float(rows["W_bound"].max())
        base = every[(every["mu"] == mu0) & (every["W_bound"] == W0) & (every["d"] == dmax)]
        finite = base["abs_err_W"][np.isfinite(base["abs_err_W"].astype(float))]
        top = float(finite.max()) * 30 if len(finite) else 1.0
        for c, (lname, label) in enumerate([("noisy", "Thm 6.1 (clipped)"),
                                            ("unclipped", "no clipping"),
                                            ("exact", "Thm 4.1 exact learner")]):
            h = base[base["learner"] == lname]
            if h.empty:
                continue
            agg = h[h["status"] == "ok"].groupby("tau")["abs_err_W"].median()
            ax3.plot(agg.index, agg.values, "o-", ms=3, color=colors[c],
                     label=label + " (median of ok runs)")
            bad = h.groupby("tau")["status"].apply(lambda s: (s != "ok").mean())
            for t, frac in bad.items():
                if frac > 0:
                    y_x = top / 4.0**c  # one row of crosses per learner
                    ax3.plot([t], [y_x], "x", color=colors[c], ms=6)
                    ax3.annotate(f"{frac:.0%}", (t, y_x), textcoords="offset points",
                                 xytext=(-4, 0), ha="right", va="center", fontsize=5.5,
                                 color=colors[c])
        ax3.axhline(top, color="0.5", lw=0.5, ls=":")
        ax3.text(0.02, 0.97, "x: share of runs failed or undefined (top rows)",
                 transform=ax3.transAxes, va="top", fontsize=6)
        ax3.set(xscale="log", yscale="log", xlabel=r"tolerance $\tau$",
                ylabel=r"$\|\hat W - W\|_F$")
        ax3.set_title(rf"(c) baselines, $\mu$={mu0:g}, W={W0:g}, d={dmax}")
        ax3.legend(fontsize=6, loc="lower right")

    # (d) oversampling
    ov = ok_rows(df, "noise")
    ov = ov[ov["variant"] == "oversample"]
    for c, model in enumerate(NOISE_MODELS):
        h = ov[ov["noise"] == model]
        if h.empty:
            continue
        agg = h.groupby("oversample")["abs_err_W"].agg(["median", "min", "max"])
        ax4.errorbar(agg.index, agg["median"], yerr=[agg["median"] - agg["min"],
                                                      agg["max"] - agg["median"]],
                     fmt=marks[model] + "-", ms=3.5, capsize=2, color=colors[c],
                     label=f"{model} (median, range)")
    if len(ov):
        ks = np.sort(ov["oversample"].unique()).astype(float)
        ref = ov[(ov["noise"] == "uniform") & (ov["oversample"] == ks[0])]["abs_err_W"]
        if len(ref):
            ax4.plot(ks, float(ref.median()) * (ks / ks[0]) ** -0.5, "k--", lw=0.8,
                     label=r"$\propto k^{-1/2}$")
        oc = [c for c in claims if c.name == "noise_oversample"]
        t = ov.iloc[0]
        ax4.set_title(rf"(d) oversampling, $\tau$={t['tau']:g}, d={int(t['d'])}"
                      + (f"\nexponent {oc[0].detail.split(' (')[0].replace('exponent ', '')}"
                         if oc else ""), fontsize=7)
    ax4.set(xlabel="distinct probes per unknown $k$", ylabel=r"$\|\hat W - W\|_F$")
    if ax4.has_data():
        ax4.set(xscale="log", yscale="log")
    ax4.legend(fontsize=6)
    tight_layout(fig)
    return fig, claims


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


def rounding_claims(df) -> list[Claim]:
    rows = _rounding_rows(df)
    return _rounding_claims(rows, _useful_digits(rows))


def _rounding_claims(rows, useful) -> list[Claim]:
    """:func:`rounding_claims` on the rows of :func:`_rounding_rows` and their useful digits."""
    rows = rows[rows["status"] == "ok"]
    dig = rows[rows["rounding"].str.startswith("digits=")]
    claims = []
    for lname, g in dig.groupby("curve", sort=True):
        k = g["rounding"].str.split("=").str[1].astype(float)
        y = np.log10(np.clip(g["rel_err_W"].astype(float), 1e-300, 1e300))
        try:
            fit = fit_linear(k, y)
            ok = fit.hi < 0
            detail = (f"log10 error per digit {fit}; useful (median rel. error <= "
                      f"{USEFUL_REL_ERR:g}) from {useful.get(lname)} digits")
        except Exception as exc:
            ok, detail = False, f"no fit: {exc}"
        claims.append(Claim(
            f"rounding_{lname.replace('@', '_')}",
            f"{lname}: the error of W falls as more digits are kept (slope of log10 error "
            "against digits < 0)", bool(ok), detail))
    lp = {c: k for c, k in useful.items() if c.startswith("lowprecision@")}
    if lp and "exact" in useful:
        q, k = min(lp.items(), key=lambda kv: float(kv[0].split("@")[1]))
        ex = useful["exact"]
        claims.append(Claim(
            "rounding_lowprecision_useful",
            f"at its smallest budget ({q.split('@')[1]} queries per unknown) the low-precision "
            "learner extracts useful heads from fewer digits than Theorem 4.1's learner",
            bool(k is not None and (ex is None or k < ex)),
            f"useful from {k} digits against {ex} (exact learner, 1 query per unknown)",
            numbers=tuple(Number(n, v, "significant digits", "d",
                                 rows=f"rounding, smallest digits with median relative error "
                                 f"<= {USEFUL_REL_ERR:g}")
                          for n, v in (("roundingUsefulDigitsLowprecision", k),
                                       ("roundingUsefulDigitsExact", ex)) if v is not None)))
    return claims


@register_figure(
    "defence_rounding",
    experiments=["rounding"],
    category="Noisy and sign-only oracles",
    caption=DEFENCE_ROUNDING_CAPTION,
)
def defence_rounding(df):
    """Relative error of W against digits kept, per learner (and budget of the low-precision
    learner), with the usefulness threshold; and the queries each rounding costs an attacker."""
    rows = _rounding_rows(df)
    useful = _useful_digits(rows)
    claims = _rounding_claims(rows, useful)
    costs = _rounding_costs(rows, COST_TARGETS)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(6.75, 3.4), width_ratios=(1.6, 1))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
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
        ax.plot(agg.index, _inf_to(agg.values, top), "o-", color=col, ms=3, lw=1,
                label=label + (f" (useful from {k})" if k is not None else " (never useful)"))
        for fmt, mk in (("float16", "s"), ("bfloat16", "D")):
            h = g[g["rounding"] == fmt]
            if len(h):
                ax.plot([h["eff"].iloc[0]], [_inf_to([h["rel_err_W"].median()], top)[0]], mk,
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
    # (b) what a rounding costs: queries per unknown for a target error
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
            ylabel="queries per unknown, counted / (d^2 + d)")
    ax2.set_title("(b) queries per unknown for a relative error of W\n(low-precision learner; "
                  "hollow: smallest budget or fewer, or extrapolated)", fontsize=7.5)
    ax2.legend(fontsize=5.5, loc="upper right", title="median head", title_fontsize=5.5)
    tight_layout(fig)
    return fig, claims


__all__ = ["noise_claims", "rounding_claims", "useful_digits", "rounding_costs", "noise_scaling",
           "defence_rounding"]
