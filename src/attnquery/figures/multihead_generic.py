"""Figure multihead_generic: where generic multi-head recovery from value queries works.

Panels: success rate over (d, H); error against the separation eps of two heads
(``W_2 = W_1 + eps D``, eps = 0 being Prop. 7.1's non-identifiable shared-W construction);
queries counted by the oracle against d for each H (with the orthogonal-subspace comparison).
These panels read deterministic columns only, so the figure is byte-for-byte reproducible.

Figure multihead_generic_time: wall time per run against d, the one panel that reads wall-clock
timings (excluded from the reproducibility check).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from ..claims import ROUNDING_FACTOR, Claim, ClaimSet, Number, threshold_claim
from ..theory import MULTIHEAD_GENERIC_TOL as SUCCESS_TOL
from ._core import log2_ticks, register_figure

#: the claim on random heads covers grid points with d and H up to these
SMALL_D, SMALL_H = 12, 3
#: separations at or above this are claimed to be recovered
SEPARATION_CLAIM = 1e-2
#: the two learners run on the orthogonal-subspace family: (learner, marker, legend label)
_ORTH_LEARNERS = (("multihead_generic", "D", "orthogonal family, generic learner"),
                  ("orthogonal_subspace", "v", "orthogonal family, App. C learner"))


def _rows(df, variant):
    return df[(df["experiment"] == "multihead_generic") & (df["variant"] == variant)]


def _log_y_ticks(ax) -> None:
    """Label a log y axis at 1, 2 and 5 times each power of ten, as plain numbers."""
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))


def _succ(rows):
    return (rows["status"] == "ok") & rows["success"].fillna(False).astype(bool)


#: the claims of the multihead_generic experiment (one function each, named as the claim),
#: checked on the result rows
CLAIMS = ClaimSet()


@CLAIMS
def multihead_generic_small(df) -> Claim:
    """Random heads with d <= SMALL_D, H <= SMALL_H are all recovered to SUCCESS_TOL."""
    g = _rows(df, "grid")
    small = g[(g["d"] <= SMALL_D) & (g["n_heads"] <= SMALL_H)]
    s = _succ(small)
    return threshold_claim(
        "multihead_generic_small",
        f"random heads with d <= {SMALL_D}, H <= {SMALL_H} are all recovered to "
        f"{SUCCESS_TOL:g} (relative, after matching)", s,
        numbers=(Number("multiheadGenericRuns", len(small), "runs", "d",
                        rows=f"multihead_generic, grid, d <= {SMALL_D}, H <= {SMALL_H}"),
                 Number("multiheadGenericRecovered", int(s.sum()), "runs", "d",
                        rows=f"multihead_generic, grid, d <= {SMALL_D}, H <= {SMALL_H}, "
                        "success"),
                 *((Number("multiheadGenericWorstError", float(small.loc[s, "rel_err_W"].max()),
                           "relative error of W", ".2g",
                           rows="multihead_generic, grid, recovered runs",
                           factor=ROUNDING_FACTOR),) if s.any()
                   else ())))


@CLAIMS
def multihead_generic_shared_w(df) -> Claim:
    """Shared W (separation 0, Prop. 7.1) is reported as not identifiable."""
    sep = _rows(df, "separation")
    return threshold_claim(
        "multihead_generic_shared_w",
        "shared W (eps = 0, Prop. 7.1) is reported as not identifiable",
        sep.loc[sep["separation"] == 0, "status"] == "not_identifiable")


@CLAIMS
def multihead_generic_separation(df) -> Claim:
    """Two heads with separation >= SEPARATION_CLAIM are recovered."""
    sep = _rows(df, "separation")
    return threshold_claim(
        "multihead_generic_separation",
        f"two heads with separation eps >= {SEPARATION_CLAIM:g} are recovered",
        _succ(sep[sep["separation"] >= SEPARATION_CLAIM]))


@CLAIMS
def multihead_generic_negated(df) -> Claim:
    """W_2 = -W_1 is recovered with three-row queries and not with two-row queries only."""
    neg = _rows(df, "negated")
    three = neg[neg["learner"] == "multihead_generic"]
    two = neg[neg["learner"] == "multihead_generic_2row"]
    ok3 = _succ(three)
    fail2 = ~_succ(two)
    return Claim(
        "multihead_generic_negated",
        "W_2 = -W_1 is recovered with three-row queries and not with two-row queries only",
        bool(ok3.all() and fail2.all()),
        f"three-row {int(ok3.sum())}/{len(three)} recovered; two-row only "
        f"{int(fail2.sum())}/{len(two)} not recovered",
        n_runs=min(len(three), len(two)),
    )


def multihead_generic_claims(df) -> list[Claim]:
    """The claims of the multihead_generic experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


