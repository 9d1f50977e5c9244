"""Figure exact_queries: counted queries and recovery error of Theorem 4.1 against d."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

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
from ..theory import EXACT_TOL
from ._core import log2_ticks, register_figure

#: exponent interval the claim accepts
EXPONENT_RANGE = (1.95, 2.05)
#: the exponent is fitted on d >= this (the d term of d^2 + d bends the curve below it)
FIT_MIN_D = 16


@dataclass(frozen=True)
class ExactData:
    """What the claims of the exact experiment read: its rows and those that ran to an answer."""

    rows: object
    ok: object


def exact_data(df) -> ExactData:
    """The :class:`ExactData` of the result rows ``df``."""
    return ExactData(df[df["experiment"] == "exact"], ok_rows(df, "exact"))


#: the claims of the exact experiment (one function each, named as the claim)
CLAIMS = ClaimSet(exact_data)


@CLAIMS
def exact_exponent(data: ExactData) -> Claim:
    """Queries grow as d^2: the exponent fitted on d >= FIT_MIN_D within EXPONENT_RANGE."""
    fit_rows = data.ok[data.ok["d"] >= FIT_MIN_D]
    if len(fit_rows["d"].unique()) < 2 or len(fit_rows) < 3:
        return Claim("exact_exponent", "queries grow as d^2", False,
                     f"too few grid points with d >= {FIT_MIN_D} to fit")
    fit = fit_power_law(fit_rows["d"], fit_rows["n_queries"])
    return Claim(
        "exact_exponent",
        f"queries grow as d^2 (fitted exponent in [{EXPONENT_RANGE[0]}, {EXPONENT_RANGE[1]}])",
        bool(EXPONENT_RANGE[0] <= fit.slope <= EXPONENT_RANGE[1]),
        f"exponent {fit} on d >= {FIT_MIN_D}",
        numbers=(fit_number("exactQueryExponent", fit, f"exact, status ok, d >= {FIT_MIN_D}"),),
    )


@CLAIMS
def exact_count(data: ExactData) -> Claim:
    """Every run uses exactly d^2 + d queries."""
    ok = data.ok
    exact_count = (ok["n_queries"] == ok["d"] ** 2 + ok["d"])
    return threshold_claim(
        "exact_count", "every run uses exactly d^2 + d queries (as counted by the oracle)",
        exact_count,
        numbers=(Number("exactRuns", len(ok), "runs", "d", rows="exact, status ok"),
                 Number("exactRunsExactCount", int(exact_count.sum()), "runs", "d",
                        rows="exact, status ok, n_queries = d^2 + d"),
                 Number("exactMaxD", int(ok["d"].max()) if len(ok) else 0, "d", "d",
                        rows="exact, status ok")))


@CLAIMS
def exact_checked(data: ExactData) -> Claim:
    """Every run passed the learner's own check, its check queries counted apart."""
    ok = data.ok
    checked = ok["verified"].fillna(False).astype(bool) & (ok["verify_queries"].fillna(0) > 0)
    return Claim(
        "exact_checked", "every run passed the learner's own check, its check queries counted "
        "apart from the d^2 + d",
        bool(checked.all()),
        f"{int(checked.sum())}/{len(ok)} runs; {int(ok['verify_queries'].max()) if len(ok) else 0}"
        " check queries each, largest disagreement "
        f"{ok['verify_error'].astype(float).max() if len(ok) else float('nan'):.1e}",
        n_runs=len(ok),
        numbers=(Number("exactRunsChecked", int(checked.sum()), "runs", "d",
                        rows="exact, status ok, verified"),
                 Number("exactCheckQueries",
                        int(ok["verify_queries"].max()) if len(ok) else 0, "queries", "d",
                        rows="exact, status ok, largest verify_queries")),
    )


