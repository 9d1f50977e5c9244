"""Figure "served_layers": whole layers extracted from served answers (beyond the paper).

Drawn from the whole-layer rows of the ``served`` experiment (``variant`` "layer"): every
head's relative error of W against the queries spent per degree of freedom of the layer
(``layer_dof``), per precision, and each layer's functional error. Claims ``served_layer_*``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..claims import NOISE_FACTOR, Claim, ClaimSet, Number, extra_values
from ._core import register_figure

#: the issue's goal for float32-served layers: every head's W and the function within GOAL at
#: at most BUDGET times the layer's degrees of freedom
GOAL, BUDGET = 1e-5, 4.0
#: the errors a refusal may carry (attnquery.errors): a layer the learner cannot extract
NAMED = ("SearchLimitError", "AssumptionViolation", "ModelMismatchError", "BudgetExceededError")
COLORS = {"float32": "C0", "float16": "C1", "bfloat16": "C2"}
LOW = 1e-12


def _rows(df):
    rows = df[df["experiment"] == "served"]
    if "variant" not in rows:
        return rows.iloc[:0], rows.iloc[:0]
    rows = rows[rows["variant"] == "layer"]
    return rows, rows[rows["status"] == "ok"]


def _layer_data(df):
    """The whole-layer rows and those that ran to an answer (None without a layer row: the
    figure then states no claim)."""
    rows, ok = _rows(df)
    return (rows, ok) if len(rows) else None


#: the claims of the whole-layer cells of the served experiment (one function each, named as
#: the claim), checked on ``(rows, ok)``: the layer rows and those with status ok
CLAIMS = ClaimSet(_layer_data)


def _float32(data):
    rows, ok = data
    return rows[rows["rounding"] == "float32"], ok[ok["rounding"] == "float32"]


@CLAIMS
def served_layer_runs(data) -> Claim | None:
    """Every float32-served layer is extracted (no claim without a float32 layer cell)."""
    f32, ok32 = _float32(data)
    if not len(f32):
        return None
    return Claim(
        "served_layer_runs", "every float32-served layer is extracted (no refusal)",
        bool(len(ok32) == len(f32)), f"{len(ok32)}/{len(f32)} layer cells ok",
        n_runs=len(ok32),
        numbers=(Number("servedLayerRuns", len(ok32), "runs", "d",
                        rows="served, variant layer, float32, status ok"),))


@CLAIMS
def served_layer_goal_float32(data) -> Claim | None:
    """float32: every layer within BUDGET dof has every head's W and its function within
    GOAL (a layer meets it when some cell within the budget does; no claim without a float32
    layer cell)."""
    f32, ok32 = _float32(data)
    return _goal_claim(f32, ok32) if len(f32) else None


@CLAIMS
def served_layer_refusals_named(data) -> Claim:
    """Every served layer the learner does not extract ends in a named error."""
    rows, ok = data
    failed = rows[rows["status"] != "ok"]
    named = failed["message"].fillna("").map(lambda m: m.split(":")[0] in NAMED).astype(bool)
    return Claim(
        "served_layer_refusals_named", "every served layer the learner does not extract ends "
        "in a named error of attnquery.errors (never a silent wrong answer)",
        bool(named.all()), f"{int(named.sum())}/{len(failed)} refusals named, "
        f"{len(ok)} layers extracted and checked", n_runs=len(rows),
        numbers=(Number("servedLayerRefusals", len(failed), "runs", "d",
                        rows="served, variant layer, status not ok"),))


def served_layer_claims(df) -> list[Claim]:
    """The claims of the whole-layer cells of the served experiment (:data:`CLAIMS`)."""
    return CLAIMS.of_rows(df)


def _goal_claim(f32, ok32) -> Claim:
    """:func:`served_layer_goal_float32` on the float32 layer rows and those with status ok."""
    sel = ok32[ok32["queries_per_unknown"] <= BUDGET]
    mine = f32[f32["queries_per_unknown"] <= BUDGET]
    spent = extra_values(sel, "spent_per_dof").astype(float)
    eW, fe = sel["rel_err_W"].astype(float), sel["func_err"].astype(float)
    good = (eW <= GOAL) & (fe <= GOAL) & (spent <= BUDGET)
    keys = ["layer", "seed"]
    layers = mine.groupby(keys).size().index
    met = set(sel[good.to_numpy()].set_index(keys).index)
    n_met = sum(k in met for k in layers)
    worst_W = float(eW.max()) if len(sel) else float("nan")
    worst_f = float(fe.max()) if len(sel) else float("nan")
    worst_q = float(spent.max()) if len(sel) else float("nan")
    rows = "served, variant layer, float32, budget <= 4 dof"
    return Claim(
        "served_layer_goal_float32",
        f"float32-served layers: every head's W and the layer's function within {GOAL:g} "
        f"(relative) at <= {BUDGET:g} times the layer's degrees of freedom, on every layer",
        bool(len(layers) and n_met == len(layers)),
        f"{n_met}/{len(layers)} layers (worst head W {worst_W:.3g}, worst function "
        f"{worst_f:.3g}, at most {worst_q:.3g} dof)", n_runs=len(sel),
        numbers=(Number("servedLayersMet", n_met, "layers", "d", rows=rows),
                 Number("servedLayersMeasured", len(layers), "layers", "d", rows=rows))
        # no layer cell within the budget (the quick study's): no worst error to state, not NaN
        # float32 noise: the learner's float64 query choices flip a few float32 roundings
        # from one BLAS kernel to another (NOISE_FACTOR), and with them the plan's passes
        + ((Number("servedLayerWorstW", worst_W, "relative error", ".2g", rows=rows,
                   factor=NOISE_FACTOR),
            Number("servedLayerWorstFunc", worst_f, "relative error", ".2g", rows=rows,
                   factor=NOISE_FACTOR),
            Number("servedLayerQueriesPerDof", worst_q, "queries / dof", ".3g", rows=rows,
                   factor=1.05))
           if len(sel) else ()))


SERVED_LAYERS_CAPTION = """\
**Whole layers served in float32 (beyond the paper).** Every layer of the checkpoint (all
heads, every bias, read out at the last token) computed as an engine computes it, extracted by
``AttentionLayerLearner(route="served", n_queries=...)``. (a) Each head's relative error of W
(matched up to a permutation) against the queries spent per degree of freedom of the layer;
dotted: the goal (1e-5), dashed: the budget it is stated at (4 queries per degree of freedom).
(b) Each layer's functional relative error; with a single layer in the study, drawn in (a)
instead (a star).
"""


@register_figure("served_layers", experiments=["served"], category="Real heads",
                 caption=SERVED_LAYERS_CAPTION)
def served_layers(df):
    """Per-head errors of W against queries per dof, and per-layer functional errors."""
    claims = served_layer_claims(df)
    _, ok = _rows(df)
    layers = np.unique(ok["layer"].astype(int)) if len(ok) else np.array([], dtype=int)
    # one layer: its functional error beside its heads' errors in one panel, not a panel of
    # one point
    n = 1 if len(layers) == 1 else 2
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 2.8), layout="constrained", squeeze=False)
    ax = axes[0, 0]
    bx = axes[0, 1] if n == 2 else None
    drawn = False
    for prec, color in COLORS.items():
        sel = ok[ok["rounding"] == prec]
        if not len(sel):
            continue
        q = extra_values(sel, "spent_per_dof").astype(float).to_numpy()
        per = extra_values(sel, "err_W_heads", []).to_list()
        xs = np.concatenate([[qi] * len(p) for qi, p in zip(q, per, strict=True)])
        ys = np.concatenate([np.asarray(p, dtype=float) for p in per])
        ax.scatter(xs, np.maximum(ys, LOW), s=10, color=color, label=f"$W_h$, {prec}")
        func = np.maximum(sel["func_err"].astype(float), LOW)
        if bx is None:
            ax.scatter(q, func, s=40, marker="*", color=color,
                       label=f"layer {int(layers[0])}: function, {prec}")
        else:
            bx.scatter(sel["layer"].astype(int), func, s=14, color=color, label=prec)
        drawn = True
    for a in axes.flat:
        a.axhline(GOAL, color="k", ls=":", lw=0.8, label=f"goal {GOAL:g}")
    ax.set(yscale="log", xlabel="queries per degree of freedom of the layer",
           ylabel="relative error", title="(a) every head" + (" and the layer" if n == 1 else ""))
    if bx is not None:
        bx.set(yscale="log", xlabel="layer", ylabel="functional relative error",
               title="(b) every layer")
    if drawn:  # no legend on an empty figure (no layer cells in the study)
        # the budget of the goal on the x axis, from 0: where the heads are against it
        ax.axvline(BUDGET, color="k", ls="--", lw=0.8, label=f"budget of the goal ({BUDGET:g})")
        ax.set_xlim(0, 1.1 * max(BUDGET, float(np.nanmax(extra_values(
            ok, "spent_per_dof").astype(float)))))
        ax.legend(fontsize=6, loc="lower left", frameon=True)
        if bx is not None:
            bx.set_xticks(layers)
            bx.set_xlim(layers.min() - 0.75, layers.max() + 0.75)
            bx.legend(fontsize=7, loc="lower right", frameon=True)
    return fig, claims
