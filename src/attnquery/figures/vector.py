"""Figure "vector": extraction from vector answers against scalar answers (beyond the paper).

Drawn from the rows of the ``vector`` experiment only: the queries counted by the oracle (the
check queries included) against d for scalar answers (the exact learner, d^2 + 2d + 1 with
biases), the last token's output vectors and every token's (``VectorLayerLearner``), beside the
floor of each (degrees of freedom over the numbers one answer holds), and the errors of the fits.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..claims import (
    ROUNDING_FACTOR,
    Claim,
    ClaimSet,
    Number,
    extra_values,
    number_name,
)
from ._common import label_points
from ._core import log2_ticks, register_figure

#: the issue's goal for float64 fits (W, V, c, beta and the function, relative)
GOAL = 1e-9
#: queries per d (the check included) one head may ask, per kind of vector answers, at d of at
#: least QUERY_MIN_D (below it the d + 1 one-token queries and the 8 check queries weigh more)
QUERIES_PER_D = {"all": 2, "last": 4}
QUERY_MIN_D = 32
#: all-token answers against scalar answers at d of at least GAIN_MIN_D: at least GAIN times
#: fewer queries
GAIN, GAIN_MIN_D = 30.0, 64
COLORS = {"scalar": "C0", "last": "C1", "all": "C2"}
LABELS = {"scalar": "scalar answers", "last": "last token's output", "all": "every token's output"}
#: errors are drawn no lower than this on log axes
LOW = 1e-17
ERRORS = ("rel_err_W", "rel_err_v", "rel_err_c", "rel_err_offset", "func_err")


def _all_rows(df):
    """The vector experiment's rows: the grid's and the named cases' (column ``family``)."""
    return df[df["experiment"] == "vector"]


def _is_case(rows) -> np.ndarray:
    """Per row, whether it is a named case (``experiments.vector.cases``)."""
    if "family" not in rows.columns:
        return np.zeros(len(rows), dtype=bool)
    return rows["family"].notna().to_numpy()


def _rows(df):
    """The grid's rows (named cases apart) and those that ran to an answer."""
    rows = _all_rows(df)
    rows = rows[~_is_case(rows)]
    return rows, rows[rows["status"] == "ok"]


def _cases(df):
    """The named cases' rows (None without one: no claim on them)."""
    rows = _all_rows(df)
    rows = rows[_is_case(rows)]
    return rows if len(rows) else None


def _worst_error(rows) -> np.ndarray:
    """Per row, the largest of the errors of W, V (v), c, beta and the function."""
    return rows[list(ERRORS)].astype(float).max(axis=1).to_numpy()


def _total(rows) -> np.ndarray:
    """Per row, the queries counted by the oracle, the check included."""
    return (rows["n_queries"].astype(int) + rows["verify_queries"].astype(int)).to_numpy()


def _vector_data(df):
    """The vector rows and those that ran to an answer (None without a row: the figure then
    states no claim)."""
    rows, ok = _rows(df)
    return (rows, ok) if len(rows) else None


def _single(ok):
    """The ok rows of single heads."""
    return ok[ok["n_heads"] == 1]


#: the claims of the vector experiment (one function each, named as the claim; the query
#: claims are named ``vector_queries_<variant>``), checked on ``(rows, ok)``: its rows and those
#: with status ok
CLAIMS = ClaimSet(_vector_data)


@CLAIMS
def vector_runs(data) -> Claim:
    """Every cell ran (no refusal, no error)."""
    rows, ok = data
    return Claim("vector_runs", "every cell ran (no refusal, no error)",
                 bool(len(ok) == len(rows)), f"{len(ok)}/{len(rows)} cells ok", n_runs=len(ok))


@CLAIMS
def vector_goal(data) -> Claim:
    """Every single head with biases is recovered from vector answers within GOAL."""
    rows, ok = data
    single = _single(ok)
    vec = single[single["variant"] != "scalar"]
    vec_rows = rows[(rows["n_heads"] == 1) & (rows["variant"] != "scalar")]
    err = _worst_error(vec)
    worst = float(err.max()) if len(vec) else float("nan")
    what = "single heads with biases, float64, vector answers"
    return Claim(
        "vector_goal", f"every single head with biases is recovered from vector answers "
        f"(the last token's or every token's) in float64: W, V, c, beta and the function "
        f"on 1 to 256 tokens within {GOAL:g}",
        bool(len(vec) == len(vec_rows) and (err <= GOAL).all()),
        f"{int((err <= GOAL).sum())}/{len(vec_rows)} heads, worst {worst:.3g}",
        n_runs=len(vec),
        numbers=(Number(number_name("vector", "heads"), len(vec_rows), "heads", "d",
                        rows=what),
                 Number(number_name("vector", "worst", "error"), worst, "relative error",
                        ".2g", rows=what)))


