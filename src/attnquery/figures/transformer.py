"""Figure transformer_recovery: one-layer transformers (Sec. 4.1) against d and FFN width m."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..claims import ROUNDING_FACTOR, Claim, ClaimSet, Number, ok_rows, threshold_claim
from ..theory import FFN_TOL
from ..theory import TRANSFORMER_W_TOL as W_TOL
from ._core import log2_ticks, register_figure

FLOOR = 1e-17  # errors of exactly 0 are drawn here on log axes


def _transformer_rows(df):
    return df[df["experiment"] == "transformer"]


#: the claims of the transformer experiment (one function each, named as the claim), checked on
#: its rows (every status)
CLAIMS = ClaimSet(_transformer_rows)


@CLAIMS
def transformer_runs(rows) -> Claim:
    """Every cell ran to completion."""
    n, n_ok = len(rows), len(ok_rows(rows))
    return Claim(
        "transformer_runs", "every cell ran to completion (status ok)",
        bool(n_ok == n), f"{n_ok}/{n} ok", n_runs=n,
        numbers=(Number("transformerRuns", n, "runs", "d", rows="transformer"),),
    )


@CLAIMS
def transformer_W(rows) -> Claim:
    """W is recovered from antisymmetric queries to relative error <= W_TOL."""
    ok = ok_rows(rows)
    return threshold_claim(
        "transformer_W",
        f"W is recovered from antisymmetric queries to relative error <= {W_TOL:g}",
        ok["rel_err_W"] <= W_TOL, worst=ok["rel_err_W"].max(),
        numbers=(Number("transformerWorstErrorW", float(ok["rel_err_W"].max()),
                        "relative error of W", ".2g", rows="transformer, status ok",
                        factor=ROUNDING_FACTOR),)
        if len(ok) else ())


@CLAIMS
def transformer_ffn(rows) -> Claim:
    """The FFN is recovered to relative functional error <= FFN_TOL for widths m <= d."""
    ok = ok_rows(rows)
    le = ok[ok["width"] <= ok["d"]]
    return threshold_claim(
        "transformer_ffn",
        f"the FFN is recovered to relative functional error <= {FFN_TOL:g} for m <= d",
        le["func_err_ffn"] <= FFN_TOL, worst=le["func_err_ffn"].max(), runs="runs with m <= d",
        numbers=(Number("transformerWorstErrorFfn", float(le["func_err_ffn"].max()),
                        "relative functional error", ".2g",
                        rows="transformer, status ok, width m <= d",
                        factor=ROUNDING_FACTOR),) if len(le) else ())


@CLAIMS
def transformer_attention_queries(rows) -> Claim:
    """The attention part uses exactly 2 (d^2 + d) value queries."""
    ok = ok_rows(rows)
    return threshold_claim(
        "transformer_attention_queries",
        "the attention part uses exactly 2 (d^2 + d) value queries (two per antisymmetric query)",
        ok["n_queries_attention"] == 2 * (ok["d"] ** 2 + ok["d"]))


def transformer_claims(df) -> list[Claim]:
    """The claims of the transformer experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


TRANSFORMER_RECOVERY_CAPTION = """\
**One-layer transformers (Sec. 4.1).** W and v = A w_o are read from antisymmetric queries
VQ(X) - VQ(-X) (two value queries each) with the exact single-head learner; the bias-free ReLU
FFN from one-row queries, by locating its kinks along random lines, reading the gradient jumps,
refining each hyperplane from points located on it, and refitting the output weights and the
linear remainder. Left: worst relative error of W against d, one line per FFN width m. Middle:
worst relative error of the recovered FFN on random unit inputs against m, one line per d (open
markers: m > d, where the orientation of the neurons is not decided and two linear units carry
the remainder; the function is still recovered). Right: the value queries counted by the oracle
for the attention part (exactly 2 (d^2 + d)) and for the FFN part (median over seeds).
"""


@register_figure(
    "transformer_recovery",
    experiments=["transformer"],
    category="One-layer transformers and multi-head attention",
    caption=TRANSFORMER_RECOVERY_CAPTION,
)
def transformer_recovery(df):
    """Error of W and of the FFN, and the queries of both parts, against d and m."""
    ok = ok_rows(df, "transformer")
    claims = transformer_claims(df)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(6.75, 3.0), layout="constrained")
    ds = np.sort(ok["d"].unique())
    ms = np.sort(ok["width"].unique())
    # (a) error of W against d, one line per width
    for k, m in enumerate(ms):
        g = ok[ok["width"] == m].groupby("d")["rel_err_W"].max()
        ax1.plot(g.index, np.maximum(g.values, FLOOR), "o-", color=f"C{k % 10}", label=f"m = {m}")
    ax1.axhline(W_TOL, color="k", ls="--", lw=0.8, label=f"target {W_TOL:g}")
    ax1.set(xscale="log", yscale="log", xlabel="dimension $d$",
            ylabel=r"worst $\|\hat W - W\|_F / \|W\|_F$")
    ax1.set_title("(a) Attention: error of $W$")
    ax1.legend(fontsize=5.5, ncol=2, loc="lower right")
    # (b) FFN functional error against m, one line per d; m > d open markers
    for k, d in enumerate(ds):
        g = ok[ok["d"] == d].groupby("width")
        worst = g["func_err_ffn"].max()
        ax2.plot(worst.index, np.maximum(worst.values, FLOOR), "o-", color=f"C{k % 10}",
                 label=f"d = {d}")
        wide = worst[worst.index > d]
        ax2.plot(wide.index, np.maximum(wide.values, FLOOR), "o", mfc="white",
                 color=f"C{k % 10}")
    ax2.axhline(FFN_TOL, color="k", ls="--", lw=0.8, label=f"target {FFN_TOL:g}")
    ax2.set(xscale="log", yscale="log", xlabel="FFN width $m$",
            ylabel="worst relative error of the FFN")
    ax2.plot([], [], "o", mfc="white", color="0.4", label="$m > d$ (2 linear units)")
    ax2.set_title("(b) FFN: functional error")
    ax2.legend(fontsize=5.5, ncol=2, loc="lower right")
    # (c) queries of each part against d (median over seeds), per width
    for k, m in enumerate(ms):
        g = ok[ok["width"] == m].groupby("d")
        ax3.plot(g["n_queries_ffn"].median().index, g["n_queries_ffn"].median().values, "o-",
                 color=f"C{k % 10}", label=f"FFN, m = {m}")
    att = ok.groupby("d")["n_queries_attention"].median()
    ax3.plot(att.index, att.values, "ks--", label="attention, $2(d^2 + d)$")
    ax3.set(xscale="log", yscale="log", xlabel="dimension $d$",
            ylabel="value queries (counted)")
    ax3.set_title("(c) Queries per part")
    ax3.legend(fontsize=5.5, loc="upper left")
    for ax in (ax1, ax3):
        log2_ticks(ax, ds)
    log2_ticks(ax2, ms)
    return fig, claims
