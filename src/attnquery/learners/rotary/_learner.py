"""The rotary learner's estimator, :class:`RotaryValueQueryLearner` (its method in the module
docstring of :mod:`attnquery.learners.rotary`).

``fit`` checks the plan against its :class:`~attnquery.learners._base.QueryLedger` (cap
``n_queries``, the check's queries in reserve), reads v, picks the route from the answers'
format and the parameters (:class:`~._routes.DenseRoute`, :class:`~._routes.LowRankRoute`,
:class:`~._served.ServedRoute`), factors T (:mod:`._factor`) and assigns every fitted
attribute from the frozen values the route and the factorisation return.
"""

from __future__ import annotations

import numbers

import numpy as np

from ...errors import ConfigError, NotIdentifiableError
from ...models import RotaryAttentionHead
from ...precision import answer_format
from .._base import (
    BLOCK_BYTES_PARAM,
    DEFAULT_VERIFY,
    BaseLearner,
    check_oracle,
    check_scalar,
    check_verify_param,
)
from .._params import Interval, Lengths, Options
from .._probes import PROBE_PARAMS, check_probe_params
from .._registry import LearnerSpec
from ._common import STAGES, UNIT_TOL, VERIFY_LENGTHS, rotary_query_count, rotary_refine_count
from ._factor import Svd, biases, factor
from ._prober import _RotaryProber
from ._routes import DenseRoute, LowRankRoute, check_plan
from ._served import ServedRoute

__all__ = ["RotaryValueQueryLearner"]