@CLAIMS
def vector_queries(data) -> list[Claim]:
    """Per kind of vector answers (QUERIES_PER_D) with heads at d >= QUERY_MIN_D: one head asks
    at most the kind's queries per d, the check included."""
    _, ok = data
    single = _single(ok)
    vec = single[single["variant"] != "scalar"]
    claims = []
    for variant, per_d in QUERIES_PER_D.items():
        sel = vec[(vec["variant"] == variant) & (vec["d"] >= QUERY_MIN_D)]
        if not len(sel):
            continue
        ratio = _total(sel) / sel["d"].to_numpy()
        claims.append(Claim(
            f"vector_queries_{variant}",
            f"one head from {LABELS[variant]}s: at most {per_d}d queries, the check included, "
            f"at d >= {QUERY_MIN_D}", bool((ratio <= per_d).all()),
            f"{int((ratio <= per_d).sum())}/{len(sel)} heads, at most {ratio.max():.3g}d",
            n_runs=len(sel), numbers=_query_numbers(vec, variant)))
    return claims


@CLAIMS
def vector_gain(data) -> Claim | None:
    """All-token answers against scalar answers at every d >= GAIN_MIN_D both ran at: at least
    GAIN times fewer queries (no claim without such a d)."""
    single = _single(data[1])
    scal, alls = single[single["variant"] == "scalar"], single[single["variant"] == "all"]
    ds = sorted(set(scal["d"]) & set(alls["d"]))
    ds = [d for d in ds if d >= GAIN_MIN_D]
    if not ds:
        return None
    gains = {d: float(_total(scal[scal["d"] == d]).min() / _total(alls[alls["d"] == d]).max())
             for d in ds}
    worst = min(gains.values())
    top = max(ds)
    what = f"single heads, d = {top}: fewest scalar-answer queries over most all-token ones"
    return Claim(
        "vector_gain", f"at d >= {GAIN_MIN_D}, a head from every token's outputs asks at least "
        f"{GAIN:g} times fewer queries than from scalar answers (the check included)",
        bool(worst >= GAIN), ", ".join(f"d = {d}: {g:.3g} times" for d, g in gains.items()),
        n_runs=int(len(scal[scal["d"].isin(ds)]) + len(alls[alls["d"].isin(ds)])),
        numbers=(Number(number_name("vector", "gain"), gains[top], "times", ".3g",
                        rows=what),))


@CLAIMS
def vector_scalar_count(data) -> Claim | None:
    """Scalar answers: the exact learner with biases asks exactly d^2 + 2d + 1 queries, the
    check apart (no claim without a scalar head)."""
    single = _single(data[1])
    scal = single[single["variant"] == "scalar"]
    if not len(scal):
        return None
    dof = extra_values(scal, "dof").astype(int).to_numpy()
    exact = scal["n_queries"].astype(int).to_numpy() == dof
    return Claim(
        "vector_scalar_count", "scalar answers: the exact learner with biases asks exactly "
        "d^2 + 2d + 1 queries, the check apart (its floor: one number an answer)",
        bool(exact.all()), f"{int(exact.sum())}/{len(scal)} heads", n_runs=len(scal),
        numbers=_query_numbers(single, "scalar"))


@CLAIMS
def vector_layers(data) -> Claim | None:
    """Layers of several heads that fill d, from vector answers: every head and the function
    within GOAL (no claim without a layer cell)."""
    rows, ok = data
    lay_rows, lay = rows[rows["n_heads"] > 1], ok[ok["n_heads"] > 1]
    if not len(lay_rows):
        return None
    err = _worst_error(lay)
    met = int((err <= GOAL).sum())
    worst = float(err.max()) if len(lay) else float("nan")
    what = "layers of heads that fill d, float64, vector answers"
    return Claim(
        "vector_layers", f"layers of H > 1 heads that fill d, from vector answers: every head's "
        f"W, V and c, beta and the function within {GOAL:g} (heads matched by their value maps)",
        bool(met == len(lay_rows)), f"{met}/{len(lay_rows)} layers, worst {worst:.3g}",
        n_runs=len(lay),
        numbers=(Number(number_name("vector", "layers"), len(lay_rows), "layers", "d", rows=what),
                 Number(number_name("vector", "layers", "recovered"), met, "layers", "d",
                        rows=what),
                 Number(number_name("vector", "layers", "worst", "error"), worst,
                        "relative error", ".2g", rows=what),
                 Number(number_name("vector", "layers", "most", "queries"),
                        int(_total(lay).max()) if len(lay) else 0, "queries", "d",
                        rows=what)))


