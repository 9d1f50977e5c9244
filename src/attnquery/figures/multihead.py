"""Figure multihead: non-identifiability (Prop. 7.1) and orthogonal-subspace recovery (App. C)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..claims import ROUNDING_FACTOR, Claim, ClaimSet, Number, ok_rows, threshold_claim
from ..theory import AGREE_TOL, DISCOVER_TOL, DISTANCE_MIN, KNOWN_TOL
from ..theory import NON_IDENTIFIABLE_CONSTRUCTIONS as CONSTRUCTIONS
from ._core import log2_ticks, register_figure

#: the learner's default finite-difference step, at which the discovery claim is checked
DEFAULT_STEP = 1e-2
#: success rate the discovery claim requires at the default step
DISCOVERY_RATE = 0.9
FLOOR = 1e-17  # differences of exactly 0 are drawn here on log axes
LABELS = {
    "prop71": r"Prop. 7.1 (shared $W$, $v_h = \lambda_h b$)",
    "shared_w": "heads sharing $W$, zero-sum $v$ changes",
    "dead_head": "head with $v = 0$, any $W$",
    "single_head": "single-head learner on $H$-head oracle",
}


def _multihead_rows(df):
    return df[df["experiment"] == "multihead"]


#: the claims of the multihead experiment (one function each, named as the claim), checked on
#: its rows (every status)
CLAIMS = ClaimSet(_multihead_rows)


@CLAIMS
def multihead_nonidentifiable(rows) -> Claim:
    """Every non-identifiable pair agrees to AGREE_TOL while its parameters differ by more than
    DISTANCE_MIN; a pair that did not run counts against."""
    ni = ok_rows(rows)
    ni = ni[ni["variant"].isin(CONSTRUCTIONS)]
    n_ni = int(rows["variant"].isin(CONSTRUCTIONS).sum())
    agree = (ni["output_difference"] <= AGREE_TOL) & (ni["param_distance"] > DISTANCE_MIN)
    return Claim(
        "multihead_nonidentifiable",
        f"every non-identifiable pair agrees to {AGREE_TOL:g} relative on 1000 random inputs "
        f"while its parameters differ by more than {DISTANCE_MIN:g} (relative)",
        bool(len(ni) == n_ni and agree.all()),
        f"{int(agree.sum())}/{n_ni} pairs; largest output difference "
        f"{ni['output_difference'].max():.1e}, smallest distance {ni['param_distance'].min():.2f}",
        n_runs=len(ni),
        numbers=(Number("multiheadPairs", n_ni, "pairs", "d", rows="multihead, constructions"),
                 Number("multiheadPairsMaxDifference", float(ni["output_difference"].max()),
                        "relative output difference", ".1g", rows="multihead, constructions",
                        factor=ROUNDING_FACTOR),
                 Number("multiheadPairsMinDistance", float(ni["param_distance"].min()),
                        "relative parameter distance", ".2f", rows="multihead, constructions"))
        if len(ni) else (),
    )


@CLAIMS
def multihead_single_head_fails(rows) -> Claim:
    """The single-head learner on a multi-head oracle is far from the function, or refuses."""
    sh = rows[rows["variant"] == "single_head"]
    sh_ok = sh[sh["status"] == "ok"]
    # the learner refuses: during its probes (attention weights outside (0, 1)) or when its
    # check queries disagree with the head it found (ModelMismatchError)
    refused = sh["message"].fillna("").str.contains(
        "not those of a single attention head|differ from a single attention head")
    far = (sh["status"] == "ok") & (sh["func_err"] > 1e-3)
    return Claim(
        "multihead_single_head_fails",
        "the single-head exact learner on a multi-head oracle is far from the function "
        "(relative functional error > 1e-3), or reports answers no single head gives",
        bool((far | refused).all()),
        f"{int(far.sum())} far, {int(refused.sum())} refused, of {len(sh)} runs; smallest "
        f"error {sh_ok['func_err'].min():.2e}",
        n_runs=len(sh),
        numbers=(Number("multiheadSingleHeadRuns", len(sh), "runs", "d",
                        rows="multihead, variant single_head"),
                 Number("multiheadSingleHeadRefused", int(refused.sum()), "runs", "d",
                        rows="multihead, variant single_head, refused by the learner"),
                 *((Number("multiheadSingleHeadMinError", float(sh_ok["func_err"].min()),
                           "relative functional error", ".2g",
                           rows="multihead, variant single_head, status ok"),) if len(sh_ok)
                   else ())),
    )


@CLAIMS
def multihead_known_bases(rows) -> Claim:
    """With the bases known (Prop. C.2) every head is recovered to KNOWN_TOL."""
    kn = rows[rows["variant"] == "known"]
    kn_ok = (kn["status"] == "ok") & (kn["rel_err_W"] <= KNOWN_TOL) & \
        (kn["rel_err_v"] <= KNOWN_TOL)
    return threshold_claim(
        "multihead_known_bases",
        f"with the bases known (Prop. C.2) every head is recovered to relative error <= "
        f"{KNOWN_TOL:g}", kn_ok, worst=kn["rel_err_W"].max(),
        numbers=(Number("multiheadKnownWorstError", float(kn["rel_err_W"].max()),
                        "relative error of W", ".2g", rows="multihead, variant known",
                        factor=ROUNDING_FACTOR),)
        if len(kn) else ())


@CLAIMS
def multihead_discovery_rate(rows) -> Claim:
    """Basis discovery at the default step recovers every head in at least DISCOVERY_RATE of the
    runs."""
    disc = rows[rows["variant"] == "discover"]
    at_default = disc[np.isclose(disc["fd_step"], DEFAULT_STEP)]
    succ = (at_default["status"] == "ok") & at_default["success"].fillna(False).astype(bool)
    return Claim(
        "multihead_discovery_rate",
        f"basis discovery at the default step h = {DEFAULT_STEP:g} recovers every head to "
        f"{DISCOVER_TOL:g} in at least {DISCOVERY_RATE:.0%} of the runs (the rate at every step "
        "is drawn, as measured)",
        bool(succ.mean() >= DISCOVERY_RATE),
        f"{int(succ.sum())}/{len(at_default)} runs at h = {DEFAULT_STEP:g}; "
        f"{int(disc['success'].fillna(False).astype(bool).sum())}/{len(disc)} at all steps",
        n_runs=len(at_default),
        numbers=(Number("multiheadDiscoveryRuns", len(at_default), "runs", "d",
                        rows=f"multihead, variant discover, h = {DEFAULT_STEP:g}"),
                 Number("multiheadDiscoverySuccesses", int(succ.sum()), "runs", "d",
                        rows=f"multihead, variant discover, h = {DEFAULT_STEP:g}, success")),
    )


def multihead_claims(df) -> list[Claim]:
    """The claims of the multihead experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


