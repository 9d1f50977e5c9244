"""Experiment "multihead": non-identifiability (Prop. 7.1) and orthogonal-subspace recovery.

Three variants of cells (``variant`` column):

- the non-identifiable constructions of :func:`non_identifiability_demo`
  (``prop71``, ``shared_w``, ``dead_head``): parameter distance after the best head
  permutation (``param_distance``) and largest relative output difference on 1000 random
  inputs (``output_difference``; ``n_queries`` is the number of these inputs); and
  ``single_head``: the single-head exact learner run on a generic multi-head oracle
  (``func_err``, and its parameter distance to the H true heads; a run where the learner
  reports answers no single head can give is a row with status ``error`` and that message);
- ``known``: Prop. C.2 with the subspace bases given; errors after matching heads;
- ``discover``: bases discovered from finite-difference Hessians (step ``fd_step``), then
  Prop. C.2; ``success`` when every head is within relative error ``DISCOVER_TOL``;
  ``basis_err`` is the largest distance ``||P_hat - P||_2`` between matched projectors.
"""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pyarrow as pa

from ..errors import AssumptionViolation, ConfigError, NotIdentifiableError
from ..learners import ExactValueQueryLearner, OrthogonalSubspaceLearner
from ..metrics import match_heads
from ..models import (
    NON_IDENTIFIABLE_CONSTRUCTIONS,
    MultiHeadAttention,
    as_rng,
    non_identifiable_pair,
    orthogonal_subspace_multihead,
    random_multihead,
)
from ..oracles import ValueOracle
from ..outcomes import Refusal
from ..theory import DISCOVER_TOL, KNOWN_TOL
from ._core import Experiment, grid, register
from ._learners import Takes
from ._recipe import fit_and_measure

__all__ = ["non_identifiability_demo", "CONSTRUCTIONS"]

#: the non-identifiable constructions :func:`non_identifiability_demo` knows
CONSTRUCTIONS = NON_IDENTIFIABLE_CONSTRUCTIONS


def _heads_params(model: MultiHeadAttention):
    return [h.W for h in model.heads], [h.v for h in model.heads]


def non_identifiability_demo(
    d: int,
    H: int,
    seed=None,
    *,
    n_queries: int = 1000,
    lengths=(1, 2, 4, 8),
    constructions=CONSTRUCTIONS,
    single_head: bool = True,
) -> dict:
    """Demonstrate that multi-head attention is not identifiable from its outputs.

    For each construction, two parameter sets are built from ``seed`` and compared:

    ``"prop71"`` (the paper's Prop. 7.1), ``"shared_w"`` and ``"dead_head"``: see
    :func:`attnquery.models.non_identifiable_pair`.

    Both sets are evaluated on the same ``n_queries`` random inputs (tokens ~ N(0, I/d), lengths
    cycling through ``lengths``).

    Finally, when ``single_head`` is true, the single-head exact learner
    (:class:`~attnquery.learners.ExactValueQueryLearner`) is run on a value oracle of a generic
    multi-head model (:func:`~attnquery.models.random_multihead` with the same d, H and a stream
    of ``seed``), and the functional error of the head it returns is measured.

    Parameters
    ----------
    d : int
        Token dimension (>= 2).
    H : int
        Number of heads (>= 2).
    seed : int, sequence of ints or Generator
    n_queries : int
        Number of random inputs on which outputs are compared.
    lengths : sequence of int
        Sequence lengths of the random inputs.
    constructions : sequence of str
        Which constructions to run (subset of :data:`CONSTRUCTIONS`).
    single_head : bool
        Also run the single-head learner on a multi-head oracle.

    Returns
    -------
    dict
        ``"constructions"``: a list with one dict per construction: ``name``, ``model_a`` and
        ``model_b`` (the two :class:`~attnquery.models.MultiHeadAttention` models),
        ``param_distance`` (relative distance of the stacked parameters after the best head
        permutation, :func:`~attnquery.metrics.match_heads`), ``v_distance`` and ``W_distance``
        (the same, for v's and W's alone), ``max_abs_diff`` and ``max_rel_diff``
        (``max |f_a - f_b|`` and that over ``max |f_a|`` on the random inputs).
        ``"single_head"``: ``status`` ("ok" or the error type), ``functional_error`` (relative
        RMS on held-out inputs; NaN when the learner failed), ``param_distance`` (of the one
        recovered head to the H true heads, unmatched heads compared with 0), ``n_queries``,
        ``message`` and ``model`` (the multi-head model used).
    """
    if not isinstance(d, int | np.integer) or d < 2:
        raise ConfigError(f"d must be an integer >= 2; got {d!r}")
    if not isinstance(H, int | np.integer) or H < 2:
        raise ConfigError(f"a multi-head demonstration needs H >= 2 heads; got {H!r}")
    if n_queries < 1:
        raise ConfigError(f"n_queries must be >= 1; got {n_queries}")
    unknown = [c for c in constructions if c not in CONSTRUCTIONS]
    if unknown:
        raise ConfigError(f"unknown construction {unknown[0]!r}; choose from {CONSTRUCTIONS}")
    lengths = tuple(int(n) for n in lengths)
    if not lengths or min(lengths) < 1:
        raise ConfigError(f"lengths must be positive ints; got {lengths}")
    rng = as_rng(seed)
    r_cons, r_inputs, r_single, r_eval = rng.spawn(4)
    # the same random inputs for every construction
    X_all = []
    for k, N in enumerate(lengths):
        n = n_queries // len(lengths) + (1 if k < n_queries % len(lengths) else 0)
        if n:
            X_all.append(r_inputs.standard_normal((n, N, d)) / np.sqrt(d))
    out = {"constructions": []}
    for name, r in zip(constructions, r_cons.spawn(len(constructions)), strict=True):
        ma, mb = non_identifiable_pair(name, int(d), int(H), r)
        Wa, va = _heads_params(ma)
        Wb, vb = _heads_params(mb)
        m = match_heads(Wb, vb, Wa, va)
        mW = match_heads(Wb, [np.zeros(d)] * len(Wb), Wa, [np.zeros(d)] * len(Wa))
        den_v = np.sqrt(sum(float(np.sum(x**2)) for x in va))
        dv = np.sqrt(sum(m["err_v"] ** 2))
        fa = np.concatenate([ma(X) for X in X_all])
        fb = np.concatenate([mb(X) for X in X_all])
        max_abs = float(np.max(np.abs(fa - fb)))
        scale = float(np.max(np.abs(fa)))
        out["constructions"].append(
            {
                "name": name,
                "model_a": ma,
                "model_b": mb,
                "param_distance": m["param_distance"],
                "v_distance": float(dv / den_v) if den_v > 0 else float(dv),
                "W_distance": mW["param_distance"],
                "max_abs_diff": max_abs,
                "max_rel_diff": max_abs / scale if scale > 0 else max_abs,
                "n_inputs": int(fa.size),
            }
        )
    if single_head:
        model = random_multihead(int(d), int(H), r_single)
        oracle = ValueOracle(model, int(d))
        rec = {"model": model, "status": "ok", "message": "", "functional_error": np.nan,
               "param_distance": np.nan}
        try:
            m = fit_and_measure(ExactValueQueryLearner(random_state=r_single), oracle, model,
                                int(d), r_eval, n_eval=256, measure=_single_head_measure)
            rec["functional_error"] = m["func_err"]
            rec["param_distance"] = m["param_distance"]
        except (AssumptionViolation, NotIdentifiableError) as exc:
            rec["status"] = type(exc).__name__
            rec["message"] = str(exc)
        rec["n_queries"] = int(oracle.n_queries)
        out["single_head"] = rec
    return out


