"""Figure realheads: queries and errors for every head of a pretrained checkpoint.

Errors per head without and with the module's biases (heatmaps), the errors of every learnt
parameter with the biases (W, c, v, beta), queries per head, and the noisy learner against the
margin.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.ticker import FuncFormatter, NullFormatter

from ..claims import ROUNDING_FACTOR, Claim, ClaimSet, Number, extra_values, ok_rows
from ..theory import BIAS_EXACT_TOL, BIAS_PARAM_TOL, BIAS_SKETCH_TOL, exact_queries, lowrank_floor
from ..theory import REALHEADS_EXACT_TOL as EXACT_TOL
from ..theory import REALHEADS_SKETCH_TOL as SKETCH_TOL
from ._core import register_figure

#: the sketch may spend at most this factor over r(2d - r) + d (the project's target for the sketch)
SKETCH_QUERY_FACTOR = 1.05
#: errors are drawn no lower than this on log axes
FLOOR = 1e-17


def _biased(rows):
    """Per row: whether the run learnt the module's biases (a missing value counts as not)."""
    return rows["biases"].fillna(False).astype(bool)


def _learner_rows(df, learner, biases=False):
    rows = df[(df["experiment"] == "realheads") & (df["learner"] == learner)]
    if "biases" in rows:
        rows = rows[_biased(rows) == biases]
    elif biases:
        rows = rows.iloc[:0]
    return rows, rows[rows["status"] == "ok"]


def _sketch_floor(ok):
    d = extra_values(ok, "d").astype(float)
    r = extra_values(ok, "rank").astype(float)
    return d, r, pd.Series(list(map(lowrank_floor, d, r)), index=d.index, dtype=float)


def _numbers(prefix, rows, ok, what) -> tuple:
    """Heads, worst relative error of W (of c, v and beta when fitted) and the largest query
    count of one learner's rows."""
    if not len(ok):
        return ()
    out = [Number(f"{prefix}Heads", len(rows), "heads", "d", rows=what),
           Number(f"{prefix}Queries", int(ok["n_queries"].max()), "queries", "d",
                  rows=f"{what}, status ok, largest n_queries")]
    for col, name in (("rel_err_W", "W"), ("rel_err_c", "C"), ("rel_err_v", "V"),
                      ("rel_err_offset", "Beta")):
        if col in ok and ok[col].notna().any():
            out.append(Number(f"{prefix}WorstError{name}", float(ok[col].max()),
                              f"relative error of {name.lower()}", ".2g",
                              rows=f"{what}, status ok, largest {col}",
                              factor=ROUNDING_FACTOR))
    if "rel_err_W" in ok:
        out.append(Number(f"{prefix}MedianErrorW", float(ok["rel_err_W"].median()),
                          "relative error of W", ".2g", rows=f"{what}, status ok, median",
                          factor=ROUNDING_FACTOR))
    return tuple(out)


def _margin_numbers(df) -> tuple:
    """The heads' margins: the range over heads of ``min |v_i|`` and the median of
    ``max |v_i|`` (from every realheads row, one value per layer and head)."""
    rows = ok_rows(df, "realheads")
    if rows.empty:
        return ()
    heads = rows.assign(lo=extra_values(rows, "min_abs_v", np.nan).astype(float),
                        hi=extra_values(rows, "max_abs_v", np.nan).astype(float))
    heads = heads.dropna(subset=["lo", "hi"]).drop_duplicates(["layer", "head"])
    if heads.empty:
        return ()
    what = "realheads, every head once, extra "
    return (Number("realheadsMarginMin", float(heads["lo"].min()), "min |v_i|", ".2g",
                   rows=what + "min_abs_v, smallest"),
            Number("realheadsMarginMax", float(heads["lo"].max()), "min |v_i|", ".2g",
                   rows=what + "min_abs_v, largest"),
            Number("realheadsVMaxMedian", float(heads["hi"].median()), "max |v_i|", ".2g",
                   rows=what + "max_abs_v, median"))


def _worst(ok, col):
    return float(ok[col].max()) if len(ok) else float("nan")


