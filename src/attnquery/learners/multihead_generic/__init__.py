"""Multi-head attention from value queries, beyond the paper.

* :class:`MultiHeadLearner` (:mod:`.generic`): generic heads in general position, up to a
  permutation, from line fits (:mod:`.lines`), matching across lines (:mod:`.matching`) and a
  final refit (:mod:`.refit`); practical for a few heads of small dimension.
"""

from .generic import MultiHeadLearner
from .lines import LineFit, TanhSumFit, fit_tanh_sum, predicted_error
from .matching import match_additive, match_by_v
from .refit import head_separation, multihead_eval, multihead_jacobian, refit_heads

__all__ = ["MultiHeadLearner", "fit_tanh_sum",
           "predicted_error", "TanhSumFit", "LineFit", "match_additive", "match_by_v",
           "head_separation", "multihead_eval", "multihead_jacobian", "refit_heads"]
