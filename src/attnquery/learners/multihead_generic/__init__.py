"""Multi-head attention from value queries, beyond the paper.

* :class:`MultiHeadLearner` (:mod:`.generic`): generic heads in general position, up to a
  permutation, from line fits (:mod:`.lines`), matching across lines (:mod:`.matching`) and a
  final refit (:mod:`.refit`); practical for a few heads of small dimension.
* :class:`AttentionLayerLearner` (:mod:`.layer`): a whole attention layer of a real model, many
  heads of rank ``d / n_heads`` with their biases; each head is isolated by its value vector and
  measured with the single-head probes.
"""

from .generic import MultiHeadLearner
from .layer import AttentionLayerLearner, layer_dof, layer_probe_count
from .lines import LineFit, TanhSumFit, fit_tanh_sum, predicted_error
from .matching import match_additive, match_by_v
from .refit import head_separation, multihead_eval, multihead_jacobian, refit_heads

__all__ = ["MultiHeadLearner", "AttentionLayerLearner", "layer_dof",
           "layer_probe_count", "fit_tanh_sum",
           "predicted_error", "TanhSumFit", "LineFit", "match_additive", "match_by_v",
           "head_separation", "multihead_eval", "multihead_jacobian", "refit_heads"]