def _worst_biased(ok) -> str:
    """The worst errors of W, c, v and beta of runs with the module's biases, as the claims
    print them."""
    return (f"worst W {_worst(ok, 'rel_err_W'):.2e}, c {_worst(ok, 'rel_err_c'):.2e}, v "
            f"{_worst(ok, 'rel_err_v'):.2e}, beta {_worst(ok, 'rel_err_offset'):.2e}")


#: the claims of the realheads experiment (one function each, named as the claim; a learner's
#: claims are not made without its rows), checked on the result rows
CLAIMS = ClaimSet()


@CLAIMS
def realheads_exact(df) -> Claim | None:
    """The exact learner recovers every head within EXACT_TOL with exactly d^2 + d queries."""
    rows, ok = _learner_rows(df, "exact")
    if not len(rows):
        return None
    d = extra_values(ok, "d").astype(float)
    count_ok = ok["n_queries"].astype(float) == d**2 + d
    succ = ok["success"].fillna(False).astype(bool)
    worst = ok["rel_err_W"].max() if len(ok) else float("nan")
    return Claim(
        "realheads_exact",
        f"the exact learner recovers every head to relative error <= {EXACT_TOL:g} with "
        "exactly d^2 + d queries",
        bool(len(ok) == len(rows) and succ.all() and count_ok.all()),
        f"{int(succ.sum())}/{len(rows)} heads within tolerance (worst {worst:.2e}); "
        f"{int(count_ok.sum())}/{len(rows)} with d^2 + d queries",
        numbers=_numbers("realheadsExact", rows, ok, "realheads, learner exact, no biases"),
    )


@CLAIMS
def realheads_sketch(df) -> Claim | None:
    """The sketch learner recovers every head within SKETCH_TOL, its rank right, with at most
    SKETCH_QUERY_FACTOR times the low-rank floor of queries."""
    rows, ok = _learner_rows(df, "sketch")
    if not len(rows):
        return None
    _, r, floor = _sketch_floor(ok)
    within = ok["n_queries"].astype(float) <= SKETCH_QUERY_FACTOR * floor
    rank_ok = ok["rank_found"].astype(float) == r
    succ = ok["success"].fillna(False).astype(bool)
    worst = ok["rel_err_W"].max() if len(ok) else float("nan")
    ratio = (ok["n_queries"] / floor).max() if len(ok) else float("nan")
    return Claim(
        "realheads_sketch",
        f"the sketch learner recovers every head (rank = head dimension) to relative error "
        f"<= {SKETCH_TOL:g} with at most {SKETCH_QUERY_FACTOR} (r(2d - r) + d) queries",
        bool(len(ok) == len(rows) and succ.all() and within.all() and rank_ok.all()),
        f"{int(succ.sum())}/{len(rows)} heads within tolerance (worst {worst:.2e}); "
        f"queries at most {ratio:.3f} x r(2d - r) + d; rank right in "
        f"{int(rank_ok.sum())}/{len(rows)}",
        numbers=_numbers("realheadsSketch", rows, ok, "realheads, learner sketch, no biases")
        + ((Number("realheadsSketchFloorRatio", float(ratio), "queries / floor", ".3f",
                   rows="realheads, learner sketch, no biases, largest"),) if len(ok)
           else ()),
    )


@CLAIMS
def realheads_exact_biases(df) -> Claim | None:
    """With the module's biases the exact learner recovers every head within the tolerances,
    with exactly d^2 + 2d + 1 queries."""
    rows, ok = _learner_rows(df, "exact", biases=True)
    if not len(rows):
        return None
    d = extra_values(ok, "d").astype(float)
    n = ok["n_queries"].astype(float)
    count_ok = n == d**2 + 2 * d + 1
    succ = ok["success"].fillna(False).astype(bool)
    return Claim(
        "realheads_exact_biases",
        f"with the module's biases, the exact learner recovers every head to relative error "
        f"<= {BIAS_EXACT_TOL:g} for W and <= {BIAS_PARAM_TOL:g} for c, v and beta, with "
        "exactly d^2 + 2d + 1 queries",
        bool(len(ok) == len(rows) and succ.all() and count_ok.all()),
        f"{int(succ.sum())}/{len(rows)} heads within tolerance ({_worst_biased(ok)}); "
        f"{int(count_ok.sum())}/{len(rows)} with d^2 + 2d + 1 queries",
        numbers=_numbers("realheadsBiasExact", rows, ok, "realheads, learner exact, biases"),
    )