MULTIHEAD_CAPTION = """\
**Multi-head attention (Sec. 7, App. C).** (a) Pairs of distinct parameter sets computing the
same function: the paper's Prop. 7.1 (all heads share W, v_h = lambda_h b), heads sharing a W
with zero-sum changes of their v's, and a head with v = 0 whose W is arbitrary; x: relative
parameter distance after the best head permutation, y: largest relative output difference on
1000 random inputs (the dashed line is 1e-12, the dotted line a distance of 0.1). Crosses: the
single-head exact learner run on a generic H-head oracle (its functional error and distance to
the heads). (b) Prop. C.2 with the subspace bases known: worst relative error of a head's W
against d, per number of heads H. (c) Basis discovery from finite-difference Hessians (commutant
of the Hessians M(y_k), then Prop. C.2): success rate (every head within 1e-6) against d at the
default step, per H, with the number of runs. (d) Success rate and median error against the
finite-difference step h.
"""


@register_figure(
    "multihead",
    experiments=["multihead"],
    category="One-layer transformers and multi-head attention",
    caption=MULTIHEAD_CAPTION,
)
def multihead(df):
    """Non-identifiability, known-basis recovery and basis-discovery success rates."""
    ok = ok_rows(df, "multihead")
    all_rows = df[df["experiment"] == "multihead"]
    claims = multihead_claims(df)
    fig, axes = plt.subplots(2, 2, figsize=(6.75, 5.6), layout="constrained")
    ax1, ax2, ax3, ax4 = axes.ravel()
    markers = {"prop71": "o", "shared_w": "s", "dead_head": "^", "single_head": "x"}
    for k, variant in enumerate([*CONSTRUCTIONS, "single_head"]):
        g = ok[ok["variant"] == variant]
        if len(g):
            ax1.scatter(g["param_distance"], np.maximum(g["output_difference"], FLOOR),
                        marker=markers[variant], color=f"C{k}", s=14, label=LABELS[variant])
    ax1.axhline(AGREE_TOL, color="k", ls="--", lw=0.8)
    ax1.axvline(DISTANCE_MIN, color="k", ls=":", lw=0.8)
    ax1.set(xscale="log", yscale="log",
            xlabel="parameter distance (relative, best permutation)",
            ylabel="max relative output difference")
    ax1.set_title("(a) Distinct parameters, same function")
    ax1.legend(fontsize=5.5, loc="center left", title=f"(0 drawn at {FLOOR:g})",
               title_fontsize=5.5)
    kn = ok[ok["variant"] == "known"]
    for k, (H, g) in enumerate(kn.groupby("n_heads")):
        agg = g.groupby("d")["rel_err_W"].max()
        ax2.plot(agg.index, np.maximum(agg.values, FLOOR), "o-", color=f"C{k}", label=f"H = {H}")
    ax2.axhline(KNOWN_TOL, color="k", ls="--", lw=0.8, label=f"target {KNOWN_TOL:g}")
    ax2.set(xscale="log", yscale="log", xlabel="dimension $d$",
            ylabel=r"worst head $\|\hat W_h - W_h\|_F / \|W_h\|_F$")
    ax2.set_title("(b) Known bases (Prop. C.2)")
    ax2.legend(fontsize=6)
    if len(kn):
        log2_ticks(ax2, np.sort(kn["d"].unique()))
    disc = all_rows[all_rows["variant"] == "discover"].copy()
    disc["succ"] = (disc["status"] == "ok") & disc["success"].fillna(False).astype(bool)
    steps = np.sort(disc["fd_step"].dropna().unique())
    default = steps[np.argmin(np.abs(np.log(steps / DEFAULT_STEP)))] if steps.size else np.nan
    sub = disc[disc["fd_step"] == default]
    for k, (H, g) in enumerate(sub.groupby("n_heads")):
        rate = g.groupby("d")["succ"].mean()
        cnt = g.groupby("d")["succ"].size()
        ax3.plot(rate.index, rate.values, "os^D"[k % 4] + "-:"[k % 2], color=f"C{k}",
                 ms=6 - 1.5 * k, label=f"H = {H}")
        for x, y, c in zip(rate.index, rate.values, cnt.values, strict=True):
            ax3.annotate(f"n={c}", (x, y), fontsize=5, xytext=(2, -7 - 8 * k),
                         textcoords="offset points")
    ax3.set(xscale="log", ylim=(-0.05, 1.05), xlabel="dimension $d$", ylabel="success rate")
    ax3.set_title(f"(c) Basis discovery, step {default:g}")
    ax3.legend(fontsize=6)
    if len(sub):
        log2_ticks(ax3, np.sort(sub["d"].unique()))
    for k, (H, g) in enumerate(disc.groupby("n_heads")):
        rate = g.groupby("fd_step")["succ"].mean()
        ax4.plot(rate.index, rate.values, "os^D"[k % 4] + "-:"[k % 2], color=f"C{k}",
                 ms=6 - 1.5 * k, label=f"H = {H} (all d)")
    ax4b = ax4.twinx()
    err = disc[disc["status"] == "ok"].groupby("fd_step")["rel_err_W"].median()
    ax4b.plot(err.index, np.maximum(err.values, FLOOR), "k^:", ms=4, label="median error of W")
    ax4b.set(yscale="log", ylabel="median relative error of $W$")
    ax4.set(xscale="log", ylim=(-0.05, 1.05), xlabel="finite-difference step $h$",
            ylabel="success rate")
    ax4.set_title("(d) Basis discovery against the step")
    h1, l1 = ax4.get_legend_handles_labels()
    h2, l2 = ax4b.get_legend_handles_labels()
    ax4.legend(h1 + h2, l1 + l2, fontsize=6, loc="lower left")
    return fig, claims
