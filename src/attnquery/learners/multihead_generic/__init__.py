"""Multi-head attention from value queries, beyond the paper.

* :class:`MultiHeadLearner` (:mod:`.generic`): generic heads in general position, up to a
  permutation, from line fits (:mod:`.lines`), matching across lines (:mod:`.matching`) and a
  final refit (:mod:`.refit`); practical for a few heads of small dimension.
* :class:`AttentionLayerLearner` (:mod:`.layer`): a whole attention layer of a real model, many
  heads of rank ``d / n_heads`` with their biases; each head is isolated by its value vector and
  measured with the single-head probes. It picks one estimator per route from its parameters
  and fits it: :class:`ExactLayerLearner` (:mod:`.exact_layer`, exact answers),
  :class:`ServedLayerLearner` (:mod:`.served_layer`, served answers within ``n_queries``,
  ``route="served"``) and
  :class:`~.rotary_layer.RotaryLayerLearner` (``positions="rotary"``), over
  the shared measurement modules :mod:`.scan` (the circle scan) and :mod:`.heads` (the
  isolated heads and their missing directions).
"""

from .exact_layer import ExactLayerLearner
from .generic import MultiHeadLearner
from .layer import AttentionLayerLearner, RotaryLayerLearner, layer_dof, layer_probe_count
from .lines import LineFit, TanhSumFit, fit_tanh_sum, predicted_error
from .matching import match_additive, match_by_v
from .refit import head_separation, multihead_eval, multihead_jacobian, refit_heads
from .served_layer import ServedLayerLearner

__all__ = ["MultiHeadLearner", "AttentionLayerLearner", "ExactLayerLearner",
           "ServedLayerLearner", "RotaryLayerLearner", "layer_dof",
           "layer_probe_count", "fit_tanh_sum",
           "predicted_error", "TanhSumFit", "LineFit", "match_additive", "match_by_v",
           "head_separation", "multihead_eval", "multihead_jacobian", "refit_heads"]
