"""The public entry of the low-precision learner: :class:`LowPrecisionValueQueryLearner`, which
runs the paper's head itself (``fit_bias=False``) and hands ``fit_bias=True`` to its bias
route, :class:`~attnquery.learners.lowprecision.BiasedLowPrecisionLearner`, taking that
estimator's fitted attributes."""

from __future__ import annotations

import numpy as np

from .._base import CHECK_LENGTH, DEFAULT_VERIFY, check_oracle
from .._probes import balanced_orthonormal, check_v, read_v
from .._registry import LearnerSpec
from ._biased import BiasedLowPrecisionLearner
from ._common import LowPrecisionBase, min_queries
from ._constants import STAGES
from ._pairs import Channel, Probes
from ._passes import full_passes, solve


class _BiasRoute(BiasedLowPrecisionLearner):
    """:class:`BiasedLowPrecisionLearner` as ``LowPrecisionValueQueryLearner(fit_bias=True)``
    runs it: its refusals and warnings name the public entry (they name
    ``type(self).__name__``)."""


_BiasRoute.__name__ = "LowPrecisionValueQueryLearner"


class LowPrecisionValueQueryLearner(LowPrecisionBase):
    """Recovery of (W, v) from answers rounded to low precision, with a given query budget.

    Parameters
    ----------
    n_queries : int
        Queries the learner may spend, the check queries included; at least
        :meth:`min_queries` (one probe pair per entry of W, about ``2 d^2``). What is left after
        v (d one-row queries), the scale search and the check goes to passes of ``2 d^2``
        queries over every entry of W and a last partial pass; fewer than ``4 d`` queries may
        stay unspent.
    rank : int, optional
        Rank of W. Given, the estimate is truncated to it (``W_factors_``); without it the rank
        is the number of singular values above ``2 / sqrt(3)`` times the spectral edge of the
        noise the learner estimated (a hard threshold in the manner of Gavish and Donoho), and W
        is returned as factors when that rank is below d.
    random_state : int, sequence of ints, Generator or None
        Seed of the probe directions and scales, and (an independent stream) of the check
        queries.
    target_logit : float
        Root-mean-square logit ``|t|`` the probes of a column aim at once its scale is known.
        The error of W falls like ``1 / target_logit`` under relative noise; larger values ask
        more pairs again (those beyond ``max_logit``). 2.5 gave the smallest errors at a fixed
        budget among 1.5, 2, 2.5 and 3 on random and MiniLM heads once those re-asked pairs fit
        the smallest budgets (3 asks about 0.7% of the pairs again).
    answer_scale : float
        Smallest size ``|c u^T v|`` of the answers (float16 answers then stay within its normal
        range, 6e-5 to 65504, for logits up to ``max_logit``). It grows where the last token's
        own value ``s v_j`` would not be negligible, and each pass after the first multiplies a
        column's answer size by a factor drawn log-uniformly in [1, 10]; answers never exceed
        1e4.
    max_logit : float
        A pair whose ``|t|`` exceeds this (or whose ratio is not positive) is asked again at a
        tenth of the scale.
    initial_logit_scale : float
        Scale ``c s`` of the first probes, before any answer has shown the model's scale.
    pilot_rows : int
        Directions every column is asked first, at a common scale, to set its own scale (they
        count as measurements of the first pass).
    block_bytes : int
        Memory bound on one batch of queries.
    verify : int
        Check queries spent after fitting (0 turns the check off)
        (default 8: 6 fresh random queries of 2 to ``check_length`` tokens and copies of the
        two longest with their first N - 1 tokens permuted, which the box must answer alike;
        :func:`~attnquery.learners._base.check_plan`).
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is a head on every
        input of up to ``check_length`` tokens, such as a wider sliding window, passes.
    fit_bias : bool
        The head may carry a key bias c and an offset beta, as a real module's head does
        (``f(X) = softmax(X (W x_N + c))^T (X v) + beta``; served boxes, docs/served.md). The
        learner then reads v at two scales and the offset as a mean of 64 one-row answers,
        measures ``b_l = u_l^T c`` with pairs whose last token is 0 (16 to 256 rounds of ``2 d``
        queries, more with larger budgets), caps every probe's scale c so that the key bias's
        part of its logit stays within 2 (and the bias's part of the query vector no larger than
        the measured part), and takes ``c b_l`` out of every logit. Where d exceeds 48 and W's
        rank is below it (and the budget pays for a full pass after it), the query bias is then
        cancelled: 48 rows of W measured once give its row space, the shift z of every probe
        is moved in it until ``W z + c = 0``, so the key bias no longer caps c, whose answer
        size is then chosen among 0.03 to 3 by the measured scatter of repeated probes
        (``query_bias_cancelled_``, ``answer_size_``; docs/served.md), and W is measured from
        both sides of its rank-r sketch instead of entry by entry (``sketch_``: ``r (2d - r)
        + d`` entries, each asked in several passes with its own scale, so that its logit is
        ``entry_logit_``, and alternating last-token signs). Answers that are not
        finite (the box's format overflowed) count in ``n_overflow_`` and their probes are
        asked again at a smaller scale. Default False (the paper's head, and the float64
        behaviour of earlier versions).
    noise : {"format", "measured"}
        How the answers' measured relative noise (``noise_level_``) is judged when every answer
        is a value of a narrow format (float32, float16, bfloat16: ``answer_format_``).
        "format" (default): it may be at most ``NOISE_FORMAT_FACTOR`` (4) times what the
        format's rounding explains (``noise_floor_``,
        :func:`~attnquery.precision.rounding_floor`); more means the box is not a single head
        (its disagreement with one is counted as noise, and the check's tolerance, built from
        the noise, would grow with it), and :class:`~attnquery.errors.ModelMismatchError` is
        raised before the check. "measured": the answers are declared noisier than their
        format (a box that adds noise before it rounds); the learner then warns with
        :class:`~attnquery.errors.NoiseAboveFormatWarning`, sets ``noise_above_format_`` and
        goes on with the noise it measured. Answers in no narrow format (float64, a few decimal
        digits, noise added in float64) are not judged, in either mode. docs/served.md, "Noise
        judged against the format".

    Attributes
    ----------
    W_ : ndarray (d, d)
        Estimate of W (from the factors, on request, when ``W_factors_`` is set).
    W_factors_ : tuple (L, R) or None
        ``W = L @ R.T``, each d x ``rank_``, when the rank is below d; else None.
    v_ : ndarray (d,)
        Estimate of v, from the pairs' differences.
    rank_ : int
        Rank of the estimate.
    n_queries_ : int
        Queries counted by the oracle during ``fit``, check queries included.
    noise_level_ : float
        Relative noise of the answers (root-mean-square of error / answer), estimated from the
        scatter of ``u^T v`` over the columns that share a direction.
    W_error_estimate_ : float
        Estimated relative Frobenius error of ``W_``: the answers' noise propagated through the
        logits and the weighted means (or, per column, the residual scatter of repeated
        measurements where that is larger), times ``sqrt(r (2d - r)) / d`` after truncation to
        rank r.
    v_error_estimate_ : float
        Estimated relative error of ``v_``.
    residual_ratio_ : float
        Error of W predicted from the scatter of repeated logit measurements over the error the
        noise level predicts, both squared (about 1 for a single head; NaN when no entry was
        measured twice).
    singular_values_ : ndarray (d,)
        Singular values of the dense estimate before truncation.
    n_passes_ : int
        Complete passes over the d x d entries (with ``sketch_``: over both sides of the
        sketch).
    n_partial_rows_ : int
        Directions of the final partial pass.
    sketch_ : bool
        Whether W was measured from its rank-r sketch (with ``fit_bias``, where the query bias
        was cancelled): the columns ``U W R`` along W's row space R and the rows ``B W`` along
        a basis B of its column space and v, ``W = (U^T U W R) (B U^T U W R)^+ (B W)``.
    logit_scale_ : ndarray (d,)
        Scale ``kappa_j = c s`` of column j's probes after the first pass (before dithering).
    n_requeried_ : int
        Pairs asked again (scale search and saturated pairs).
    verify_error_, n_verify_queries_ : float, int
        Relative disagreement and number of the check queries.
    key_bias_ : ndarray (d,)
        Estimate of the key bias c (projected on the column space of ``W_`` when its rank is
        below d); zeros without ``fit_bias``.
    offset_ : float
        Estimate of the offset beta; 0 without ``fit_bias``.
    n_overflow_ : int
        Answers that were not finite (inf or NaN: the box's format overflowed).
    n_bias_rounds_ : int
        Rounds of key-bias pairs (with ``fit_bias``).
    query_bias_cancelled_ : bool
        With ``fit_bias``: whether the probes' shift was moved to cancel the query bias
        (``W z + c = 0``).
    answer_size_ : float or None
        With ``fit_bias``, once the query bias is cancelled: the probes' answer size
        ``|c u^T v|`` the design search chose (None otherwise).
    entry_logit_ : float or None
        With ``sketch_``: the logit each entry's pairs aim at (its scale from its estimate),
        chosen among 1.5, 2.25 and 3 by the design search's measured scatter (None otherwise).
    shift_ : ndarray (d,) or None
        With ``fit_bias``: the shift z added to every probe's tokens (``z^T v = -beta``; None
        where the offset is 0).
    answer_format_ : str
        The narrowest format holding every answer the fit used: "bfloat16", "float16",
        "float32" or "float64" (:func:`~attnquery.precision.answer_format`).
    noise_floor_ : float or None
        The relative noise the answers' format explains
        (:func:`~attnquery.precision.rounding_floor`); None for float64 answers.
    noise_above_format_ : bool
        Whether ``noise_level_`` exceeded ``NOISE_FORMAT_FACTOR`` times ``noise_floor_`` (set
        only with ``noise="measured"``, which warns; "format" raises).
    """

    _parameter_constraints = {
        **LowPrecisionBase._parameter_constraints,
        "fit_bias": ["boolean"],
    }
    spec = LearnerSpec(
        name="lowprecision", oracle="value", returns="head", stages=STAGES, fits_bias=True,
        description="a head behind float16, bfloat16 or rounded answers, within a budget of "
        "n_queries value queries (beyond the paper)", label="low precision",
        command_line=False)

    def __init__(self, *, n_queries: int, rank: int | None = None, target_logit: float = 2.5,
                 answer_scale: float = 16.0, max_logit: float = 10.0,
                 initial_logit_scale: float = 1.0, pilot_rows: int = 8,
                 block_bytes: int = 16 * 2**20, fit_bias: bool = False,
                 noise: str = "format", verify: int = DEFAULT_VERIFY,
                 check_length: int = CHECK_LENGTH, random_state=None):
        # the bias route's parameters are all of these but fit_bias (LowPrecisionBase's)
        LowPrecisionBase.__init__(self, **{k: v for k, v in locals().items()
                                           if k not in ("self", "fit_bias")})
        self.fit_bias = fit_bias

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def min_queries(d: int, verify: int = DEFAULT_VERIFY, fit_bias: bool = False) -> int:
        """The least ``n_queries`` at dimension d: ``2 d^2`` (one pair per entry of W), ``d``
        (v), the check queries and 48 for the search of the logit scale; with ``fit_bias``
        also ``d + 1 + 64`` one-row queries (v at a second scale and the offset) and 16 rounds
        of ``2 d`` key-bias pairs. A budget this small leaves nothing for re-asking pairs
        (:class:`~attnquery.errors.BudgetExceededError` then)."""
        return min_queries(d, verify, fit_bias)

    # ------------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover (W, v) from ``oracle`` within ``n_queries`` queries; returns self.

        Raises
        ------
        ConfigError
            Bad parameters, a rank above d, ``n_queries`` below :meth:`min_queries`, or a
            membership oracle.
        BudgetExceededError
            The oracle's budget is below ``n_queries``, or re-asking saturated pairs needs more
            queries than are left.
        NotIdentifiableError
            Every answer to the one-row queries is 0 (v = 0).
        AssumptionViolation
            The answers' relative noise is above ``MAX_NOISE_LEVEL`` (0.03: one significant
            digit, for instance), where averaging cannot remove the bias of a pair's log-ratio.
        ModelMismatchError
            The box is not a single attention head: some pairs give no positive ratio at any
            scale, the answers are values of a narrow format but carry more than
            ``NOISE_FORMAT_FACTOR`` times the noise its rounding explains (with
            ``noise="format"``), or the check queries disagree with the estimate beyond the
            learner's own error estimate (also when the answers carry additive noise that is
            large beside the check's answers: the error model is relative).

        Warns
        -----
        NoiseAboveFormatWarning
            With ``noise="measured"``, where ``noise="format"`` would raise.
        """
        self._validate_params()
        if self.fit_bias:  # the bias route: its own estimator, whose fitted attributes are ours
            route = _BiasRoute(**{k: v for k, v in self.get_params().items()
                                  if k != "fit_bias"})
            try:
                route.fit(oracle)
            finally:
                for name, value in vars(route).items():
                    if name.endswith("_") or name == "_W":
                        setattr(self, name, value)
            return self
        d = check_oracle(oracle)
        n_verify = self._check_box(oracle, d, fit_bias=False)
        with self._open_budget(oracle, n_verify) as ledger:
            fit_rng, check_rng = self._rng().spawn(2)
            channel = Channel(ledger)
            with ledger.stage("v"):
                v0 = read_v(ledger, d)
                channel.formats.update(v0)  # the answers themselves
                check_v(v0)
                probes = Probes.start(self, channel, balanced_orthonormal(v0, fit_rng), v0,
                                      fit_bias=False)
            self.sketch_ = False
            try:  # every entry of W (U^T T)
                run = full_passes(self, probes, ledger, fit_rng)
            finally:
                self.n_requeried_ = int(ledger.n_requeried)
                self.n_overflow_ = int(channel.n_overflow)
            self.logit_scale_ = run.logit_scale
            self.n_passes_, self.n_partial_rows_ = run.n_passes, run.n_partial_rows
            sol = solve(run.acc, probes.U, self.rank)
            for attr, value in sol.fitted().items():
                setattr(self, attr, value)
            self.key_bias_, self.offset_ = np.zeros(d), 0.0
            self._check(oracle, ledger, check_rng, d, channel.formats.format, sol.W_err_noise,
                        "a single attention head")
        return self