class RotaryValueQueryLearner(BaseLearner):
    """Recover a rotary attention head (RoPE) from value queries (the method:
    :mod:`attnquery.learners.rotary`).

    Parameters
    ----------
    rope_base : float, optional
        The base of the frequencies, when the model's configuration gives it: the measured
        angles must match ``rope_base^(-2j/R)`` (to ``FREQ_TOL``) and the exact values are used.
        None (default): the frequencies are found from the answers.
    rotary_dim : int, optional
        R, the number of rotated dimensions, when known; None: found from the answers.
    rank : int, optional
        The head dimension d_h (the rank of the forms) for the low-rank route (about
        ``2 d (d_h + oversample) + d_h^2`` queries); None (default): the dense route
        (``2 (d^2 + d)`` queries), which finds the rank itself.
    fit_bias : bool
        Learn a head with query, key and value biases (Qwen2): ``2 d^2 + 5 d + 3`` queries,
        dense route only (module docstring, "Biases").
    n_queries : int, optional
        A cap on the queries of the fit (the check included), the cap of its
        :class:`~attnquery.learners._base.QueryLedger`: the fit raises
        :class:`~attnquery.errors.BudgetExceededError` before spending any query when its plan
        exceeds it, and when probes asked again (saturated ones) would run past it. A served
        (float32) head spends up to it on repeated measurements (None: ``8 (d^2 + d)``;
        module docstring, "Served heads").
    refine : {"auto", True, False}
        Ask the pilot column of ``M_{-1}`` again at the learnt logit scale (``d + 1`` queries,
        dense route; module docstring, "Refinement"): ``"auto"`` (default) when
        ``cond(M_{-1}) >= REFINE_CONDITION`` and the budget has room, True always, False
        never.
    oversample : int
        Extra columns of the sketches of the low-rank route.
    max_logit, min_logit, initial_logit_scale : float
        Probe scale controls, as in :class:`~attnquery.learners.ExactValueQueryLearner`.
    rank_tol : float
        Singular values of ``M_{-1}`` below ``rank_tol`` times the largest are zero (dense route).
    verify : int
        Check queries (0: none), split between ``verify_lengths`` (no permuted copies: a
        rotary head depends on the order of the tokens).
    verify_lengths : tuple of int
        Lengths of the check sequences.
    block_bytes : int
        Memory bound on one batch of probes.
    random_state : int, sequence of ints, Generator or None
        Seed of the probe directions and of the check queries.

    Attributes
    ----------
    frequencies_ : ndarray (R/2,)
        The frequencies theta_j, largest first.
    rotary_dim_ : int
        R.
    rank_ : int
        The head dimension d_h (rank of the forms).
    Q_, K_ : ndarray (rank_, d)
        Factors in the rotary basis (rows: first components of the R/2 pairs, their second
        components, then the rows not rotated), with the score scale folded into ``K_``:
        ``M_delta = K_^T Rot_{-delta} Q_`` (:meth:`M`); unique up to the gauge above.
    v_ : ndarray (d,)
    b_Q_, b_K_ : ndarray (rank_,)
        Query and key biases in the basis of ``Q_`` and ``K_`` (0 unless ``fit_bias``; the
        key bias is 0 on the dimensions not rotated, where it is not identifiable).
    offset_ : float
        The constant of every answer (0 unless ``fit_bias``).
    eigenvalues_ : ndarray (rank_,) complex
        The eigenvalues of T (``e^{+-i theta_j}`` and 1).
    condition_ : float
        The condition number of ``M_{-1}`` on its row space.
    check_rtol_ : float
        The relative disagreement the check allowed (error model above; a served head's,
        ``SERVED_RTOL``, relative to each length's answers on its own).
    logit_scale_ : float
        The logit scale ``c s`` learnt from the answers.
    n_queries_, n_verify_queries_, verify_error_, n_requeried_
        As in the other learners.
    head_ : RotaryAttentionHead
        The recovered head (``predict`` evaluates it).
    answer_precision_ : str
        ``"float64"``, or ``"float32"`` when every answer of the v stage is a float32 value
        (a served head; module docstring, "Served heads").
    long_offset_ : int
        The first long offset L of a served head's blocks ``T^(L-1)`` (served heads only).
    long_offsets_ : tuple of int
        Every long offset of a served head's blocks (the first measured twice; () for
        float64 answers).
    n_m1_repeats_ : int
        How many times a served head's ``M_{-1}`` was measured again (0 for float64 answers).
    noise_level_ : float
        A served head's relative noise, from the spread of its two blocks at the first
        offset (0 for float64 answers).
    n_queries_by_stage_ : dict
        Queries per stage of :data:`STAGES`: ``v``, ``bias`` (``fit_bias``), ``M1``, ``M2``,
        ``refine`` (the pilot column and the smallest rows asked again), ``verify`` (counted
        by the oracle, see
        :class:`~attnquery.learners._base.QueryLedger`).
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        **PROBE_PARAMS,
        "rope_base": [Interval(numbers.Real, 1, None, closed="neither"), None],
        "rotary_dim": [Interval(numbers.Integral, 0, None, closed="left"), None],
        "rank": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "fit_bias": ["boolean"],
        "n_queries": [Interval(numbers.Integral, 0, None, closed="left"), None],
        "refine": [Options({"auto"}), "boolean"],
        "oversample": [Interval(numbers.Integral, 0, None, closed="left")],
        "rank_tol": [Interval(numbers.Real, 0, 1, closed="neither")],
        "verify_lengths": [Lengths(1)],
        "block_bytes": [BLOCK_BYTES_PARAM],
    }
    spec = LearnerSpec(
        name="rotary", oracle="value", returns="rotary head", stages=STAGES,
        description="a rotary (RoPE) head, 2 (d^2 + d) queries (beyond the paper; "
        "--param rope_base=B optional, --rank r for the low-rank route)", label="rotary head")

    def __init__(self, *, rope_base=None, rotary_dim=None, rank=None, fit_bias=False,
                 n_queries=None, refine="auto", oversample: int = 8, max_logit: float = 10.0,
                 min_logit: float = 1e-5, initial_logit_scale: float = 1e-2,
                 rank_tol: float = 1e-9, verify: int = DEFAULT_VERIFY,
                 verify_lengths=VERIFY_LENGTHS, block_bytes: int = 64 * 2**20,
                 random_state=None):
        self.rope_base = rope_base
        self.rotary_dim = rotary_dim
        self.rank = rank
        self.fit_bias = fit_bias
        self.n_queries = n_queries
        self.refine = refine
        self.oversample = oversample
        self.max_logit = max_logit
        self.min_logit = min_logit
        self.initial_logit_scale = initial_logit_scale
        self.rank_tol = rank_tol
        self.verify = verify
        self.verify_lengths = verify_lengths
        self.block_bytes = block_bytes
        self.random_state = random_state

    # ------------------------------------------------------------------------------------------
    def _validate_extra(self):
        check_probe_params(self)
        if (self.rank is not None and self.rotary_dim is not None
                and self.rotary_dim > self.rank):
            raise ConfigError("rotary_dim cannot exceed rank (the head dimension)")

    def _validate(self, d: int):
        """The rules that need d (the parameters are valid); return the check lengths and the
        route's rank (None: dense)."""
        rotary_dim = check_scalar(self.rotary_dim, "rotary_dim", numbers.Integral, min_val=0,
                                  max_val=d, allow_none=True)
        rank = check_scalar(self.rank, "rank", numbers.Integral, min_val=1, max_val=d,
                            allow_none=True)
        if rotary_dim is not None and rotary_dim % 2:
            raise ConfigError(f"rotary_dim must be even and at most d = {d}; got {rotary_dim}")
        lengths = tuple(int(n) for n in self.verify_lengths)
        rank = None if rank is None or rank >= d else rank
        if self.fit_bias and rank is not None:
            raise ConfigError("fit_bias needs the dense route (rank=None)")
        if self.refine is True and rank is not None:
            raise ConfigError("refine=True needs the dense route (rank=None)")
        return lengths, rank

    def fit(self, oracle):
        """Recover the head from ``oracle``; returns self.

        The queries are counted per stage in ``n_queries_by_stage_`` (:data:`STAGES`).

        Raises
        ------
        NotIdentifiableError
            When v = 0 (every answer is the same) or M_{-1} = 0.
        AssumptionViolation
            When the answers cannot come from a rotary head (attention weights outside (0, 1),
            eigenvalues off the unit circle, frequencies other than those of ``rope_base``).
        ModelMismatchError
            When the check queries (up to 4,096 tokens) disagree with the estimate beyond
            float64 rounding (a served head: beyond ``SERVED_RTOL`` relative to any one
            length's answers); the estimate's attributes are set.
        BudgetExceededError
            When the plan exceeds ``n_queries`` or the oracle's budget (before any query; for
            a served head's larger minimum, after the d queries of v), or a batch would run
            past either (probes asked again).
        """
        self._validate_params()
        d = check_oracle(oracle)
        lengths, rank = self._validate(d)
        n_verify = check_verify_param(self.verify)
        r_probe, r_check = self._rng().spawn(2)
        with self._open_ledger(oracle, STAGES, cap=self.n_queries, reserve=n_verify) as ledger:
            check_plan(ledger, self._planned(d, rank) + n_verify, n_verify, self.n_queries)
            with ledger.stage("v"):
                beta, v = self._read_v(ledger, d)
            fmt = answer_format(v) if np.all(np.isfinite(v)) else "float64"
            self.answer_precision_ = fmt
            self.noise_level_, self.n_m1_repeats_, self.long_offsets_ = 0.0, 0, ()
            route = self._route(ledger, fmt, d, rank, n_verify)
            pr = _RotaryProber(ledger, v, beta, self, d)
            forms = route.forms(ledger, pr, v, r_probe)
            fac = factor(forms.T, forms.svd, route.unit_tol, self.rotary_dim, self.rope_base)
            blocks = route.blocks(ledger, pr, fac, forms.svd, r_probe, lengths, self.rope_base)
            head = fac if blocks is None else blocks.factors  # the served blocks refine T's
            self.eigenvalues_, self.frequencies_ = fac.eigenvalues, head.frequencies
            self.rotary_dim_, self.rank_, self.Q_, self.K_ = (head.rotary_dim, head.rank,
                                                              head.Q, head.K)
            self.v_, self.offset_, self.n_m1_repeats_ = v, beta, forms.n_m1_repeats
            self.noise_level_ = route.noise_level if blocks is None else blocks.noise_level
            if blocks is not None:
                self.long_offset_, self.long_offsets_ = (blocks.long_offsets[0],
                                                         blocks.long_offsets)
            self.b_Q_, self.b_K_ = biases(fac, forms.bias_data)
            self.n_requeried_, self.logit_scale_ = int(pr.n_requeried), float(pr.kappa)
            self.condition_ = float(forms.svd.S[0] / forms.svd.S[-1])
            self.check_rtol_ = route.check_rtol(self.condition_, lengths)
            with ledger.stage("verify"):
                self._check(oracle, r_check, ledger.n0,
                            route.check_args(lengths, self.check_rtol_, self.predict))
        return self

    def _planned(self, d: int, rank) -> int:
        """The queries of the plan before the check: :func:`rotary_query_count` on the route
        ``rank`` (with the biases' and, with ``refine=True``, the refinement's)."""
        planned = rotary_query_count(d, rank, self.oversample, bias=bool(self.fit_bias))
        return planned + (rotary_refine_count(d) if self.refine is True else 0)

    def _check(self, oracle, rng, n0: int, args: dict) -> None:
        """The self-check on fresh sequences (no permuted copies: a rotary head depends on the
        order of the tokens), with the route's tolerances ``args``
        (``check_args``: ``rtol``, ``atol``, ``lengths``, ``n_checks``)."""
        self._verify_fit(oracle, self.predict, rng, n0=n0, permuted=False,
                         what="a rotary attention head",
                         hint="the box may not be a rotary head (ALiBi, a sliding window, "
                              "query or key biases without fit_bias), or have several "
                              "heads, noise or precision below float32", **args)

    def _route(self, ledger, fmt: str, d: int, rank, n_verify: int):
        """The route for answers in the format ``fmt`` (float64: dense or low-rank; else the
        served route, which refuses what it does not take)."""
        if fmt != "float64":
            return ServedRoute.open(ledger, fmt, rank=rank, fit_bias=bool(self.fit_bias),
                                    n_queries=self.n_queries, n_verify=n_verify,
                                    rank_tol=self.rank_tol)
        if rank is not None:
            return LowRankRoute(d, n_verify, rank=rank, oversample=self.oversample)
        return DenseRoute(d, n_verify, fit_bias=bool(self.fit_bias), refine=self.refine,
                          rank_tol=self.rank_tol)

    def _read_v(self, ledger, d: int):
        """The answers' constant beta (from ``[0]``, with ``fit_bias``; else 0) and v from the
        d one-row queries ``[e_i]`` (paper Theorem 4.1, phase 1)."""
        beta = float(ledger(np.zeros((1, 1, d)))[0]) if self.fit_bias else 0.0
        v = ledger(np.eye(d)[:, None, :].copy()) - beta
        if not np.any(v):
            raise NotIdentifiableError("v = 0: every answer is the same, so the scores are not "
                                       "identifiable from value queries")
        return beta, v

    def _factor(self, T, U_s, S, Vt):
        """Factor ``T`` (:func:`~._factor.factor`, float64 tolerance) and set ``eigenvalues_``,
        ``frequencies_``, ``rotary_dim_``, ``rank_``, ``Q_`` and ``K_``; returns the
        eigenvalues, the eigenvectors and R/2. Kept for
        :mod:`attnquery.learners.multihead_generic.rotary_layer`, which factors each isolated
        head with a learner of its own; ``fit`` does not use it."""
        fac = factor(T, Svd(U_s, S, Vt), UNIT_TOL, self.rotary_dim, self.rope_base)
        self.eigenvalues_ = fac.eigenvalues
        self.frequencies_, self.rotary_dim_, self.rank_ = (fac.frequencies, fac.rotary_dim,
                                                           fac.rank)
        self.Q_, self.K_ = fac.Q, fac.K
        return fac.eigenvalues, fac.E, fac.half

    # ------------------------------------------------------------------------------------------
    def _head(self) -> RotaryAttentionHead:
        return RotaryAttentionHead(self.Q_, self.K_, self.v_, frequencies=self.frequencies_,
                                   b_Q=self.b_Q_, b_K=self.b_K_, offset=self.offset_,
                                   scale=1.0)

    @property
    def head_(self) -> RotaryAttentionHead:
        """The recovered head as a :class:`~attnquery.models.RotaryAttentionHead` (after
        ``fit``; its ``W_Q``, ``W_K`` are ``Q_``, ``K_`` with the scale folded in)."""
        if not hasattr(self, "Q_"):
            raise AttributeError("head_ is available after fit()")
        return self._head()

    def M(self, delta: int) -> np.ndarray:
        """The recovered bilinear form ``M_delta`` (d x d) of the offset ``delta <= 0``."""
        return self._head().M(delta)

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered head on inputs X (B, N, d), any length N."""
        return self._head()(X)
