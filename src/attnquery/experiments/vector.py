"""Experiment "vector": extraction from vector answers against scalar answers (beyond the paper).

A served attention module answers every token's output vector. Each cell draws a random
:class:`~attnquery.models.vector.VectorAttentionLayer` with biases (``random_vector_layer``,
float64) and extracts it from one kind of answer (``variant``):

* ``"scalar"``: the paper's one number per query, the last token's output read out along a
  Gaussian unit vector r (a head with ``v = V r``, key bias c and offset ``beta^T r``), learnt by
  :class:`~attnquery.learners.ExactValueQueryLearner` with ``fit_bias=True`` (d^2 + 2d + 1
  queries; single heads only);
* ``"last"``: the last token's output vector, ``(B, d_out)``;
* ``"all"``: every token's output vector, ``(B, N, d_out)``; both learnt by
  :class:`~attnquery.learners.VectorLayerLearner` (one head, or H heads that fill d).

Queries and tokens are counted by the oracle. ``extra.floor`` is the degrees of freedom over the
numbers one answer holds (1, d_out, or the learner's tokens per query times d_out): no learner
can ask fewer queries. Errors of W, V (v for scalar answers), c and beta are the worst over the
heads (matched by their value maps), the functional error the largest relative difference of the
outputs on fresh sequences of 1 to 256 tokens.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from ..metrics import relative_error
from ._core import Experiment, grid, register
from ._learners import Takes
from ._recipe import fit_and_measure, relative_bias_measure, sequence_error
from ._recipe import match_heads as _match_heads  # noqa: F401 (importable from here)
from ._recipe import value_measure as _value_measure

__all__ = ["cells", "run", "VARIANTS", "degrees_of_freedom", "floor_queries", "CHECK_LENGTHS",
           "BIAS", "GOAL"]

#: the kinds of answers: one number, the last token's output vector, every token's
VARIANTS = ("scalar", "last", "all")
#: standard deviation of every bias of the drawn layers (query, key, value and output)
BIAS = 0.3
#: the issue's goal for float64 fits: W, V (v), c, beta and the function within this (relative)
GOAL = 1e-9
#: lengths of the fresh sequences the functional error is measured on (16 of each)
CHECK_LENGTHS = (1, 2, 8, 64, 256)


#: the learners "vector" runs: its own, and plug-ins that learn a layer from vector answers
#: (``returns="vector layer"``), on the random layers of vector answers (given ``n_heads``)
TAKES = Takes("vector", oracles=("vector",), returns=("vector layer",),
              own=("exact", "vector", "vector_rotary_layer"), gives=("n_heads",))


def cells(cfg) -> list[dict]:
    """Cells: single heads per variant and d, and layers of several heads (vector answers)."""
    out = []
    seeds = list(range(cfg["seeds"]))
    heads = cfg["heads"]
    bad = sorted(set(heads) - set(VARIANTS))
    if bad:
        raise ConfigError(f"experiments.vector.heads: unknown answers {bad}; choose from "
                          f"{VARIANTS}")
    for variant in VARIANTS:
        for g in grid(d=heads.get(variant) or [None], seed=seeds):
            if g["d"] is None:
                break
            out.append(_cell(variant, g["d"], 1, g["seed"]))
    for case in cfg.get("cases") or []:
        for seed in seeds:
            out.append(_case_cell(case, seed))
    layers = cfg.get("layers")
    if layers:
        if "scalar" in layers["answers"]:
            raise ConfigError("experiments.vector.layers.answers: layers are learnt from "
                              "vector answers (last, all); scalar answers learn single heads")
        for g in grid(variant=layers["answers"], d=layers["d"], n_heads=layers["n_heads"],
                      seed=seeds):
            if g["d"] % g["n_heads"]:
                raise ConfigError(f"experiments.vector.layers: n_heads = {g['n_heads']} does "
                                  f"not divide d = {g['d']} (the heads must fill d)")
            out.append(_cell(g["variant"], g["d"], g["n_heads"], g["seed"]))
    return TAKES.join(out, cfg["learners"], "vector",
                      where=lambda c: not c.get("family"))


def _cell(variant: str, d: int, n_heads: int, seed: int) -> dict:
    return {"learner": "exact" if variant == "scalar" else "vector", "variant": variant,
            "d": int(d), "n_heads": int(n_heads), "biases": True, "seed": seed}


#: the cell parameters of a case (``experiments.vector.cases``) beyond d and n_heads, with the
#: value a case leaves out
CASE_DEFAULTS = {"answers": "all", "n_kv_heads": None, "head_dim": None, "key_dim": None,
                 "causal": False, "rope_base": None, "rounding": "float64",
                 "check_length": None}
#: the answers' formats a case may round to (the layer computes in it, summing in float64 and
#: rounding once: the same answers on every machine)
CASE_ROUNDINGS = ("float64", "float32", "float16", "bfloat16")


def _case_cell(case: dict, seed: int) -> dict:
    """One named layer of ``experiments.vector.cases`` (a family the grid does not draw)."""
    c = {**CASE_DEFAULTS, **case}
    d, H = int(c["d"]), int(c["n_heads"])
    G = H if c["n_kv_heads"] is None else int(c["n_kv_heads"])
    where = f"experiments.vector.cases[{c['name']!r}]"
    if H % G:
        raise ConfigError(f"{where}: n_kv_heads = {G} does not divide n_heads = {H}")
    if c["rounding"] not in CASE_ROUNDINGS:
        raise ConfigError(f"{where}: rounding {c['rounding']!r}; choose from {CASE_ROUNDINGS}")
    if c["answers"] not in ("last", "all"):
        raise ConfigError(f"{where}: answers {c['answers']!r}; choose 'last' or 'all'")
    # a rotary layer is read by its own route (its logits are rotary forms, no W to measure)
    learner = "vector_rotary_layer" if c["rope_base"] else "vector"
    return {"learner": learner, "variant": c["answers"], "family": str(c["name"]), "d": d,
            "n_heads": H, "n_kv_heads": G,
            "head_dim": int(c["head_dim"] or d // H),
            "key_dim": None if c["key_dim"] is None else int(c["key_dim"]),
            "causal": bool(c["causal"]), "rope_base": c["rope_base"] and float(c["rope_base"]),
            "rounding": c["rounding"], "goal": _case_goal(c, where), "biases": True,
            "seed": seed,
            # only when given: the cells (and their ids) of cases without it stay as they were
            **({"check_length": int(c["check_length"])} if c["check_length"] else {})}


def _case_goal(c: dict, where: str) -> float:
    """A case's goal: ``goal`` (relative error), or ``goal_floors`` times its format's
    rounding floor (:func:`~attnquery.precision.rounding_floor`, served formats only)."""
    from ..precision import rounding_floor

    if ("goal" in c) == ("goal_floors" in c):
        raise ConfigError(f"{where}: give one of goal (a relative error) or goal_floors "
                          "(multiples of the format's rounding floor)")
    if "goal" in c:
        return float(c["goal"])
    if c["rounding"] == "float64":
        raise ConfigError(f"{where}: goal_floors needs a served format (rounding float32, "
                          "float16 or bfloat16); give goal for float64")
    return float(c["goal_floors"]) * rounding_floor(c["rounding"], int(c["d"]))


def degrees_of_freedom(d: int, n_heads: int, d_out: int, variant: str) -> int:
    """Unknowns of the extracted model with biases: per head W (d^2), c (d) and V (d d_out),
    and beta (d_out); for scalar answers one head's W, c, v (d) and offset (1)."""
    if variant == "scalar":
        return d * d + 2 * d + 1
    return n_heads * (d * d + d + d * d_out) + d_out


