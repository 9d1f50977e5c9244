"""Recovery of a single attention head from low-precision answers (beyond the paper).

Serving stacks answer in float16 or bfloat16, or round to a few digits. Such answers are exact up
to a deterministic error of relative size about ``eps`` (``2^-11`` for float16, ``2^-8`` for
bfloat16, ``0.5 * 10^(1-k)`` for k significant digits): asking the same query again teaches
nothing, but distinct probes have errors that behave like independent noise, and averaging them
lowers the error like ``1 / sqrt(queries)``.

The measurement is an antipodal pair of two-row probes with a shared last token ``s e_j``::

    X(+u) = [( c u + s e_j); s e_j],     X(-u) = [(-c u + s e_j); s e_j].

With ``alpha = sigma(t)``, ``t = c s u^T W e_j`` and ``beta = s v_j``, a single head answers
``y(+u) = beta + alpha c u^T v`` and ``y(-u) = beta - (1 - alpha) c u^T v``, so

    t = log((y(+u) - beta) / (beta - y(-u))),     y(+u) - y(-u) = c u^T v.

The logit is a ratio of two answers: a relative error ``e`` in each answer moves it by about
``e(+u) - e(-u)``, whatever ``t`` is (no margin on v and no sigmoid slope enter), and ``beta`` is
kept below ``1e-3 |c u^T v|`` by the ratio ``c / s``, so v need only be known roughly. The
difference of the pair measures ``u^T v`` with the answers' relative precision and does not
depend on W at all (for any sum of heads too): its scatter over the columns that share ``u``
estimates the answers' relative noise (``noise_level_``) from residuals, without assuming the box
is a single head, and its average gives v.

Structure: the directions ``u_1..u_d`` are one random orthonormal basis reflected so that every
``|u_l^T v|`` is the same (:func:`~attnquery.learners._probes.balanced_orthonormal`), so
``W = U^T T`` where ``T_lj = u_l^T W e_j``. Every entry ``T_lj`` is measured by one pair per pass
over the d x d entries, each pass at a scale ``kappa`` (the logit's) and an answer size drawn
afresh per column (the answers of two passes then sit at unrelated places of the rounding grid,
so their errors are unrelated); a final partial pass covers a random subset of the directions.
Each entry is the weighted mean of its measurements (weights ``kappa^2``, the inverse variances),
which is the exact weighted least-squares solution; their scatter is the logits' residual. The
pairs of a column share their last token (a box that caches per-token work evaluates ``W e_j``
once per column), memory is ``O(d^2)`` besides one batch, and time is ``O(n_queries d)``.

Errors: under relative noise of size sigma each pair measures ``t`` with variance ``2 sigma^2``,
so with the scale of column j chosen to put its root-mean-square logit at ``target_logit``, the
relative error of W is about ``sqrt(2) sigma / (target_logit sqrt(k))`` after k passes (``2 k``
queries per entry of W). The learner computes this from its own residuals (``W_error_estimate_``)
and checks its estimate against the oracle on fresh random queries
(:meth:`~attnquery.learners._base.BaseLearner._verify_fit`) with a tolerance built from the
answers' noise, so a box that is not a single head raises
:class:`~attnquery.errors.ModelMismatchError` while rounded answers of a single head pass.
Where every answer is a float32, float16 or bfloat16 value, that noise is first judged against
what the format's rounding explains (:func:`~attnquery.learners._base.judge_noise`): a box
that is not a head shows its misfit as noise, which would otherwise widen the check's
tolerance with it (``noise`` parameter).

With ``fit_bias=True`` the head may carry a key bias and an offset, as a served module's head
does (docs/served.md): the offset is averaged from one-token answers and cancelled by a shift of
every probe along v, the key bias is measured in the probe basis with pairs whose last token is
that shift and taken out of every logit, the probes' scale is capped so that the bias's part of
a logit stays small and its sign opposes the measured part, every pair is weighed by its
inverse variance, and logits stay within 8: in a box computed in float32, float16 or bfloat16
the scores' own rounding, of order ``eps |k| |q|``, is what limits the precision. Where W's rank
is below 48 and d above it, the shift is then moved within W's row space until ``W z + c = 0``
(the query bias cancelled in the query vector itself), which frees the probes' scale from the
key bias's cap; their answer size is then chosen by the measured scatter of repeated probes,
and W, of rank r, is measured from both sides of its sketch (``U W R`` along its row space R
and ``B W`` along its column space and v), ``r (2d - r) + d`` entries instead of ``d^2``: each
is asked often enough that its pairs' scale can be set from its own estimate (all at one
logit, chosen by the same measured scatter) and its last-token signs alternate from pass to
pass (errors that flip with the sign, such as the key bias's, cancel instead of averaging).

Floating-point formats carry more absolute precision near zero than near their largest answers;
this learner does not exploit that (it treats every answer as carrying the same relative noise),
so its query counts are what an attacker pays when the answers' errors are relative noise.

Layout: :class:`LowPrecisionValueQueryLearner` (``_learner``) is the public entry; with
``fit_bias=True`` it runs the bias route, :class:`BiasedLowPrecisionLearner` (``_biased``),
and takes its fitted attributes. Both sequence shared measurement modules: the pair probes
(``_pairs``: :func:`pair_logits`, the frozen probe design ``Probes`` and the ``Channel`` the
answers come through, whose ledger is the fit's one budget), the entry estimates
(``_entries``), the noise model (``_noise``), the passes over every entry and the solve
(``_passes``), the bias route's stages (``_bias``) and the rank-r sketch (``_sketch``); the
constants are in ``_constants``.
"""

from __future__ import annotations

from ._biased import BiasedLowPrecisionLearner

# the constants other modules and tests read from this package's old single module
from ._constants import _BIAS_MAX_LOGIT as _BIAS_MAX_LOGIT
from ._constants import _CANCEL_SIZES as _CANCEL_SIZES
from ._constants import _KAPPA_DITHER as _KAPPA_DITHER
from ._constants import _SKETCH_LOGITS as _SKETCH_LOGITS
from ._constants import MAX_NOISE_LEVEL, STAGES
from ._learner import LowPrecisionValueQueryLearner
from ._pairs import pair_logits

__all__ = ["LowPrecisionValueQueryLearner", "BiasedLowPrecisionLearner", "pair_logits",
           "MAX_NOISE_LEVEL", "STAGES"]
