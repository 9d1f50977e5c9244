"""Figures rotary and rotary_layers: rotary heads (RoPE) and whole GQA layers from value
queries (beyond the paper).

``rotary`` reads the head rows of the ``rotary`` experiment (routes ``dense`` and ``lowrank``):
counted queries against d, the frequencies' errors and the functional error against the
sequence length (1 to 4,096 tokens). ``rotary_layers`` reads its layer rows (variant
``layer``): the functional error or the refusal of every (d, H, G), the failure map.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .. import errors
from ..claims import (
    NOISE_FACTOR,
    ROUNDING_FACTOR,
    Claim,
    ClaimSet,
    Number,
    extra_values,
    fit_number,
    ok_rows,
    threshold_claim,
)
from ..metrics import fit_power_law
from ._common import label_points
from ._core import log2_ticks, register_figure

#: exponent interval the claim accepts (dense route, d >= FIT_MIN_D)
EXPONENT_RANGE = (1.95, 2.05)
FIT_MIN_D = 32
#: largest frequency error (absolute, radians per position) the claim accepts
FREQ_TOL = 1e-12
#: largest functional error (relative, every length up to 4,096 tokens) per route
FUNC_TOL = {"dense": 1e-9, "lowrank": 1e-8}
#: the routes of single heads (the other variant, ``layer``, is a whole GQA layer)
HEAD_ROUTES = ("dense", "lowrank")
#: largest functional error (relative, up to 4,096 tokens) of a recovered layer (issue 23's goal)
LAYER_TOL = 1e-8
#: issue 23's goal shapes (d, H, G): Llama-like GQA (heads of 16), 8 heads of 64 sharing one
#: key/value head (multi-query)
LAYER_GOALS = ((128, 8, 2), (512, 8, 1))


def _heads(df):
    """The single-head rows of the rotary experiment (every status)."""
    rows = df[df["experiment"] == "rotary"]
    return rows[rows["variant"].isin(HEAD_ROUTES)]


def _layers(df):
    """The layer rows of the rotary experiment (every status)."""
    rows = df[df["experiment"] == "rotary"]
    return rows[rows["variant"] == "layer"]


def _error_name(message) -> str:
    """The exception's name that starts a failed row's message (``"SearchLimitError: ..."``)."""
    return str(message).split(":", 1)[0].strip() if isinstance(message, str) else ""


def expected_queries(route: str, d: int, rank: int, oversample: int = 8) -> int:
    """The learner's count on an ordinary head (its module docstring): ``2 (d^2 + d)`` dense,
    ``d (k + 2 r + 3) + r^2 + 2 r`` (k = r + oversample) on the sketch route."""
    if route == "dense":
        return 2 * (d * d + d)
    k = min(d, rank + oversample)
    return d * (k + 2 * rank + 3) + rank * rank + 2 * rank


#: the claims of the rotary experiment's single heads (one function each, named as the claim),
#: checked on its head rows (every status)
CLAIMS = ClaimSet(_heads)


@CLAIMS
def rotary_count(rows) -> Claim:
    """Every run uses exactly the learner's stated count (:func:`expected_queries`)."""
    ok = ok_rows(rows)
    n_all = len(rows)
    want = np.array([expected_queries(r, int(d), int(k))
                     for r, d, k in zip(ok["variant"], ok["d"], ok["rank"], strict=True)],
                    dtype=float)
    exact = ok["n_queries"].to_numpy(dtype=float) == want
    return threshold_claim(
        "rotary_count", "every run uses exactly 2 (d^2 + d) queries (dense route; the sketch "
        "route its own count), as counted by the oracle", exact, of=n_all,
        numbers=(Number("rotaryRuns", n_all, "runs", "d", rows="rotary heads, every status"),
                 Number("rotaryRunsExactCount", int(exact.sum()), "runs", "d",
                        rows="rotary heads, status ok, count as the learner states"),
                 Number("rotaryMaxD", int(rows["d"].max()) if n_all else 0, "d", "d",
                        rows="rotary heads")))


