"""Experiment "reallayer": whole attention layers of a pretrained checkpoint, every head at once.

The ground truth of a cell is layer ``layer`` of the checkpoint, read out along a fixed vector r,
with all its biases: ``f(X) = r^T (W_O concat_h(head_h(X)) + b_O)`` at the last token
(:func:`attnquery.realheads.layer_from_checkpoint`; for all-MiniLM-L6-v2, 12 heads of rank 32 at
d = 384). :class:`~attnquery.learners.AttentionLayerLearner` recovers it through a value oracle,
with the rank set to the head dimension. Each cell records, per layer:

* the heads recovered, matched to the true heads by the Hungarian method
  (:func:`~attnquery.experiments._recipe.layer_measure`): ``n_heads_found`` counts the heads
  whose relative errors of ``W_h``, ``v_h`` and ``c_h`` are all at most ``HEAD_TOL``;
* the per-head relative errors of ``W_h``, ``v_h`` and ``c_h`` (their maxima in ``rel_err_W``,
  ``rel_err_v``, ``rel_err_c``, every head's in ``extra``) and of the offset beta;
* the functional relative error on held-out random inputs of lengths 1, 2, 4 and 8
  (``func_err``);
* the queries counted by the oracle against the layer's degrees of freedom
  ``H (r (2d - r) + 2d) + 1`` (``extra.dof``), the queries of each stage, and the count the
  learner states for every stage but the circle scan (``extra.probe_count``,
  :func:`~attnquery.learners.multihead_generic.layer_probe_count`);
* the wall time (timing table).

``success`` is every head within ``HEAD_TOL`` and ``func_err <= FUNC_TOL``, the goals of the
study; a layer the learner refuses is a row with status ``error`` and the learner's message.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from ..metrics import relative_error
from ..oracles import ValueOracle
from ..realheads import layer_from_checkpoint
from ..theory import LAYER_FUNC_TOL as FUNC_TOL
from ..theory import LAYER_HEAD_TOL as HEAD_TOL
from ._core import Experiment, checkpoint_source, grid, readout_args, register
from ._learners import Takes
from ._recipe import fit_and_measure, layer_measure

#: the learner of this experiment
LEARNERS = ("attention_layer",)

#: the learners "reallayer" runs: the attention-layer learner, and plug-ins that learn a layer
#: (``heads_``, ``offset_``) from value queries (given ``n_heads``, ``rank`` and ``fit_bias``
#: where they take them)
TAKES = Takes("reallayer", oracles=("value",), returns=("layer",), own=LEARNERS,
              gives=("n_heads", "rank", "fit_bias"))


def cells(cfg) -> list[dict]:
    n_heads = cfg["n_heads"]
    layers = cfg["layers"]
    if not isinstance(layers, list) or not layers:
        raise ConfigError(f"layers must be a non-empty list of integers; got {layers!r}")
    readout = f"{cfg['readout']}:{cfg['readout_seed']}"
    common = {"learner": "attention_layer", "checkpoint": cfg["checkpoint"],
              "n_heads": n_heads, "readout": readout,
              "biases": bool(cfg["biases"])}
    return TAKES.join([{**common, **g} for g in grid(layer=layers,
                                                     seed=list(range(cfg["seeds"])))],
                      cfg["learners"], "attention_layer")


def run(cell: dict, rng: np.random.Generator) -> dict:
    from ..learners import AttentionLayerLearner

    learner_rng, eval_rng = rng.spawn(2)
    biases = bool(cell["biases"])
    layer = layer_from_checkpoint(cell["checkpoint"], cell["layer"], n_heads=cell["n_heads"],
                                  **readout_args(cell), biases=biases)
    d, H = layer.d, layer.n_heads
    r = int(layer.heads[0].K.shape[0])
    oracle = ValueOracle(layer, d)
    if TAKES.is_joined(cell):
        est = TAKES.make(cell, learner_rng, n_heads=H, rank=r, fit_bias=biases)
    else:
        est = AttentionLayerLearner(n_heads=H, rank=r, fit_bias=biases,
                                    random_state=learner_rng)
    m = fit_and_measure(est, oracle, layer, d, eval_rng, n_eval=64, measure=layer_measure,
                        record_refusal=TAKES.is_joined(cell))
    per = {k: np.asarray(m.pop(f"err_{k}_heads")) for k in ("W", "v", "c")}
    found = (per["W"] <= HEAD_TOL) & (per["v"] <= HEAD_TOL) & (per["c"] <= HEAD_TOL)
    from ..learners.multihead_generic import layer_dof, layer_probe_count

    if TAKES.is_joined(cell):  # a plug-in: its heads and function, none of the learner's own
        m.update(n_heads_found=int(found.sum()),
                 success=bool(found.all() and m["func_err"] <= FUNC_TOL),
                 extra={"d": d, "rank": r, "rel_err_W_heads": per["W"].tolist()})
        if biases:
            m["rel_err_offset"] = relative_error(est.offset_, layer.total_offset)
        else:
            del m["rel_err_c"]
        return m
    m.update({
        "n_heads_found": int(found.sum()),
        "success": bool(found.all() and m["func_err"] <= FUNC_TOL),
        "extra": {
            "d": d, "rank": r, "dof": layer_dof(d, H, r, bias=biases),
            "probe_count": layer_probe_count(d, H, r, est.oversample, bias=biases),
            "n_requeried": est.n_requeried_,
            "rel_err_W_heads": per["W"].tolist(), "rel_err_v_heads": per["v"].tolist(),
            "rel_err_c_heads": per["c"].tolist(), "queries_by_stage": est.n_queries_by_stage_,
            "scan_T": est.scan_["T"], "scan_planes": est.scan_["planes"],
            "verify_error": est.verify_error_,
        },
    })
    if biases:
        m["rel_err_offset"] = relative_error(est.offset_, layer.total_offset)
    else:
        del m["rel_err_c"]  # a layer without biases has no key bias to measure
    return m


# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests): a
# MiniLM layer (d = 384, 12 heads) took 7 to 8 s in the default study on a loaded 2-core machine.
def seconds(cell) -> float:
    """A layer of the checkpoint: 12 s."""
    return 12.0


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {}


EXPERIMENT = register(
    Experiment(
        name="reallayer",
        cells=cells,
        run=run,
        params=PARAMS,
        metrics=METRICS,
        description="Whole attention layers of a pretrained checkpoint (every head, with its "
        "biases) recovered by the attention-layer learner",
        seconds=seconds,
        data=checkpoint_source,
    )
)
