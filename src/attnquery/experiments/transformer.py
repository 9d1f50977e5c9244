"""Experiment "transformer": one-layer transformers (Sec. 4.1) over d, FFN width m and seeds.

Each cell draws a random transformer (:func:`~attnquery.models.random_transformer`), fits
:class:`~attnquery.learners.TransformerLearner` on a value oracle and scores:

- W and ``v = A w_o`` against the truth (relative Frobenius errors);
- the FFN alone: worst relative difference on random unit inputs (``func_err_ffn``), and, when
  the width is recovered, the error of the neurons after matching them up to permutation and
  positive scale (``neuron_err``);
- the whole transformer: relative difference per held-out input (inputs of lengths 1, 2, 4, 8),
  normalised by the RMS output; worst (``func_err_max``) and median (``func_err_median``);
- the queries used by the attention part (two per antisymmetric query) and by the FFN part.

Claims checked: W to relative error <= 1e-10; FFN functional error <= 1e-8 for m <= d; the
attention part uses exactly 2 (d^2 + d) value queries.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..learners import TransformerLearner
from ..metrics import match_neurons, random_inputs, relative_error
from ..models import random_transformer
from ..oracles import ValueOracle
from ..theory import FFN_TOL
from ..theory import TRANSFORMER_W_TOL as W_TOL
from ._core import Experiment, grid, register
from ._learners import Takes
from ._recipe import fit_and_measure

#: the learners "transformer" runs: the transformer learner, and plug-ins that learn a
#: transformer block from value queries (its fitted attributes: ``W_``, ``v_``, ``A_``, ``w_o_``,
#: ``ffn_``), on the same blocks
TAKES = Takes("transformer", oracles=("value",), returns=("transformer",),
              own=("transformer",))


def cells(cfg) -> list[dict]:
    out = []
    for g in grid(d=cfg["d"], width=cfg["width"], seed=list(range(cfg["seeds"]))):
        out.append({"learner": "transformer", **g})
    return TAKES.join(out, cfg["learners"], "transformer")


def transformer_functional_errors(f_true, f_hat, d, rng, n=64, lengths=(1, 2, 4, 8)):
    """Per-input relative differences ``|f_hat - f| / rms(f)`` (rms over inputs of that length).

    Returns (worst, median).
    """
    rel = []
    for X in random_inputs(d, rng, n=n, lengths=lengths):
        a = np.asarray(f_true(X), dtype=float)
        b = np.asarray(f_hat(X), dtype=float)
        rms = float(np.sqrt(np.mean(a**2)))
        rel.append(np.abs(a - b) / (rms if rms > 0 else 1.0))
    rel = np.concatenate(rel)
    return float(rel.max()), float(np.median(rel))


def ffn_error(tf, predict, d, rng, n=512) -> float:
    """Worst ``|FFN_hat - FFN|`` over the largest ``|FFN|`` on random unit inputs."""
    Z = rng.standard_normal((n, d))
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    y = tf.ffn(Z)
    scale = float(np.max(np.abs(y)))
    err = float(np.max(np.abs(predict(Z) - y)))
    return err / scale if scale > 0 else err


def run(cell: dict, rng: np.random.Generator) -> dict:
    model_rng, learner_rng, eval_rng = rng.spawn(3)
    d, m = cell["d"], cell["width"]
    tf = random_transformer(d, m, model_rng)
    oracle = ValueOracle(tf, d)
    est = (TAKES.make(cell, learner_rng) if TAKES.is_joined(cell) else
           TransformerLearner(random_state=learner_rng))
    out = fit_and_measure(est, oracle, tf, measure=_measure)
    r_ffn, r_tf = eval_rng.spawn(2)
    out.update({
        "n_queries_attention": getattr(est, "n_queries_attention_", None),
        "n_queries_ffn": getattr(est, "n_queries_ffn_", None),
        "func_err_ffn": ffn_error(tf, est.ffn_.predict, d, r_ffn),
    })
    out["func_err_max"], out["func_err_median"] = transformer_functional_errors(
        tf, est.predict, d, r_tf
    )
    out["func_err"] = out["func_err_max"]
    out["success"] = bool(out["rel_err_W"] <= W_TOL and out["func_err_ffn"] <= FFN_TOL)
    return out


def _measure(est, tf) -> dict:
    """The attention's relative errors of W and v, the width found and, at the true width, the
    neurons' error after matching (:func:`~attnquery.metrics.match_neurons`; None otherwise)."""
    match = match_neurons(est.A_, est.w_o_, tf.A, tf.w_o)
    return {
        "rel_err_W": relative_error(est.W_, tf.W),
        "rel_err_v": relative_error(est.v_, tf.v),
        "width_found": int(est.A_.shape[1]),
        "neuron_err": match["rel_err"] if match["same_width"] else None,  # does not apply
    }


# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests), from
# the wall times of the default study on a 2-core machine shared with other work, extrapolated
# with the benchmarks (README) to the sizes of config/paper.yaml.
def seconds(cell) -> float:
    """0.14 s at d = 32, m = 32 (default study): d m."""
    return 0.03 + 1e-4 * cell["d"] * cell["width"]


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {
    "width": pa.int64(),
}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {
    "n_queries_attention": pa.int64(),
    "n_queries_ffn": pa.int64(),
    "func_err_max": pa.float64(),
    "func_err_median": pa.float64(),
    "func_err_ffn": pa.float64(),
    "neuron_err": pa.float64(),
    "width_found": pa.int64(),
}


EXPERIMENT = register(
    Experiment(
        name="transformer",
        cells=cells,
        run=run,
        params=PARAMS,
        metrics=METRICS,
        description="One-layer transformers: antisymmetric queries + bias-free ReLU FFN learner",
        seconds=seconds,
    )
)