@CLAIMS
def rotary_exponent(rows) -> Claim:
    """Dense queries grow as d^2 (exponent in EXPONENT_RANGE), twice the paper's d^2 + d."""
    ok = ok_rows(rows)
    dense = ok[(ok["variant"] == "dense") & (ok["d"] >= FIT_MIN_D)]
    if len(dense["d"].unique()) < 2 or len(dense) < 3:
        return Claim("rotary_exponent", "dense queries grow as d^2", False,
                     f"too few dense grid points with d >= {FIT_MIN_D} to fit", n_runs=0)
    fit = fit_power_law(dense["d"], dense["n_queries"])
    ratio = dense["n_queries"] / (dense["d"] ** 2 + dense["d"])
    const = float(np.median(ratio))
    what = f"rotary heads, dense route, status ok, d >= {FIT_MIN_D}"
    return Claim(
        "rotary_exponent", f"dense queries grow as d^2 (fitted exponent in "
        f"[{EXPONENT_RANGE[0]}, {EXPONENT_RANGE[1]}]), twice the paper's d^2 + d",
        bool(EXPONENT_RANGE[0] <= fit.slope <= EXPONENT_RANGE[1]
             and float(np.max(np.abs(ratio - 2))) < 1e-9),
        f"exponent {fit} on d >= {FIT_MIN_D}; queries / (d^2 + d) = {const:.3f}",
        n_runs=len(dense),
        numbers=(fit_number("rotaryExponent", fit, what),
                 Number("rotaryConstant", const, "queries / (d^2 + d)", ".3f",
                        rows=what + "; median")))


@CLAIMS
def rotary_frequencies(rows) -> Claim:
    """The frequencies are found from the answers to FREQ_TOL (a failed run counts against)."""
    ok = ok_rows(rows)
    freq = extra_values(ok, "freq_err", float("inf")).astype(float)
    worst_freq = float(freq.max()) if len(ok) else float("nan")
    return threshold_claim(
        "rotary_frequencies", f"the frequencies are found from the answers to {FREQ_TOL:g}",
        freq <= FREQ_TOL, of=len(rows), worst=worst_freq, fmt=".1e",
        numbers=(Number("rotaryWorstFrequencyError", worst_freq, "radians per position",
                        ".1e", rows="rotary heads, status ok, no rope base given",
                        factor=ROUNDING_FACTOR),))


@CLAIMS
def rotary_length(rows) -> Claim:
    """The recovered head agrees with the box on 1 to 4,096 tokens within its route's FUNC_TOL."""
    ok = ok_rows(rows)
    n_all = len(rows)
    tol = ok["variant"].map(FUNC_TOL).astype(float)
    within = ok["func_err"].astype(float) <= tol
    parts, numbers = [], []
    for route, g in ok.groupby("variant", sort=True):
        worst = float(g["func_err"].max())
        parts.append(f"{route}: worst {worst:.1e} (<= {FUNC_TOL[route]:g})")
        numbers.append(Number(f"rotaryWorstError{route.capitalize()}", worst,
                              "relative error", ".1e",
                              rows=f"rotary heads, {route} route, status ok, 1 to 4,096 tokens",
                              factor=ROUNDING_FACTOR))
    return Claim(
        "rotary_length", "the recovered head agrees with the box on sequences of 1 to 4,096 "
        "tokens: functional relative error <= 1e-9 (dense; 1e-8 on the sketch route)",
        bool(within.all() and len(ok) == n_all),
        f"{int(within.sum())}/{n_all} runs; " + "; ".join(parts), n_runs=len(ok),
        numbers=numbers)


@CLAIMS
def rotary_checked(rows) -> Claim:
    """Every run passed the learner's own check, its check queries counted apart."""
    ok = ok_rows(rows)
    return threshold_claim(
        "rotary_checked", "every run passed the learner's own check on sequences of up to "
        "4,096 tokens, its check queries counted apart",
        ok["verified"].fillna(False).astype(bool), of=len(rows))


def rotary_claims(df) -> list[Claim]:
    """The claims of the rotary experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


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
    ok = ok_rows(_heads(df))
    claims = rotary_claims(df)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(10, 3.2), layout="constrained")
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
    _legend(ax2, loc="center right", fontsize=6)
    for k, ((route, d), g) in enumerate(ok.groupby(["variant", "d"], sort=True)):
        by = extra_values(g, "func_err_by_length", {})
        lengths = sorted({int(n) for row in by for n in row})
        if k == 0:
            ax2.plot([], [], "-", lw=0.4, color="0.4", label="every layer")
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


def _per_group(rows) -> np.ndarray:
    """Query heads per key/value group, H / G, of each row."""
    return (rows["n_heads"].astype(int) // rows["n_kv_heads"].astype(int)).to_numpy()


def _biased(rows) -> np.ndarray:
    """Whether each layer row's layer carries biases (Qwen2-style; absent means none)."""
    if "biases" not in rows.columns:
        return np.zeros(len(rows), dtype=bool)
    return rows["biases"].astype("boolean").fillna(False).to_numpy(dtype=bool)


