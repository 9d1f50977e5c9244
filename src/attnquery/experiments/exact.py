"""Experiment "exact": Theorem 4.1's learner over d, probe design, head scale and seeds.

Claim checked: the queries counted by the oracle grow as d^2 (fitted log-log exponent in
[1.95, 2.05]) and every head is recovered to relative error <= 1e-10.

A plug-in learner of one head from value queries joins it through the section's ``learners``
(:data:`TAKES`): it runs on the exact learner's heads (every probe design's cells are one
cell of its own), judged by the same tolerance.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..learners import ExactValueQueryLearner
from ..models import random_head
from ..oracles import ValueOracle
from ..theory import EXACT_TOL
from ._core import Experiment, grid, register
from ._costs import exact_learner_seconds
from ._learners import Takes
from ._recipe import fit_and_measure

#: the learners "exact" runs: Theorem 4.1's, and plug-ins of one head from value queries
TAKES = Takes("exact", oracles=("value",), returns=("head",), own=("exact",))


def cells(cfg) -> list[dict]:
    out = []
    for g in grid(
        d=cfg["d"],
        probes=cfg["probes"],
        W_spectral=cfg["W_spectral"],
        zero_frac=cfg["zero_frac"],
        seed=list(range(cfg["seeds"])),
    ):
        out.append({"learner": "exact", **g})
    return TAKES.join(out, cfg["learners"], "exact", drop=("probes",))


def run(cell: dict, rng: np.random.Generator) -> dict:
    model_rng, learner_rng, eval_rng = rng.spawn(3)
    d = cell["d"]
    head = random_head(d, model_rng, W_spectral=cell["W_spectral"], zero_frac=cell["zero_frac"])
    oracle = ValueOracle(head, d)
    est = (TAKES.make(cell, learner_rng) if TAKES.is_joined(cell) else
           ExactValueQueryLearner(probes=cell["probes"], random_state=learner_rng))
    m = fit_and_measure(est, oracle, head, d, eval_rng, n_eval=64)
    m["success"] = bool(m["rel_err_W"] <= EXACT_TOL and m["rel_err_v"] <= EXACT_TOL)
    return m


def seconds(cell) -> float:
    """Estimated seconds of a cell (:func:`~attnquery.experiments._costs.exact_learner_seconds`).
    """
    return exact_learner_seconds(cell["d"])


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {}


EXPERIMENT = register(
    Experiment(
        name="exact",
        cells=cells,
        run=run,
        params=PARAMS,
        metrics=METRICS,
        description="Exact recovery from d^2 + d value queries (Theorem 4.1)",
        seconds=seconds,
    )
)
