"""Ground-truth heads built from pretrained checkpoints ("real heads").

Head ``h`` of layer ``L`` of a BERT- or GPT-2-style checkpoint (safetensors) gives the
single-head model of the paper, in its convention ``s_i = x_i^T W x_N``:

* the score of token ``i`` seen from the last token is
  ``(W_Q,h x_N) . (W_K,h x_i) / sqrt(d_h) = x_i^T W_K,h^T W_Q,h x_N / sqrt(d_h)``, so
  ``W = W_K,h^T W_Q,h / sqrt(d_h)``, stored as the factors ``K = W_K,h / d_h^(1/4)`` and
  ``Q = W_Q,h / d_h^(1/4)`` (``W = K^T Q``, rank ``d_h``; W is never formed to evaluate);
* the layer's attention output read out along a fixed vector ``r`` is
  ``r^T W_O concat_h(sum_i alpha_i W_V,h x_i) = sum_h sum_i alpha_i x_i^T (W_V,h^T u_h)`` with
  ``u_h`` head h's slice of ``W_O^T r``, so head h's value vector is ``v = W_V,h^T u_h``.

With ``biases=True`` the head keeps the module's biases, exactly (the softmax cancels every
term of the score that does not depend on the attended token i):

* ``(W_Q x_N + b_Q)^T (W_K x_i + b_K) / sqrt(d_h) = x_i^T (W x_N + c) + (terms free of i)`` with
  the key bias ``c = W_K,h^T b_Q,h / sqrt(d_h)`` (``K^T (b_Q,h / d_h^(1/4))``); the key bias
  ``b_K`` only adds terms free of i, so it cancels;
* the value bias adds ``u_h^T b_V,h`` to every answer (the attention weights sum to 1), and the
  output bias adds ``r^T b_O``: the head's offset is ``beta = u_h^T b_V,h + r^T b_O``.

Without biases (the paper's head) they are dropped. :func:`build_layer` builds the whole
layer, every head with its biases, and :class:`ModuleBlackBox` evaluates the module itself from
the checkpoint's raw tensors (a head or the whole layer), as a black box for the learners.

``W_Q,h`` etc. are in PyTorch ``Linear`` orientation (``out x in``): rows ``h d_h : (h + 1) d_h``
of the layer's query, key and value weights. GPT-2's ``Conv1D`` stores its weights transposed
(``in x out``, ``y = x W``) and packs Q, K and V (and their biases) in ``c_attn``; both are
handled.

Checkpoints are read with :func:`safetensors.numpy.load_file` (nothing is unpickled), and head
files are ``.npz`` archives of plain arrays read with ``allow_pickle=False``.

The package's modules (every name is importable from ``attnquery.realheads`` itself):

* :mod:`attnquery.realheads.checkpoints`: reading, writing and fetching checkpoints;
* :mod:`attnquery.realheads.readout`: heads and layers read out along a vector;
* :mod:`attnquery.realheads.blackbox`: :class:`ModuleBlackBox`, the module itself;
* :mod:`attnquery.realheads.io`: head and layer files;
* :mod:`attnquery.realheads.gguf_files`: Llama-architecture GGUF files (llama.cpp's format),
  dequantized, and the named real checkpoints (``"smollm2-135m"``);
* :mod:`attnquery.realheads.decoder`: a decoder layer's attention module and the attention
  half of the layer (through its RMSNorm) as vector boxes;
* :mod:`attnquery.realheads.rotary`: rotary grouped-query layers of Llama- and Qwen2-layout
  safetensors checkpoints (beyond the paper).
"""

from __future__ import annotations

from .blackbox import ModuleBlackBox
from .checkpoints import (
    Checkpoint,
    cached_checkpoint,
    checkpoint_files,
    extract_member,
    fetch_checkpoint,
    load_checkpoint,
    sha256_file,
    write_test_checkpoint,
)
from .decoder import NormedResidualAttention, attention_half, attention_module, rms_norm
from .gguf_files import (
    GGUF_VERSION,
    NAMED_CHECKPOINTS,
    LlamaCheckpoint,
    NamedCheckpoint,
    cached_gguf,
    gguf_file,
    load_gguf,
    named_checkpoint_path,
    permute_rows,
    read_gguf_tensor,
    rope_interleaved,
    unpermute_rows,
    write_test_gguf,
)
from .io import (
    load_head,
    load_layer,
    load_vector_layer,
    save_head,
    save_layer,
    save_vector_layer,
)
from .readout import (
    READOUTS,
    build_head,
    build_layer,
    head_from_checkpoint,
    head_summary,
    layer_from_checkpoint,
    readout_vector,
)
from .rotary import PREFIX, load_rotary_head, load_rotary_layer, write_rotary_checkpoint

__all__ = [
    "Checkpoint",
    "load_checkpoint",
    "checkpoint_files",
    "cached_checkpoint",
    "readout_vector",
    "build_head",
    "build_layer",
    "head_from_checkpoint",
    "layer_from_checkpoint",
    "ModuleBlackBox",
    "save_head",
    "load_head",
    "load_vector_layer",
    "save_vector_layer",
    "save_layer",
    "load_layer",
    "head_summary",
    "READOUTS",
    "write_test_checkpoint",
    "fetch_checkpoint",
    "extract_member",
    "sha256_file",
    "GGUF_VERSION",
    "LlamaCheckpoint",
    "NamedCheckpoint",
    "NAMED_CHECKPOINTS",
    "load_gguf",
    "cached_gguf",
    "read_gguf_tensor",
    "gguf_file",
    "named_checkpoint_path",
    "permute_rows",
    "unpermute_rows",
    "rope_interleaved",
    "write_test_gguf",
    "attention_module",
    "attention_half",
    "NormedResidualAttention",
    "rms_norm",
    "write_rotary_checkpoint",
    "load_rotary_layer",
    "load_rotary_head",
    "PREFIX",
]
