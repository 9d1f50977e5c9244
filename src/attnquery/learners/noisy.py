"""Recovery of a single attention head from approximate value queries (paper Theorem 6.1).

The oracle answers every query within ``+-tau`` of ``f(X)``. The learner is Theorem 4.1's with
scaled probes, so that every attention weight it inverts lies where ``sigma^{-1}`` is Lipschitz:

* ``v``: ``v_hat_i = AVQ([e_i])``; an entry with ``|v_hat_i| <= mu / 2`` is zero (the margin
  assumption), and is set to 0.
* ``W_ij``: the probe ``[(b u + a e_j); a e_j]`` with ``a = 1/2``, ``b = 1 / W_bound`` has logit
  ``a b u^T W e_j`` in ``[-1/2, 1/2]``, so ``alpha = sigma(a b W_ij)`` (for ``u = e_i``) lies in
  ``[sigma(-1/2), sigma(1/2)]``. The estimate
  ``alpha_hat = (y - a v_hat_j) / (b v_hat_i)`` is clipped to that interval before the logit
  (Lemma A.1: ``sigma^{-1}`` is then 1/(sigma(1/2) sigma(-1/2)) < 5 Lipschitz), and
  ``W_hat_ij = sigma^{-1}(clip(alpha_hat)) / (a b)``.
* Rows with ``v_i = 0`` use ``u = e_i + e_p`` (``p`` the largest ``|v_hat_p|``) and subtract
  ``W_hat_pj``. Here the logit is ``a b (W_ij + W_pj)``, which ``||W||_F <= W_bound`` only bounds
  by ``a b sqrt(2) W_bound = 0.71``, outside the clipping range; these probes therefore use
  ``b / sqrt(2)``, which restores ``|logit| <= 1/2`` (the proof's step for this case needs it).

Theorem 6.1's tolerance, with the final halving for sparse ``v``, is
``tau <= min(mu / 2, eps_v / sqrt(d), mu eps_W / (160 W^2 d))``: the learner reports it as
``required_tau_``. Inverting it gives the guarantee for a given ``tau < mu / 2``:
``||W_hat - W||_F <= 160 W^2 d tau / mu`` and ``||v_hat - v|| <= sqrt(d) tau``
(:func:`theorem61_guarantee`).

Beyond the paper, ``oversample = k > 1`` asks ``k`` distinct probes per unknown (the theorem's
probe and ``k - 1`` probes with ``a`` (and the one-row scale) drawn in ``[1/2, 1]`` times the
theorem's) and solves each unknown by least squares. Under independent noise the error falls
like ``1 / sqrt(k)``; under adversarial noise it need not.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import scipy.special

from ..errors import AssumptionViolation, ConfigError, NotIdentifiableError
from ..theory import THEOREM_CONSTANT, theorem61_guarantee, theorem61_required_tau  # noqa: F401
from ._base import (
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    CHECK_LENGTHS,
    DEFAULT_VERIFY,
    N_QUERIES_PARAM,
    BaseLearner,
    check_oracle,
    check_verify_param,
    chunk_slices,
    output_error_bound,
    pair_token_scale,
)
from ._params import Interval
from ._registry import LearnerSpec

__all__ = [
    "NoisyValueQueryLearner",
    "AssumptionParameterError",
    "theorem61_required_tau",
    "theorem61_guarantee",
    "TAU_CLIP",
    "L_CLIP",
]

#: the stages ``n_queries_by_stage_`` counts
STAGES = ("v", "W", "verify")
#: sigma(-1/2): the lower end of the clipping range
TAU_CLIP = float(1.0 / (1.0 + np.exp(0.5)))
#: Lipschitz constant of sigma^{-1} on [sigma(-1/2), sigma(1/2)] (Lemma A.1), about 4.26
L_CLIP = float(1.0 / (TAU_CLIP * (1.0 - TAU_CLIP)))


class AssumptionParameterError(ConfigError, AssumptionViolation):
    """A learner parameter that states a theorem's assumption is out of its range (``mu``
    outside (0, 1], ``W_bound < 2``, ``tau <= 0``); both a :class:`ConfigError` and an
    :class:`AssumptionViolation`."""


class _WProbes:
    """The two-row probes ``[(b_i u_i + a_m e_j); a_m e_j]`` of W, one per (m, i, j).

    ``u_i = e_i``, or ``e_i + e_p`` where ``v_i = 0`` (p the largest ``|v_hat_p|``), with
    ``b_i = 1 / W_bound``, or ``1 / (sqrt(2) W_bound)`` for those rows (module docstring).
    """

    def __init__(self, d: int, a: np.ndarray, v: np.ndarray, zero: np.ndarray, W: float):
        k = a.size
        self.d, self.v, self.zero = d, v, zero
        self.p = int(np.argmax(np.abs(v)))
        b_row = np.where(zero, 1.0 / (W * np.sqrt(2.0)), 1.0 / W)  # (d,) per row i
        q_row = np.where(zero, self.p, np.arange(d))  # index whose v divides alpha
        mm, self.ii, self.jj = (g.ravel() for g in np.meshgrid(
            np.arange(k), np.arange(d), np.arange(d), indexing="ij"))
        self.n = mm.size
        self.am, self.bi, self.qi = a[mm], b_row[self.ii], q_row[self.ii]

    def queries(self, sl: slice) -> np.ndarray:
        """The probes ``sl`` (m, 2, d)."""
        ii, jj, am, bi = self.ii[sl], self.jj[sl], self.am[sl], self.bi[sl]
        m = sl.stop - sl.start
        Xb = np.zeros((m, 2, self.d))
        r = np.arange(m)
        Xb[r, 0, ii] += bi
        zr = self.zero[ii]
        Xb[r[zr], 0, self.p] += bi[zr]
        Xb[r, 0, jj] += am
        Xb[r, 1, jj] = am
        return Xb


class NoisyValueQueryLearner(BaseLearner):
    """Recovery of (W, v) from approximate value queries (Theorem 6.1).

    Parameters
    ----------
    W_bound : float
        Known bound ``W >= 2`` on ``||W||_F`` (the paper's norm).
    mu : float in (0, 1]
        Margin: every nonzero ``|v_i| >= mu``.
    eps_W, eps_v : float > 0
        Target errors; they only set :attr:`required_tau_`, the tolerance the theorem asks of
        the oracle (the learner's queries do not depend on them).
    oversample : int >= 1
        Distinct probes per unknown, combined by least squares (1 = the theorem as written:
        ``d + d^2`` queries; ``k``: ``k (d + d^2)``).
    clip : bool
        Clip the attention-weight estimate to ``[sigma(-1/2), sigma(1/2)]`` before the logit
        (the theorem). ``False`` is the unclipped baseline: ``sigma^{-1}`` is applied to the raw
        estimate, which has no Lipschitz bound and is undefined (NaN) outside (0, 1).
    tau : float, optional
        The oracle's tolerance, if known; by default ``oracle.tau`` when the oracle has one,
        else :attr:`required_tau_` (the theorem's premise). Only the assumption check uses it.
    strict : bool
        Raise :class:`AssumptionViolation` when an attention-weight estimate lies outside the
        clipping range by more than the tolerance allows (``||W||_F > W_bound``). With
        ``False`` such weights are clipped silently and counted in ``n_out_of_range_``.
    verify : int
        Check queries spent after fitting (0: no check): by default 6 fresh random queries of
        1, 4, 8, 32, 64 and ``check_length`` tokens and copies of the two longest with their
        first N - 1 tokens permuted, whose answers must differ by at most ``2 tau`` (a
        position-free head answers both alike; :func:`~attnquery.learners._base.check_plan`).
        The two longest and their copies have tokens scaled to logits far from uniform
        (:func:`~attnquery.learners._check.pair_token_scale`), where a rotary or other
        position-dependent box changes its answers by more than ``2 tau``.
        The answers must agree with the estimate's within ``tau`` plus the error the estimate
        can have: on one-row queries ``[x]``, ``|x|^T err_v`` (tight, so answers off by more
        than tau show); on longer ones, the proof's bound on each entry (``L |alpha_hat -
        alpha| / (a b)`` with ``|alpha_hat - alpha|`` bounded from tau and the measured
        ``v_hat``), carried to the outputs by
        :func:`~attnquery.learners._base.output_error_bound`; else
        :class:`~attnquery.errors.ModelMismatchError`.
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 1 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is a head on every
        input of up to ``check_length`` tokens, such as a wider sliding window, passes.
    n_queries : int, optional
        The most queries the whole fit asks, its check's included (default None: no cap;
        :class:`~attnquery.learners.base.BaseLearner` says how a cap is kept).
    random_state : int, Generator or None
        Seed of the extra probe scales (only used when ``oversample > 1``) and of the check
        queries.

    Attributes
    ----------
    W_ : ndarray (d, d)
    v_ : ndarray (d,)
        Estimates; entries judged zero (``|v_hat_i| <= mu / 2``) are exactly 0.
    required_tau_ : float
        Theorem 6.1's tolerance for ``(eps_W, eps_v)`` at this ``d``.
    tau_ : float
        Tolerance used by the assumption check.
    zero_mask_ : ndarray of bool (d,)
        Entries of v judged zero.
    ref_index_ : int
        The index p used for the rows where ``v_i = 0``.
    n_clipped_ : int
        Probes whose weight estimate was clipped.
    n_out_of_range_ : int
        Probes whose weight estimate was outside the clipping range by more than the tolerance
        allows (0 unless ``strict=False``).
    n_undefined_ : int
        Unclipped baseline only: probes whose estimate fell outside (0, 1) (W_ is NaN there).
    err_W_, err_v_ : ndarray (d, d), (d,)
        Bounds on the error of each entry of ``W_`` and ``v_`` that the answers' tolerance
        allows (infinite where the estimate is undefined or unbounded).
    n_queries_ : int
        Queries counted by the oracle during ``fit`` (the check queries included).
    n_verify_queries_ : int
        Check queries (``verify``).
    verify_vacuous_ : bool
        The check could not have failed: on every check query of two tokens or more, tau and
        the estimate's error bounds allow more disagreement than the estimate's own answer
        (a loose tau: at d = 8, ``W_bound = 8``, ``tau = 5e-3`` the bounds on W exceed 6 per
        entry). Such a fit warns with :class:`~attnquery.errors.VacuousCheckWarning` and the
        study records ``verify_vacuous`` in its row; only the order test (the permuted copies,
        to within 2 tau) then holds.
    verify_error_ : float
        Largest disagreement on the check queries, relative to the largest answer.
    n_queries_by_stage_ : dict
        Queries per stage: ``v``, ``W`` and ``verify``.
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        "n_queries": [N_QUERIES_PARAM, None],
        "W_bound": [Interval(Real, 2, None, closed="left", note="Theorem 6.1")],
        "mu": [Interval(Real, 0, 1, closed="right")],
        "eps_W": [Interval(Real, 0, None, closed="neither")],
        "eps_v": [Interval(Real, 0, None, closed="neither")],
        "oversample": [Interval(Integral, 1, None, closed="left")],
        "clip": ["boolean"],
        "tau": [Interval(Real, 0, None, closed="neither"), None],
        "strict": ["boolean"],
    }
    #: the theorem's assumptions: a bad value is also an AssumptionViolation
    _parameter_errors = {name: AssumptionParameterError for name in ("W_bound", "mu", "tau")}
    spec = LearnerSpec(
        name="noisy", oracle="approximate value", returns="head", stages=STAGES,
        description="approximate value queries within +-tau (Theorem 6.1)",
        variants={"unclipped": {"clip": False, "strict": False}}, label="noisy (Thm 6.1)")

    def __init__(self, *, W_bound: float, mu: float, eps_W: float = 1e-2, eps_v: float = 1e-2,
                 oversample: int = 1, clip: bool = True, tau: float | None = None,
                 strict: bool = True, verify: int = DEFAULT_VERIFY,
                 check_length: int = CHECK_LENGTH, n_queries: int | None = None, random_state=None):
        self.W_bound = W_bound
        self.mu = mu
        self.eps_W = eps_W
        self.eps_v = eps_v
        self.oversample = oversample
        self.clip = clip
        self.tau = tau
        self.strict = strict
        self.verify = verify
        self.check_length = check_length
        self.n_queries = n_queries
        self.random_state = random_state

    # ------------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover (W, v) from ``oracle`` (any object with the value-oracle interface).

        Raises
        ------
        ConfigError
            Bad parameters (``W_bound < 2``, ``mu`` outside (0, 1], ...) or a membership oracle.
        NotIdentifiableError
            Every ``|v_hat_i| <= mu / 2``: under the margin assumption v = 0 and W is not
            identifiable.
        AssumptionViolation
            (``strict``) an attention weight outside ``[sigma(-1/2), sigma(1/2)]`` by more than
            the tolerance allows: ``||W||_F > W_bound``, or the oracle's error exceeds ``tau``;
            or (``clip=False``) an estimate that is undefined (NaN entries). The estimate's
            attributes are set.
        ModelMismatchError
            The check queries disagree with the estimate by more than ``tau`` and the error the
            estimate can have (answers off by more than ``tau``, several heads, biases, a
            clipped estimate with ``strict=False``); the estimate's attributes are set.
        """
        self._validate_params()
        d = check_oracle(oracle)
        if getattr(oracle, "kind", "value") == "membership":
            raise ConfigError("NoisyValueQueryLearner needs a value oracle; got a membership "
                              "oracle (use MembershipLearner)")
        with self._open_ledger(oracle, STAGES) as ledger:
            self.required_tau_, self.tau_, scale = self._prepare(ledger, d)
            rng = self._rng()
            if scale.size > 1:  # probe scales: the theorem's (1) first, then k - 1 in [1/2, 1]
                scale[1:] = rng.uniform(0.5, 1.0, size=scale.size - 1)
            v_hat, tau_v, zero = self._read_v(ledger, d, scale)  # v: one-row queries
            probes = _WProbes(d, 0.5 * scale, v_hat, zero, float(self.W_bound))
            yW = self._ask_W(ledger, probes)  # W: two-row probes, one per (m, i, j)
            alpha, slack = self._weights(probes, yW, tau_v)
            logit, lip = self._invert(alpha, slack)  # clipped (Lemma A.1) or not
            self._solve_W(probes, logit, lip, slack)
            self.v_ = v_hat
            self.err_v_ = np.where(zero, 0.0, tau_v)  # zeros are exact under the margin
            self.zero_mask_ = zero
            self.ref_index_ = probes.p
            self._check_defined(ledger, probes.n)
            # one-row check queries test the answers' tolerance almost exactly (their
            # allowance is tau + |x|^T err_v); longer ones test W within the propagated bound;
            # a query and its prefix-permuted copy must agree to within 2 tau, on tokens where
            # the estimate's logits are not small (a position-dependent box shows there)
            with ledger.stage("verify"):
                self._verify_fit(
                    oracle, self.predict, rng.spawn(1)[0], rtol=0.0, n0=ledger.n0,
                    lengths=(1, *CHECK_LENGTHS), check_length=self.check_length,
                    pair_atol=2.0 * self.tau_, pair_scale=pair_token_scale(self.W_, self.W_bound),
                    atol=lambda X: self.tau_ + output_error_bound(X, self.v_, self.err_W_,
                                                                  self.err_v_),
                    hint=f"the answers may be off by more than tau = {self.tau_:.3g}, or the "
                    "box may have several heads or biases")
        return self

    def _prepare(self, ledger, d: int) -> tuple[float, float, np.ndarray]:
        """Check the plan against the fit's budget. Returns the theorem's required tau, the
        tau used (given, the oracle's, else the required one) and the probe scales (k,), all
        1 (the theorem's) until drawn."""
        W, mu, k = float(self.W_bound), float(self.mu), int(self.oversample)
        n_check = check_verify_param(self.verify)
        ledger.need(k * (d + d * d) + n_check,
                    f"Theorem 6.1 recovery with oversample={k} ({k} (d + d^2) queries and "
                    f"{n_check} check queries)")
        required = theorem61_required_tau(d, W, mu, self.eps_W, self.eps_v)
        tau = self.tau if self.tau is not None else getattr(ledger.oracle, "tau", None)
        return required, float(tau) if tau is not None else required, np.ones(k)

    def _read_v(self, ledger, d: int, scale: np.ndarray):
        """``v_hat``: one-row queries ``[c_m e_i]``, least squares over m; entries with
        ``|v_hat_i| <= mu / 2`` are zero. Returns v_hat, its error bound and the zero mask."""
        k, mu = scale.size, float(self.mu)
        X = np.zeros((k * d, 1, d))
        ii = np.tile(np.arange(d), k)
        cm = np.repeat(scale, d)
        X[np.arange(k * d), 0, ii] = cm
        y = ledger.ask(X, "v").reshape(k, d)
        v_hat = (scale @ y) / float(scale @ scale)
        tau_v = self.tau_ * float(scale.sum() / (scale @ scale))  # worst case of the LS error
        zero = np.abs(v_hat) <= mu / 2.0
        if zero.all():
            raise NotIdentifiableError(
                f"every |v_hat_i| <= mu/2 = {mu / 2:g}: under the margin assumption v = 0, and "
                "W is not identifiable from value queries"
            )
        return np.where(zero, 0.0, v_hat), tau_v, zero

    @staticmethod
    def _ask_W(ledger, probes: _WProbes) -> np.ndarray:
        """Answers to the probes ``[(b_i u_i + a_m e_j); a_m e_j]``, in bounded batches."""
        d, n = probes.d, probes.n
        yW = np.empty(n)
        block = max(1, (32 * 2**20) // (16 * d))
        for sl in chunk_slices(n, block):
            yW[sl] = ledger.ask(probes.queries(sl), "W")
        return yW

    def _weights(self, probes: _WProbes, yW, tau_v):
        """``alpha_hat`` of every probe and its worst-case error (proof of Thm 6.1, eq. (6));
        ``n_out_of_range_``, and with ``strict`` the error, for weights beyond the clipping
        range by more than that."""
        am, bi = probes.am, probes.bi
        den = bi * probes.v[probes.qi]
        alpha = (yW - am * probes.v[probes.jj]) / den
        slack = (self.tau_ + am * tau_v + bi * tau_v) / np.abs(den)
        lo, hi = TAU_CLIP, 1.0 - TAU_CLIP
        out = (alpha < lo - slack) | (alpha > hi + slack)
        self.n_out_of_range_ = int(out.sum())
        if out.any() and self.strict:
            worst = int(np.argmax(np.maximum(lo - alpha, alpha - hi) - slack))
            raise AssumptionViolation(
                f"an attention weight estimate of {alpha[worst]:.6g} lies outside the clipping "
                f"range [{lo:.4f}, {hi:.4f}] by more than the tolerance tau = {self.tau_:.3g} "
                f"allows ({slack[worst]:.3g}), at entry ({probes.ii[worst]}, "
                f"{probes.jj[worst]}) of W: the answers imply ||W||_F > W_bound = "
                f"{float(self.W_bound):g} (or an oracle error larger than tau); "
                f"{self.n_out_of_range_} of {probes.n} probes are affected"
            )
        return alpha, slack

    def _invert(self, alpha, slack):
        """The logits ``sigma^{-1}(alpha_hat)`` (clipped first, with ``clip``) and the slope of
        ``sigma^{-1}`` that carries each weight's error to its logit; sets ``n_clipped_`` and
        ``n_undefined_``."""
        lo, hi = TAU_CLIP, 1.0 - TAU_CLIP
        if self.clip:
            clipped = np.clip(alpha, lo, hi)
            self.n_clipped_ = int(np.count_nonzero(clipped != alpha))
            self.n_undefined_ = 0
            return scipy.special.logit(clipped), np.full(alpha.size, L_CLIP)  # Lemma A.1
        self.n_clipped_ = 0
        logit = scipy.special.logit(alpha)
        self.n_undefined_ = int(np.count_nonzero(~np.isfinite(logit)))
        # sigma^{-1}'s slope 1 / (q (1 - q)) is largest at the end of alpha_hat +- slack
        # farther from 1/2; unbounded when that interval leaves (0, 1)
        q = 0.5 + np.abs(alpha - 0.5) + slack
        with np.errstate(divide="ignore", invalid="ignore"):
            return logit, np.where(q < 1.0, 1.0 / (q * (1.0 - q)), np.inf)

    def _solve_W(self, probes: _WProbes, logit, lip, slack) -> None:
        """Least squares over m of ``(a_m b_i) T_ij = logit``, then ``W`` from T (rows with
        ``v_i = 0`` less row p); sets ``W_`` and ``err_W_``."""
        d, ii, jj, zero, p = probes.d, probes.ii, probes.jj, probes.zero, probes.p
        g = probes.am * probes.bi
        num = np.zeros((d, d))
        nrm = np.zeros((d, d))
        err = np.zeros((d, d))
        np.add.at(num, (ii, jj), g * logit)
        np.add.at(nrm, (ii, jj), g * g)
        np.add.at(err, (ii, jj), g * lip * slack)
        T = num / nrm  # T_ij = u_i^T W e_j
        eT = err / nrm  # |T_hat_ij - T_ij| <= eT_ij
        W_hat = T.copy()
        W_hat[zero, :] = T[zero, :] - T[p, :][None, :]
        eW = eT.copy()
        eW[zero, :] = eT[zero, :] + eT[p, :][None, :]
        self.W_ = W_hat
        self.err_W_ = eW

    def _check_defined(self, ledger, n: int) -> None:
        """Raise when the unclipped estimate is undefined (its attributes set)."""
        if self.n_undefined_:
            self.verify_error_, self.n_verify_queries_ = float("nan"), 0
            self.n_queries_ = ledger.total
            raise AssumptionViolation(
                f"the unclipped estimate of W is undefined at {self.n_undefined_} of {n} probes: "
                "sigma^(-1) of attention-weight estimates outside (0, 1) (the answers' error is "
                "too large to go without clipping)")

    def guarantee(self, tau: float, d: int):
        """``(eps_W, eps_v)`` that Theorem 6.1 guarantees at tolerance ``tau`` for this learner."""
        return theorem61_guarantee(tau, d, float(self.W_bound), float(self.mu))

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered head on inputs X (B, N, d)."""
        from ..models import AttentionHead

        return AttentionHead(self.v_, W=self.W_)(X)
