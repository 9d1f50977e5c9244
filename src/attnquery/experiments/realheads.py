"""Experiment "realheads": every head of a pretrained checkpoint, extracted by several learners.

The ground truth of a cell is head ``head`` of layer ``layer`` of the checkpoint named in the
cell, built as :mod:`attnquery.realheads` defines (d = 384, head dimension 32 and rank 32 for
all-MiniLM-L6-v2). The checkpoint is read once per process.

Learners (one cell each):

* ``exact``: Theorem 4.1 (``d^2 + d`` queries), with the probe design of the config;
* ``sketch``: the low-rank sketch with the rank set to the head dimension
  (``r (2d - r) + d`` queries plus oversampling);

and, with ``biases: true``, both again on the heads with the module's biases (the key bias
``c = W_K^T b_Q / sqrt(d_h)`` and the offset ``beta = u_h^T b_V + r^T b_O``, see
:mod:`attnquery.realheads`), learnt with ``fit_bias=True``: ``d^2 + 2d + 1`` and
``r (2d - r) + 2d + 1`` queries (plus oversampling). Cells carry ``biases`` (true or false);
* ``noisy``: Theorem 6.1 against an approximate value oracle with uniform noise of size
  ``tau``. The learner is given the two constants the theorem assumes known, taken from the
  head itself: ``W_bound = max(2, ||W||_F)`` and the margin ``mu = min_i |v_i|``. Real heads
  have no margin to speak of (over MiniLM's 72 heads ``min |v_i|`` ranges from 7.5e-8 to
  3e-4, while ``max |v_i|`` is about 0.05), so the theorem's premise ``tau <= mu / 2`` fails
  at every useful tau and, where it holds, its error bound ``160 W^2 d tau / mu`` exceeds
  ``||W||_F``; the experiment measures what the learner then does.

Every cell records the head's scale facts (``||W||_F``, spectral norm, ``min |v_i|``) in
``extra``, so the figure can relate the errors to the margin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from ..oracles import ValueOracle
from ..realheads import head_from_checkpoint, head_summary
from ..theory import BIAS_EXACT_TOL, BIAS_PARAM_TOL, BIAS_SKETCH_TOL
from ..theory import REALHEADS_EXACT_TOL as EXACT_TOL
from ..theory import REALHEADS_SKETCH_TOL as SKETCH_TOL
from ._core import Experiment, checkpoint_source, grid, readout_args, register
from ._learners import Takes
from ._recipe import bias_measure, fit_and_measure, head_measure


def _ints(cfg, key):
    vals = cfg[key]
    if not isinstance(vals, list) or not vals:
        raise ConfigError(f"{key} must be a non-empty list of integers; got {vals!r}")
    return vals


def cells(cfg) -> list[dict]:
    checkpoint_source(cfg)  # at most one of fetch and synthetic
    n_heads = cfg["n_heads"]
    syn = cfg.get("synthetic")
    if syn and syn["d"] % n_heads:
        raise ConfigError(f"synthetic.d={syn['d']} is not a multiple of n_heads={n_heads}")
    if syn:
        bad = [L for L in cfg["layers"] if L >= syn["n_layers"]]
        if bad:
            raise ConfigError(f"layers {bad} do not exist in the synthetic checkpoint "
                              f"({syn['n_layers']} layers)")
    heads = _ints(cfg, "heads")
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise ConfigError(f"heads {bad} are outside [0, n_heads={n_heads})")
    readout = f"{cfg['readout']}:{cfg['readout_seed']}"
    common = {"checkpoint": cfg["checkpoint"], "n_heads": n_heads, "readout": readout}
    out = []
    for learner in TAKES.check(cfg["learners"]):
        axes, fixed = (LEARNERS[learner].axes if learner in LEARNERS else _joined_axes)(
            cfg, heads, learner)
        for g in grid(**axes, seed=list(range(cfg["seeds"]))):
            out.append({"learner": learner, **common, **g, **fixed})
    return out


def _head_axes(cfg, heads, learner=None):
    """Every selected head, with and without the module's biases when ``biases`` is set."""
    return {"layer": _ints(cfg, "layers"), "head": heads,
            "biases": [False, True] if cfg["biases"] else [False]}, {}


def _joined_axes(cfg, heads, learner):
    """A joined learner's heads: the exact learner's, with the biases only when its spec says
    it fits them (``fits_bias``)."""
    axes, _ = _head_axes(cfg, heads)
    if not TAKES.spec({"learner": learner}).fits_bias:
        axes["biases"] = [False]
    return axes, {}