def _recovered(rows) -> np.ndarray:
    """Whether each layer row was returned (status ok) within the goal: functional error
    <= LAYER_TOL, frequencies within FREQ_TOL and the key-sharing groups found."""
    if not len(rows):
        return np.zeros(0, dtype=bool)
    ok = (rows["status"] == "ok").to_numpy()
    err = rows["func_err"].astype(float).fillna(np.inf).to_numpy() <= LAYER_TOL
    freq = extra_values(rows, "freq_err", np.inf).astype(float).to_numpy() <= FREQ_TOL
    groups = extra_values(rows, "groups_found", False).astype(bool).to_numpy()
    return ok & err & freq & groups


def _shape(row) -> str:
    return f"({int(row['d'])}, {int(row['n_heads'])}, {int(row['n_kv_heads'])})"


def _named_refusals(failed):
    """The error names that start the messages of the rows ``failed``, and whether each row
    failed with a named error of :mod:`attnquery.errors`."""
    names = [_error_name(m) for m in failed["message"]]
    named = [failed["status"].iloc[i] == "error" and isinstance(getattr(errors, nm, None), type)
             and issubclass(getattr(errors, nm), errors.AttnQueryError)
             for i, nm in enumerate(names)]
    return names, named


#: the claims of the rotary experiment's layer rows (variant ``layer``; one function each,
#: named as the claim), checked on those rows (every status)
LAYER_CLAIMS = ClaimSet(_layers)


@LAYER_CLAIMS.named("rotary_layers")  # the figure of the layers is rotary_layers
def rotary_layers_claim(rows) -> Claim:
    """Every GQA layer the learner returns agrees with the box to LAYER_TOL, its frequencies
    within FREQ_TOL and the heads that share keys found."""
    ok = rows[rows["status"] == "ok"]
    good = _recovered(ok)
    worst = float(ok["func_err"].astype(float).max()) if len(ok) else float("nan")
    freq = extra_values(ok, "freq_err", np.inf).astype(float)
    worst_freq = float(freq.max()) if len(ok) else float("nan")
    ok_rows_ = "rotary layers, status ok, 1 to 4,096 tokens"
    return threshold_claim(
        "rotary_layers", f"every GQA layer the learner returns agrees with the box to "
        f"{LAYER_TOL:g} on 1 to 4,096 tokens, its frequencies within {FREQ_TOL:g} and the heads "
        "that share keys found", good, of=len(ok), worst=worst, runs="layers returned",
        numbers=(Number("rotaryLayers", len(rows), "layers", "d",
                        rows="rotary layers, every status"),
                 Number("rotaryLayersRecovered", int(good.sum()), "layers", "d",
                        rows=ok_rows_ + ", within the goal"),
                 Number("rotaryLayersWorstError", worst, "relative error", ".1e", rows=ok_rows_,
                        factor=ROUNDING_FACTOR),
                 Number("rotaryLayersWorstFrequencyError", worst_freq, "radians per position",
                        ".1e", rows="rotary layers, status ok", factor=ROUNDING_FACTOR)))


@LAYER_CLAIMS
def rotary_layers_refused(rows) -> Claim:
    """Every layer not returned was refused with a named error of attnquery.errors."""
    failed = rows[rows["status"] != "ok"]
    names, named = _named_refusals(failed)
    kinds = ", ".join(f"{k} {names.count(k)}" for k in sorted(set(names))) or "none"
    return Claim(
        "rotary_layers_refused", "every layer not returned was refused with a named error of "
        "attnquery.errors (no timeout, no crash, no silent wrong answer)",
        bool(all(named)), f"{int(sum(named))}/{len(failed)} refusals named ({kinds})",
        n_runs=len(rows), numbers=(Number("rotaryLayersRefused", len(failed), "layers", "d",
                                          rows="rotary layers, status not ok"),))