MULTIHEAD_GENERIC_CAPTION = """\
Generic multi-head attention (no structural assumption between heads) recovered from value
queries by ``MultiHeadLearner``, up to a permutation of the heads. Top left: share of runs in
which every recovered W_h and v_h is within relative error 1e-8 of the truth after Hungarian
matching, over the dimension d and the number of heads H (a run the learner refuses, or one past
the cell time limit, counts as a failure and is labelled). Top right: two heads with
W_2 = W_1 + eps D (||D||_F = ||W_1||_F) against eps; at eps = 0 (Prop. 7.1's shared W) the learner
raises NotIdentifiableError, and below about eps = 1e-3 it refuses (the line fits merge the two
heads and the merged model fails the held-out check) rather than return wrong heads. Bottom:
queries counted by the oracle against d for each H (medians over seeds), with a d^2 guide and the
orthogonal-subspace family learned by the generic learner and by the App. C learner. Wall times
are in ``multihead_generic_time``.

{{ snakemake.params.claims }}
"""

MULTIHEAD_GENERIC_TIME_CAPTION = """\
Wall time per run against d (oracle simulation included) of ``MultiHeadLearner`` on random heads
for each number of heads H (median over seeds), and, on the orthogonal-subspace family, of the
generic learner and of the App. C learner (every run). Measured on a shared CPU, so the times are
upper bounds; the query counts of the same runs are in ``multihead_generic``.
"""


@register_figure(
    "multihead_generic",
    experiments=["multihead_generic"],
    category="One-layer transformers and multi-head attention",
    caption=MULTIHEAD_GENERIC_CAPTION,
)
def multihead_generic(df):
    """Success heatmap over (d, H), error against separation, queries against d."""
    claims = multihead_generic_claims(df)
    fig, axd = plt.subplot_mosaic([["rate", "sep"], ["queries", "queries"]],
                                  figsize=(6.75, 5.4), layout="constrained",
                                  height_ratios=(1.15, 0.85))
    g = _rows(df, "grid")
    _rate_panel(fig, axd["rate"], g)
    _separation_panel(axd["sep"], _rows(df, "separation"))
    _queries_panel(axd["queries"], g, _rows(df, "orthogonal"))
    return fig, claims


def _rate_panel(fig, ax1, g) -> None:
    """(a) the success rate over (d, H) of the random-heads grid ``g``, with the runs that
    timed out or were refused."""
    ds = np.sort(g["d"].unique())
    Hs = np.sort(g["n_heads"].unique())
    rate = np.full((Hs.size, ds.size), np.nan)
    for i, H in enumerate(Hs):
        for j, d in enumerate(ds):
            cell = g[(g["d"] == d) & (g["n_heads"] == H)]
            if len(cell):
                rate[i, j] = _succ(cell).mean()
                label = f"{int(_succ(cell).sum())}/{len(cell)}"
                for status, word in (("timeout", "timeout"), ("error", "refused")):
                    n = int((cell["status"] == status).sum())
                    if n:
                        label += f"\n{n} {word}"
                ax1.text(j, i, label, ha="center", va="center", fontsize=6.5,
                         color="white" if rate[i, j] < 0.5 else "black")
    im = ax1.imshow(np.ma.masked_invalid(rate), origin="lower", cmap="cividis", vmin=0,
                    vmax=1, aspect="auto")
    ax1.set_xticks(range(ds.size), [str(int(x)) for x in ds])
    ax1.set_yticks(range(Hs.size), [str(int(x)) for x in Hs])
    ax1.set(xlabel="dimension $d$", ylabel="heads $H$")
    ax1.grid(False)
    rates = np.unique(rate[np.isfinite(rate)])
    title = f"(a) Success rate (error $\\leq$ {SUCCESS_TOL:g})"
    if rates.size == 1:  # one value: said in the title, no colour bar that says nothing
        ax1.set_title(f"{title}\nevery (d, H): {rates[0]:.0%} of runs", fontsize=8)
    else:
        ax1.set_title(title, fontsize=8)
        fig.colorbar(im, ax=ax1, fraction=0.06, pad=0.02, label="success rate (runs recovered)")


