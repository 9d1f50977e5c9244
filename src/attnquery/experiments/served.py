"""Experiment "served": single heads with their biases extracted from served answers.

Beyond the paper. Each cell serves one head of a pretrained checkpoint (with every bias, the
other heads removed, read out along r) as an engine computes it
(:class:`attnquery.realheads.ModuleBlackBox` with ``precision``: weights, inputs and every
operation rounded to float32, float16 or bfloat16; :mod:`attnquery.precision`), and runs
:class:`~attnquery.learners.LowPrecisionValueQueryLearner` with ``fit_bias=True`` and a budget of
``queries_per_unknown (d^2 + 2d + 1)`` queries. Errors are against the checkpoint's own float64
weights; ``extra.floor_W`` is the error of W from the weights rounded to the format (what no
learner can pass when scored against the checkpoint) and ``extra.floor_ratio`` the error over
it. ``success`` is the issue's goal for the format: float32 W within ``FLOAT32_GOAL``, float16
within 2x its floor, bfloat16 within 1.5x, with no answer overflowing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from ..metrics import relative_error
from ..oracles import ValueOracle
from ..precision import PRECISIONS, Arithmetic
from ..realheads import ModuleBlackBox, cached_checkpoint, head_from_checkpoint
from ._core import Experiment, checkpoint_source, grid, readout_args, register
from ._learners import Takes
from ._recipe import fit_and_measure, layer_measure, relative_bias_measure

__all__ = ["cells", "run", "floor_W", "floor_cv", "GOALS", "FLOAT32_GOAL", "layer_cells",
           "run_layer", "LAYER_GOAL", "LAYER_BUDGET"]

#: float32-served W: relative error at most this (the floor is 0 for float32 weights)
FLOAT32_GOAL = 3e-7
#: precision -> largest error of W over its floor (float32: absolute, FLOAT32_GOAL)
GOALS = {"float32": FLOAT32_GOAL, "float16": 2.0, "bfloat16": 1.5}


#: the learners "served" runs: its own, and plug-ins that learn one head with its biases
#: (``fits_bias``) from value or approximate value queries, on the same served heads (with their
#: own budget; given ``fit_bias=True``)
TAKES = Takes("served", oracles=("value", "approximate value"), returns=("head",),
              own=("lowprecision", "layer"), gives=("fit_bias",),
              box="(a head served in float32, float16 or bfloat16)")


def cells(cfg) -> list[dict]:
    """Cells: precision x budget x layer x head x seed."""
    precisions = cfg["precisions"]
    if not isinstance(precisions, list) or not precisions or any(
            p not in PRECISIONS[1:] for p in precisions):
        raise ConfigError(f"experiments.served.precisions must be a non-empty list of "
                          f"{PRECISIONS[1:]}; got {precisions!r}")
    bad = [h for h in cfg["heads"] if not 0 <= h < int(cfg["n_heads"])]
    if bad:
        raise ConfigError(f"experiments.served.heads: {bad} are outside "
                          f"[0, n_heads={cfg['n_heads']})")
    readout = f"{cfg['readout']}:{cfg['readout_seed']}"
    budgets = cfg["queries_per_unknown"]
    out = []
    for g in grid(rounding=precisions, layer=cfg["layers"], head=cfg["heads"],
                  seed=list(range(cfg["seeds"]))):
        q = budgets.get(g["rounding"]) if isinstance(budgets, dict) else budgets
        if not q:
            raise ConfigError(f"experiments.served.queries_per_unknown has no budget for "
                              f"{g['rounding']}")
        for b in q:
            out.append({"learner": "lowprecision", "family": "real", "biases": True,
                        "checkpoint": cfg["checkpoint"], "n_heads": int(cfg["n_heads"]),
                        "readout": readout, **g, "queries_per_unknown": float(b)})
    out = TAKES.join(out, cfg["learners"], "lowprecision",
                     drop=("queries_per_unknown",))
    return out + layer_cells(cfg)


def _head_rows(path, layer: int, head: int, n_heads: int, precision: str):
    """The layer's tensors, head ``head``'s rows of them, and the rounding to ``precision``
    (as float64 arrays) that the floors below compare against the weights as stored."""
    ck = cached_checkpoint(path, n_heads)
    A = Arithmetic(precision)

    def st(a):
        return np.asarray(A.store(a), dtype=float)

    return ck, ck.layers[layer], slice(head * ck.d_head, (head + 1) * ck.d_head), st


def floor_W(path, layer: int, head: int, n_heads: int, precision: str) -> float:
    """Relative error of head ``head``'s W built from the checkpoint's query and key weights
    rounded to ``precision``, against W from the weights as stored."""
    _, w, rows, st = _head_rows(path, layer, head, n_heads, precision)
    W = w["k"][rows].T @ w["q"][rows]
    return relative_error(st(w["k"][rows]).T @ st(w["q"][rows]), W)


def floor_cv(path, layer: int, head: int, n_heads: int, precision: str, r) -> tuple:
    """Relative errors of head ``head``'s key bias ``c = W_K^T b_Q / sqrt(d_h)`` and value
    vector ``v = W_V^T (W_O^T r)_h`` built from the checkpoint's weights, biases and readout
    vector ``r`` rounded to ``precision``, against those built from the weights as stored: the
    floors of c and v, as :func:`floor_W` is W's."""
    ck, w, rows, st = _head_rows(path, layer, head, n_heads, precision)
    bq = w["bq"] if w["bq"] is not None else np.zeros(ck.d)
    c = w["k"][rows].T @ bq[rows]
    c_r = st(w["k"][rows]).T @ st(bq)[rows]
    v = w["v"][rows].T @ (w["o"].T @ r)[rows]
    v_r = st(w["v"][rows]).T @ (st(w["o"]).T @ st(r))[rows]
    return relative_error(c_r, c), relative_error(v_r, v)