#: the claims on the named cases (``experiments.vector.cases``), checked on their rows
CASE_CLAIMS = ClaimSet(_cases)


def _case_label(row) -> str:
    """A case's layer in words: heads, key/value heads, W's rank, mask, positions, format."""
    H, G = int(row["n_heads"]), row.get("n_kv_heads")
    parts = [f"d = {int(row['d'])}", f"{H} head{'s' if H > 1 else ''}"]
    if G is not None and not _missing(G) and int(G) != H:
        parts[-1] += f" over {int(G)} key/value heads"
    if not _missing(row.get("key_dim")) and int(row["key_dim"]) == int(row["d"]):
        parts.append("full-rank W")
    if bool(row.get("causal")):
        parts.append("causal")
    if not _missing(row.get("rope_base")):
        parts.append(f"RoPE base {row['rope_base']:g}")
    parts.append(f"{row['rounding']} answers" if isinstance(row.get("rounding"), str)
                 else "float64 answers")
    return ", ".join(parts)


def _longest(rows) -> int:
    """The longest sequence the rows' function error was measured on (``extra.check_lengths``)."""
    lengths = extra_values(rows, "check_lengths").dropna()
    return int(max((max(x) for x in lengths), default=0))


def _missing(x) -> bool:
    """A parameter the row does not set (None, NaN or pandas' NA)."""
    return bool(pd.isna(x))


@CASE_CLAIMS
def vector_case(rows) -> list[Claim]:
    """Per named case: every cell ran and every error (W, V, c, beta where the learner has
    them, the function) is within the case's goal; its queries and worst error as numbers."""
    claims = []
    for name, sel in rows.groupby("family", sort=False):
        ok = sel[sel["status"] == "ok"]
        goal = float(sel["goal"].max())
        err = _worst_error(ok) if len(ok) else np.array([np.inf])
        met = int((err <= goal).sum()) if len(ok) else 0
        worst = float(err.max()) if len(ok) else float("nan")
        queries = int(_total(ok).max()) if len(ok) else 0
        what = f"named case {name}: {_case_label(sel.iloc[0])}"
        float64 = not isinstance(sel.iloc[0].get("rounding"), str) or \
            sel.iloc[0]["rounding"] == "float64"
        claims.append(Claim(
            f"vector_case_{name}", f"{_case_label(sel.iloc[0])}, from "
            f"{LABELS[sel.iloc[0]['variant']]}s: every error within {goal:.3g}",
            bool(met == len(sel)), f"{met}/{len(sel)} layers, worst {worst:.3g}, "
            f"at most {queries} queries (the check included)", n_runs=len(ok),
            numbers=(Number(number_name("vector", name, "queries"), queries, "queries", "d",
                            rows=what),
                     Number(number_name("vector", name, "worst", "error"), worst,
                            "relative error", ".2g", rows=what,
                            factor=ROUNDING_FACTOR if float64 else None),
                     *((Number(number_name("vector", name, "longest"), longest, "tokens", "d",
                               rows=f"{what}: the longest sequence of its function error"),)
                       if (longest := _longest(ok)) else ()))))
    return claims


def vector_claims(df) -> list[Claim]:
    """The claims of the vector experiment (:data:`CLAIMS` on the grid's rows,
    :data:`CASE_CLAIMS` on the named cases')."""
    return CLAIMS.of_rows(df) + CASE_CLAIMS.of_rows(df)


def _query_numbers(rows, variant) -> tuple:
    """The queries (the check included) and the floor ratio of ``variant`` at the largest d."""
    sel = rows[rows["variant"] == variant]
    if not len(sel):
        return ()
    d = int(sel["d"].max())
    at = sel[sel["d"] == d]
    what = f"single heads, {LABELS[variant]}, d = {d}, the check included"
    out = [Number(number_name("vector", variant, "max d"), d, "d", "d", rows=what),
           Number(number_name("vector", variant, "queries"), int(_total(at).max()), "queries",
                  "d", rows=what),
           Number(number_name("vector", variant, "floor ratio"),
                  float(extra_values(at, "floor_ratio").astype(float).max()),
                  "queries / floor", ".3g", rows=what)]
    if variant != "scalar":
        out.append(Number(number_name("vector", variant, "tokens"),
                          int(extra_values(at, "n_tokens").astype(int).max()), "tokens", "d",
                          rows=what))
    return tuple(out)