@LAYER_CLAIMS
def rotary_layers_map(rows) -> Claim:
    """The failure map: a layer is recovered exactly where H / G <= d_h and it has no biases."""
    n = len(rows)
    pred = (_per_group(rows) <= rows["rank"].astype(int).to_numpy()) & ~_biased(rows)
    rec = _recovered(rows)
    wrong = [_shape(r) for (_, r), p, g in zip(rows.iterrows(), pred, rec, strict=True) if p != g]
    return Claim(
        "rotary_layers_map", "the failure map: a layer is recovered exactly where its query "
        "heads per key/value group H / G are at most the head dimension d_h = d / H and it has "
        "no biases",
        not wrong, f"{n - len(wrong)}/{n} layers as predicted"
        + (f"; not as predicted: {', '.join(wrong[:6])}" if wrong else ""), n_runs=n,
        numbers=(Number("rotaryLayersAsMapped", n - len(wrong), "layers", "d",
                        rows="rotary layers, every status"),))


@LAYER_CLAIMS
def rotary_layers_goal(rows) -> Claim | None:
    """Issue 23's goal layers (LAYER_GOALS) are recovered to LAYER_TOL (no claim without
    them)."""
    goal = rows[[(int(d), int(h), int(g)) in LAYER_GOALS for d, h, g in
                 zip(rows["d"], rows["n_heads"], rows["n_kv_heads"], strict=True)]]
    if not len(goal):
        return None
    gok = _recovered(goal)
    gworst = float(goal["func_err"].astype(float).fillna(np.inf).max())
    shapes = sorted({_shape(r) for _, r in goal.iterrows()})
    return threshold_claim(
        "rotary_layers_goal", f"issue 23's goal layers {', '.join(shapes)} (d, H, G) are "
        f"recovered to {LAYER_TOL:g}", gok, worst=gworst, runs="goal layers",
        numbers=(Number("rotaryLayersGoalError", gworst, "relative error", ".1e",
                        rows="rotary layers of the goal shapes, 1 to 4,096 tokens",
                        factor=ROUNDING_FACTOR),))


def rotary_layer_claims(df) -> list[Claim]:
    """The claims of the rotary experiment's layer rows (:data:`LAYER_CLAIMS`)."""
    return LAYER_CLAIMS.of_rows(df)


ROTARY_LAYERS_CAPTION = """\
**Whole rotary layers with grouped-query attention (beyond the paper).** Random Llama-style
layers, H query heads over G key/value heads of dimension d_h = d / H (RoPE, read out along a
unit vector), learnt by ``AttentionLayerLearner(n_heads=H, n_kv_heads=G, positions="rotary")``.
Left: the failure map over the query heads per key/value group H / G and d_h; a circle is a
layer recovered (colour: its functional relative error, log10), a cross one the learner refused
(its error's name beside it), an open square a layer with Qwen2-style biases refused; the dashed
line is H / G = d_h. Middle: the functional relative
error of the recovered layers against the length of the held-out sequences (1 to 4,096 tokens),
every layer (thin) and the worst of each d (bold). Right: the queries counted by the oracle
against d, per H.
"""


@register_figure("rotary_layers", experiments=["rotary"], category="Beyond the paper",
                 caption=ROTARY_LAYERS_CAPTION)
