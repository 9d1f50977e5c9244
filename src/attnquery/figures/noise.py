"""Figure noise_scaling: learning from approximate answers (Sec. 6, Theorem 6.1)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..claims import Claim, ClaimSet, Number, extra_values, fit_number, number_name, ok_rows
from ..theory import oversample_exponent_range, theorem61_guarantee
from ..theory import theorem61_premise as cell_meets_assumptions
from ._common import fit_within
from ._core import register_figure, tight_layout

#: interval the fitted slope of error against tau must fall in
SLOPE_RANGE = (0.9, 1.1)
NOISE_MODELS = ("uniform", "adversarial")


def _tau_rows(df, ok_only=True):
    rows = ok_rows(df, "noise") if ok_only else df[df["experiment"] == "noise"]
    return rows[rows["variant"] == "tau"]


def _met(rows):
    """Rows whose cell meets Theorem 6.1's assumptions (from the cell's parameters)."""
    met = [cell_meets_assumptions(d, t, m, w) for d, t, m, w in
           zip(rows["d"], rows["tau"], rows["mu"], rows["W_bound"], strict=True)]
    return rows[np.array(met, dtype=bool)]


def _noisy_met(df):
    """Ok rows of the noisy learner without oversampling whose run met the assumptions."""
    rows = _tau_rows(df)
    noisy = rows[(rows["learner"] == "noisy") & (rows["oversample"] == 1)]
    return noisy[extra_values(noisy, "assumptions_met", False).astype(bool)]


#: the claims of the noise experiment (one function each, named as the claim; the per-model
#: claims are named ``<function>_<model>``), checked on the result rows
CLAIMS = ClaimSet()


@CLAIMS
def noise_bound(df) -> list[Claim]:
    """Per noise model: every run meeting Theorem 6.1's assumptions is within its guarantee (a
    cell meeting them that did not run to an answer counts against)."""
    met, every = _noisy_met(df), _tau_rows(df, ok_only=False)
    claims = []
    for model in NOISE_MODELS:
        g = met[met["noise"] == model]
        # every cell meeting the assumptions (any status) must be an ok row within the bound
        cells = _met(every[(every["learner"] == "noisy") & (every["noise"] == model)])
        wb = g["within_bound"].fillna(False).astype(bool)
        claims.append(Claim(
            f"noise_bound_{model}",
            f"{model} noise: every run meeting Theorem 6.1's assumptions is within its guarantee",
            bool(wb.all() and len(g) == len(cells)),
            f"{int(wb.sum())}/{len(cells)} runs; largest error / guarantee "
            f"{(g['abs_err_W'] / g['bound_W']).max():.3g}" if len(g) else "no runs",
            n_runs=len(g),
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
    return claims


@CLAIMS
def noise_slope(df) -> list[Claim]:
    """Per noise model: the error grows linearly in tau (log-log slope in SLOPE_RANGE, fitted
    with an intercept per cell on the runs where no weight was clipped)."""
    met = _noisy_met(df)
    claims = []
    for model in NOISE_MODELS:
        g = met[met["noise"] == model]
        g = g[extra_values(g, "n_clipped", 0).astype(int) == 0]
        numbers = ()
        try:
            fit = fit_within(g, "tau", "abs_err_W", by=("noise", "mu", "W_bound", "d", "seed"))
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
    return claims


@CLAIMS
def noise_unclipped_fails(df) -> Claim:
    """Without clipping the estimate is undefined in some runs that meet the assumptions."""
    every = _tau_rows(df, ok_only=False)
    unc = _met(every[every["learner"] == "unclipped"])
    und = unc["status"] != "ok"
    return Claim(
        "noise_unclipped_fails",
        "without clipping the estimate is undefined (sigma^-1 outside (0, 1)) in some runs that "
        "meet the theorem's assumptions",
        bool(und.any()),
        f"unclipped undefined in {int(und.sum())}/{len(unc)} such runs, at tau >= "
        f"{unc[und]['tau'].min() if und.any() else float('nan'):g}",
        n_runs=len(unc),
        numbers=(Number("noiseUnclippedUndefinedTau", float(unc[und]["tau"].min()), "tau", "g",
                        rows="noise, learner unclipped, smallest tau of an undefined run"),)
        if und.any() else (),
    )


@CLAIMS
def noise_checks(df) -> Claim:
    """The learners' own checks against noisy answers: Theorem 6.1's learner passes its check in
    every run (its tolerance is the declared tau), Theorem 4.1's learner, which allows float64
    rounding only, verifies no noisy oracle (it refuses the estimate, ``verified`` False, or fails
    in the probes)."""
    rows = df[df["experiment"] == "noise"]
    noisy = rows[rows["learner"] == "noisy"]
    exact = rows[rows["learner"] == "exact"]
    checked = int(((noisy["status"] == "ok") & noisy["verified"].eq(True)).sum())
    ok = exact["status"] == "ok"
    refused = int((ok & exact["verified"].eq(False)).sum())
    failed = int((~ok).sum())
    passed = len(noisy) > 0 and checked == len(noisy) and refused + failed == len(exact)
    return Claim(
        "noise_checks",
        "the learners' checks see the noise: Theorem 6.1's learner passes its check in every run, "
        "Theorem 4.1's (float64 rounding allowed) verifies no noisy oracle",
        bool(passed),
        f"noisy learner checked in {checked}/{len(noisy)} runs; exact learner refused "
        f"{refused} and failed in the probes in {failed} of {len(exact)}",
        n_runs=len(noisy),
        numbers=(Number("noiseNoisyRunsAll", len(noisy), "runs", "d",
                        rows="noise, learner noisy, every variant"),
                 Number("noiseNoisyChecked", checked, "runs", "d",
                        rows="noise, learner noisy, status ok and verified"),
                 Number("noiseExactRefused", refused, "runs", "d",
                        rows="noise, learner exact, status ok, verified false"),
                 Number("noiseExactProbeFailures", failed, "runs", "d",
                        rows="noise, learner exact, status not ok")))


@CLAIMS
def noise_oversample(df) -> Claim | None:
    """The claim on oversampling under uniform noise: the fitted exponent's 95% interval lies
    below 0 (the error falls) and meets the range least squares allows on the grid
    (:func:`attnquery.theory.oversample_exponent_range`: from -1/2, plain averaging, to the rate of
    half-scale extra probes). No claim (None) without two oversampling factors."""
    ov = ok_rows(df, "noise")
    ov = ov[(ov["variant"] == "oversample") & (ov["noise"] == "uniform")]
    if ov["oversample"].nunique() < 2:
        return None
    fit = fit_within(ov, "oversample", "abs_err_W", by=("seed",))
    steep, shallow = oversample_exponent_range(ov["oversample"].unique())
    ok = fit.hi < 0 and fit.lo <= shallow and fit.hi >= steep
    return Claim(
        "noise_oversample",
        "uniform noise: error falls with oversampling k as least squares predicts, between "
        f"k^({steep:g}) and k^({shallow:.2f}) on this grid (the fitted exponent's 95% interval "
        "is below 0 and meets that range)",
        bool(ok), f"exponent {fit}; least squares allows [{steep:g}, {shallow:.3f}]",
        numbers=(fit_number("noiseOversampleExponent", fit,
                            "noise, variant oversample, uniform noise"),
                 Number("noiseOversampleShallowest", shallow, "exponent", ".2f",
                        rows="noise, variant oversample: least squares with every extra probe "
                        "at half scale, fitted over the grid's k (attnquery.theory)")))




def noise_claims(df) -> list[Claim]:
    """Claims of the noise experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


