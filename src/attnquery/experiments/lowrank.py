"""Experiments "lowrank_phase" and "lowrank_scale": low-rank heads (paper Section 5).

* ``lowrank_phase``: the nuclear-norm learner of Theorem 5.1 on a grid of
  ``c = m / (r (2d))`` for each (d, r): its success probability (relative Frobenius error of W
  at most :data:`PHASE_TOL` after polishing) shows the phase transition and the constant C.
* ``lowrank_scale``: the sketch learner (rank found from the answers) and the exact learner of
  Theorem 4.1 on the same factored heads, up to d = 1024 (4096 in ``config/scale.yaml``): the
  queries counted against the floor ``r (2d - r) + d``, the error and the wall time. Its
  ``learners`` may name any registered learner of one head from value queries
  (:mod:`attnquery.learners._registry`, plug-ins included) that needs no parameter: it is built
  with its defaults and the cell's generator, and judged on its dense ``W_`` and ``v_``.

The head of a grid point depends on (d, r, seed index) only, so every learner and every c of a
grid point meet the same head; the probes come from the cell's own generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from ..learners import ExactValueQueryLearner, NuclearNormROPLearner, SketchLowRankLearner
from ..learners._registry import registry
from ..metrics import absolute_error, relative_error
from ..models import random_head
from ..theory import PHASE_TOL, SKETCH_TOL, lowrank_floor
from ._core import Experiment, grid, register
from ._costs import exact_learner_seconds
from ._learners import Takes
from ._recipe import fit_and_measure, head_measure

#: tag mixed into the seed of the heads (so they differ from other experiments' heads)
_HEAD_TAG = 5_0001


def _head(d: int, r: int, seed: int):
    """The factored head of grid point (d, r, seed): shared by every learner and every c."""
    return random_head(d, np.random.default_rng([_HEAD_TAG, d, r, seed]), rank=r)


def factored_error(L, R, K, Q) -> tuple[float, float]:
    """Absolute and relative Frobenius error of ``L R^T`` against ``K^T Q``, never forming d x d.

    ``L R^T - K^T Q = [L, -K^T] [R, Q^T]^T``; with thin QR factorisations of both d x 2r factors
    the norm is that of a 2r x 2r matrix, accurate to rounding (a Gram-matrix formula would lose
    half the digits).
    """
    A = np.concatenate([L, -K.T], axis=1)
    B = np.concatenate([R, Q.T], axis=1)
    Ra = np.linalg.qr(A, mode="r")
    Rb = np.linalg.qr(B, mode="r")
    err = float(np.linalg.norm(Ra @ Rb.T))
    Rk = np.linalg.qr(K.T, mode="r")
    Rq = np.linalg.qr(Q.T, mode="r")
    ref = float(np.linalg.norm(Rk @ Rq.T))
    return err, err / ref if ref > 0 else err


# ----------------------------------------------------------------------------------------------
def phase_cells(cfg) -> list[dict]:
    out = []
    for g in grid(d=cfg["d"], rank=cfg["rank"], c=cfg["c"], solver=cfg["solver"],
                  seed=list(range(cfg["seeds"]))):
        if not 2 * g["rank"] < g["d"]:
            continue  # the study keeps r < d / 2
        m = int(math.ceil(g["c"] * g["rank"] * 2 * g["d"] - 1e-9))
        out.append({"learner": "nuclear", **g, "n_measurements": m})
    if not out:
        raise ConfigError("no grid point has rank < d / 2")
    return PHASE_TAKES.join(out, cfg["learners"], "nuclear",
                            drop=("c", "n_measurements", "solver"))


def phase_run(cell: dict, rng: np.random.Generator) -> dict:
    learner_rng, eval_rng = rng.spawn(2)
    d, r = cell["d"], cell["rank"]
    head = _head(d, r, cell["seed"])
    from ..oracles import ValueOracle

    oracle = ValueOracle(head, d)
    if PHASE_TAKES.is_joined(cell):  # a plug-in on the same head, with its defaults
        m = fit_and_measure(PHASE_TAKES.make(cell, learner_rng), oracle, head, d, eval_rng,
                            n_eval=32, record_refusal=True)
        return {**m, "success": bool(m["rel_err_W"] <= PHASE_TOL and
                                     m["rel_err_v"] <= PHASE_TOL)}
    est = NuclearNormROPLearner(n_measurements=cell["n_measurements"], rank=r,
                                solver=cell["solver"], random_state=learner_rng)
    # below the phase transition the program's solution is wrong and the learner says so
    # (verified = False); the row keeps its errors
    m = fit_and_measure(est, oracle, head, d, eval_rng, n_eval=32, record_refusal=True)
    return {
        **m,
        "success": bool(m["rel_err_W"] <= PHASE_TOL and m["rel_err_v"] <= PHASE_TOL),
        "rank_found": est.rank_,
        "solver_status": est.solver_status_,
        "solver_iterations": est.solver_iterations_,
        "solve_time_s": est.solve_time_s_,
        "extra": {
            "raw_rel_err_W": relative_error(est.W_raw_, head.W),
            "polished": est.polished_,
            "spectral_gap": est.gap_,
            "n_requeried": est.n_requeried_,
            "measurement_residual": est.measurement_residual_,
        },
    }


# ----------------------------------------------------------------------------------------------
def _sketch_measure(est, head) -> dict:
    """The sketch's errors: of W from its factors (never forming d x d), and of v."""
    L, R = est.W_factors_
    abs_err, rel = factored_error(L, R, head.K, head.Q)
    return {"rel_err_W": rel, "abs_err_W": abs_err, "rel_err_v": relative_error(est.v_, head.v),
            "err_v": absolute_error(est.v_, head.v)}