def rotary_layers(df):
    """The failure map of GQA layers, their error against the length, their queries."""
    rows = _layers(df)
    claims = rotary_layer_claims(df)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(10, 3.3), layout="constrained")
    rec = _recovered(rows)
    if len(rows):
        per, dh = _per_group(rows), rows["rank"].astype(int).to_numpy()
        err = np.log10(np.maximum(rows["func_err"].astype(float).fillna(1.0).to_numpy(), 1e-17))
        sc = ax1.scatter(per[rec], dh[rec], c=err[rec], cmap="viridis", vmin=-14, vmax=-8,
                         marker="o", s=30, label="recovered")
        bias = _biased(rows)
        ax1.scatter(per[~rec & ~bias], dh[~rec & ~bias], color="C3", marker="x", s=40,
                    label="refused")
        if bias.any():
            ax1.scatter(per[~rec & bias], dh[~rec & bias], facecolors="none", edgecolors="C3",
                        marker="s", s=60, label="refused, with biases")
        # sorted: a set's order follows the strings' hashes, which vary between processes
        # (PYTHONHASHSEED), and the PDF keeps the annotations in the order they are drawn
        refusals = sorted({(int(p), int(h), _error_name(m)) for p, h, m, r in
                           zip(per, dh, rows["message"], rec, strict=True) if not r})
        fig.colorbar(sc, ax=ax1, label="log10 functional error", shrink=0.9)
        xx = np.geomspace(0.8, max(per.max(), dh.max()) * 1.25, 10)
        ax1.plot(xx, xx, "k--", lw=0.8, label="$H/G = d_h$")
    ax1.set(xscale="log", yscale="log", xlabel="query heads per key/value head $H/G$",
            ylabel="head dimension $d_h = d/H$")
    if len(rows):
        log2_ticks(ax1, per)
        log2_ticks(ax1, dh, "y")
    ax1.set_title("Failure map")
    _legend(ax1, loc="lower right", fontsize=6)
    if len(rows) and refusals:  # each refusal named by its error, beside its marker
        label_points(ax1, *zip(*[(p, h, m.replace("Error", "")) for p, h, m in refusals],
                                strict=True), fontsize=5, color="C3")
    ok = rows[rec] if len(rows) else rows
    for k, (d, g) in enumerate(ok.groupby("d", sort=True)):
        by = extra_values(g, "func_err_by_length", {})
        lengths = sorted({int(n) for row in by for n in row})
        for row in by:  # every layer, thin; the worst of each d, bold
            ax2.plot(lengths, np.maximum([row.get(str(n), np.nan) for n in lengths], 1e-17),
                     "-", lw=0.4, alpha=0.5, color=f"C{k}")
        if k == 0:
            ax2.plot([], [], "-", lw=0.4, color="0.4", label="every layer")
        worst = [max(float(row.get(str(n), np.nan)) for row in by) for n in lengths]
        ax2.plot(lengths, np.maximum(worst, 1e-17), "o-", ms=3, lw=1.2, color=f"C{k}",
                 label=f"d = {int(d)}, worst")
    ax2.axhline(LAYER_TOL, color="k", lw=0.8, ls="--", label=f"goal {LAYER_TOL:g}")
    ax2.set(xscale="log", yscale="log", xlabel="sequence length $N$",
            ylabel="functional relative error")
    ax2.set_title("Error against the length")
    _legend(ax2, loc="lower right", fontsize=6)
    for k, (H, g) in enumerate(ok.groupby("n_heads", sort=True)):
        ax3.plot(g["d"], g["n_queries"], "os^vD"[k % 5], color=f"C{k}", ms=4, label=f"H = {int(H)}")
    ax3.set(xscale="log", yscale="log", xlabel="dimension $d$", ylabel="queries counted")
    ax3.set_title("Queries, recovered layers")
    _legend(ax3, loc="upper left", fontsize=6)
    log2_ticks(ax3, np.sort(ok["d"].unique()) if len(ok) else np.zeros(0))
    return fig, claims


# --- served heads (variant "served") ------------------------------------------------------------

#: issue 23's served goal: functional relative error on 1 to 4,096 tokens, at most
#: SERVED_GOAL_QUERIES (d^2 + d) queries counted by the oracle (the check included)
SERVED_GOAL = 1e-5
SERVED_GOAL_QUERIES = 8
#: the formats in the order the figure shows them
SERVED_PRECISIONS = ("float32", "float16", "bfloat16")


def _served(df):
    """The served rows of the rotary experiment (every status)."""
    rows = df[df["experiment"] == "rotary"]
    return rows[rows["variant"] == "served"]


def _served_total(rows) -> np.ndarray:
    """Queries counted by the oracle, the check included, per ``d^2 + d`` (NaN where refused)."""
    d = rows["d"].astype(float).to_numpy()
    q = (rows["n_queries"].astype(float).fillna(np.nan)
         + rows["verify_queries"].astype(float).fillna(0)).to_numpy()
    return q / (d * d + d)


def _served_met(rows) -> np.ndarray:
    """Whether each served row meets issue 23's goal: returned (status ok), functional error
    <= SERVED_GOAL on every length and at most SERVED_GOAL_QUERIES (d^2 + d) queries."""
    if not len(rows):
        return np.zeros(0, dtype=bool)
    ok = (rows["status"] == "ok").to_numpy()
    err = rows["func_err"].astype(float).fillna(np.inf).to_numpy() <= SERVED_GOAL
    q = np.nan_to_num(_served_total(rows), nan=np.inf) <= SERVED_GOAL_QUERIES
    return ok & err & q


def _half_or_less(rows) -> np.ndarray:
    """Whether each row's head dimension is at most d / 2 (every real model's heads)."""
    return (2 * rows["rank"].astype(int) <= rows["d"].astype(int)).to_numpy()


