"""Experiment "membership": recovery from sign-only answers (paper Appendix B).

Two grids:

* ``variant="count"``: the bisection learner over d, eps and seeds: queries counted by the
  oracle against ``log2(1/eps)`` and d, and ``||W_hat - W||_F`` against eps.
* ``variant="v_compare"``: the v stage by sphere sampling (the paper, learner ``mq_sampling``)
  against bisection (``mq_bisection``), both
  asked for ``||v_hat - v/||v|| ||_inf <= eps``. A sampling cell whose stated sample size
  exceeds :data:`SAMPLE_BUDGET` is not run: its count is computed from the sample-size formula
  and the row says so (``queries_computed``), with no errors. The sampling rows keep their
  errors in ``extra`` (the error columns are null for every sampling row).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from ..learners import MembershipLearner
from ..models import membership_head
from ..oracles import MembershipOracle
from ..theory import membership_target
from ._core import Experiment, grid, register
from ._learners import Takes
from ._recipe import fit_and_measure

__all__ = ["LEARNERS", "SAMPLE_BUDGET", "cells", "run", "seconds"]

#: largest sphere sample a cell runs (larger ones are computed, not run)
SAMPLE_BUDGET = 2_000_000


def _membership_learner(v_method: str):
    def factory(cell, d, rng) -> MembershipLearner:
        eps = cell["eps"]
        return MembershipLearner(
            eps=eps, v_method=v_method, W_bound=cell["W_bound"], mu=cell["mu"],
            random_state=rng, eps_v=eps if cell["variant"] == "v_compare" else None)
    return factory


#: the learners of this experiment, by name: a factory (cell, d, rng) -> estimator (the v stage
#: by bisection, or by sphere sampling as in the paper)
LEARNERS = {
    "mq_bisection": _membership_learner("bisection"),
    "mq_sampling": _membership_learner("sampling"),
}


#: the learners "membership" runs: its own, and plug-ins of one head from membership queries on
#: the count grid's heads (given the cell's eps, W_bound and mu where they take them)
TAKES = Takes("membership", oracles=("membership",), returns=("head",), own=tuple(LEARNERS),
              gives=("eps", "W_bound", "mu"))


def cells(cfg) -> list[dict]:
    """Cells of "membership": the count grid and the v-comparison grid."""
    out = []
    for g in grid(d=cfg["d"], eps=cfg["eps"], seed=list(range(cfg["seeds"]))):
        out.append({"learner": "mq_bisection", "v_method": "bisection", **g,
                    "W_bound": float(cfg["W_bound"]), "mu": float(cfg["mu"]),
                    "variant": "count"})
    cmp_cfg = cfg.get("compare")
    if cmp_cfg:
        for g in grid(v_method=["sampling", "bisection"], d=cmp_cfg["d"], eps=cmp_cfg["eps"],
                      seed=list(range(cmp_cfg.get("seeds", cfg["seeds"])))):
            out.append({"learner": f"mq_{g['v_method']}", **g, "W_bound": float(cfg["W_bound"]),
                        "mu": float(cfg["mu"]), "variant": "v_compare"})
    return TAKES.join(out, cfg["learners"], "mq_bisection", drop=("v_method",),
                      where=lambda c: c["variant"] == "count")


def run(cell: dict, rng: np.random.Generator) -> dict:
    """Run one "membership" cell (or compute its count when the sample is too large to run)."""
    model_rng, learner_rng = rng.spawn(2)
    d, eps, Wb, mu = cell["d"], cell["eps"], cell["W_bound"], cell["mu"]
    head = membership_head(d, model_rng, Wb, mu)
    compare = cell["variant"] == "v_compare"
    if TAKES.is_joined(cell):  # a plug-in: its errors as the bisection learner's
        est = TAKES.make(cell, learner_rng, eps=eps, W_bound=Wb, mu=mu)
        m = fit_and_measure(est, MembershipOracle(head, d), head, measure=_measure)
        m["extra"] = {"err_v_inf": m.pop("err_v_inf"),
                      "target_queries": membership_target(d, eps, Wb)}
        return {**m, "queries_computed": False, "success": bool(m["abs_err_W"] <= eps)}
    learner = LEARNERS[cell["learner"]](cell, d, learner_rng)
    plan = learner.planned_queries(d)
    target = membership_target(d, eps, Wb)
    extra = {"target_queries": target, "planned_v": plan["v"], "planned_W": plan["W"]}
    if cell["v_method"] == "sampling" and plan["v"] > SAMPLE_BUDGET:
        return {
            "n_queries": plan["total"], "n_queries_v": plan["v"], "n_queries_W": plan["W"],
            "queries_computed": True, "extra": extra,
        }
    oracle = MembershipOracle(head, d)
    m = fit_and_measure(learner, oracle, head, measure=_measure)
    errs = {k: m.pop(k) for k in ("abs_err_W", "rel_err_W", "err_v", "rel_err_v")}
    err_v_inf = m.pop("err_v_inf")
    extra["err_v_inf"] = err_v_inf
    extra["n_beyond_bound"] = learner.n_beyond_bound_
    extra["n_extra_queries"] = learner.n_extra_queries_
    m.update({
        "n_queries_v": learner.n_queries_v_,
        "n_queries_W": learner.n_queries_W_,
        "queries_computed": False,
        "extra": extra,
    })
    errs["success"] = bool(errs["abs_err_W"] <= eps and (not compare or err_v_inf <= eps))
    if cell["v_method"] == "sampling":
        # sampling rows whose count is computed have no errors: keep the run ones' in extra so
        # the error columns mean the same thing (present in every row) for each learner
        extra.update(errs)
    else:
        m.update(errs)
    return m


def _measure(est, head) -> dict:
    """The errors of W, and of v against the unit vector the membership learners recover (v is
    learnt up to its scale): Euclidean (``err_v``, equal to ``rel_err_v``) and largest entry
    (``err_v_inf``)."""
    v_unit = head.v / np.linalg.norm(head.v)
    abs_W = float(np.linalg.norm(est.W_ - head.W))
    err_v = float(np.linalg.norm(est.v_ - v_unit))
    return {"abs_err_W": abs_W, "rel_err_W": abs_W / float(np.linalg.norm(head.W)),
            "err_v": err_v, "rel_err_v": err_v,
            "err_v_inf": float(np.max(np.abs(est.v_ - v_unit)))}


# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests), from
# the wall times of the default study on a 2-core machine shared with other work, extrapolated
# with the benchmarks (README) to the sizes of config/paper.yaml.
def seconds(cell) -> float:
    """Bisection: 0.05 s at d = 32 (default study), d^2 log2(1/eps); sampling (up to 2e6
    queries): 0.65 s at most."""
    if cell["learner"] == "mq_sampling":
        return 1.0  # a joined learner: as the bisection learner (not measured)
    return 0.01 + 4e-6 * cell["d"] ** 2 * max(1.0, math.log2(1.0 / cell["eps"]))


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {
    "v_method": pa.string(),
}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {
    "n_queries_v": pa.int64(),
    "n_queries_W": pa.int64(),
    "queries_computed": pa.bool_(),
}


EXPERIMENT = register(Experiment(
    name="membership", cells=cells, run=run, params=PARAMS, metrics=METRICS,
    description="Recovery from membership queries (Appendix B): queries against eps and d",
    seconds=seconds,
))