def _no_report(est) -> tuple:
    return None, {}


@dataclass(frozen=True)
class _ScaleLearner:
    #: random_state -> an unfitted estimator
    make: Callable
    #: (est, head) -> its errors (head_measure: from the dense W)
    measure: Callable = head_measure
    #: est -> (rank found or None, extra)
    report: Callable = _no_report


#: the learners of "lowrank_scale" with a build of their own, by name; any other registered
#: learner of one head from value queries runs through :func:`_registered`
SCALE_LEARNERS = {
    # the sketch learner (rank found from the answers); its error from the factors
    "sketch": _ScaleLearner(
        lambda rng: SketchLowRankLearner(random_state=rng), _sketch_measure,
        lambda est: (est.rank_, {"n_requeried": est.n_requeried_,
                                 "oversample": est.oversample_})),
    # Theorem 4.1's exact learner (d^2 + d queries); its error from the dense W
    "exact": _ScaleLearner(lambda rng: ExactValueQueryLearner(random_state=rng),
                           report=lambda est: (None, {"n_requeried": est.n_requeried_})),
}


def _registered(name: str) -> _ScaleLearner:
    """A registered learner built with its defaults (its spec checked by
    :data:`SCALE_TAKES`); its error from the dense W."""
    return _ScaleLearner(lambda rng: SCALE_TAKES.make({"learner": name}, rng))


#: the learners "lowrank_scale" runs: any registered learner of one head from value queries
#: (built in or a plug-in) that needs no parameter but the cell's ``random_state``
SCALE_TAKES = Takes("lowrank_scale", oracles=("value",), returns=("head",),
                    own=tuple(SCALE_LEARNERS), registered=True)

#: the learners "lowrank_phase" runs: the nuclear-norm learner on its grid of m, and plug-ins of
#: one head from value queries on its heads (one cell per (d, r, seed), built with defaults)
PHASE_TAKES = Takes("lowrank_phase", oracles=("value",), returns=("head",), own=("nuclear",))


def scale_learners() -> list[str]:
    """The registered learners ``lowrank_scale`` can run: one head from value queries, no
    parameter needed (a plug-in is imported to read its spec; one that cannot be is left
    out)."""
    return [name for name in registry() if SCALE_TAKES.why_not(name) is None]


