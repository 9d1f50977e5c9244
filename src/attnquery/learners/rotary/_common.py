"""The rotary learner's constants, stages and query counts (:mod:`attnquery.learners.rotary`).

Every module of the rotary learner reads its tolerances and budget factors from here; the
counts are those of the module docstring of :mod:`attnquery.learners.rotary`.
"""

from __future__ import annotations

#: the stages ``n_queries_by_stage_`` counts: v (and the answers' constant), the biases'
#: zero-token probes (``fit_bias``), the form M_{-1} (and the constants b^T M_0 b), the form
#: M_{-2} on M_{-1}'s spaces, the pilot column of M_{-1} and the forms' smallest rows asked
#: again (``refine``), the check
STAGES = ("v", "bias", "M1", "M2", "refine", "verify")

#: sequence lengths of the check queries: short ones and long ones (up to 4,096 tokens)
VERIFY_LENGTHS = (2, 3, 64, 4096)
#: an eigenvalue of T whose modulus differs from 1 by more than this is not a rotation
UNIT_TOL = 1e-6
#: an eigenvalue whose angle is below this (in radians) belongs to a dimension not rotated
PASS_TOL = 1e-9
#: the check allows ``CHECK_FACTOR eps cond(M_{-1}) N`` (relative) on sequences of N tokens
CHECK_FACTOR = 4.0
#: largest disagreement between the measured angles and the frequencies of ``rope_base``
FREQ_TOL = 1e-6
#: ``refine="auto"`` asks the pilot column again when ``cond(M_{-1})`` reaches this (square
#: heads, whose error at long offsets is the rounding of the forms times the condition number)
REFINE_CONDITION = 100.0
#: the long offset of a served head must spread the eigenvalues of ``T^(L-1)`` at least this far
#: apart on the unit circle (radians), and farther than T's
REFINE_MIN_SEPARATION = 1e-3
#: served answers (float32 values): eigenvalues of T may leave the unit circle by this much,
#: and singular values of ``M_{-1}`` below ``SERVED_RANK_FACTOR u`` (u the format's unit
#: roundoff) times the largest are noise
SERVED_UNIT_TOL = 1e-3
SERVED_RANK_FACTOR = 1e3
#: the served route's goal, and what its check allows: the functional relative error
#: ``max |f_hat - f| / max |f|`` on the check sequences of each length on its own (issue 23's
#: float32 goal); a fit beyond it on any length raises ModelMismatchError
SERVED_RTOL = 1e-5
#: check lengths of a served head (when ``verify_lengths`` is the default) and its check
#: queries (at least; ``verify=0`` asks none): 8 per length, so that each length's largest
#: answer is not a chance small one
SERVED_VERIFY_LENGTHS = (2, 16, 256, 1024, 4096)
SERVED_VERIFY = 40
#: the served route's default budget (``n_queries=None``), with the check: this times
#: ``d^2 + d``
SERVED_QUERY_FACTOR = 8
#: extra measurements of ``M_{-1}`` (averaged) and blocks ``T^(L-1)`` (other offsets) a served
#: head may spend its budget on: at most ``SERVED_M1_REPEATS`` repeats, after
#: ``SERVED_MIN_BLOCKS`` blocks are reserved; then blocks up to ``SERVED_MAX_BLOCKS``
SERVED_M1_REPEATS = 4
SERVED_MIN_BLOCKS = 4
SERVED_MAX_BLOCKS = 8
#: the blocks' probes have at most this many tokens (offsets L < it): an engine's rounding of
#: the softmax over the L - 1 zero tokens grows with L (onnxruntime's float32 kernels: the
#: blocks' spread 6.6e-6 at L = 4,095, 3.4e-6 at 1,011, 1e-6 at 247)
SERVED_MAX_OFFSET = 1024
#: what a probe that gives no usable logit at any scale says of the box
_NO_HEAD = ("the answers are not those of an attention head: some attention weights fall "
            "outside (0, 1) at every probe scale")
_NO_POSITIVE_WEIGHT = ("the answers are not those of a rotary head: a probe over zero tokens "
                       "has no positive attention weight for its first token at any scale")


def rotary_query_count(d: int, rank: int | None = None, oversample: int = 8,
                       bias: bool = False) -> int:
    """Queries the learner spends on an ordinary head (no probe asked twice, no check).

    ``2 d^2 + 2 d`` on the dense route (``2 d^2 + 5 d + 3`` with ``bias``, i.e.
    ``fit_bias=True``); ``d (k + 2 r + 3) + r^2 + 2 r`` (k = r + oversample) with ``rank=r``.
    """
    if rank is None:
        return 2 * d * d + 2 * d + (3 * d + 3 if bias else 0)
    k = min(d, rank + oversample)
    return d * (k + 2 * rank + 3) + rank * rank + 2 * rank


def rotary_refine_count(d: int) -> int:
    """Queries of the refinement (module docstring, "Refinement"): the pilot column of
    ``M_{-1}`` asked again at the learnt logit scale, ``d + 1``."""
    return d + 1


def rotary_refine_rows(d: int) -> int:
    """Rows of ``M_{-1}`` and ``M_{-2}`` the refinement asks again at their own scales (module
    docstring, "Refinement"): the most that fit, with the pilot column, in ``0.2 (d^2 + d)``
    queries, ``2 d`` each (5 at d = 64, 2 at d = 32, 1 at d = 16, 0 below d = 11)."""
    return max(0, ((d * d + d) // 5 - d - 1) // (2 * d))


def rotary_dof(d: int, head_dim: int, rotary_dim: int, positions: bool = True) -> int:
    """Identifiable parameters of a rotary head (factors modulo the gauge, frequencies, v).

    ``2 d d_h - R - (d_h - R)^2 + R/2 + d``; with ``positions=False`` the paper's head of rank
    d_h, ``2 d d_h - d_h^2 + d``.
    """
    if not positions:
        return 2 * d * head_dim - head_dim ** 2 + d
    R = rotary_dim
    return 2 * d * head_dim - R - (head_dim - R) ** 2 + R // 2 + d
