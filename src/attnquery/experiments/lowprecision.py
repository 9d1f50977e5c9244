"""Experiment "lowprecision": extraction from answers rounded to low precision (beyond the paper).

Each cell puts a head behind a :class:`~attnquery.oracles.RoundingOracle` at one precision
(``float64`` answers as they are, ``float32``, ``float16``, ``bfloat16`` or ``digits=k``) and runs
:class:`~attnquery.learners.LowPrecisionValueQueryLearner` with a budget of
``queries_per_unknown (d^2 + d)`` queries. Heads are random dense heads (``family="random"``,
:func:`~attnquery.models.random_head`: W with entries N(0, 1/d)) or heads of a pretrained
checkpoint (``family="real"``, built as :mod:`attnquery.realheads` does; d = 384 for
all-MiniLM-L6-v2). Every cell records the errors, the queries the oracle counted, and in
``extra`` the learner's own estimates (``W_error_estimate``, ``noise_level``), the precision's
largest relative error and the queries per unknown actually spent.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from ..learners import LowPrecisionValueQueryLearner
from ..models import AttentionHead, random_head
from ..oracles import RoundingOracle
from ..realheads import head_from_checkpoint
from ..theory import LOWPRECISION_TARGET as TARGET_REL_ERR
from ..theory import budget_queries, parse_rounding, precision_digits, precision_relative_tau
from ._core import Experiment, checkpoint_source, grid, readout_args, register
from ._learners import Takes
from ._recipe import fit_and_measure

__all__ = ["LEARNERS", "cells", "run", "seconds"]

#: the learners of this experiment, by name: a factory (cell, d, rng) -> estimator (the
#: low-precision learner with a budget of ``queries_per_unknown (d^2 + d)`` queries)
LEARNERS = {
    "lowprecision": lambda cell, d, rng: LowPrecisionValueQueryLearner(
        n_queries=budget_queries(cell["queries_per_unknown"], d), random_state=rng),
}


#: the learners "lowprecision" runs: its own at each budget, and plug-ins of one head from value
#: or approximate value queries on the same heads and precisions (with their own budget)
TAKES = Takes("lowprecision", oracles=("value", "approximate value"), returns=("head",),
              own=tuple(LEARNERS), box="(a value oracle rounding to a float format)")


def _check_specs(specs, where):
    if not isinstance(specs, list) or not specs:
        raise ConfigError(f"{where}: precisions must be a non-empty list")
    for s in specs:
        try:
            parse_rounding(s)
        except Exception:
            raise ConfigError(f"{where}: unknown precision {s!r} (float64, float32, float16, "
                              "bfloat16 or digits=k)") from None


def cells(cfg) -> list[dict]:
    """Cells: random heads (precision x budget x d x seed) and real heads (precision x budget x
    layer x head x seed)."""
    out = []
    specs, budgets = cfg["precisions"], cfg["queries_per_unknown"]
    _check_specs(specs, "experiments.lowprecision")
    seeds = list(range(cfg["seeds"]))
    rnd = cfg.get("random")
    if rnd:
        for g in grid(rounding=specs, queries_per_unknown=budgets, d=rnd["d"], seed=seeds):
            out.append({"learner": "lowprecision", "family": "random", **g,
                        "queries_per_unknown": float(g["queries_per_unknown"])})
    real = cfg.get("real")
    if real:
        r_specs = real.get("precisions", specs)
        _check_specs(r_specs, "experiments.lowprecision.real")
        readout = f"{real['readout']}:{real['readout_seed']}"
        bad = [h for h in real["heads"] if not 0 <= h < int(real["n_heads"])]
        if bad:
            raise ConfigError(f"experiments.lowprecision.real.heads: {bad} are outside "
                              f"[0, n_heads={real['n_heads']})")
        for g in grid(rounding=r_specs,
                      queries_per_unknown=real.get("queries_per_unknown", budgets),
                      layer=real["layers"], head=real["heads"],
                      seed=list(range(real["seeds"]))):
            out.append({"learner": "lowprecision", "family": "real",
                        "checkpoint": real["checkpoint"], "n_heads": int(real["n_heads"]),
                        "readout": readout, **g,
                        "queries_per_unknown": float(g["queries_per_unknown"])})
    if not out:
        raise ConfigError("experiments.lowprecision: give random and/or real heads")
    return TAKES.join(out, cfg["learners"], "lowprecision",
                      drop=("queries_per_unknown",))


def _head(cell, rng) -> AttentionHead:
    if cell["family"] == "random":
        return random_head(int(cell["d"]), rng)
    return head_from_checkpoint(cell["checkpoint"], cell["layer"], cell["head"],
                                n_heads=cell["n_heads"], **readout_args(cell))


def run(cell: dict, rng: np.random.Generator) -> dict:
    """One head behind one rounding oracle, one budget."""
    model_rng, learner_rng, eval_rng = rng.spawn(3)
    head = _head(cell, model_rng)
    d = head.d
    oracle = RoundingOracle.from_spec(head, d, cell["rounding"])
    extra = {"d": d, "relative_tau": precision_relative_tau(cell["rounding"]),
             "effective_digits": precision_digits(cell["rounding"])}
    if TAKES.is_joined(cell):  # a plug-in: its own budget, its refusal recorded
        m = fit_and_measure(TAKES.make(cell, learner_rng), oracle, head, d, eval_rng,
                            n_eval=32, record_refusal=True)
        extra["spent_per_unknown"] = oracle.n_queries / (d * d + d)
        return {**m, "success": bool(m["rel_err_W"] <= TARGET_REL_ERR), "extra": extra}
    est = LEARNERS[cell["learner"]](cell, d, learner_rng)
    m = fit_and_measure(est, oracle, head, d, eval_rng, n_eval=32)
    m["rank_found"] = int(est.rank_)
    m["success"] = bool(m["rel_err_W"] <= TARGET_REL_ERR)
    m["extra"] = {
        "d": d,
        "spent_per_unknown": oracle.n_queries / (d * d + d),
        "relative_tau": precision_relative_tau(cell["rounding"]),
        "effective_digits": precision_digits(cell["rounding"]),
        "W_error_estimate": est.W_error_estimate_,
        "v_error_estimate": est.v_error_estimate_,
        "noise_level": est.noise_level_,
        "residual_ratio": est.residual_ratio_,
        "n_passes": est.n_passes_,
        "n_requeried": est.n_requeried_,
        "verify_error": est.verify_error_,
    }
    return m


def data(cfg) -> dict:
    """The checkpoint of the real heads, if any (:func:`~attnquery.experiments.checkpoint_source`).
    """
    return checkpoint_source(cfg["real"]) if cfg.get("real") else {}


# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests): the
# learner and the simulated head cost O(queries d); 33 s of CPU for a MiniLM head (d = 384) at
# 50 (d^2 + d) queries (benchmark), plus loading the head.
def seconds(cell) -> float:
    """1.2e-8 s per query and dimension, plus 0.5 s for a real head (d = 384); a joined learner
    as at one query per unknown (not measured)."""
    d = cell.get("d") or 384
    extra = 0.5 if cell["family"] == "real" else 0.05
    return extra + 1.2e-8 * cell.get("queries_per_unknown", 1.0) * (d * d + d) * d


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {}


EXPERIMENT = register(Experiment(
    name="lowprecision", cells=cells, run=run, params=PARAMS, metrics=METRICS,
    description="Extraction from float32/float16/bfloat16 answers and a few significant digits "
    "(error of W against queries per unknown)",
    seconds=seconds,
    data=data,
))