def _single_head_measure(est, model) -> dict:
    """The distance of one recovered head to a multi-head model's heads (unmatched heads
    compared with 0)."""
    W, v = _heads_params(model)
    return {"param_distance": match_heads([est.W_], [est.v_], W, v)["param_distance"]}


#: the learners "multihead" runs: its own, and plug-ins that learn several heads (lists ``W_``,
#: ``v_``) from value queries, on the orthogonal-subspace layers (given ``n_heads`` where they
#: take it, never the bases)
TAKES = Takes("multihead", oracles=("value",), returns=("heads",), own=("demo", "exact",
              "orthogonal"), gives=("n_heads",))


def cells(cfg) -> list[dict]:
    out = []
    seeds = list(range(cfg["seeds"]))
    ni = cfg.get("nonident")
    if ni:
        for g in grid(d=ni["d"], n_heads=ni["n_heads"],
                      variant=[*CONSTRUCTIONS, "single_head"], seed=seeds):
            out.append({"learner": "demo" if g["variant"] != "single_head" else "exact", **g})
    kn = cfg.get("known")
    if kn:
        for g in grid(d=kn["d"], n_heads=kn["n_heads"], seed=seeds):
            if g["n_heads"] <= g["d"]:
                out.append({"learner": "orthogonal", "variant": "known", **g})
    disc = cfg.get("discover")
    if disc:
        for g in grid(d=disc["d"], n_heads=disc["n_heads"], fd_step=disc["fd_step"],
                      seed=seeds):
            if g["n_heads"] <= g["d"]:
                out.append({"learner": "orthogonal", "variant": "discover", **g})
    return TAKES.join(out, cfg["learners"], "orthogonal", drop=("fd_step",))


def _projector_distance(B_hat, B, perm) -> float:
    worst = 0.0
    for j, E in enumerate(B):
        if perm[j] < 0:
            return float("inf")
        P = E @ E.T
        Eh = B_hat[perm[j]]
        worst = max(worst, float(np.linalg.norm(Eh @ Eh.T - P, 2)))
    return worst