def oversample_claims(df) -> list[Claim]:
    """The claim on oversampling (:func:`noise_oversample`) as a list: empty without two
    oversampling factors."""
    claim = noise_oversample(df)
    return [] if claim is None else [claim]


#: the claim on the learners' checks under its former name
checks_claim = noise_checks


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
unknown and least squares; under uniform noise the error falls between k^(-1/2) (plain
averaging, dashed) and the rate of extra probes at half the theorem's scale (dotted): least squares
allows no other (the extra probes' scales are drawn in [1/2, 1]); under adversarial noise it does
not fall.
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
    fig, axes = plt.subplots(2, 2, figsize=(6.75, 5.6))
    (ax1, ax2), (ax3, ax4) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    dmax = _error_panels(ax1, ax2, rows, claims, colors)
    if len(rows):
        _baselines_panel(ax3, rows, _tau_rows(df, ok_only=False), dmax, colors)
    _oversample_panel(ax4, df, claims, colors)
    tight_layout(fig)
    return fig, claims


_MARKS = {"uniform": "o", "adversarial": "^"}


def _error_panels(ax1, ax2, rows, claims, colors) -> int:
    """(a) the error of W and (b) of v against tau at the largest d, per (mu, W_bound), with
    the theorem's guarantees; returns that d."""
    marks = _MARKS
    noisy = rows[(rows["learner"] == "noisy") & (rows["oversample"] == 1)]
    dmax = int(noisy["d"].max()) if len(noisy) else 0
    sub = noisy[noisy["d"] == dmax]
    combos = sorted(set(zip(sub["mu"], sub["W_bound"], strict=True)))
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
    ax1.set_title(f"(a) $W$ error, d = {dmax}\nfitted slopes (uniform; adversarial):\n{slopes}",
                  fontsize=7)
    ax1.legend(fontsize=5.5, loc="upper left", ncol=2)
    ax2.set(xscale="log", yscale="log", xlabel=r"tolerance $\tau$",
            ylabel=r"$\|\hat v - v\|_2$")
    ax2.set_title(f"(b) $v$ error, d = {dmax}")
    ax2.legend(fontsize=6, loc="upper left")
    return dmax


def _baselines_panel(ax3, rows, every, dmax, colors) -> None:
    """(c) the clipped learner against the unclipped one and the exact learner, at one
    (mu, W_bound) and the largest d; crosses at the top: the share of failed runs."""
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


def _oversample_panel(ax4, df, claims, colors) -> None:
    """(d) the error against the distinct probes per unknown, with the fitted exponent."""
    marks = _MARKS
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
            if ks.size >= 2:
                shallow = oversample_exponent_range(ks)[1]
                ax4.plot(ks, float(ref.median()) * (ks / ks[0]) ** shallow, "k:", lw=0.8,
                         label=rf"$\propto k^{{{shallow:.2f}}}$ (half-scale probes)")
        oc = [c for c in claims if c.name == "noise_oversample"]
        t = ov.iloc[0]
        ax4.set_title(rf"(d) oversampling, $\tau$={t['tau']:g}, d={int(t['d'])}"
                      + (f"\nexponent {oc[0].detail.split(' (')[0].replace('exponent ', '')}"
                         if oc else ""), fontsize=7)
    ax4.set(xlabel="distinct probes per unknown $k$", ylabel=r"$\|\hat W - W\|_F$")
    if ax4.has_data():
        ax4.set(xscale="log", yscale="log")
    ax4.legend(fontsize=6)


__all__ = ["CLAIMS", "noise_claims", "noise_scaling"]