def _separation_panel(ax2, sep) -> None:
    """(b) two heads: the error against their separation eps (eps = 0: not identifiable)."""
    pos = sep[sep["separation"] > 0]
    floor = 1e-17
    if len(pos):
        emin = float(pos["separation"].min())
        x0 = emin / 10
        ok = pos[pos["status"] == "ok"]
        err = np.maximum(np.maximum(ok["rel_err_W"], ok["rel_err_v"]), floor)
        ax2.plot(ok["separation"], err, "o", alpha=0.7, label="recovered")
        bad = pos[pos["status"] != "ok"]
        if len(bad):
            ax2.plot(bad["separation"], np.full(len(bad), 1.0), "x", color="C3",
                     label="refused (too close)")
        zero = sep[sep["separation"] == 0]
        if len(zero):
            ax2.plot(np.full(len(zero), x0), np.full(len(zero), 1.0), "s", color="k",
                     label=r"$\varepsilon = 0$: not identifiable")
        ax2.axvline(x0, color="k", ls=":", lw=0.8)
        ax2.text(x0 * 1.3, 1e-16, "non-identifiable\nlimit (shared W)", fontsize=6,
                 rotation=90, va="bottom")
        ax2.axhline(SUCCESS_TOL, color="k", ls="--", lw=0.8, label=f"goal {SUCCESS_TOL:g}")
        ax2.set_xscale("log")
        ax2.set_xlim(x0 / 3, float(pos["separation"].max()) * 3)
        ticks = [x0, *[10.0**k for k in range(int(np.ceil(np.log10(emin))),
                                              int(np.floor(np.log10(pos["separation"].max())))
                                              + 1)]]
        ax2.set_xticks(ticks, ["0", *[f"$10^{{{int(np.log10(x))}}}$" for x in ticks[1:]]])
        ax2.minorticks_off()
    ax2.set(yscale="log", xlabel=r"separation $\varepsilon$ ($W_2 = W_1 + \varepsilon D$)",
            ylabel="max rel. error of $W_h$, $v_h$")
    ax2.set_ylim(1e-17, 10)
    ax2.set_title("(b) Two heads: error against separation", fontsize=8)
    ax2.legend(loc="upper right", fontsize=6)


def _queries_panel(ax3, g, orth) -> None:
    """(c) queries against d for each H, and the orthogonal-subspace family."""
    okg = g[g["status"] == "ok"]
    for H, gh in okg.groupby("n_heads", sort=True):
        agg = gh.groupby("d")["n_queries"].median()
        ax3.plot(agg.index, agg.values, "o-", label=f"random heads, $H = {int(H)}$ (median)")
    orth = orth[orth["status"] == "ok"]
    for learner, marker, name in _ORTH_LEARNERS:
        o = orth[orth["learner"] == learner]
        if len(o):
            ax3.plot(o["d"], o["n_queries"], marker, mfc="none", color="0.3", label=name)
    if okg["d"].nunique() > 1:  # a guide needs a range of d
        xx = np.geomspace(okg["d"].min(), okg["d"].max(), 50)
        first = okg[okg["d"] == okg["d"].min()]
        c2 = float(first["n_queries"].min()) / float(okg["d"].min()) ** 2
        ax3.plot(xx, c2 * xx**2, "k--", lw=0.8, label=r"$\propto d^2$ (guide)")
    ax3.set(xscale="log", yscale="log", xlabel="dimension $d$",
            ylabel="queries (counted by the oracle)")
    log2_ticks(ax3, np.concatenate([np.sort(g["d"].unique()), orth["d"].to_numpy()]))
    _log_y_ticks(ax3)
    ax3.set_title("(c) Queries against $d$", fontsize=8)
    ax3.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=6.5)


@register_figure(
    "multihead_generic_time",
    experiments=["multihead_generic"],
    category="One-layer transformers and multi-head attention",
    caption=MULTIHEAD_GENERIC_TIME_CAPTION,
    uses_timing=True,
)
def multihead_generic_time(df):
    """Wall time per run against d: random heads per H, and the orthogonal-subspace family."""
    claims = []
    fig, ax = plt.subplots(figsize=(6.75, 3.0), layout="constrained")
    g = _rows(df, "grid")
    orth = _rows(df, "orthogonal")
    if "wall_time_s" in df.columns:
        okg = g[g["status"] == "ok"]
        for H, gh in okg.groupby("n_heads", sort=True):
            agg = gh.groupby("d")["wall_time_s"].median()
            ax.plot(agg.index, agg.values, "o-", label=f"random heads, $H = {int(H)}$ (median)")
        orth = orth[orth["status"] == "ok"]
        for learner, marker, name in _ORTH_LEARNERS:
            o = orth[orth["learner"] == learner]
            if len(o):
                ax.plot(o["d"], o["wall_time_s"], marker, mfc="none", color="0.3", label=name)
    ax.set(xscale="log", yscale="log", xlabel="dimension $d$",
           ylabel="wall time per run (s), oracle included")
    log2_ticks(ax, np.concatenate([g["d"].to_numpy(), orth["d"].to_numpy()]))
    _log_y_ticks(ax)
    ax.set_title("Generic multi-head learner: wall time against $d$ "
                 "(shared CPU: times are upper bounds)", fontsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=6.5)
    return fig, claims