def _check_learner(name: str) -> None:
    """ConfigError naming the learners ``lowrank_scale`` can run unless it can run ``name``."""
    why = SCALE_TAKES.why_not(name)
    if why is not None:
        raise ConfigError(f"learners: {name!r} {why}; lowrank_scale runs the registered "
                          f"learners of one head from value queries: {scale_learners()}")


def scale_cells(cfg) -> list[dict]:
    for name in dict.fromkeys(cfg["learners"]):
        _check_learner(name)
    out = []
    for g in grid(d=cfg["d"], rank=cfg["rank"], learner=cfg["learners"],
                  seed=list(range(cfg["seeds"]))):
        if not 2 * g["rank"] <= g["d"]:
            continue
        if g["learner"] == "exact" and g["d"] > cfg["exact_max_d"]:
            continue
        out.append(g)
    if not out:
        raise ConfigError("no grid point has rank <= d / 2")
    return out


def scale_run(cell: dict, rng: np.random.Generator) -> dict:
    learner_rng, eval_rng = rng.spawn(2)
    d, r = cell["d"], cell["rank"]
    head = _head(d, r, cell["seed"])
    from ..oracles import ValueOracle

    oracle = ValueOracle(head, d)
    _check_learner(cell["learner"])
    learner = SCALE_LEARNERS.get(cell["learner"]) or _registered(cell["learner"])
    est = learner.make(learner_rng)
    # the functional error up to d = 1024 (beyond, the held-out answers cost more than the fit)
    out = fit_and_measure(est, oracle, head, d, eval_rng if d <= 1024 else None, n_eval=16,
                          measure=learner.measure)
    rank_found, extra = learner.report(est)
    out.update({
        "success": bool(out["rel_err_W"] <= SKETCH_TOL and out["rel_err_v"] <= SKETCH_TOL),
        "rank_found": rank_found,
        "extra": {"floor": lowrank_floor(d, r), **extra},
    })
    return out


# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests), from
# the wall times of the default study on a 2-core machine shared with other work, extrapolated
# with the benchmarks (README) to the sizes of config/paper.yaml.
def phase_seconds(cell) -> float:
    """SCS: 1.2 s at d = 32 (default study), 7.5 s at d = 64 (benchmark); Clarabel: 7.6 s at
    d = 32, 47 s at d = 48, 207 s at d = 64 (benchmark); a joined learner: as the exact
    learner (not measured)."""
    if PHASE_TAKES.is_joined(cell):
        return exact_learner_seconds(cell["d"])
    x = cell["d"] / 32
    return 0.05 + (8.0 * x ** 4.5 if cell["solver"] == "CLARABEL" else 1.2 * x ** 3.5)


def scale_seconds(cell) -> float:
    """Sketch: 3.4 s at d = 1024, r = 128 (default study), 50 s at d = 4096, r = 128
    (benchmark): r d^2; exact: as the exact experiment; another registered learner: as the exact
    learner (a dense head, d^2 + d queries; not measured)."""
    return _SCALE_SECONDS.get(cell["learner"], _SCALE_SECONDS["exact"])(cell["d"], cell["rank"])


_SCALE_SECONDS = {"sketch": lambda d, r: 0.02 + 3e-8 * r * d**2,
                  "exact": lambda d, r: exact_learner_seconds(d)}


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {
    "c": pa.float64(),
    "n_measurements": pa.int64(),
    "solver": pa.string(),
}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {
    "solver_status": pa.string(),
    "solver_iterations": pa.int64(),
}


PHASE = register(Experiment(
    name="lowrank_phase",
    cells=phase_cells,
    run=phase_run,
    params=PARAMS,
    metrics=METRICS,
    description="Nuclear-norm recovery from rank-one projections (Theorem 5.1): phase transition",
    seconds=phase_seconds,
))

SCALE = register(Experiment(
    name="lowrank_scale",
    cells=scale_cells,
    run=scale_run,
    params=PARAMS,
    metrics=METRICS,
    description="Sketch learner vs exact learner on low-rank heads: queries, error, time",
    seconds=scale_seconds,
))