def _exact_axes(cfg, heads, learner=None):
    axes, _ = _head_axes(cfg, heads)
    return axes, {"probes": cfg["probes"]}


def _noisy_axes(cfg, heads, learner=None):
    """The heads of the section ``noisy`` (default: the section's own), at each tau."""
    sub = cfg.get("noisy") or {}
    if "tau" not in sub:
        raise ConfigError("noisy: the noisy learner needs a list of tau")
    return {"layer": sub.get("layers", cfg["layers"]),
            "head": sub.get("heads", heads), "tau": sub["tau"]}, {}


def _on_values(make_learner, tols, head, cell, learner_rng):
    """A learner of exact value queries on ``head`` (with the key bias and offset when the
    cell has ``biases``): what the exact and sketch cells share.

    Parameters
    ----------
    make_learner : callable
        ``make_learner(random_state=..., fit_bias=...)`` -> an unfitted learner.
    tols : tuple of float
        Success tolerance without and with the biases.
    head : AttentionHead
        The ground truth, behind a :class:`ValueOracle`.
    cell : dict
        The cell (its ``biases``).
    learner_rng : numpy.random.Generator
        The learner's seed.

    Returns
    -------
    tuple
        ``(oracle, unfitted estimator, success tolerance)``.
    """
    biases = bool(cell.get("biases", False))
    est = make_learner(random_state=learner_rng, fit_bias=biases)
    return ValueOracle(head, head.d), est, tols[biases]


def _exact(head, cell, learner_rng, oracle_rng, summary):
    """Theorem 4.1's exact learner (with the key bias and offset when ``biases``)."""
    from ..learners.exact import ExactValueQueryLearner

    return _on_values(partial(ExactValueQueryLearner, probes=cell["probes"]),
                      (EXACT_TOL, BIAS_EXACT_TOL), head, cell, learner_rng)


def _sketch(head, cell, learner_rng, oracle_rng, summary):
    """The sketch learner at the head's rank (with the biases when ``biases``)."""
    from ..learners.lowrank import SketchLowRankLearner

    return _on_values(partial(SketchLowRankLearner, rank=summary["rank"]),
                      (SKETCH_TOL, BIAS_SKETCH_TOL), head, cell, learner_rng)


def _joined(head, cell, learner_rng, oracle_rng, summary):
    """A joined learner (a plug-in), built with its defaults (and ``fit_bias`` when the cell
    has the biases), judged by the exact learner's tolerances."""
    return _on_values(lambda random_state, fit_bias: TAKES.make(cell, random_state,
                                                                fit_bias=fit_bias),
                      (EXACT_TOL, BIAS_EXACT_TOL), head, cell, learner_rng)


def _requeried(est, cell):
    """What the exact learner reports beyond the errors: the answers it asked again."""
    return {}, {"n_requeried": int(est.n_requeried_)}


def _sketch_report(est, cell):
    """The exact learner's report and the rank the sketch found."""
    return {"rank_found": int(est.rank_)}, _requeried(est, cell)[1]


def _noisy(head, cell, learner_rng, oracle_rng, summary):
    """Theorem 6.1's learner against uniform noise of tolerance ``tau`` (no success tolerance:
    judged against the theorem's guarantee)."""
    from ..learners.noisy import NoisyValueQueryLearner
    from ..oracles import ApproximateValueOracle

    oracle = ApproximateValueOracle(head, head.d, float(cell["tau"]), noise="uniform",
                                    random_state=oracle_rng)
    est = NoisyValueQueryLearner(W_bound=max(2.0, summary["W_fro"]),
                                 mu=min(1.0, summary["min_abs_v"]), random_state=learner_rng,
                                 strict=False)
    return oracle, est, None


def _noisy_report(est, cell):
    """Theorem 6.1's required tolerance and error bounds (where finite), and the learner's
    counts of clipped and out-of-range answers."""
    from ..learners.noisy import theorem61_guarantee

    tau, W_bound, mu = float(cell["tau"]), est.W_bound, est.mu
    m = {"required_tau": est.required_tau_}
    bound_W, bound_v = theorem61_guarantee(tau, est.W_.shape[0], W_bound, mu)
    if np.isfinite(bound_W):
        m.update(bound_W=bound_W, bound_v=bound_v)
    extra = {"W_bound": W_bound, "mu": mu, "n_clipped": int(est.n_clipped_),
             "n_out_of_range": int(est.n_out_of_range_), "n_zero_v": int(est.zero_mask_.sum()),
             "margin_premise": bool(tau <= mu / 2)}
    return m, extra


