"""Figure rotary: rotary heads (RoPE) from value queries (beyond the paper).

Reads the rows of the ``rotary`` experiment: counted queries against d, the frequencies' errors
and the functional error against the sequence length (1 to 4,096 tokens).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..claims import Claim, extra_values, ok_rows, threshold_claim
from ..metrics import fit_power_law
from . import log2_ticks, register_figure

#: exponent interval the claim accepts (dense route, d >= FIT_MIN_D)
EXPONENT_RANGE = (1.95, 2.05)
FIT_MIN_D = 32
#: largest frequency error (absolute, radians per position) the claim accepts
FREQ_TOL = 1e-12
#: largest functional error (relative, every length up to 4,096 tokens) per route
FUNC_TOL = {"dense": 1e-9, "lowrank": 1e-8}


def expected_queries(route: str, d: int, rank: int, oversample: int = 8) -> int:
    """The learner's count on an ordinary head (its module docstring): ``2 (d^2 + d)`` dense,
    ``d (k + 2 r + 3) + r^2 + 2 r`` (k = r + oversample) on the sketch route."""
    if route == "dense":
        return 2 * (d * d + d)
    k = min(d, rank + oversample)
    return d * (k + 2 * rank + 3) + rank * rank + 2 * rank


def rotary_claims(df) -> list[Claim]:
    """The claims of the rotary experiment, checked on its rows."""
    ok = ok_rows(df, "rotary")
    all_rows = df[df["experiment"] == "rotary"]
    n_all = len(all_rows)
    claims = []
    want = np.array([expected_queries(r, int(d), int(k))
                     for r, d, k in zip(ok["variant"], ok["d"], ok["rank"], strict=True)],
                    dtype=float)
    exact = ok["n_queries"].to_numpy(dtype=float) == want
    claims.append(threshold_claim(
        "rotary_count", "every run uses exactly 2 (d^2 + d) queries (dense route; the sketch "
        "route its own count), as counted by the oracle", exact, of=n_all))
    dense = ok[(ok["variant"] == "dense") & (ok["d"] >= FIT_MIN_D)]
    if len(dense["d"].unique()) >= 2 and len(dense) >= 3:
        fit = fit_power_law(dense["d"], dense["n_queries"])
        const = float(np.median(dense["n_queries"] / (dense["d"] ** 2 + dense["d"])))
        claims.append(Claim(
            "rotary_exponent", f"dense queries grow as d^2 (fitted exponent in "
            f"[{EXPONENT_RANGE[0]}, {EXPONENT_RANGE[1]}]), twice the paper's d^2 + d",
            bool(EXPONENT_RANGE[0] <= fit.slope <= EXPONENT_RANGE[1] and abs(const - 2) < 1e-9),
            f"exponent {fit} on d >= {FIT_MIN_D}; queries / (d^2 + d) = {const:.3f}",
            n_runs=len(dense)))
    else:
        claims.append(Claim("rotary_exponent", "dense queries grow as d^2", False,
                            f"too few dense grid points with d >= {FIT_MIN_D} to fit", n_runs=0))
    freq = extra_values(ok, "freq_err", float("inf")).astype(float)
    good = freq <= FREQ_TOL
    claims.append(threshold_claim(
        "rotary_frequencies", f"the frequencies are found from the answers to {FREQ_TOL:g}",
        good, of=n_all, worst=freq.max() if len(ok) else float("nan"), fmt=".1e"))
    tol = ok["variant"].map(FUNC_TOL).astype(float)
    within = ok["func_err"].astype(float) <= tol
    parts = []
    for route, g in ok.groupby("variant", sort=True):
        parts.append(f"{route}: worst {g['func_err'].max():.1e} (<= {FUNC_TOL[route]:g})")
    claims.append(Claim(
        "rotary_length", "the recovered head agrees with the box on sequences of 1 to 4,096 "
        "tokens: functional relative error <= 1e-9 (dense; 1e-8 on the sketch route)",
        bool(within.all() and len(ok) == n_all),
        f"{int(within.sum())}/{n_all} runs; " + "; ".join(parts), n_runs=len(ok)))
    checked = ok["verified"].fillna(False).astype(bool)
    claims.append(threshold_claim(
        "rotary_checked", "every run passed the learner's own check on sequences of up to "
        "4,096 tokens, its check queries counted apart", checked, of=n_all))
    return claims


def _legend(ax, **kw):
    """A legend, where the axes have labelled artists (none without data)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


ROTARY_CAPTION = """\
**Rotary heads from value queries (beyond the paper).** Left: the queries counted by the oracle
against d (log-log), dense route (2 (d^2 + d), dashed) and sketch route, with the exponent
fitted on the dense runs. Middle: the largest error of the frequencies theta_j found from the
answers (no rope base given), per run. Right: the functional relative error against the length
of the held-out sequences (1 to 4,096 tokens), worst over the runs of each d and route.
"""


@register_figure("rotary", experiments=["rotary"], category="Beyond the paper",
                 caption=ROTARY_CAPTION)
def rotary(df):
    """Queries against d, frequency errors, functional error against the sequence length."""
    ok = ok_rows(df, "rotary")
    claims = rotary_claims(df)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(10, 3.2))
    ds = np.sort(ok["d"].unique())
    for k, (route, g) in enumerate(ok.groupby("variant", sort=True)):
        ax1.plot(g["d"], g["n_queries"], "ox"[k % 2], color=f"C{k}", label=f"counted, {route}")
        ax2.plot(g["d"], np.maximum(extra_values(g, "freq_err", np.nan).astype(float), 1e-18),
                 "ox"[k % 2], color=f"C{k}", label=route)
    if ds.size:
        xx = np.geomspace(ds.min(), ds.max(), 100)
        ax1.plot(xx, 2 * (xx**2 + xx), "k--", lw=0.8, label="$2(d^2 + d)$")
    ax1.set(xscale="log", yscale="log", xlabel="dimension $d$", ylabel="queries counted")
    ax1.set_title("Queries against $d$")
    ax1.text(0.97, 0.04, claims[1].detail.split(";")[0].replace(" (95% CI", "\n(95% CI"),
             transform=ax1.transAxes, ha="right", va="bottom", fontsize=6)
    _legend(ax1, loc="upper left", fontsize=6)
    ax2.axhline(FREQ_TOL, color="k", lw=0.8, ls="--", label=f"target {FREQ_TOL:g}")
    ax2.set(xscale="log", yscale="log", xlabel="dimension $d$",
            ylabel=r"$\max_j |\hat\theta_j - \theta_j|$")
    ax2.set_title("Frequency error")
    _legend(ax2, loc="upper left", fontsize=6)
    for k, ((route, d), g) in enumerate(ok.groupby(["variant", "d"], sort=True)):
        by = extra_values(g, "func_err_by_length", {})
        lengths = sorted({int(n) for row in by for n in row})
        worst = [max(float(row.get(str(n), np.nan)) for row in by) for n in lengths]
        ax3.plot(lengths, np.maximum(worst, 1e-17), "o-" if route == "dense" else "^:",
                 color=f"C{k}", label=f"{route}, d={d}")
    for route, tol in FUNC_TOL.items():
        ax3.axhline(tol, color="k", lw=0.8, ls="--" if route == "dense" else ":")
    ax3.set(xscale="log", yscale="log", xlabel="sequence length $N$",
            ylabel="functional relative error")
    ax3.set_title("Error against the sequence length")
    _legend(ax3, loc="lower right", fontsize=5, ncol=2)
    for ax in (ax1, ax2):
        log2_ticks(ax, ds)
    return fig, claims
