"""Low-rank recovery of a single attention head from value queries (paper Section 5).

Both learners read v from the d one-row queries ``[e_i]`` and then measure bilinear forms
``u^T W b`` of the score matrix with scaled two-row probes ``[(c u + s b); s b]``: the attention
weight on the first row is ``sigma(c s u^T W b)``, so one value query gives one number
``u^T W b`` (see :func:`attnquery.learners.exact.probe_logits`). The scale ``kappa = c s`` is set
from the answers (a pilot batch) so that logits stay where the sigmoid can be inverted; a probe
whose logit is saturated is asked again at a smaller scale and counted in ``n_requeried_``.

* :class:`NuclearNormROPLearner` is Theorem 5.1: m Gaussian rank-one projections
  ``t_k = a_k^T W b_k`` and ``min ||W||_* s.t. <a_k b_k^T, W> = t_k`` in cvxpy, optionally
  polished (truncation to the rank the spectrum shows, then Gauss-Newton on the factors against
  the measurements).
* :class:`SketchLowRankLearner` measures ``W B`` (a random right sketch, read in a coordinate
  basis) and ``A^T W`` (a random left sketch, read against ``[B, e_j]`` so that the core
  ``A^T W B`` is never measured twice), and returns ``W = (W B)(A^T W B)^+ (A^T W)`` as factors.
  With ``k = r`` this is ``r (2d - r) + d`` queries, the degrees of freedom of (W, v).
"""

# the learners live in _nuclear.py and _sketch.py (no name outside them imports their private
# helpers or constants)
from ...theory import lowrank_floor
from ._nuclear import SOLVERS, NuclearNormROPLearner
from ._sketch import SketchLowRankLearner

__all__ = ["NuclearNormROPLearner", "SketchLowRankLearner", "lowrank_floor", "SOLVERS"]
