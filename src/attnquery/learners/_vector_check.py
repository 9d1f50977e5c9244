"""The check of the vector learners' estimates (:class:`~attnquery.learners.VectorLayerLearner`
and its rotary route, :class:`~attnquery.learners.vector_rotary.RotaryVectorLearner`): the
lengths of their fresh check queries and the disagreement they allow, in one place."""

from __future__ import annotations

__all__ = ["CHECK_LENGTHS", "VERIFY_RTOL"]

#: lengths of the fresh check queries after a fit, one query each with the default ``verify``
#: (8) and ``check_length`` (4096; a shorter one replaces the longest, see
#: :func:`~attnquery.learners._base.check_lengths`): long sequences are where a
#: position-dependent or windowed box differs from a head
CHECK_LENGTHS = (1, 2, 3, 8, 64, 256, 1024, 4096)
#: largest relative disagreement ``max |O - O_hat| / max |O|`` the check allows: float64 fits
#: (1 to 4096 tokens) stay at 1e-11 or below (single heads at d = 64: 1.4e-13; 8 heads at
#: d = 16: 1.0e-11); a soft-capped, rotary or undeclared extra head, or answers rounded to
#: float32, exceed it by orders of magnitude
VERIFY_RTOL = 1e-8