def _at_goal_budget(rows) -> np.ndarray:
    """Whether each row's budget is the goal's, ``n_queries = SERVED_GOAL_QUERIES (d^2 + d)``
    (the goal and the map are claimed on these; a smaller budget below the learner's plan is
    refused by BudgetExceededError, which says nothing about the goal)."""
    return (rows["queries_per_unknown"].astype(float) == SERVED_GOAL_QUERIES).to_numpy()


def _served_shape(row) -> str:
    return (f"({row['rounding']}, d={int(row['d'])}, d_h={int(row['rank'])}, "
            f"base {row['rope_base']:g})")


#: the claims of the rotary experiment's served rows (variant ``served``; one function each,
#: named as the claim), checked on those rows (every status)
SERVED_CLAIMS = ClaimSet(_served)


@SERVED_CLAIMS
def rotary_served_goal(rows) -> Claim:
    """Rotary heads served in float32 with d_h <= d/2, given the goal's budget, are recovered to
    SERVED_GOAL at <= SERVED_GOAL_QUERIES (d^2 + d) queries, the check included."""
    sel = ((rows["rounding"] == "float32").to_numpy() & _half_or_less(rows)
           & _at_goal_budget(rows))
    goal_rows = rows[sel]
    gmet = _served_met(rows)[sel]
    gok = goal_rows[goal_rows["status"] == "ok"]
    worst = float(gok["func_err"].astype(float).max()) if len(gok) else float("nan")
    freq = extra_values(gok, "freq_err", np.inf).astype(float)
    noise = extra_values(gok, "noise_level", np.nan).astype(float)
    most = float(np.max(_served_total(gok))) if len(gok) else float("nan")
    grows = (f"rotary heads served in float32, d_h <= d/2, budget {SERVED_GOAL_QUERIES} "
             "(d^2 + d)")
    return threshold_claim(
        "rotary_served_goal", f"rotary heads served in float32 with d_h <= d/2 are recovered to "
        f"{SERVED_GOAL:g} (functional relative error against the served box on 1 to 4,096 "
        f"tokens) at <= {SERVED_GOAL_QUERIES} (d^2 + d) queries counted by the oracle, the "
        "check included", gmet, worst=worst, runs="heads",
        numbers=(Number("rotaryServedHeads", len(goal_rows), "heads", "d",
                        rows=grows + ", every status"),
                 Number("rotaryServedMet", int(gmet.sum()), "heads", "d",
                        rows=grows + ", within the goal"),
                 Number("rotaryServedWorstError", worst, "relative error", ".1e",
                        rows=grows + ", status ok, 1 to 4,096 tokens", factor=NOISE_FACTOR),
                 Number("rotaryServedMostQueries", most, "queries / (d^2 + d)", ".2f",
                        rows=grows + ", status ok, check included"),
                 Number("rotaryServedWorstFrequencyError",
                        float(freq.max()) if len(gok) else float("nan"),
                        "radians per position", ".1e", rows=grows + ", status ok",
                        factor=NOISE_FACTOR),
                 Number("rotaryServedMaxNoise",
                        float(noise.max()) if len(gok) else float("nan"),
                        "relative noise (noise_level_)", ".1e", rows=grows + ", status ok",
                        factor=NOISE_FACTOR),
                 Number("rotaryServedMaxD", int(goal_rows["d"].max()) if len(goal_rows) else 0,
                        "d", "d", rows=grows)))


@SERVED_CLAIMS
def rotary_served_refused(rows) -> Claim:
    """Every served head not returned was refused with a named error, and every float16 and
    bfloat16 head with AssumptionViolation."""
    failed = rows[rows["status"] != "ok"]
    names, named = _named_refusals(failed)
    low = (rows["rounding"] != "float32").to_numpy()
    low_refused = [r != "ok" and _error_name(m) == "AssumptionViolation"
                   for r, m in zip(rows["status"][low], rows["message"][low], strict=True)]
    kinds = ", ".join(f"{k} {names.count(k)}" for k in sorted(set(names))) or "none"
    return Claim(
        "rotary_served_refused", "every served head not returned was refused with a named "
        "error of attnquery.errors (no timeout, no crash), and every float16 and bfloat16 head "
        "with AssumptionViolation (the learner takes float32 answers only)",
        bool(all(named) and all(low_refused)),
        f"{int(sum(named))}/{len(failed)} refusals named ({kinds}); "
        f"{int(sum(low_refused))}/{len(low_refused)} 16-bit heads refused by "
        "AssumptionViolation", n_runs=len(rows),
        numbers=(Number("rotaryServedRefused", len(failed), "heads", "d",
                        rows="served rotary heads, status not ok"),
                 Number("rotaryServedSixteenBit", len(low_refused), "heads", "d",
                        rows="rotary heads served in float16 or bfloat16, every status")))