@dataclass(frozen=True)
class _Learner:
    #: (section, heads) -> (grid axes, fixed cell entries)
    axes: Callable
    #: (head, cell, learner_rng, oracle_rng, summary) -> (oracle, unfitted estimator, success
    #: tolerance or None)
    build: Callable
    #: (fitted estimator, cell) -> (metrics, extra) it adds to the errors
    report: Callable = _requeried
    #: outside its premise the learner may refuse its estimate (recorded, verified = False)
    record_refusal: bool = False


#: the learners of this experiment, by name: their grid, how a cell builds them and what they
#: report
LEARNERS = {
    "exact": _Learner(_exact_axes, _exact),
    "sketch": _Learner(_head_axes, _sketch, _sketch_report),
    "noisy": _Learner(_noisy_axes, _noisy, _noisy_report, record_refusal=True),
}


#: the learners "realheads" runs: its own, and plug-ins of one head from value queries (with the
#: module's biases where their spec ``fits_bias``)
TAKES = Takes("realheads", oracles=("value",), returns=("head",), own=tuple(LEARNERS),
              gives=("fit_bias",))


def _no_report(est, cell):
    return {}, {}


#: how a joined learner's cells are built and what they report (nothing beyond the errors)
_JOINED = _Learner(_joined_axes, _joined, _no_report)


def _as_head(est, biases: bool):
    """The estimate as a head (with its key bias and offset when ``biases``)."""
    from ..models import AttentionHead

    c_hat, beta_hat = (est.key_bias_, est.offset_) if biases else (None, 0.0)
    return AttentionHead(est.v_, W=est.W_, key_bias=c_hat, offset=beta_hat)


def run(cell: dict, rng: np.random.Generator) -> dict:
    learner_rng, oracle_rng, eval_rng = rng.spawn(3)
    biases = bool(cell.get("biases", False))
    head = head_from_checkpoint(cell["checkpoint"], cell["layer"], cell["head"],
                                n_heads=cell["n_heads"], **readout_args(cell), biases=biases)
    summary = head_summary(head)
    learner = _JOINED if TAKES.is_joined(cell) else LEARNERS[cell["learner"]]
    oracle, est, tol = learner.build(head, cell, learner_rng, oracle_rng, summary)
    m = fit_and_measure(est, oracle, head, head.d, eval_rng, n_eval=32,
                        record_refusal=learner.record_refusal,
                        measure=bias_measure if biases else head_measure,
                        model=partial(_as_head, biases=biases))
    added, extra = learner.report(est, cell)
    m.update(added)
    if tol is not None:
        m["success"] = bool(m["rel_err_W"] <= tol and (
            max(m["rel_err_v"], m["rel_err_c"], m["rel_err_offset"]) <= BIAS_PARAM_TOL
            if biases else m["rel_err_v"] <= tol))
    elif "bound_W" in m:
        m["within_bound"] = bool(m["abs_err_W"] <= m["bound_W"] and m["err_v"] <= m["bound_v"])
    extra.update({k: summary[k] for k in ("d", "rank", "W_fro", "W_spectral", "v_norm",
                                          "min_abs_v", "max_abs_v")})
    if biases:
        extra.update(c_norm=float(np.linalg.norm(head.key_bias)), offset=head.offset)
    m["extra"] = extra
    return m


# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests), from
# the wall times of the default study on a 2-core machine shared with other work: a MiniLM head
# (d = 384) takes 1.2 s (3.6 s at most) with the exact learner, 0.17 s (0.6 s) with the sketch
# and 3.9 s (6.5 s) with the noisy learner.
_SECONDS = {"exact": 2.0, "sketch": 0.4, "noisy": 6.0}


def seconds(cell) -> float:
    """Estimated seconds of a cell: per learner, at d = 384 (a joined learner as the exact
    one, not measured)."""
    return _SECONDS.get(cell["learner"], _SECONDS["exact"])  # a joined one: as exact


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {}


EXPERIMENT = register(
    Experiment(
        name="realheads",
        cells=cells,
        run=run,
        params=PARAMS,
        metrics=METRICS,
        description="Every head of a pretrained checkpoint, with and without the module's "
        "biases, extracted by the exact, sketch and noisy learners",
        seconds=seconds,
        data=checkpoint_source,
    )
)
