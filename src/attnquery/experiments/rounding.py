"""Experiment "rounding": output rounding as a defence (beyond the paper, after Sec. 6).

The heads of Theorem 6.1 (:func:`attnquery.models.theorem_head`, of rank ``rank``) behind a
:class:`~attnquery.oracles.RoundingOracle` (2..12 significant digits, float16, bfloat16),
attacked by the exact, the noisy and the low-rank sketch learner, and by the low-precision
learner at several budgets (``queries_per_unknown`` times ``d^2 + d`` queries).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from ..learners import (
    ExactValueQueryLearner,
    LowPrecisionValueQueryLearner,
    NoisyValueQueryLearner,
    SketchLowRankLearner,
)
from ..models import theorem_head
from ..oracles import RoundingOracle
from ..theory import USEFUL_REL_ERR, budget_queries
from ._core import Experiment, grid, register
from ._learners import Takes
from ._recipe import fit_and_measure

__all__ = ["LEARNERS", "TAKES", "BUDGET_AXES", "cells", "run", "seconds"]

#: the learners of this experiment, by name: a factory (cell, d, rng) -> estimator
LEARNERS = {
    "exact": lambda cell, d, rng: ExactValueQueryLearner(probes="basis", random_state=rng),
    # rounding error is relative, not a fixed tau: no assumption check
    "noisy": lambda cell, d, rng: NoisyValueQueryLearner(
        W_bound=cell["W_bound"], mu=cell["mu"], strict=False, random_state=rng),
    "lowrank": lambda cell, d, rng: SketchLowRankLearner(rank=cell["rank"], random_state=rng),
    "lowprecision": lambda cell, d, rng: LowPrecisionValueQueryLearner(
        n_queries=budget_queries(cell["queries_per_unknown"], d), random_state=rng),
}

#: the learners "rounding" runs: its own, and plug-ins of one head from value or approximate
#: value queries (a rounding oracle answers as either)
TAKES = Takes("rounding", oracles=("value", "approximate value"), returns=("head",),
              own=tuple(LEARNERS), gives=("W_bound", "mu"),
              box="(a value oracle rounding its answers)")

#: learners run at several budgets: name -> the config key of their budgets (queries per unknown)
BUDGET_AXES = {"lowprecision": "lowprecision_queries_per_unknown"}


def cells(cfg) -> list[dict]:
    """Cells: learner x rounding (digits, formats) x d x seed, and for the learners of
    :data:`BUDGET_AXES` x their budgets."""
    specs = [f"digits={k}" for k in cfg["digits"]] + list(cfg["dtypes"])
    bad = [d for d in cfg["d"] if 2 * int(cfg["rank"]) > d]
    if "lowrank" in cfg["learners"] and bad:
        raise ConfigError(
            f"experiments.rounding.rank: {cfg['rank']} must be <= d / 2 for the low-rank learner; "
            f"d = {bad} is too small"
        )
    out = []
    for g in grid(
        learner=TAKES.check(cfg["learners"]),
        rounding=specs,
        d=cfg["d"],
        seed=list(range(cfg["seeds"])),
    ):
        cell = {**g, "rank": int(cfg["rank"]), "mu": float(cfg["mu"]),
                "W_bound": float(cfg["W_bound"])}
        if g["learner"] not in BUDGET_AXES:
            out.append(cell)
            continue
        for q in cfg[BUDGET_AXES[g["learner"]]]:
            out.append({**cell, "queries_per_unknown": float(q)})
    return out


def run(cell: dict, rng: np.random.Generator) -> dict:
    """Run one cell: a rank-``rank`` head behind a rounding oracle, one learner."""
    model_rng, learner_rng = rng.spawn(2)
    d, Wb, mu = cell["d"], cell["W_bound"], cell["mu"]
    head = theorem_head(d, model_rng, Wb, mu, zero_frac=0.0, rank=cell["rank"])
    oracle = RoundingOracle.from_spec(head, d, cell["rounding"])
    extra = {"effective_digits": oracle.effective_digits, "relative_tau": oracle.relative_tau}
    learner = cell["learner"]
    est = (TAKES.make(cell, learner_rng, W_bound=cell["W_bound"], mu=cell["mu"])
           if TAKES.is_joined(cell) else
           LEARNERS[learner](cell, d, learner_rng))
    # rounded answers are not float64 answers: the learners' checks refuse most estimates
    # (verified = False), and the row keeps their errors, which the defence is judged by
    m = fit_and_measure(est, oracle, head, d, record_refusal=True, finite_as=learner)
    if isinstance(est, LowPrecisionValueQueryLearner):
        extra.update(W_error_estimate=est.W_error_estimate_, noise_level=est.noise_level_,
                     n_passes=est.n_passes_)
    m["success"] = bool(m["rel_err_W"] <= USEFUL_REL_ERR)
    m["extra"] = extra
    return m


# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests), from
# the wall times of the default study on a 2-core machine shared with other work, extrapolated
# with the benchmarks (README) to the sizes of config/paper.yaml.
def seconds(cell) -> float:
    """2-3 ms per cell at d <= 16 (default study), d^2; the low-precision learner costs
    1.2e-8 s per query and dimension (as in the lowprecision experiment)."""
    d = cell["d"]
    q = cell.get("queries_per_unknown") or 0.0
    return 0.003 + 2e-5 * d**2 + 1.2e-8 * q * (d * d + d) * d


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {}


EXPERIMENT = register(Experiment(
    name="rounding", cells=cells, run=run, params=PARAMS, metrics=METRICS,
    description="Output rounding as a defence (error against digits kept)",
    seconds=seconds,
))