@SERVED_CLAIMS
def rotary_served_map(rows) -> Claim:
    """The served failure map (at the goal's budget): the goal is met exactly where the head is
    served in float32 and d_h <= d/2 (square float32 heads miss it or are refused; 16-bit heads
    are refused)."""
    f32 = (rows["rounding"] == "float32").to_numpy()
    half = _half_or_less(rows)
    at = _at_goal_budget(rows)
    mapped = rows[at]
    pred = (f32 & half)[at]
    wrong = [_served_shape(r) for (_, r), p, g in zip(mapped.iterrows(), pred,
                                                       _served_met(rows)[at], strict=True)
             if p != g]
    m = len(mapped)
    sq = rows[f32 & ~half & at]
    sq_ok = sq[sq["status"] == "ok"]
    sq_rows = "rotary heads served in float32, d_h > d/2, at the goal's budget"
    return Claim(
        "rotary_served_map", f"the served failure map: the goal ({SERVED_GOAL:g} at <= "
        f"{SERVED_GOAL_QUERIES} (d^2 + d) queries, heads given that budget) is met exactly "
        "where the head is served in float32 with d_h <= d/2; heads with d_h > d/2 in float32 "
        "miss it or are refused, 16-bit heads are refused",
        not wrong, f"{m - len(wrong)}/{m} served heads as predicted"
        + (f"; not as predicted: {', '.join(wrong[:6])}" if wrong else ""), n_runs=m,
        numbers=(Number("rotaryServedCells", len(rows), "heads", "d",
                        rows="served rotary heads, every status and budget"),
                 Number("rotaryServedMapped", m, "heads", "d",
                        rows="served rotary heads at the goal's budget, every status"),
                 Number("rotaryServedAsMapped", m - len(wrong), "heads", "d",
                        rows="served rotary heads at the goal's budget, every status"),
                 Number("rotaryServedSquare", len(sq), "heads", "d",
                        rows=sq_rows + ", every status"),
                 Number("rotaryServedSquareReturned", len(sq_ok), "heads", "d",
                        rows=sq_rows + ", status ok")))


def rotary_served_claims(df) -> list[Claim]:
    """The claims of the rotary experiment's served rows (:data:`SERVED_CLAIMS`)."""
    return SERVED_CLAIMS.of_rows(df)


ROTARY_SERVED_CAPTION = """\
**Served rotary heads (beyond the paper).** Random rotary heads served in float32, float16 and
bfloat16 (``RotaryAttentionHead(precision=...)``: weights, cos/sin tables and every operation
rounded), learnt by ``RotaryValueQueryLearner(n_queries=budget)`` from the served answers.
Left: the functional relative error against the served box, against the length of the
held-out sequences (1 to 4,096 tokens), worst over the bases and seeds of each (d, d_h), float32
heads returned; the dashed line is issue 23's goal 1e-5, the grey band the format's own floor
(the served box against the exact float64 head). Middle: the failure map over the format and
the head's shape: per group, the heads that meet the goal, those returned with a larger error,
and those refused (the error's name). Right: the queries counted by the oracle (check
included) per d^2 + d, against d, with the budgets (dotted) and the goal's 8 (dashed).
"""


_SHAPE_LABEL = {True: r"$d_h \leq d/2$", False: r"$d_h > d/2$"}