VECTOR_CAPTION = """\
**Vector answers against scalar answers (beyond the paper).** Random float64 layers with
biases, extracted from one number per query (the last token's output read out along a vector;
the exact learner with biases), from the last token's output vector, or from every token's
(``VectorLayerLearner``). (a) Queries counted by the oracle, the 8 check queries included,
against d; dashed: each kind's floor, the degrees of freedom over the numbers one answer holds
(for every token's outputs, at the learner's tokens per query); hollow markers: layers of
several heads that fill d. (b) The largest relative error of W, V (v), c, beta and the function
on 1 to 256 tokens; dotted: the goal 1e-9. (c) Named layers beyond the grid
(``experiments.vector.cases``: heads of full-rank W, a Qwen2-style causal rotary layer of
grouped-query heads, answers served in float32, float16 and bfloat16): queries against the
worst error over the case's goal (dotted: the goal; for rotary layers the value maps and the
function on 1 to 512 tokens).
"""


@register_figure("vector", experiments=["vector"], category="Beyond the paper",
                 caption=VECTOR_CAPTION)
def vector(df):
    """Queries against d per kind of answers, beside the floor; errors."""
    claims = vector_claims(df)
    _, ok = _rows(df)
    cases = _cases(df)
    n = 2 if cases is None else 3
    fig, axes = plt.subplots(1, n, figsize=(3.4 * n, 2.8), layout="constrained")
    ax, bx = axes[:2]
    for variant, color in COLORS.items():
        sel = ok[ok["variant"] == variant]
        for layers, marker in ((False, "o"), (True, "s")):
            s = sel[(sel["n_heads"] > 1) == layers]
            if not len(s):
                continue
            face = "none" if layers else color
            label = None if layers else LABELS[variant]
            ax.scatter(s["d"], _total(s), s=14, marker=marker, facecolors=face, edgecolors=color,
                       label=label)
            bx.scatter(s["d"], np.maximum(_worst_error(s), LOW), s=14, marker=marker,
                       facecolors=face, edgecolors=color, label=label)
            if not layers:
                fl = s.assign(floor=extra_values(s, "floor").astype(float))
                fl = fl.groupby("d")["floor"].max().sort_index()
                ax.plot(fl.index, fl.to_numpy(), color=color, ls="--", lw=0.8)
    bx.axhline(GOAL, color="0.4", ls=":", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="d", ylabel="queries (check included)",
           title="(a) queries and floor")
    bx.set(xscale="log", yscale="log", xlabel="d", ylabel="largest relative error",
           title="(b) errors")
    from matplotlib.lines import Line2D

    keys = [Line2D([], [], ls="none", marker="s", mfc="none", mec="0.3",
                   label="layer of several heads")] if (ok["n_heads"] > 1).any() else []
    floor = [Line2D([], [], color="0.3", ls="--", lw=0.8, label="floor (dof / answer)")]
    goal = [Line2D([], [], color="0.4", ls=":", lw=0.8, label=f"goal {GOAL:g}")]
    for a, extra in ((ax, keys + floor), (bx, keys + goal)):
        if len(ok):
            log2_ticks(a, ok["d"])
        if a.has_data():
            handles, _ = a.get_legend_handles_labels()
            a.legend(handles=handles + extra, fontsize=6)
    if cases is not None:  # last: its labels are placed on the laid-out figure
        _draw_cases(axes[2], cases)
    return fig, claims


def _draw_cases(cx, cases) -> None:
    """Panel (c): each named case's queries against its worst error over its goal."""
    ok = cases[cases["status"] == "ok"]
    ratio = np.maximum(_worst_error(ok) / ok["goal"].astype(float).to_numpy(), LOW)
    colors = [COLORS[v] for v in ok["variant"]]
    cx.scatter(_total(ok), ratio, s=18, marker="D", c=colors)
    cx.axhline(1.0, color="0.4", ls=":", lw=0.8)
    cx.set(xscale="log", yscale="log", xlabel="queries (check included)",
           ylabel="worst error / goal", title="(c) named layers")
    label_points(cx, _total(ok), ratio, ok["family"])
