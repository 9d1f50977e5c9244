"""Experiment "rotary" (beyond the paper): rotary heads (RoPE) from value queries.

:class:`~attnquery.learners.RotaryValueQueryLearner` on random rotary heads
(:func:`~attnquery.models.random_rotary_head`) over d, the head dimension (a fraction of d),
the rope base and the route (``dense``: ``2 (d^2 + d)`` queries; ``lowrank``: the sketch route
with ``rank`` = the head dimension). Each cell records the queries counted by the oracle, the
largest frequency error, the relative error of ``M_{-1}`` and ``M_{-4095}``, and the functional
error on held-out sequences of 1 to 4,096 tokens (``extra``: per length). Claims
(:mod:`attnquery.figures.rotary`): the dense count is exactly ``2 (d^2 + d)`` (fitted exponent
2), frequencies within 1e-12, functional error <= 1e-9 on every length (dense) and every run
passes its own check.
"""

from __future__ import annotations

import json

import numpy as np

from ..learners import RotaryValueQueryLearner
from ..metrics import fit_counted, relative_error
from ..models import random_rotary_head
from ..oracles import ValueOracle
from . import Experiment, grid, register

#: sequence lengths of the functional error, and how many held-out sequences of each
LENGTHS = (1, 16, 256, 4096)
N_SEQUENCES = {1: 64, 16: 64, 256: 16, 4096: 4}


def head_dim_of(d: int, fraction: float) -> int:
    """The head dimension of a cell: ``fraction * d`` rounded down to an even number (>= 2)."""
    return max(2, int(fraction * d) // 2 * 2)


def cells(cfg) -> list[dict]:
    out = []
    for g in grid(d=cfg["d"], head_fraction=cfg["head_fraction"],
                  rope_base=cfg["rope_base"], variant=cfg["routes"],
                  seed=list(range(cfg["seeds"]))):
        dh = head_dim_of(g["d"], g.pop("head_fraction"))
        if g["variant"] == "lowrank" and dh > g["d"] // 2:
            continue  # the sketch route is for heads of low rank
        out.append({"learner": "rotary", "rank": dh, **g})
    return out


def run(cell: dict, rng: np.random.Generator) -> dict:
    model_rng, learner_rng, eval_rng = rng.spawn(3)
    d, dh = cell["d"], cell["rank"]
    head = random_rotary_head(d, model_rng, head_dim=dh, rope_base=cell["rope_base"])
    oracle = ValueOracle(head, d)
    est = RotaryValueQueryLearner(rank=dh if cell["variant"] == "lowrank" else None,
                                  random_state=learner_rng)
    m = fit_counted(est, oracle)
    freq_err = (float(np.max(np.abs(est.frequencies_ - head.frequencies)))
                if est.frequencies_.size == head.frequencies.size else float("inf"))
    by_length = {}
    for N in LENGTHS:
        X = eval_rng.standard_normal((N_SEQUENCES[N], N, d)) / np.sqrt(d)
        y = head(X)
        by_length[str(N)] = float(np.max(np.abs(est.predict(X) - y)) / np.max(np.abs(y)))
    m["rel_err_W"] = relative_error(est.M(-1), head.M(-1))
    m["func_err"] = max(by_length.values())
    m["rank_found"] = int(est.rank_)
    m["success"] = bool(freq_err <= 1e-12 and m["func_err"] <= 1e-9)
    m["extra"] = json.dumps({
        "freq_err": freq_err, "func_err_by_length": by_length,
        "rel_err_M_4095": relative_error(est.M(-4095), head.M(-4095)),
        "rotary_dim": int(est.rotary_dim_), "condition": float(est.condition_),
        "check_rtol": float(est.check_rtol_)}, sort_keys=True)
    return m


def seconds(cell) -> float:
    """About 0.2 s at d = 32 and 5 s at d = 128 (dense, 2-core machine); the low-rank route at
    d = 1024, d_h = 128 takes 49 s of CPU (benchmark ``rotary``)."""
    d = cell["d"]
    if cell["variant"] == "lowrank":
        return 1.0 + 50.0 * (d / 1024) ** 2 * (cell["rank"] / 128)
    return 0.2 + 5.0 * (d / 128) ** 3


EXPERIMENT = register(
    Experiment(
        name="rotary",
        cells=cells,
        run=run,
        description="Rotary heads (RoPE) from 2 (d^2 + d) value queries (beyond the paper)",
        seconds=seconds,
    )
)