def floor_queries(dof: int, numbers_per_answer: int) -> int:
    """The fewest queries whose answers hold ``dof`` numbers."""
    return math.ceil(dof / numbers_per_answer)


def run(cell: dict, rng: np.random.Generator) -> dict:
    """One layer extracted from one kind of answers."""
    from ..models.vector import random_vector_layer

    model_rng, learner_rng, eval_rng = rng.spawn(3)
    if cell.get("family"):
        return _run_case(cell, model_rng, learner_rng, eval_rng)
    d, H, variant = cell["d"], cell["n_heads"], cell["variant"]
    outputs = "last" if variant == "scalar" else variant
    layer = random_vector_layer(d, H, model_rng, bias=BIAS, outputs=outputs)
    if variant == "scalar":
        if H != 1:
            raise ConfigError("scalar answers: single heads only (n_heads = 1)")
        return _run_scalar(layer, learner_rng, eval_rng)
    return _run_vector(layer, variant, learner_rng, eval_rng,
                       TAKES.make(cell, learner_rng, n_heads=H) if TAKES.is_joined(cell)
                       else None)


def _run_scalar(layer, learner_rng, eval_rng) -> dict:
    """The exact learner on the last token's output read out along a Gaussian unit vector."""
    from ..learners import ExactValueQueryLearner
    from ..models import AttentionHead
    from ..oracles import ValueOracle

    d = layer.d
    r = learner_rng.standard_normal(layer.d_out)
    r /= np.linalg.norm(r)
    head = AttentionHead(layer.value_maps()[0] @ r, W=layer.head_W()[0],
                         key_bias=layer.key_bias()[0], offset=float(layer.output_bias @ r))
    oracle = ValueOracle(head, d)
    est = ExactValueQueryLearner(fit_bias=True, random_state=learner_rng)
    m = fit_and_measure(est, oracle, head, measure=relative_bias_measure)
    m["func_err"] = sequence_error(head, est.predict, d, eval_rng, CHECK_LENGTHS)
    dof = degrees_of_freedom(d, 1, layer.d_out, "scalar")
    return _metrics(m, dof, 1, n_tokens=None, tokens_per_query=None)