@CLAIMS
def realheads_sketch_biases(df) -> Claim | None:
    """With the module's biases the sketch learner recovers every head within the tolerances,
    with at most the sketch's budget plus d + 1 queries."""
    rows, ok = _learner_rows(df, "sketch", biases=True)
    if not len(rows):
        return None
    d, r, floor = _sketch_floor(ok)
    n = ok["n_queries"].astype(float)
    within = n <= SKETCH_QUERY_FACTOR * floor + d + 1
    rank_ok = ok["rank_found"].astype(float) == r
    succ = ok["success"].fillna(False).astype(bool)
    ratio = ((n - d - 1) / floor).max() if len(ok) else float("nan")
    return Claim(
        "realheads_sketch_biases",
        f"with the module's biases, the sketch learner recovers every head to relative "
        f"error <= {BIAS_SKETCH_TOL:g} for W and <= {BIAS_PARAM_TOL:g} for c, v and beta, "
        f"with at most {SKETCH_QUERY_FACTOR} (r(2d - r) + d) + d + 1 queries",
        bool(len(ok) == len(rows) and succ.all() and within.all() and rank_ok.all()),
        f"{int(succ.sum())}/{len(rows)} heads within tolerance ({_worst_biased(ok)}); "
        f"queries minus d + 1 at most {ratio:.3f} x r(2d - r) + d",
        numbers=_numbers("realheadsBiasSketch", rows, ok, "realheads, learner sketch, biases"),
    )


@CLAIMS
def realheads_noisy_bound(df) -> Claim | None:
    """Where Theorem 6.1's premise holds, the noisy learner's errors are within its bound."""
    rows, ok = _learner_rows(df, "noisy")
    if not len(rows):
        return None
    premise = extra_values(ok, "margin_premise").fillna(False).astype(bool)
    has_bound = ok["bound_W"].notna()
    inside = ok.loc[has_bound, "within_bound"].fillna(False).astype(bool)
    return Claim(
        "realheads_noisy_bound",
        "where Theorem 6.1's premise tau <= min|v_i| / 2 holds, the noisy learner's errors "
        "are within the theorem's bound",
        bool(len(ok) == len(rows) and inside.all()),
        f"premise holds in {int(premise.sum())}/{len(rows)} runs; within the bound in "
        f"{int(inside.sum())}/{int(has_bound.sum())} of them",
    )


@CLAIMS
def realheads_noisy_vacuous(df) -> Claim | None:
    """On these heads Theorem 6.1's bound is at least ||W||_F wherever it applies."""
    rows, ok = _learner_rows(df, "noisy")
    if not len(rows):
        return None
    has_bound = ok["bound_W"].notna()
    vacuous = ok.loc[has_bound, "bound_W"] >= extra_values(ok[has_bound], "W_fro").astype(float)
    return Claim(
        "realheads_noisy_vacuous",
        "on these heads Theorem 6.1's bound on ||W_hat - W||_F is at least ||W||_F wherever "
        "it applies (the margin is too small for a useful guarantee)",
        bool(vacuous.all()),
        f"{int(vacuous.sum())}/{int(has_bound.sum())} runs with a defined bound; median "
        f"relative error of W {ok['rel_err_W'].median():.2e}",
        numbers=((Number("realheadsNoisyMedianErrorW", float(ok["rel_err_W"].median()),
                         "relative error of W", ".2g",
                         rows="realheads, learner noisy, status ok, median"),) if len(ok)
                 else ()) + _margin_numbers(df),
    )