def run(cell: dict, rng: np.random.Generator) -> dict:
    """One head served in one precision, one budget (a whole layer: :func:`run_layer`)."""
    from ..learners import LowPrecisionValueQueryLearner

    if cell.get("variant") == "layer":
        return run_layer(cell, rng)

    learner_rng, eval_rng = rng.spawn(2)
    prec = cell["rounding"]
    args = dict(n_heads=cell["n_heads"], **readout_args(cell))
    head = head_from_checkpoint(cell["checkpoint"], cell["layer"], cell["head"], biases=True,
                                **args)
    box = ModuleBlackBox(cell["checkpoint"], cell["layer"], cell["head"], precision=prec, **args)
    d = head.d
    unit = d * d + 2 * d + 1
    oracle = ValueOracle(box, d)
    joined = TAKES.is_joined(cell)
    if joined:  # a plug-in with its own budget; its refusal recorded
        est = TAKES.make(cell, learner_rng, fit_bias=True)
    else:
        n = int(round(cell["queries_per_unknown"] * unit))
        est = LowPrecisionValueQueryLearner(n_queries=n, fit_bias=True,
                                            random_state=learner_rng)
    m = fit_and_measure(est, oracle, head, d, eval_rng, n_eval=32, measure=relative_bias_measure,
                        record_refusal=joined)
    eW = m["rel_err_W"]
    floor = floor_W(cell["checkpoint"], cell["layer"], cell["head"], cell["n_heads"], prec)
    if joined:
        goal = GOALS[prec] if prec == "float32" else GOALS[prec] * floor
        return {**m, "success": bool(eW <= goal), "extra": {
            "d": d, "floor_W": floor, "floor_ratio": eW / floor if floor > 0 else None,
            "goal_W": goal, "spent_per_unknown": oracle.n_queries / unit}}
    floor_c, floor_v = floor_cv(cell["checkpoint"], cell["layer"], cell["head"],
                                cell["n_heads"], prec, box.r)
    goal = GOALS[prec] if prec == "float32" else GOALS[prec] * floor
    m.update({
        "rank_found": int(est.rank_),
        "success": bool(eW <= goal and est.n_overflow_ == 0),
        "extra": {
            "d": d, "floor_W": floor, "floor_ratio": eW / floor if floor > 0 else None,
            "floor_c": floor_c, "floor_v": floor_v,
            "goal_W": goal, "spent_per_unknown": oracle.n_queries / unit,
            "n_overflow": est.n_overflow_, "W_error_estimate": est.W_error_estimate_,
            "noise_level": est.noise_level_, "n_passes": est.n_passes_,
            "verify_error": est.verify_error_, "sketch": bool(est.sketch_),
            "query_bias_cancelled": bool(est.query_bias_cancelled_),
        },
    })
    return m


# -- whole layers (AttentionLayerLearner(route="served", n_queries=...)) --------------------------
#: the issue's goal for a float32-served layer: every head's W and the function within this
LAYER_GOAL = 1e-5
#: ... at most this many times the layer's degrees of freedom (layer_dof) in queries
LAYER_BUDGET = 4.0


