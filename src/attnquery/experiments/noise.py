"""Experiment "noise": learning from approximate answers (paper Sec. 6).

Theorem 6.1's learner (and two baselines: the same learner without clipping, and
Theorem 4.1's exact learner) against :class:`~attnquery.oracles.ApproximateValueOracle` under
uniform and adversarial noise, over tau, mu, W_bound, d and seeds; plus an oversampling grid.
Every cell records Theorem 6.1's guarantee at its tau (``bound_W``, ``bound_v``), the tolerance
the theorem asks for eps_W = eps_v = ``eps`` (``required_tau``) and whether the errors are within
the guarantee (``within_bound``, only where the cell meets the theorem's assumptions; null
elsewhere).

The heads are :func:`attnquery.models.theorem_head`; the rounding experiment
(:mod:`attnquery.experiments.rounding`) puts the same heads behind a rounding API.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import AssumptionViolation, UndefinedEstimate
from ..learners import ExactValueQueryLearner, NoisyValueQueryLearner
from ..models import assumptions_met, theorem_head
from ..oracles import ApproximateValueOracle
from ..outcomes import Refusal
from ..theory import theorem61_guarantee, theorem61_required_tau
from ._core import Experiment, grid, register
from ._learners import Takes
from ._recipe import fit_and_measure, head_measure

__all__ = ["LEARNERS", "TAKES", "REFUSALS", "within", "cells", "run", "seconds"]

#: the learners of this experiment, by name: a factory (cell, d, rng) -> estimator
LEARNERS = {
    # Theorem 6.1's learner, which checks the theorem's assumptions
    "noisy": lambda cell, d, rng: NoisyValueQueryLearner(
        W_bound=cell["W_bound"], mu=cell["mu"], eps_W=cell["eps"], eps_v=cell["eps"],
        oversample=cell["oversample"], random_state=rng, clip=True, strict=True),
    # the same learner without clipping (nor the assumption check)
    "unclipped": lambda cell, d, rng: NoisyValueQueryLearner(
        W_bound=cell["W_bound"], mu=cell["mu"], eps_W=cell["eps"], eps_v=cell["eps"],
        oversample=cell["oversample"], random_state=rng, clip=False, strict=False),
    # Theorem 4.1's exact learner (float64 answers assumed)
    "exact": lambda cell, d, rng: ExactValueQueryLearner(probes="basis", random_state=rng),
}

#: the learners "noise" runs: its own, and plug-ins of one head from approximate value queries
#: (or from value queries, as the exact baseline: a tau-approximate oracle answers as one)
TAKES = Takes("noise", oracles=("approximate value", "value"), returns=("head",),
              own=tuple(LEARNERS), gives=("W_bound", "mu"),
              box="(a tau-approximate value oracle)")

#: float64 slack on the guarantee: adversarial noise meets ||v_hat - v|| <= sqrt(d) tau with
#: equality, up to the rounding of f(X) + tau (about 1e-16 absolute per answer)
BOUND_RTOL, BOUND_ATOL = 1e-9, 1e-14


def within(err: float, bound: float) -> bool:
    """``err <= bound`` up to float64 rounding of the answers."""
    return bool(err <= bound * (1 + BOUND_RTOL) + BOUND_ATOL)


# ---------------------------------------------------------------------------------------------
# noise
# ---------------------------------------------------------------------------------------------
def cells(cfg) -> list[dict]:
    """Cells of "noise": the tau grid (``variant="tau"``) and the oversampling grid."""
    out = []
    for g in grid(
        learner=TAKES.check(cfg["learners"]),
        noise=list(cfg["noise"]),
        d=cfg["d"],
        tau=cfg["tau"],
        mu=cfg["mu"],
        W_bound=cfg["W_bound"],
        seed=list(range(cfg["seeds"])),
    ):
        out.append({**g, "oversample": 1, "zero_frac": float(cfg["zero_frac"]),
                    "eps": float(cfg["eps"]), "variant": "tau"})
    ov = cfg["oversample"]
    if ov:
        for g in grid(
            noise=list(cfg["noise"]),
            oversample=list(ov),
            seed=list(range(cfg.get("oversample_seeds", cfg["seeds"]))),
        ):
            out.append({
                "learner": "noisy", **g, "d": int(cfg["d"][0]),
                "tau": float(cfg["oversample_tau"]), "mu": float(cfg["mu"][0]),
                "W_bound": float(cfg["W_bound"][0]),
                "zero_frac": float(cfg["zero_frac"]),
                "eps": float(cfg["eps"]), "variant": "oversample",
            })
    return out


def run(cell: dict, rng: np.random.Generator) -> dict:
    """Run one "noise" cell: a head meeting Theorem 6.1's assumptions, an approximate oracle,
    one learner. A learner that fails (the exact learner's AssumptionViolation, the unclipped
    learner's undefined logit) raises, and the cell's row gets status ``error``."""
    model_rng, noise_rng, learner_rng = rng.spawn(3)
    d, tau, mu, Wb = cell["d"], cell["tau"], cell["mu"], cell["W_bound"]
    head = theorem_head(d, model_rng, Wb, mu, zero_frac=cell["zero_frac"])
    oracle = ApproximateValueOracle(head, d, tau, noise=cell["noise"],
                                    random_state=noise_rng)
    met = assumptions_met(head, tau, Wb, mu)
    eps = cell["eps"]
    bound_W, bound_v = theorem61_guarantee(tau, d, Wb, mu)
    m = {
        "required_tau": theorem61_required_tau(d, Wb, mu, eps, eps),
        "bound_W": bound_W if np.isfinite(bound_W) else None,
        "bound_v": bound_v if np.isfinite(bound_v) else None,
    }
    extra = {"assumptions_met": met, "W_fro": float(np.linalg.norm(head.W)),
             "v_norm": float(np.linalg.norm(head.v))}
    learner = cell["learner"]
    est = (TAKES.make(cell, learner_rng, W_bound=cell["W_bound"], mu=cell["mu"])
           if TAKES.is_joined(cell) else
           LEARNERS[learner](cell, d, learner_rng))
    # the exact learner (float64 answers assumed) refuses noisy answers, and so may the noisy
    # learner outside the theorem's assumptions: the row records verified = False and the
    # estimate's errors
    e = fit_and_measure(est, oracle, head, d, record_refusal=True, finite_as=learner,
                        measure=_measure)
    m.update(e)
    if isinstance(est, NoisyValueQueryLearner):
        extra["n_clipped"] = est.n_clipped_
        extra["n_out_of_range"] = est.n_out_of_range_
    if met:
        m["within_bound"] = bool(within(e["abs_err_W"], bound_W) and within(e["err_v"], bound_v))
    # success: the target (eps_W, eps_v) = (eps, eps) reached
    m["success"] = bool(e["abs_err_W"] <= eps and e["err_v"] <= eps)
    m["extra"] = extra
    return m


def _measure(est, head) -> dict:
    """:func:`~attnquery.experiments._recipe.head_measure`; an estimate of W the unclipped
    learner left undefined raises :class:`~attnquery.errors.UndefinedEstimate`."""
    if isinstance(est, NoisyValueQueryLearner) and est.n_undefined_:
        raise UndefinedEstimate(
            f"sigma^(-1) of an attention-weight estimate outside (0, 1) at "
            f"{est.n_undefined_} of {head.d * head.d} probes: the unclipped estimate of W is "
            "undefined"
        )
    return head_measure(est, head)


# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests), from
# the wall times of the default study on a 2-core machine shared with other work, extrapolated
# with the benchmarks (README) to the sizes of config/paper.yaml.
def seconds(cell) -> float:
    """2-3 ms per cell at d <= 16 (default study); d^2 and the oversampling factor."""
    return 0.003 + 2e-5 * cell["d"] ** 2 * cell.get("oversample", 1)


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {}

#: the refusals this experiment is designed to meet (attnquery.outcomes): the two baselines
#: refuse where the noise pushes an attention-weight estimate out of (0, 1); Theorem 6.1's
#: learner (clipped) has none
REFUSALS = (
    Refusal("the exact learner (Theorem 4.1) given noisy answers", (AssumptionViolation,),
            where=lambda cell: cell["learner"] == "exact"),
    Refusal("the unclipped baseline, undefined where a noisy weight leaves (0, 1)",
            (AssumptionViolation, UndefinedEstimate),
            where=lambda cell: cell["learner"] == "unclipped"),
)


EXPERIMENT = register(Experiment(
    name="noise", cells=cells, run=run, params=PARAMS, metrics=METRICS, refusals=REFUSALS,
    description="Theorem 6.1 under uniform and adversarial noise (error against tau)",
    seconds=seconds,
))
