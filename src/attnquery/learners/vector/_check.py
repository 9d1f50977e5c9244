"""The check of the vector learners' estimates (:class:`~attnquery.learners.VectorLayerLearner`
and its rotary routes, :class:`~attnquery.learners.vector.rotary.RotaryVectorLearner` and
:class:`~attnquery.learners.vector.rotary_layer.RotaryLayerVectorLearner`): the lengths of their
fresh check queries and the disagreement they allow, in one place, and the rotary routes'
check (:func:`verify_fit`)."""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError, ModelMismatchError
from .._base import check_oracle
from .._check import check_queries

__all__ = ["CHECK_LENGTHS", "VERIFY_RTOL", "verify_fit", "vector_oracle"]

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


def vector_oracle(oracle) -> tuple[int, str]:
    """The oracle's d and outputs; ConfigError unless it is a vector oracle of every token's
    outputs or the last token's that counts its tokens (as the vector learners need)."""
    d = check_oracle(oracle, kinds=("vector",))
    outputs = getattr(oracle, "outputs", None)
    if outputs not in ("all", "last"):
        raise ConfigError("the vector learners read every token's outputs or the last token's: "
                          f"the oracle's outputs must be 'all' or 'last'; got {outputs!r}")
    if not hasattr(oracle, "n_tokens"):
        raise ConfigError(f"the oracle must count its tokens (n_tokens), as VectorOracle "
                          f"does; got {type(oracle).__name__}")
    return d, outputs


def verify_fit(est, oracle, rng, n: int, lengths, what: str,
               allowed: float = VERIFY_RTOL, token_scale: float = 1.0) -> None:
    """``n`` fresh queries spread over ``lengths`` (0: no check), their tokens of norm about
    ``token_scale``: sets ``est.verify_error_`` (``max |O - O_hat| / max |O|``) and
    ``est.n_verify_queries_``, and raises ModelMismatchError ("the box is not ``what``") beyond
    ``allowed`` (default :data:`VERIFY_RTOL`; the served route's is a multiple of its format's
    floor, on tokens of norm 2)."""
    est.verify_error_, est.n_verify_queries_ = float("nan"), 0
    if n == 0:
        return
    worst, scale, at = 0.0, 0.0, 0
    for X in check_queries(rng, int(oracle.d), int(n), token_scale=token_scale,
                           lengths=lengths, permuted=False):
        O = np.asarray(oracle(X), dtype=np.float64)
        est.n_verify_queries_ += X.shape[0]
        diff = float(np.max(np.abs(O - est.predict(X))))
        scale = max(scale, float(np.max(np.abs(O))))
        if diff > worst:
            worst, at = diff, X.shape[1]
    est.verify_error_ = worst / scale if scale > 0 else worst
    if not est.verify_error_ <= allowed:
        raise ModelMismatchError(
            f"the estimate's outputs differ from the box's by {est.verify_error_:.3g} "
            f"(relative) on {est.n_verify_queries_} check queries of {min(lengths)} to "
            f"{max(lengths)} tokens (the farthest of {at} tokens), where at most "
            f"{allowed:.3g} is expected: the box is not {what}",
            error=est.verify_error_, allowed=allowed, n_checks=est.n_verify_queries_)