def _run_vector(layer, variant, learner_rng, eval_rng, est=None) -> dict:
    """VectorLayerLearner (or the joined learner ``est``) on the layer's vector answers."""
    from ..learners import VectorLayerLearner
    from ..oracles import VectorOracle

    d, H = layer.d, layer.n_heads
    oracle = VectorOracle(layer, d, outputs=variant)
    if est is None:
        est = VectorLayerLearner(n_heads=H, random_state=learner_rng)
    m = fit_and_measure(est, oracle, layer, measure=_layer_measure)
    m["func_err"] = sequence_error(layer, est.predict, d, eval_rng, CHECK_LENGTHS)
    N = int(est.tokens_per_query_)
    per_answer = layer.d_out * (N if variant == "all" else 1)
    dof = degrees_of_freedom(d, H, layer.d_out, variant)
    return _metrics(m, dof, per_answer, n_tokens=int(oracle.n_tokens), tokens_per_query=N)


def _run_case(cell, model_rng, learner_rng, eval_rng) -> dict:
    """A named layer (``family``): drawn as the cell says (grouped-query heads, full-rank W,
    a causal mask, rotary positions of ``rope_base``), answering in ``rounding``; errors against
    the float64 layer of the same weights, success when every error is within the case's
    ``goal``."""
    import copy

    from ..learners import VectorLayerLearner
    from ..models.vector import random_vector_layer
    from ..oracles import VectorOracle

    d, H, variant = cell["d"], cell["n_heads"], cell["variant"]
    draw = dict(n_kv_heads=cell["n_kv_heads"], head_dim=cell["head_dim"],
                key_dim=cell["key_dim"], bias=BIAS, causal=cell["causal"],
                outputs=variant)
    if cell["rope_base"]:
        draw["rope_base"] = cell["rope_base"]
    # the box computes in its format; errors are against the float64 layer of the same draw
    truth = random_vector_layer(d, H, copy.deepcopy(model_rng), **draw)
    box = truth if cell["rounding"] == "float64" else random_vector_layer(
        d, H, model_rng, precision=cell["rounding"], **draw)
    oracle = VectorOracle(box, d, outputs=variant)
    rotary = bool(cell["rope_base"])
    check = {"check_length": int(cell["check_length"])} if cell.get("check_length") else {}
    if rotary:  # the case's base, declared (None would measure it from the answers)
        check["rope_base"] = float(cell["rope_base"])
    est = VectorLayerLearner(n_heads=H, n_kv_heads=cell["n_kv_heads"], causal=cell["causal"],
                             positions="rotary" if rotary else "none",
                             random_state=learner_rng, **check)
    m = fit_and_measure(est, oracle, truth,
                        measure=_value_measure if rotary else _layer_measure)
    # a rotary case's function also at the longest sequence its learner checks (its claim)
    longest = (int(est.check_length),) if rotary else ()
    lengths = tuple(sorted(set(CHECK_LENGTHS + CASE_LENGTHS + longest))) if rotary \
        else CHECK_LENGTHS
    m["func_err"] = sequence_error(truth, est.predict, d, eval_rng, lengths)
    N = getattr(est, "tokens_per_query_", None)
    per_answer = truth.d_out * (int(N) if N and variant == "all" else 1)
    dof = layer_parameters(truth)
    out = _metrics(m, dof, per_answer, n_tokens=int(oracle.n_tokens),
                   tokens_per_query=None if N is None else int(N), goal=cell["goal"])
    out["extra"]["check_lengths"] = list(lengths)
    return out


