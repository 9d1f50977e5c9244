"""The bias route of the low-precision learner as its own estimator:
:class:`BiasedLowPrecisionLearner`, a head with a key bias and an offset behind low-precision
answers (a served module's head)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._base import DEFAULT_VERIFY, check_oracle
from .._probes import balanced_orthonormal, check_v
from .._registry import LearnerSpec
from ._bias import BiasRun, combine_key_bias, read_v_offset, shift_and_key_bias
from ._common import LowPrecisionBase, min_queries
from ._constants import _BIAS_SV_FACTOR, _MAX_ANSWER, STAGES
from ._pairs import Channel, Probes
from ._passes import Solution, full_passes, solve
from ._sketch import sketch_ok, sketch_passes, solve_sketch


class MeasuredW(NamedTuple):
    """W, v and the key bias as the bias route measured them (``_measure_W``)."""

    #: each column's logit scale
    logit_scale: np.ndarray
    #: passes over every entry (over both sides of the sketch), and the partial pass's rows
    n_passes: int
    n_partial_rows: int
    solution: Solution
    key_bias: np.ndarray


class BiasedLowPrecisionLearner(LowPrecisionBase):
    """Recovery of (W, v, key bias, offset) of a head behind low-precision answers.

    The route ``LowPrecisionValueQueryLearner(fit_bias=True)`` runs (its ``fit`` builds this
    estimator with its own parameters and takes its fitted attributes): the offset is averaged
    from one-token answers and cancelled by a shift of every probe along v, the key bias is
    measured in the probe basis and taken out of every logit, and where W's rank is below 48
    and d above it the query bias is cancelled and W measured from both sides of its rank-r
    sketch. The measurements are the modules :mod:`~attnquery.learners.lowprecision` shares
    with the paper's route (the pair probes, the entry estimates, the noise model); this
    class only sequences them.

    Parameters
    ----------
    n_queries : int
        Queries the learner may spend, the check queries included; at least
        :meth:`min_queries`.
    rank : int, optional
        Rank of W (found from the noise when not given).
    random_state : int, sequence of ints, Generator or None
        Seed of the probes and (an independent stream) of the check queries.
    target_logit, answer_scale, max_logit, initial_logit_scale : float
        The probes' logits and answer sizes, as for
        :class:`~attnquery.learners.lowprecision.LowPrecisionValueQueryLearner`.
    pilot_rows, block_bytes, verify, check_length : int
        As for :class:`~attnquery.learners.lowprecision.LowPrecisionValueQueryLearner`.
    noise : {"format", "measured"}
        How the answers' measured noise is judged against their format, as for
        :class:`~attnquery.learners.lowprecision.LowPrecisionValueQueryLearner`.

    Attributes
    ----------
    W_, W_factors_, v_, rank_, key_bias_, offset_, shift_ : see LowPrecisionValueQueryLearner
        The head's estimate (with ``fit_bias=True`` there).
    n_bias_rounds_, query_bias_cancelled_, answer_size_, entry_logit_, sketch_ : see there
        What the bias route measured and chose.
    noise_level_, W_error_estimate_, v_error_estimate_, residual_ratio_ : float
        The answers' noise and the estimate's errors.
    singular_values_, logit_scale_ : ndarray
    n_passes_, n_partial_rows_, n_requeried_, n_overflow_, n_queries_ : int
    n_queries_by_stage_ : dict
    verify_error_, n_verify_queries_ : float, int
    answer_format_, noise_floor_, noise_above_format_ : see LowPrecisionValueQueryLearner
    """

    spec = LearnerSpec(
        name="lowprecision_bias", oracle="value", returns="head", stages=STAGES,
        fits_bias=True,
        description="a head with a key bias and an offset behind float32, float16 or bfloat16 "
        "answers, within a budget of n_queries value queries (LowPrecisionValueQueryLearner's "
        "fit_bias=True route)", label="low precision, biases", command_line=False)

    @staticmethod
    def min_queries(d: int, verify: int = DEFAULT_VERIFY) -> int:
        """The least ``n_queries`` at dimension d
        (``LowPrecisionValueQueryLearner.min_queries(d, verify, fit_bias=True)``)."""
        return min_queries(d, verify, fit_bias=True)

    def fit(self, oracle):
        """Recover (W, v, key bias, offset) from ``oracle`` within ``n_queries`` queries;
        returns self. Raises what ``LowPrecisionValueQueryLearner(fit_bias=True).fit``
        raises."""
        self._validate_params()
        d = check_oracle(oracle)
        n_verify = self._check_box(oracle, d, fit_bias=True)
        with self._open_budget(oracle, n_verify) as ledger:
            fit_rng, check_rng = self._rng().spawn(2)
            channel = Channel(ledger)
            with ledger.stage("v"):  # the offset and the key bias too
                v0, off = read_v_offset(channel, d, fit_rng)
                check_v(v0)
                bias = shift_and_key_bias(self, Probes.start(
                    self, channel, balanced_orthonormal(v0, fit_rng), v0, True, off), d, fit_rng)
            self.n_bias_rounds_ = bias.key_bias.rounds
            self.query_bias_cancelled_ = bias.cancelled
            self.answer_size_, self.entry_logit_ = bias.answer_size, bias.entry_logit
            self.shift_ = None if bias.probes.z is None else bias.probes.z.copy()
            self.sketch_ = sketch_ok(self.rank, bias, ledger)
            try:  # every entry of W (U^T T), or the two sides of its rank-r sketch
                run = self._measure_W(bias, ledger, fit_rng, self.sketch_)
            finally:
                self.n_requeried_ = int(ledger.n_requeried)
                self.n_overflow_ = int(channel.n_overflow)
            self.logit_scale_ = run.logit_scale
            self.n_passes_, self.n_partial_rows_ = run.n_passes, run.n_partial_rows
            for attr, value in run.solution.fitted().items():
                setattr(self, attr, value)
            self.key_bias_, self.offset_ = run.key_bias, float(bias.probes.off)
            self._check(oracle, ledger, check_rng, d, channel.formats.format,
                        run.solution.W_err_noise, "a single attention head with biases")
        return self

    def _measure_W(self, bias: BiasRun, ledger, rng, sketch: bool) -> MeasuredW:
        """W from the two sides of its rank-r sketch (``sketch``, where :func:`sketch_ok`
        allows), else from passes over every entry, with the key bias taken out."""
        if sketch:
            sk = sketch_passes(self, bias, ledger, rng)
            sol, key_bias = solve_sketch(bias, sk)
            return MeasuredW(sk.logit_scale, sk.n_passes, 0, sol, key_bias)
        run = full_passes(self, bias.probes, ledger, rng)
        sol = solve(run.acc, bias.probes.U, self.rank,
                    min_cut=_BIAS_SV_FACTOR * self._key_bias_sv(bias, run.logit_scale))
        return MeasuredW(run.logit_scale, run.n_passes, run.n_partial_rows, sol,
                         self._key_bias(bias, sol))

    def _key_bias_sv(self, bias, logit_scale) -> float:
        """The key bias's error in W: it reaches every entry of its direction's row through
        ``c / kappa``, a rank-one error of norm about ``||db c|| ||1 / kappa||``, which the
        entries' noise does not cover (with the query bias cancelled, the random last-token
        signs spread it like noise: ``2 / sqrt(d)`` of it)."""
        probes = bias.probes
        d = probes.U.shape[0]
        c_row = np.minimum(min(float(self.answer_scale), _MAX_ANSWER) / probes.uv,
                           probes.c_bias)
        bias_sv = float(np.linalg.norm(np.sqrt(bias.key_bias.b_var) * c_row)
                        * np.linalg.norm(1.0 / logit_scale))
        if bias.cancelled:
            bias_sv *= 2.0 / np.sqrt(d)
        return bias_sv

    @staticmethod
    def _key_bias(bias, sol) -> np.ndarray:
        """The key bias ``U^T b - W z`` (mixed with the first shift's where the query bias
        was cancelled), projected on W's column space where its rank is below d: a module's
        key bias ``W_K^T b_Q / sqrt(d_h)`` lies there."""
        probes = bias.probes
        U, W, d, r = probes.U, sol.W, probes.U.shape[0], sol.rank
        cb = U.T @ probes.b  # u_l^T (W z + c_b) in the basis U, z the shift (if any)
        if probes.z is not None:
            cb = cb - W @ probes.z
        if bias.cancelled:
            cb = combine_key_bias(cb, W, U, bias.first, probes.z, bias.key_bias.b_var,
                                  sol.col_err)
        Uw = sol.Uw
        return Uw[:, :r] @ (Uw[:, :r].T @ cb) if r < d else cb