def realheads_claims(df) -> list[Claim]:
    """The claims of the realheads experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


def _heatmap(ax, ok, title, norm, n_layers, n_heads):
    grid = np.full((n_layers, n_heads), np.nan)
    for L, h, e in zip(ok["layer"], ok["head"], ok["rel_err_W"], strict=True):
        grid[int(L), int(h)] = max(float(e), FLOOR)
    im = ax.imshow(grid, norm=norm, cmap="viridis", aspect="auto", origin="lower")
    ax.set(xlabel="head", ylabel="layer", title=title)
    ax.grid(False)
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    ax.tick_params(axis="x", labelsize=6)
    return im


def _no_runs(ax, what):
    ax.text(0.5, 0.5, f"no {what} runs", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


#: the parameters whose errors the bias panel shows, and their result columns
_BIAS_PARAMS = (("W", "rel_err_W"), ("c", "rel_err_c"), ("v", "rel_err_v"),
                (r"\beta", "rel_err_offset"))


def _bias_errors(ax, rh):
    """Relative errors of every learnt parameter with the biases, per learner."""
    biased = rh[_biased(rh)] if "biases" in rh else rh.iloc[:0]
    if not len(biased):
        _no_runs(ax, "biased")
        return
    x = 0
    ticks, labels = [], []
    for learner, marker, tol in (("exact", "o", BIAS_EXACT_TOL),
                                 ("sketch", "s", BIAS_SKETCH_TOL)):
        sub = biased[biased["learner"] == learner]
        if not len(sub):
            continue
        for k, (name, col) in enumerate(_BIAS_PARAMS):
            vals = np.maximum(sub[col].to_numpy(dtype=float), FLOOR)
            jitter = np.linspace(-0.25, 0.25, vals.size)
            ax.plot(x + jitter, vals, marker, ms=2.5, alpha=0.6, color=f"C{k}",
                    label=f"${name}$" if learner == "exact" else None)
            ticks.append(x)
            labels.append(f"{learner}\n${name}$")
            x += 1
        ax.hlines([tol, BIAS_PARAM_TOL], x - 4.4, x - 0.6, colors=["k", "0.5"],
                  linestyles=["--", ":"], lw=0.8)
        x += 0.5
    zero = any((biased[col].to_numpy(dtype=float) <= FLOOR).any() for _, col in _BIAS_PARAMS)
    ax.set(yscale="log", ylabel="relative error" + (f"\n(0 drawn at {FLOOR:g})" if zero else ""),
           title="With the biases: every learnt parameter, every head (dashed: the goal for "
                 r"$W$, dotted: for $c$, $v$, $\beta$)")
    ax.title.set_fontsize(8)
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=6)
    ax.legend(loc="upper left", fontsize=6, ncols=4)


def _queries(ax, rh, n_heads):
    for (learner, biases), marker in ((("exact", False), "o"), (("sketch", False), "s"),
                                      (("noisy", False), "^"), (("exact", True), "x"),
                                      (("sketch", True), "+")):
        sub = rh[rh["learner"] == learner]
        if "biases" in sub:
            sub = sub[_biased(sub) == biases]
        elif biases:
            continue
        if not len(sub):
            continue
        idx = sub["layer"] * n_heads + sub["head"]
        ax.plot(idx, sub["n_queries"], marker, ms=3, alpha=0.7,
                label=f"{learner}{' (biases)' if biases else ''}")
    d = float(extra_values(rh, "d").iloc[0])
    r = float(extra_values(rh, "rank").iloc[0])
    lines = [(exact_queries(d), "k", "--", f"$d^2 + d$ (d = {d:.0f})"),
             (lowrank_floor(d, r), "0.4", ":", f"$r(2d - r) + d$ (r = {r:.0f})")]
    for y, col, ls, lab in lines:
        ax.axhline(y, color=col, ls=ls, lw=0.8, label=lab)
    ax.set(yscale="log", xlabel="layer x heads per layer + head",
           ylabel="queries (oracle)", title="Queries per head")
    ax.title.set_fontsize(8)
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks([y for y, *_ in lines])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}"))
    ax.legend(loc="center right", fontsize=5.5)


def _noisy(ax, rh):
    noisy = rh[rh["learner"] == "noisy"]
    if not len(noisy):
        _no_runs(ax, "noisy")
        return
    mv = extra_values(noisy, "min_abs_v").astype(float)
    x = noisy["tau"].astype(float) / mv
    for tau in sorted(noisy["tau"].unique()):
        sel = noisy["tau"] == tau
        ax.plot(x[sel], noisy.loc[sel, "rel_err_W"], "o", ms=3.5, label=rf"$\tau$ = {tau:g}")
    ax.axvline(0.5, color="k", ls="--", lw=0.8)
    ax.text(0.5, 0.97, r"premise $\tau \leq \min_i|v_i|/2$ holds to the left ",
            transform=ax.get_xaxis_transform(), fontsize=6, ha="right", va="top",
            rotation=90)
    ax.axhline(1.0, color="0.5", ls=":", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel=r"$\tau / \min_i |v_i|$",
           ylabel="rel. error of $W$", title="Noisy learner (Thm 6.1)")
    ax.title.set_fontsize(8)
    ax.legend(loc="upper left", fontsize=6)


REALHEADS_CAPTION = """\
**Real heads (all-MiniLM-L6-v2, or the configured checkpoint).** Every head of every selected
layer is turned into a single-head model (W = W_K,h^T W_Q,h / sqrt(d_h), v = W_V,h^T u_h for a
fixed Gaussian readout vector r) and extracted from queries alone, without the module's biases (the
paper's head) and with them (beyond the paper: the key bias c = W_K,h^T b_Q,h / sqrt(d_h) and the
offset beta = r^T (b_V + b_O) of the module's exact answer). Top left: relative Frobenius error
of the recovered W per head (layer x head), for Theorem 4.1's exact learner (d^2 + d queries;
d^2 + 2d + 1 with the biases) and the low-rank sketch learner with the rank set to the head
dimension (r(2d - r) + d queries; d + 1 more with the biases), without and with the biases, on
one colour scale. Top right: Theorem 6.1's noisy learner (uniform noise of size tau, given
W_bound = max(2, ||W||_F) and the margin ``mu = min_i |v_i|``) against ``tau / min_i |v_i|``:
real heads have almost no margin, so the theorem's premise tau <= mu / 2 fails at every useful
tau, and where it holds its bound on ||W_hat - W||_F exceeds ||W||_F (dotted line: relative
error 1).
Middle right: the queries counted by the oracle for every head and learner, with the formulas.
Bottom: with the biases, the relative error of every learnt parameter (W, c, v, beta) of every
head, against the goals (dashed: W; dotted: c, v, beta).
"""


@register_figure(
    "realheads",
    experiments=["realheads"],
    category="Real heads",
    caption=REALHEADS_CAPTION,
)
def realheads(df):
    """Errors per head without and with biases, errors of every learnt parameter with the
    biases, queries per head, and the noisy learner against the margin."""
    claims = realheads_claims(df)
    rh = ok_rows(df, "realheads")
    fig = plt.figure(figsize=(7.5, 7.2), layout="constrained")
    gs = fig.add_gridspec(3, 4, height_ratios=[1, 1, 1.05], width_ratios=[1, 1, 0.05, 1.5])
    heat = [[fig.add_subplot(gs[i, j]) for j in range(2)] for i in range(2)]
    n_layers = int(rh["layer"].max()) + 1 if len(rh) else 1
    n_heads = int(rh["n_heads"].max()) if len(rh) else 1
    biased = _biased(rh) if "biases" in rh else False
    dense = rh[rh["learner"].isin(["exact", "sketch"])]
    errs = np.maximum(dense["rel_err_W"].to_numpy(dtype=float), FLOOR)
    lo, hi = (errs.min(), errs.max()) if errs.size else (1e-16, 1e-8)
    norm = LogNorm(vmin=min(lo, 1e-16), vmax=max(hi, 1e-9))
    im = None
    for i, learner in enumerate(("exact", "sketch")):
        for j, with_bias in enumerate((False, True)):
            sub = rh[(rh["learner"] == learner) & (biased == with_bias)]
            if not len(sub):
                _no_runs(heat[i][j], f"{learner}{' biased' if with_bias else ''}")
                continue
            probes = sub["probes"].dropna().unique()
            what = f" ({probes[0]})" if learner == "exact" and len(probes) == 1 else ""
            title = f"{learner}{what}, {'with' if with_bias else 'no'} biases"
            im = _heatmap(heat[i][j], sub, title, norm, n_layers, n_heads)
            heat[i][j].title.set_fontsize(7)
    if im is not None:
        cb = fig.colorbar(im, cax=fig.add_subplot(gs[0:2, 2]))
        cb.set_label(r"$\|\hat W - W\|_F / \|W\|_F$")
    _noisy(fig.add_subplot(gs[0, 3]), rh)
    ax = fig.add_subplot(gs[1, 3])
    if len(rh):
        _queries(ax, rh, n_heads)
    else:
        _no_runs(ax, "realheads")
    _bias_errors(fig.add_subplot(gs[2, :]), rh)
    return fig, claims