@CLAIMS
def exact_error(data: ExactData) -> Claim:
    """Every head is recovered to relative error <= EXACT_TOL (failed runs count against)."""
    ok = data.ok
    succ = ok["success"].fillna(False).astype(bool)
    return threshold_claim(
        "exact_error", f"every head is recovered to relative error <= {EXACT_TOL:g}",
        succ, of=len(data.rows), worst=ok["rel_err_W"].max(),
        numbers=(Number("exactWorstError", float(ok["rel_err_W"].max()), "relative error of W",
                        ".2g", rows="exact, status ok, largest rel_err_W",
                        factor=ROUNDING_FACTOR),
                 *(Number(f"exactMedianError{p.capitalize()}", float(g["rel_err_W"].median()),
                          "relative error of W", ".2g", rows=f"exact, status ok, probes = {p}",
                          factor=ROUNDING_FACTOR)
                   for p, g in ok.groupby("probes", sort=True)),
                 *(Number(f"exactWorstError{p.capitalize()}", float(g["rel_err_W"].max()),
                          "relative error of W", ".2g", rows=f"exact, status ok, probes = {p}",
                          factor=ROUNDING_FACTOR)
                   for p, g in ok.groupby("probes", sort=True))) if len(ok) else ())


def exact_claims(df) -> list[Claim]:
    """The claims of the exact experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


EXACT_QUERIES_CAPTION = """\
**Exact recovery (Theorem 4.1).** Left: the queries counted by the oracle against the dimension d
on log-log axes, with the exponent fitted on d >= 16 and its 95% interval, beside the paper's
count d^2 + d. Right: the relative Frobenius error of the recovered W against d (median and worst
over seeds and head scales), for the Gaussian and the basis probe designs; the dashed line is the
1e-10 target.
"""


@register_figure(
    "exact_queries",
    experiments=["exact"],
    category="Exact recovery",
    caption=EXACT_QUERIES_CAPTION,
)
def exact_queries(df):
    """Queries against d (log-log, fitted exponent) and relative error of W against d."""
    ok = ok_rows(df, "exact")
    claims = exact_claims(df)
    fig, (ax1, ax2) = plt.subplots(1, 2)
    ds = np.sort(ok["d"].unique())
    for k, (probes, g) in enumerate(ok.groupby("probes", sort=True)):
        ax1.plot(g["d"], g["n_queries"], "o" if k == 0 else "x", color=f"C{k}", alpha=0.7,
                 label=f"counted, {probes} probes")
    if ds.size:
        xx = np.geomspace(ds.min(), ds.max(), 100)
        ax1.plot(xx, xx**2 + xx, "k--", lw=0.8, label="$d^2 + d$")
    fit_claim = claims[0]
    ax1.set(xscale="log", yscale="log", xlabel="dimension $d$",
            ylabel="queries counted by the oracle")
    ax1.set_title("Queries against $d$")
    ax1.text(0.97, 0.04, "fitted " + fit_claim.detail.replace(" (95% CI", "\n(95% CI"),
             transform=ax1.transAxes, ha="right", va="bottom", fontsize=6.5)
    ax1.legend(loc="upper left")
    floor = 1e-17
    for k, (probes, g) in enumerate(ok.groupby("probes", sort=True)):
        agg = g.groupby("d")["rel_err_W"].agg(["median", "max"])
        col = f"C{k}"
        ax2.plot(agg.index, np.maximum(agg["median"], floor), "o-", color=col,
                 label=f"{probes}: median")
        ax2.plot(agg.index, np.maximum(agg["max"], floor), "^:", color=col,
                 label=f"{probes}: max")
    ax2.axhline(EXACT_TOL, color="k", lw=0.8, ls="--", label=f"target {EXACT_TOL:g}")
    ax2.set(xscale="log", yscale="log", xlabel="dimension $d$",
            ylabel=r"$\|\hat W - W\|_F / \|W\|_F$")
    for ax in (ax1, ax2):
        log2_ticks(ax, ds)
    ax2.set_title("Relative error of $W$ (over seeds and head scales)")
    ax2.set_ylim(top=1e-8)
    ax2.legend(loc="upper left", ncol=3, fontsize=6)
    return fig, claims
