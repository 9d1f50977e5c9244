"""Ground-truth models: single-head attention, multi-head attention, one-layer transformers,
and rotary heads and layers.

All models map a batch of inputs ``X`` of shape ``(B, N, d)`` (float64, the last row of each input
is the query token) to outputs of shape ``(B,)``. They are plain callables, so any of them can be
wrapped by an oracle from :mod:`attnquery.oracles`; a learner never sees the model object itself.

Every generator is a pure function of its parameters and a seed (an int, a sequence of ints, or a
``numpy.random.Generator``).

Notation follows the paper (Section 3): scores ``s_i = x_i^T W x_N``, attention weights
``alpha = softmax(s)``, output ``f(X) = alpha^T (X v)``.

The package's modules (every name is importable from ``attnquery.models`` itself):

* :mod:`attnquery.models.heads`: :class:`AttentionHead` and the batch conventions
  (:func:`check_input`, :func:`softmax_last`, :func:`run_starts`);
* :mod:`attnquery.models.layers`: :class:`MultiHeadAttention`;
* :mod:`attnquery.models.transformer`: :class:`OneLayerTransformer`;
* :mod:`attnquery.models.rotary`: :class:`RotaryAttentionHead`, :class:`RotaryAttentionLayer`
  (beyond the paper);
* :mod:`attnquery.models.generators`: the seeded generators;
* :mod:`attnquery.models.vector`: :class:`VectorAttentionLayer` and :class:`RotaryFormLayer`,
  layers that answer every token's output vector (B, N, d_out) or the last token's (B, d_out),
  as a served module does, and their generator :func:`random_vector_layer` (beyond the paper).
"""

from __future__ import annotations

from ..rng import as_rng
from ..theory import NON_IDENTIFIABLE_CONSTRUCTIONS
from .generators import (
    assumptions_met,
    membership_head,
    non_identifiable_pair,
    orthogonal_subspace_multihead,
    random_head,
    random_multihead,
    random_orthogonal_split,
    random_rotary_head,
    random_rotary_layer,
    random_transformer,
    random_v,
    theorem_head,
)
from .heads import AttentionHead, check_input, run_starts, softmax_last
from .heads import sparse_aware_matmul as sparse_aware_matmul
from .layers import MultiHeadAttention
from .rotary import (
    RotaryAttentionHead,
    RotaryAttentionLayer,
    rope_frequencies,
    rotate_half,
)
from .rotary import _rotary_frequencies_arg as _rotary_frequencies_arg
from .transformer import OneLayerTransformer
from .vector import (
    OUTPUTS,
    RotaryFormLayer,
    VectorAttentionLayer,
    bilinear_layer,
    random_vector_layer,
    rms_norm,
)

# beside __all__, sparse_aware_matmul and _rotary_frequencies_arg are imported from here too
__all__ = [
    "AttentionHead",
    "MultiHeadAttention",
    "OneLayerTransformer",
    "softmax_last",
    "run_starts",
    "check_input",
    "random_head",
    "random_v",
    "theorem_head",
    "assumptions_met",
    "membership_head",
    "as_rng",
    "random_transformer",
    "random_multihead",
    "random_orthogonal_split",
    "orthogonal_subspace_multihead",
    "non_identifiable_pair",
    "NON_IDENTIFIABLE_CONSTRUCTIONS",
    "RotaryAttentionHead",
    "RotaryAttentionLayer",
    "rope_frequencies",
    "rotate_half",
    "random_rotary_head",
    "random_rotary_layer",
    "VectorAttentionLayer",
    "RotaryFormLayer",
    "bilinear_layer",
    "rms_norm",
    "random_vector_layer",
    "OUTPUTS",
]