#: estimated seconds of a named case on one loaded core (the Qwen2-style layer at d = 256 with
#: its check to 512 tokens, about 60 s)
CASE_SECONDS = 60.0
#: a rotary case of every token's outputs reads its forms at every offset its check asks: its
#: time grows about as (check_length / 512)^1.2 (measured: the Qwen2-style layer 42 to 59 s at
#: 512 tokens; at 4,096 303 s on an idle core, 1,101 s on a loaded one)
ROTARY_LENGTH_EXPONENT = 1.2
#: rotary cases' functional error also runs over sequences this long (the issue's 1 to 512)
CASE_LENGTHS = (512,)


def layer_parameters(layer) -> int:
    """The weights and biases of a layer (of its queries, keys, values and output): an upper
    bound of its degrees of freedom, the floor's numerator for a named case."""
    return int(sum(np.size(getattr(layer, k)) for k in
                   ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")))


def _layer_measure(est, layer) -> dict:
    """:func:`_value_measure` and the largest relative errors of W and the key bias over the
    heads (matched by their value maps)."""
    perm = _match_heads(est.V_, layer.value_maps())
    W, c = layer.head_W()[perm], layer.key_bias()[perm]
    return {
        "rel_err_W": max(relative_error(est.W_[h], W[h]) for h in range(len(W))),
        **_value_measure(est, layer, perm),
        "rel_err_c": max(relative_error(est.key_bias_[h], c[h]) for h in range(len(c))),
    }


#: the errors a cell's success asks to be at most GOAL
_ERRORS = ("rel_err_W", "rel_err_v", "rel_err_c", "rel_err_offset", "func_err")


def _metrics(m, dof, per_answer, n_tokens, tokens_per_query, goal=GOAL) -> dict:
    total = m["n_queries"] + m["verify_queries"]
    floor = floor_queries(dof, per_answer)
    return {
        **m,
        "success": bool(max(m[k] for k in _ERRORS if m.get(k) is not None) <= goal),
        "extra": {"queries_total": total, "n_tokens": n_tokens, "dof": dof,
                  "numbers_per_answer": per_answer, "floor": floor,
                  "floor_ratio": total / floor, "tokens_per_query": tokens_per_query},
    }


# Estimated seconds per cell on one core (a loaded 2-core machine): the vector learner's normal
# equations of d (d + 1) unknowns and its check queries of up to 4096 tokens: 1 s at d = 8,
# 3 s at d = 32, 6 to 13 s at d = 64; a layer of 2 heads at d = 16 (its split) 1 to 6 s; the
# exact learner well under a second.
def seconds(cell) -> float:
    """About 1 s plus (d / 24)^3 s for vector answers, 0.1 s for scalar ones, more per head."""
    if cell.get("family"):
        if cell.get("rope_base") and cell["variant"] == "all":
            from ..learners._check import CHECK_LENGTH

            length = cell.get("check_length") or CHECK_LENGTH
            return CASE_SECONDS * (length / 512) ** ROTARY_LENGTH_EXPONENT
        return CASE_SECONDS
    if cell["variant"] == "scalar":
        return 0.1 + (cell["d"] / 512) ** 2.2
    return 1.0 + (cell["d"] / 24) ** 3 + 3.0 * (cell["n_heads"] - 1)


#: the result columns of this module's cell parameters (beyond the shared ones of
#: :mod:`attnquery.results`)
PARAMS: dict[str, pa.DataType] = {
    "head_dim": pa.int64(),
    "key_dim": pa.int64(),
    "causal": pa.bool_(),
    "goal": pa.float64(),
}
#: the result columns of this module's metrics (beyond the shared ones)
METRICS: dict[str, pa.DataType] = {}


EXPERIMENT = register(Experiment(
    name="vector", cells=cells, run=run, params=PARAMS, metrics=METRICS,
    description="Extraction from vector answers (every token's output, the last token's) "
    "against scalar answers: queries and tokens counted by the oracle against d and the floor",
    seconds=seconds,
))