def run(cell: dict, rng: np.random.Generator) -> dict:
    d, H, variant = cell["d"], cell["n_heads"], cell["variant"]
    if variant in CONSTRUCTIONS:
        res = non_identifiability_demo(d, H, rng, n_queries=1000, constructions=(variant,),
                                       single_head=False)
        c = res["constructions"][0]
        return {
            "n_queries": c["n_inputs"],  # random inputs both parameter sets answered
            "param_distance": c["param_distance"],
            "output_difference": c["max_rel_diff"],
            "extra": json.dumps({"v_distance": c["v_distance"], "W_distance": c["W_distance"],
                                 "max_abs_diff": c["max_abs_diff"]}),
        }
    if variant == "single_head":
        res = non_identifiability_demo(d, H, rng, constructions=(), single_head=True)
        sh = res["single_head"]
        if sh["status"] != "ok":  # the learner saw answers no single head gives: a row with
            raise AssumptionViolation(sh["message"])  # status error and the message
        out = {"n_queries": sh["n_queries"], "func_err": sh["functional_error"],
               "extra": json.dumps({"status": sh["status"], "message": sh["message"]})}
        out["param_distance"] = sh["param_distance"]
        out["output_difference"] = sh["functional_error"]
        out["n_heads_found"] = 1
        return out
    model_rng, learner_rng, eval_rng = rng.spawn(3)
    model, bases = orthogonal_subspace_multihead(d, H, model_rng, return_bases=True)
    oracle = ValueOracle(model, d)
    if TAKES.is_joined(cell):  # a plug-in: the heads alone, its refusal recorded
        out = fit_and_measure(TAKES.make(cell, learner_rng, n_heads=H), oracle, model, d,
                              eval_rng, n_eval=64, record_refusal=True, measure=_measure)
        tol = KNOWN_TOL if variant == "known" else DISCOVER_TOL
        return {**out, "success": bool(max(out["rel_err_W"], out["rel_err_v"]) <= tol)}
    if variant == "known":
        est = OrthogonalSubspaceLearner(n_heads=H, bases=bases, random_state=learner_rng)
    elif variant == "discover":
        # a finite-difference step far from the default can give heads the learner's own check
        # refuses (verified = False); the row keeps their errors
        est = OrthogonalSubspaceLearner(n_heads=H, fd_step=cell["fd_step"],
                                        random_state=learner_rng)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    discover = variant == "discover"
    out = fit_and_measure(est, oracle, model, d, eval_rng, n_eval=64, record_refusal=discover,
                          measure=partial(_measure, bases=bases if discover else None))
    if variant == "known":
        out["success"] = bool(max(out["rel_err_W"], out["rel_err_v"]) <= KNOWN_TOL)
    else:
        out["success"] = bool(max(out["rel_err_W"], out["rel_err_v"]) <= DISCOVER_TOL)
        out["extra"] = json.dumps({
            "n_queries_bases": est.n_queries_bases_,
            "commutant_gap": est.commutant_gap_,
            "cluster_gap": est.cluster_gap_,
        })
    return out


def _measure(est, model, bases=None) -> dict:
    """The recovered heads matched to the true ones (:func:`~attnquery.metrics.match_heads`):
    the largest relative errors of W and v over the heads, the distance of the stacked
    parameters, the heads found and, given the true ``bases``, the distance of the learner's
    subspaces to them (``basis_err``)."""
    m = match_heads(est.W_, est.v_, [h.W for h in model.heads], [h.v for h in model.heads])
    out = {"rel_err_W": m["max_rel_err_W"], "rel_err_v": m["max_rel_err_v"],
           "param_distance": m["param_distance"], "n_heads_found": len(est.W_)}
    if bases is not None:
        out["basis_err"] = _projector_distance(est.bases_, bases, m["perm"])
    return out


# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests), from
# the wall times of the default study on a 2-core machine shared with other work, extrapolated
# with the benchmarks (README) to the sizes of config/paper.yaml.
def seconds(cell) -> float:
    """Discovery: 0.18 s at d = 24 (default study), d^3; known bases and the demonstration:
    0.04 s at d = 64, d^2."""
    d = cell["d"]
    if cell.get("variant") == "discover":
        return 0.02 + 0.2 * (d / 24) ** 3
    return 0.02 + 0.05 * (d / 64) ** 2


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {
    "fd_step": pa.float64(),
}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {
    "output_difference": pa.float64(),
    "basis_err": pa.float64(),
}

#: the refusals this experiment is designed to meet (attnquery.outcomes): the single-head exact
#: learner on an H-head box (H >= 2) reports answers no single head gives (the claim
#: multihead_single_head_fails: far from the function, or refused)
REFUSALS = (
    Refusal("the single-head learner on a box of H >= 2 heads", (AssumptionViolation,),
            where=lambda cell: cell.get("variant") == "single_head"),
)


EXPERIMENT = register(
    Experiment(
        name="multihead",
        cells=cells,
        run=run,
        params=PARAMS,
        metrics=METRICS,
        refusals=REFUSALS,
        description="Multi-head attention: non-identifiability and orthogonal subspaces",
        seconds=seconds,
    )
)
