"""Exact recovery of a single attention head from value queries (paper Theorem 4.1).

Phase 1 reads v from the d one-row queries ``[e_i]``. Phase 2 reads column ``w_j = W e_j`` from
d two-row probes. The paper's probe is ``[(u + e_j); e_j]``; here it is scaled,
``[(c u + s e_j); s e_j]``, which gives the same linear equation with a controlled logit:

    alpha = sigma(c s u^T w_j),     y = s v_j + alpha c (u^T v),

so ``u^T w_j = logit(alpha) / (c s)``. The product ``kappa = c s`` sets the logit scale and is
chosen from the answers themselves (the learner does not know the model's scale): the first
column's probes set it, later batches use the largest value measured so far, and only a probe
whose logit is saturated (|logit| > ``max_logit``, where float64 would lose digits) is asked
again at a smaller scale (:class:`attnquery.learners._probes.Prober`, shared with the low-rank
learners). The d probes of a column share their last token. The ratio ``c / s`` keeps
``s v_j`` from swamping ``c u^T v`` (cancellation). On ordinary heads no probe is asked twice
and the count is exactly ``d^2 + d``; the learner reports every extra query in
``n_requeried_``.

Beyond the paper, ``fit_bias=True`` learns a module's head with its biases,
``f(X) = softmax(X (W x_N + c))^T (X v) + beta`` (see :class:`attnquery.models.AttentionHead`),
with ``d^2 + 2d + 1`` queries, as many as the unknowns (W, c, v, beta):

* 1 query: the zero token ``[0]``, answered by ``beta`` alone (its weight is 1, its value 0);
* d queries: ``[e_i]``, answered by ``v_i + beta``;
* d queries: the key-bias probes ``[kappa a_m; 0]``, whose zero last token leaves the logit
  ``kappa a_m^T c`` (:func:`~attnquery.learners._probes.read_key_bias`);
* d^2 queries: the column probes, whose logit ``c s u^T w_j + c u^T c`` is corrected by the
  bias's share, known from c.

The offset enters every answer, so the probes keep ``c |u^T v| >= |beta|`` and the basis design
uses ``u_l = e_l + sigma_l e_p`` for every ``l != p`` (signed, ``|u_l^T v| >= max |v_i|``) instead
of only where ``v_l`` is near 0.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ._base import (
    BLOCK_BYTES_PARAM,
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    N_QUERIES_PARAM,
    ROUNDING_RTOL,
    BaseLearner,
    check_oracle,
    check_verify_param,
)
from ._params import Options
from ._probes import (
    PROBE_PARAMS,
    ZERO_TOL_PARAM,
    Prober,
    balanced_orthonormal,
    check_probe_params,
    check_v,
    coordinate_rows,
    pivot_directions,
    probe_logits,
    read_head_constants,
    read_v,
    unit_directions,
)
from ._registry import LearnerSpec

__all__ = ["ExactValueQueryLearner", "read_v", "probe_logits", "check_v", "unit_directions",
           "PROBE_DESIGNS"]

#: the probe designs, the default first
PROBE_DESIGNS = ("basis", "gaussian", "orthogonal")

#: the stages ``n_queries_by_stage_`` counts: v (and beta, c), the columns of W, the check
STAGES = ("constants", "W", "verify")

#: pilot probes of a head with biases: its pilot logits are mostly the bias's share, so the few
#: probes asked at the initial scale carry few digits of u^T W b, and the rest use the learnt one
PILOT_BIAS = 8


class ExactValueQueryLearner(BaseLearner):
    """Exact recovery of (W, v) from d^2 + d value queries (Theorem 4.1).

    Parameters
    ----------
    probes : {"basis", "gaussian", "orthogonal"}
        Probe directions u_1..u_d. "basis" (paper, the default): the deterministic set
        ``u_l = e_l``, or ``e_l + e_p`` where ``v_l = 0`` (also where ``|v_l|`` is below
        ``zero_tol * max|v|``, since a tiny ``u^T v`` costs precision), with
        ``p = argmax |v_i|``; the most precise design measured (``python -m attnquery.study.bench
        probes``: on the 72 MiniLM heads at d = 384 its worst relative error of W is 3e-13,
        against 2e-12 for "orthogonal" and 6e-10 for "gaussian"). "gaussian" (the paper's
        Theorem 4.1): i.i.d. standard Gaussian directions
        (normalised; a direction with ``|u^T v|`` far below its typical size is redrawn, which
        costs no query). "orthogonal"
        (beyond the paper): a random orthonormal basis (QR of a Gaussian matrix) reflected so
        that every ``|u_l^T v| = ||v|| / sqrt(d)``; its probe matrix has condition number 1,
        where a d x d Gaussian matrix has one of order d, which the error of W inherits.
    max_logit : float
        Largest |logit| accepted before a probe is asked again at a smaller scale.
    zero_tol : float
        Relative threshold below which ``v_l`` is treated as zero by the basis design.
    initial_logit_scale : float
        Scale ``c s`` of the first column's probes (the pilot), before any answer has shown the
        model's scale. The pilot is accepted without re-asking when its largest
        ``|u^T w_j|`` lies in ``[min_logit, max_logit] / initial_logit_scale``, i.e. in
        [1e-3, 1e3] with the defaults.
    min_logit : float
        A pilot whose largest |logit| is below this is asked again at a larger scale
        (its logits would carry too few significant digits).
    block_bytes : int
        Memory bound on one batch of queries.
    fit_bias : bool
        Also learn the key bias c and the offset beta of a module's head (beyond the paper;
        ``d^2 + 2d + 1`` queries, see the module docstring). Default False: the paper's head,
        ``d^2 + d`` queries, and ``key_bias_`` and ``offset_`` are 0.
    verify : int
        Check queries spent after fitting (0: no check)
        (default 8: 6 fresh random queries of 2 to ``check_length`` tokens and copies of the
        two longest with their first N - 1 tokens permuted, which the box must answer alike;
        :func:`~attnquery.learners._base.check_plan`): the oracle's
        answers must agree with the estimate's to ``ROUNDING_RTOL`` (relative), else
        :class:`~attnquery.errors.ModelMismatchError`.
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is a head on every
        input of up to ``check_length`` tokens, such as a wider sliding window, passes.
    n_queries : int, optional
        The most queries the whole fit asks, its check's included (default None: no cap;
        :class:`~attnquery.learners.base.BaseLearner` says how a cap is kept).
    random_state : int, sequence of ints, Generator or None
        Seed of the Gaussian probes.

    Attributes
    ----------
    W_ : ndarray (d, d)
    v_ : ndarray (d,)
    key_bias_ : ndarray (d,)
        The key bias c (0 unless ``fit_bias``).
    offset_ : float
        The offset beta (0 unless ``fit_bias``).
    n_queries_ : int
        Queries counted by the oracle during ``fit``: ``d^2 + d`` (``d^2 + 2d + 1`` with
        ``fit_bias``) plus ``n_requeried_``, plus the check queries.
    n_verify_queries_ : int
        Check queries (``verify``); ``n_queries_ - n_verify_queries_`` learnt the head.
    verify_error_ : float
        Largest disagreement on the check queries, relative to the largest answer.
    n_requeried_ : int
        Probes asked again because their first answer was saturated (0 on ordinary heads).
    n_queries_by_stage_ : dict
        Queries per stage: ``constants`` (v, and beta and c with ``fit_bias``), ``W`` (the
        column probes) and ``verify``.
    probe_matrix_ : ndarray (d, d)
        The probe directions, one per row.
    logit_scale_ : ndarray (d,)
        The scale ``c s`` used for each column's probes.
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        "n_queries": [N_QUERIES_PARAM, None],
        **PROBE_PARAMS,
        "probes": [Options(PROBE_DESIGNS)],
        "zero_tol": [ZERO_TOL_PARAM],
        "block_bytes": [BLOCK_BYTES_PARAM],
        "fit_bias": ["boolean"],
    }
    spec = LearnerSpec(
        name="exact", oracle="value", returns="head", stages=STAGES, fits_bias=True,
        description="exact value queries, d^2 + d queries (Theorem 4.1)",
        variants={"paper": {"probes": "gaussian"}}, label="exact (Thm 4.1)")

    def __init__(
        self,
        *,
        probes: str = "basis",
        max_logit: float = 10.0,
        zero_tol: float = 1e-3,
        min_logit: float = 1e-5,
        initial_logit_scale: float = 1e-2,
        block_bytes: int = 64 * 2**20,
        fit_bias: bool = False,
        verify: int = DEFAULT_VERIFY,
        check_length: int = CHECK_LENGTH,
        n_queries: int | None = None,
        random_state=None,
    ):
        self.probes = probes
        self.max_logit = max_logit
        self.zero_tol = zero_tol
        self.min_logit = min_logit
        self.initial_logit_scale = initial_logit_scale
        self.block_bytes = block_bytes
        self.fit_bias = fit_bias
        self.verify = verify
        self.check_length = check_length
        self.n_queries = n_queries
        self.random_state = random_state

    # ------------------------------------------------------------------------------------------
    def _probe_matrix(self, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.probes == "orthogonal":
            return balanced_orthonormal(v, rng)
        if self.probes == "basis":  # u_l = e_l + coef_l e_p; signed with an offset (see fit)
            p, coef = pivot_directions(v, None if self.fit_bias else self.zero_tol)
            U = np.eye(v.size)
            U[:, p] += coef
            return U
        return unit_directions(v.size, v, rng)

    def _validate_extra(self):
        check_probe_params(self)

    def fit(self, oracle):
        """Recover (W, v), and (c, beta) with ``fit_bias``, from ``oracle``; returns self.

        Raises
        ------
        NotIdentifiableError
            If every answer to the one-row queries is 0 (v = 0): W is then not identifiable.
        AssumptionViolation
            If the answers cannot come from a single attention head (an attention weight outside
            (0, 1) that no rescaling resolves).
        ModelMismatchError
            If the check queries disagree with the estimate beyond float64 rounding (several
            heads, biases, noise, lower precision); the estimate's attributes are set.
        """
        self._validate_params()
        d = check_oracle(oracle)
        rng = self._rng()
        with self._open_ledger(oracle, STAGES) as ledger:
            self._check_budget(ledger, d)
            with ledger.stage("constants"):  # v (and beta, c with fit_bias)
                head = read_head_constants(ledger, d, bias=bool(self.fit_bias),
                                           chunk=self._chunk(d), max_logit=self.max_logit,
                                           min_logit=self.min_logit)
            with ledger.stage("W"):  # d^2 probes, d per column j
                T, kappa_col, n_requeried = self._measure_columns(ledger, head, rng)
            self.W_ = scipy.linalg.lu_solve(scipy.linalg.lu_factor(self.probe_matrix_), T)
            self.v_ = head.v
            self.key_bias_ = head.key_bias_or_zero()
            self.offset_ = head.offset
            self.logit_scale_ = kappa_col
            self.n_requeried_ = int(n_requeried + head.n_requeried)
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, rng.spawn(1)[0], rtol=ROUNDING_RTOL,
                                 n0=ledger.n0, check_length=self.check_length)
        return self

    def _chunk(self, d: int) -> int:
        return max(1, int(self.block_bytes // (32 * d)))

    def _check_budget(self, ledger, d: int) -> None:
        """The whole plan (with the check) against the fit's budget, before any query."""
        n_check = check_verify_param(self.verify)
        if self.fit_bias:
            ledger.need(d * d + 2 * d + 1 + n_check,
                        f"exact recovery with biases (d^2 + 2d + 1 queries and {n_check} check "
                        "queries)")
        else:
            ledger.need(d * d + d + n_check,
                        f"exact recovery (d^2 + d queries and {n_check} check queries)")

    def _measure_columns(self, oracle, head, rng):
        """``T[l, j] = u_l^T w_j`` from the d^2 column probes (Theorem 4.1, phase 2); sets
        ``probe_matrix_``. Returns T, the scale ``c s`` of each column's probes and the
        probes asked again."""
        d = head.v.size
        U = self._probe_matrix(head.v, rng)
        self.probe_matrix_ = U
        prober = Prober(oracle, head.v, key_bias=head.key_bias,
                        initial_logit_scale=self.initial_logit_scale, max_logit=self.max_logit,
                        min_logit=self.min_logit, chunk=self._chunk(d),
                        pilot=PILOT_BIAS if self.fit_bias else d, target=1.0,
                        offset=head.offset)

        def make(idx):
            # probe (l, j) is number j d + l: the d probes of column j share their last token
            jj, ll = np.divmod(idx, d)
            return U[ll], coordinate_rows(jj, d)

        t, kap = prober.measure(make, d * d, float(np.min(np.abs(U @ head.v))),
                                return_scale=True)
        return t.reshape(d, d).T, kap.reshape(d, d).min(axis=1), prober.n_requeried

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered head on inputs X (B, N, d)."""
        from ..models import AttentionHead

        return AttentionHead(self.v_, W=self.W_, key_bias=self.key_bias_, offset=self.offset_)(X)
