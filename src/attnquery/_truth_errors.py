"""Errors of a learned head or layer against a simulation's ground truth (what
:func:`attnquery.extraction.run_extraction` reports when the truth is known): parameters
matched head by head, up to the gauge where only that is identifiable, and the function."""

from __future__ import annotations

import numpy as np

from .errors import ConfigError

__all__ = ["_errors", "_form"]


def _errors(learned, truth, d: int) -> dict:
    """Errors of a learned head or layer against the ground truth (simulations)."""
    from .metrics import functional_error, head_errors, layer_errors, relative_error
    from .models import MultiHeadAttention, RotaryAttentionHead
    from .models.vector import RotaryFormLayer, VectorAttentionLayer

    out = {}
    if hasattr(truth, "folded"):  # behind a norm (NormedResidualAttention): up to the gauge
        if getattr(learned, "norm_eps", None) is None:
            raise ConfigError("the ground truth reads its inputs through an RMS norm: extract "
                              "it with --param input_norm=rms --param residual=true")
        out.update(_vector_errors(learned, truth.folded(learned.norm_scale)),
                   rel_err_norm_eps=relative_error(learned.norm_eps, truth.eps))
    elif isinstance(truth, VectorAttentionLayer | RotaryFormLayer):
        out.update(_vector_errors(learned, truth))
    elif isinstance(learned, RotaryAttentionHead) or isinstance(truth, RotaryAttentionHead):
        out.update(_rotary_errors(learned, truth))
    elif isinstance(truth, MultiHeadAttention):
        if not isinstance(learned, MultiHeadAttention) or learned.rotary != truth.rotary:
            raise ConfigError("the ground truth is a layer" + (" of rotary heads" * truth.rotary)
                              + ": extract it with --method layer"
                              + (" --param positions=rotary" * truth.rotary))
        m = layer_errors(*_head_parameters(learned), *_head_parameters(truth))
        out.update(rel_err_W=m["max_rel_err_W"], rel_err_v=m["max_rel_err_v"],
                   rel_err_c=m["max_rel_err_c"],
                   rel_err_W_heads=m["rel_err_W"].tolist(),
                   matched=m["perm"].tolist())
        out["rel_err_offset"] = relative_error(learned.total_offset, truth.total_offset)
        if truth.rotary:  # the forms far away too, as for one rotary head
            out["rel_err_M_4095"] = max(
                relative_error(_form(learned.heads[i], -4095), _form(h, -4095))
                for h, i in zip(truth.heads, m["perm"], strict=True))
    else:
        out.update(head_errors(learned.W, learned.v, truth.W, truth.v))
        if truth.has_bias or learned.has_bias:
            out["rel_err_c"] = relative_error(learned.key_bias, truth.key_bias)
            out["rel_err_offset"] = relative_error(learned.offset, truth.offset)
    out["func_err"] = functional_error(truth, learned, d, np.random.default_rng(0), n=64)
    return out


def _vector_errors(learned, truth) -> dict:
    """Errors of a learned vector layer against the truth (both VectorAttentionLayer): each
    true head's W, V and c against the learned head matched to it (the heads' order is not
    identifiable), the worst head's, and the output bias's."""
    from .metrics import layer_errors, relative_error, rotary_layer_errors
    from .models.vector import RotaryFormLayer, VectorAttentionLayer

    if not isinstance(learned, VectorAttentionLayer | RotaryFormLayer):
        raise ConfigError("the ground truth is a vector layer: extract it with --answers")
    if truth.rotary or learned.rotary:
        if not (truth.rotary and learned.rotary):
            raise ConfigError("the ground truth is a vector layer "
                              f"{'with' if truth.rotary else 'without'} rotary positions: "
                              "extract it with --param positions="
                              f"{'rotary' if truth.rotary else 'none'}")
        m = rotary_layer_errors(learned, truth)
        return {**{f"rel_err_M_{-k}": v for k, v in m.pop("rel_err_M").items()}, **m}
    V_hat, V = learned.value_maps(), truth.value_maps()
    m = layer_errors(list(learned.head_W()), [a.ravel() for a in V_hat],
                     list(learned.key_bias()), list(truth.head_W()), [a.ravel() for a in V],
                     list(truth.key_bias()))
    return {"rel_err_W": m["max_rel_err_W"], "rel_err_V": m["max_rel_err_v"],
            "rel_err_c": m["max_rel_err_c"], "rel_err_W_heads": m["rel_err_W"].tolist(),
            "matched": m["perm"].tolist(),
            "rel_err_output_bias": relative_error(learned.output_bias, truth.output_bias)}


def _head_parameters(layer) -> tuple[list, list, list]:
    """Every head's form at offset -1 (W without positions), v and key bias (a rotary head's
    at offset 0, ``scale W_K^T b_Q``), as :func:`~attnquery.metrics.layer_errors` takes them."""
    heads = layer.heads
    return ([_form(h, -1) for h in heads], [h.v for h in heads],
            [h.scale * h.W_K.T @ h.b_Q if layer.rotary else h.key_bias for h in heads])


def _form(head, delta: int = -1) -> np.ndarray:
    """The bilinear form of a head at the offset ``delta``: ``M_delta`` of a rotary head, W
    (the same at every offset) of a head without positions."""
    return head.M(delta) if hasattr(head, "M") else head.W


def _rotary_errors(learned, truth) -> dict:
    """Errors of a rotary head (or of a head without positions, a rotary head with R = 0)
    against the ground truth: the forms at offsets -1 and -4095 and v."""
    from .metrics import relative_error

    if isinstance(learned, list) or not hasattr(learned, "v") or not hasattr(truth, "v"):
        raise ConfigError("--method rotary learns one head: the ground truth must be one head")
    out = {"rel_err_W": relative_error(_form(learned), _form(truth)),
           "rel_err_M_4095": relative_error(_form(learned, -4095), _form(truth, -4095)),
           "rel_err_v": relative_error(learned.v, truth.v)}
    return out