def layer_cells(cfg) -> list[dict]:
    """Whole-layer cells (``variant`` "layer", ``head`` None): precision x budget (in units of
    the layer's degrees of freedom, ``layer_budgets``) x layer x seed."""
    budgets = cfg["layer_budgets"]
    readout = f"{cfg['readout']}:{cfg['readout_seed']}"
    out = []
    for prec in PRECISIONS[1:]:
        for b in budgets.get(prec) or []:
            for g in grid(layer=cfg["layers"], seed=list(range(cfg["seeds"]))):
                out.append({"learner": "layer", "variant": "layer", "family": "real",
                            "biases": True, "checkpoint": cfg["checkpoint"],
                            "n_heads": int(cfg["n_heads"]), "readout": readout,
                            "rounding": prec, **g, "queries_per_unknown": float(b)})
    return out


def run_layer(cell: dict, rng: np.random.Generator) -> dict:
    """One whole layer served in one precision, with a budget of ``queries_per_unknown``
    times its degrees of freedom. Per-head errors (matched up to a permutation) go to
    ``extra``; ``rel_err_W``, ``rel_err_v``, ``rel_err_c`` are the largest over the heads."""
    from ..learners import AttentionLayerLearner
    from ..learners.multihead_generic import layer_dof
    from ..realheads import layer_from_checkpoint

    learner_rng, eval_rng = rng.spawn(2)
    prec = cell["rounding"]
    args = dict(n_heads=cell["n_heads"], **readout_args(cell))
    truth = layer_from_checkpoint(cell["checkpoint"], cell["layer"], biases=True, **args)
    box = ModuleBlackBox(cell["checkpoint"], cell["layer"], precision=prec, **args)
    d, H = truth.heads[0].d, truth.n_heads
    dof = layer_dof(d, H, d // H)
    oracle = ValueOracle(box, d)
    est = AttentionLayerLearner(n_heads=H, route="served",
                                n_queries=int(round(cell["queries_per_unknown"] * dof)),
                                random_state=learner_rng)
    m = fit_and_measure(est, oracle, truth, d, eval_rng, n_eval=32, measure=layer_measure)
    per = {k: m.pop(f"err_{k}_heads") for k in ("W", "v", "c")}
    m.update({
        "n_heads_found": int(est.n_heads_),
        "rel_err_offset": relative_error(est.offset_, truth.total_offset),
        "success": bool(m["rel_err_W"] <= LAYER_GOAL and m["func_err"] <= LAYER_GOAL
                        and oracle.n_queries <= LAYER_BUDGET * dof),
        "extra": {"d": d, "dof": dof, "spent_per_dof": oracle.n_queries / dof,
                  "err_W_heads": per["W"], "err_v_heads": per["v"], "err_c_heads": per["c"],
                  "noise_level": est.noise_level_, "n_passes": est.n_passes_,
                  "verify_error": est.verify_error_},
    })
    return m


# Estimated seconds per cell on one core: a MiniLM head (d = 384) took 4 to 6 s at
# 3 (d^2 + 2d + 1) queries in float32 and about 20 s at 10 (d^2 + 2d + 1) in bfloat16 (one core
# of a loaded 2-core machine; 10 and 34 s before the served box's batched contractions).
def seconds(cell) -> float:
    """About 5e-8 s per query and dimension in float32, 6e-8 in float16 and bfloat16 (whole
    layers: :func:`layer_seconds`)."""
    if cell.get("variant") == "layer":
        return layer_seconds(cell)
    d = 384 if "minilm" in str(cell["checkpoint"]) else 32
    per = 5e-8 if cell["rounding"] == "float32" else 6e-8
    # a joined learner: as at one query per unknown (not measured)
    return 1.0 + per * cell.get("queries_per_unknown", 1.0) * (d * d + 2 * d + 1) * d



def layer_seconds(cell) -> float:
    """A whole layer: about 2 s on the synthetic checkpoint, LAYER_SECONDS on MiniLM."""
    return LAYER_SECONDS if "minilm" in str(cell["checkpoint"]) else 2.0


#: seconds of one MiniLM layer at 4 layer_dof in float32 (61 to 66 s of CPU measured, 270 to
#: 540 s of wall time on a 2-core machine at load 20, docs/notes/2026-11-27-served.md;
#: 264 to 671 s before the
#: scan's gradient pairs were capped at 4)
LAYER_SECONDS = 150.0


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {}


EXPERIMENT = register(Experiment(
    name="served", cells=cells, run=run, params=PARAMS, metrics=METRICS,
    description="Single heads with their biases extracted from answers served in float32, "
    "float16 and bfloat16 arithmetic (error of W against queries per unknown and the format's "
    "floor)",
    seconds=seconds,
    data=checkpoint_source,
))