def _served_map(ax, rows) -> None:
    """The failure map's panel: a grid of (shape, base) x format, each cell its counts."""
    met = _served_met(rows)
    shapes = sorted({(bool(h), float(b)) for h, b in zip(_half_or_less(rows), rows["rope_base"],
                                                        strict=True)}, key=lambda t: (-t[0], t[1]))
    fmts = [p for p in SERVED_PRECISIONS if p in set(rows["rounding"])]
    frac = np.full((len(shapes), len(fmts)), np.nan)
    half = _half_or_less(rows)
    for i, (h, b) in enumerate(shapes):
        for j, p in enumerate(fmts):
            sel = (half == h) & (rows["rope_base"].astype(float).to_numpy() == b) & (
                rows["rounding"] == p).to_numpy()
            g = rows[sel]
            if not len(g):
                continue
            k = int(met[sel].sum())
            names = sorted({_error_name(m) for m in g["message"][g["status"] != "ok"]})
            missed = int(((g["status"] == "ok").to_numpy() & ~met[sel]).sum())
            frac[i, j] = k / len(g)
            text = f"{k}/{len(g)} met"
            if missed:
                text += f"\n{missed} missed"
            refused = int((g["status"] != "ok").sum())
            if refused:
                text += f"\n{refused} refused\n" + "\n".join(nm.replace("Error", "")
                                                             for nm in names)
            ax.text(j, i, text, ha="center", va="center", fontsize=5)
    ax.imshow(frac, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto", alpha=0.6)
    ax.grid(False)
    ax.set_xticks(range(len(fmts)), fmts, fontsize=6)
    ax.set_yticks(range(len(shapes)),
                  [f"{_SHAPE_LABEL[h]}, base {b:g}" for h, b in shapes],
                  fontsize=6)


@register_figure("rotary_served", experiments=["rotary"], category="Beyond the paper",
                 caption=ROTARY_SERVED_CAPTION)
def rotary_served(df):
    """Served rotary heads: error against the length, the failure map, the queries."""
    rows = _served(df)
    claims = rotary_served_claims(df)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(10, 3.3), layout="constrained")
    ok = rows[(rows["status"] == "ok") & (rows["rounding"] == "float32")]
    for k, ((d, dh), g) in enumerate(ok.groupby(["d", "rank"], sort=True)):
        by = extra_values(g, "func_err_by_length", {})
        lengths = sorted({int(n) for row in by for n in row})
        if k == 0:
            ax2.plot([], [], "-", lw=0.4, color="0.4", label="every layer")
        worst = [max(float(row.get(str(n), np.nan)) for row in by) for n in lengths]
        ax1.plot(lengths, np.maximum(worst, 1e-17), "o-" if 2 * dh <= d else "s:", ms=3,
                 color=f"C{k}", label=f"d={int(d)}, $d_h$={int(dh)}")
        floor = extra_values(g, "floor_by_length", {})
        ax1.plot(lengths, [max(float(row.get(str(n), np.nan)) for row in floor)
                           for n in lengths], "-", lw=3, alpha=0.15, color="0.3",
                 label="format's floor" if k == 0 else None)
    ax1.axhline(SERVED_GOAL, color="k", lw=0.8, ls="--", label=f"goal {SERVED_GOAL:g}")
    ax1.set(xscale="log", yscale="log", xlabel="sequence length $N$",
            ylabel="functional relative error")
    ax1.set_title("float32 heads: error against the length")
    _legend(ax1, loc="lower right", fontsize=5, ncol=2)
    if len(rows):
        _served_map(ax2, rows)
    ax2.set_title("Failure map (goal met / missed / refused)")
    for k, (p, g) in enumerate(rows[rows["status"] == "ok"].groupby("rounding", sort=True)):
        half = _half_or_less(g)
        q = _served_total(g)
        for sel, mark, shape in ((half, "o", True), (~half, "s", False)):
            if sel.any():
                ax3.plot(g["d"][sel], q[sel], mark, mfc=None if shape else "none",
                         color=f"C{k}", ms=4, label=f"{p}, {_SHAPE_LABEL[shape]}")
    for b in sorted(rows["queries_per_unknown"].dropna().unique()):
        if b != SERVED_GOAL_QUERIES:
            ax3.axhline(float(b), color="0.4", lw=0.8, ls=":")
    ax3.axhline(SERVED_GOAL_QUERIES, color="k", lw=0.8, ls="--",
                label=f"goal {SERVED_GOAL_QUERIES} $(d^2 + d)$")
    ax3.set(xscale="log", xlabel="dimension $d$", ylabel="queries / $(d^2 + d)$")
    ax3.set_ylim(0, SERVED_GOAL_QUERIES * 1.15)
    ax3.set_title("Queries counted (check included)")
    _legend(ax3, loc="center", fontsize=5)
    if len(rows):
        log2_ticks(ax3, np.sort(rows["d"].unique()))
    return fig, claims
