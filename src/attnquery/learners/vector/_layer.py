"""The float64 route of :class:`~attnquery.learners.vector.VectorLayerLearner` (its module
docstring has the method), and the stages the served route shares with it."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ...errors import ConfigError, NotIdentifiableError
from ...models.vector import bilinear_layer
from ...precision import answer_format
from .._base import (
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    N_QUERIES_PARAM,
    VERIFY_PARAM,
    BaseLearner,
    check_lengths,
)
from .._params import Interval, Options
from ._attention import (
    ATTENTION_TOL,
    MIN_WEIGHT,
    attention_matrices,
    solve_logits,
    spreads,
)
from ._check import CHECK_LENGTHS, VERIFY_RTOL, vector_oracle, verify_fit
from ._heads import PILOT_QUERIES, fit_shared, group_size
from ._split import (
    EXACT,
    RANK_RTOL,
    ROWS,
    SplitTolerances,
    split_queries,
    split_values,
)

__all__ = ["VectorLayerRoute", "STAGES", "POSITIONS", "CHECK_LENGTHS", "VERIFY_RTOL"]

#: the stages of a fit, as ``n_queries_by_stage_`` counts them
STAGES = ("V", "split", "attention", "verify")
#: the position models the learner knows
POSITIONS = ("none", "rotary")
#: logit differences asked per unknown of (W, c): the least-squares system's oversampling
OVERSAMPLE = 1.5
#: one attention query in PILOT_SHARE (at least one) is a pilot of tokens of norm about 1; the
#: others' tokens are scaled so that a row's logits spread over about TARGET_SPREAD (the largest
#: weight about e^4 times the smallest), by a factor within [1 / MAX_RESCALE, MAX_RESCALE]
PILOT_SHARE = 8
TARGET_SPREAD = 4.0
MAX_RESCALE = 100.0
#: heads whose (W, c) has more unknowns than this are read by the shared-token route
#: (:mod:`._heads`) where it applies (every token's outputs, no causal mask): at d = 64
#: (4,160 unknowns) the dense least squares takes about 2 s and 80 queries for one head
DENSE_UNKNOWNS = 64 * 65
#: the shared-token route's queries hold SHARED_FILL d_out / H tokens, their rows H N weights
SHARED_FILL = 0.75
#: the most unknowns of the dense least squares (its normal equations hold their square: 2.2 GB)
DENSE_MAX_UNKNOWNS = 128 * 129


def shared_tokens(d: int, d_out: int, H: int, r: int | None = None) -> int:
    """Tokens per query N of the shared-token route: :data:`SHARED_FILL` of ``min(d, d_out)``
    over H, at most ``r // H`` (r: the summed value map's rank, default d), at least 4."""
    r = d if r is None else r
    return max(4, min(r // H, int(SHARED_FILL * min(d, d_out)) // H))


class VectorLayerRoute(BaseLearner):
    """The float64 route of :class:`~attnquery.learners.vector.VectorLayerLearner` and the
    measurements it shares with the served route (:class:`~attnquery.learners.vector.served.
    ServedVectorLearner`): parameters, fitted attributes and method as
    :class:`~attnquery.learners.vector.VectorLayerLearner`'s (which adds the routes)."""

    #: the attention stage's queries hold this fraction of d / H tokens (every token's answers,
    #: last-token answers)
    _all_fill, _last_fill = 0.5, 0.75
    #: a layer's split spends its whole plan (:func:`~._split.split_queries`), what it
    #: leaves asked in the attention stage: the fit spends exactly what it planned before its
    #: first query (the served route, whose split and value stage depend on the answers'
    #: format, does not)
    _spend_split_plan = True

    def __init__(self, *, n_heads=None, n_kv_heads=None, causal=False, positions="none",
                 fit_bias=True, n_attention_queries=None, n_queries=None, verify=DEFAULT_VERIFY,
                 check_length=CHECK_LENGTH, random_state=None):
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.causal = causal
        self.positions = positions
        self.fit_bias = fit_bias
        self.n_attention_queries = n_attention_queries
        self.n_queries = n_queries
        self.verify = verify
        self.check_length = check_length
        self.random_state = random_state

    _parameter_constraints = {
        "random_state": BaseLearner._parameter_constraints["random_state"],
        "n_heads": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "n_kv_heads": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "causal": ["boolean"],
        "positions": [Options(POSITIONS)],
        "fit_bias": ["boolean"],
        "n_attention_queries": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "n_queries": [N_QUERIES_PARAM, None],
        "verify": [VERIFY_PARAM],
        "check_length": [CHECK_LENGTH_PARAM],
    }

    # -- parameters ------------------------------------------------------------------------------
    def _validate_extra(self) -> None:
        H, G = self.n_heads, self.n_kv_heads
        if G is not None and G != (H or 1) and self.positions != "rotary":
            raise ConfigError(
                f"n_kv_heads={self.n_kv_heads!r}: grouped-query layers are fitted with "
                "positions='rotary' only so far (else n_kv_heads None or equal to n_heads)")
        if G is not None and (H or 1) % G:
            raise ConfigError(f"n_kv_heads={G} must divide n_heads={H or 1}")

    # -- fit ---------------------------------------------------------------------------------------
    def fit(self, oracle):
        """The float64 route's fit (:meth:`VectorLayerLearner.fit`); returns self."""
        self._validate_params()
        self.rotary_ = None
        d, outputs = vector_oracle(oracle)
        rng = self._rng()
        tokens0 = int(oracle.n_tokens)
        self.outputs_ = outputs
        self.served_ = None
        route = self
        with self._open_ledger(oracle, STAGES) as ledger:
            try:
                route = self._fit_layer(ledger, rng, d, outputs) or self
                with ledger.stage("verify"):
                    route._verify(ledger, rng)
            finally:
                if route is not self:  # the served route's fitted attributes are the fit's
                    for k, v in vars(route).items():
                        if k.endswith("_") and not k.startswith("_") and k != "served_":
                            setattr(self, k, v)
                self.n_queries_ = ledger.total
                self.n_tokens_ = int(oracle.n_tokens) - tokens0
        return self

    def _fit_layer(self, ledger, rng, d: int, outputs: str):
        """The stages V, split (several heads) and attention, and every head's (W, c); returns
        the served route (:class:`~.served.ServedVectorLearner`, fitted on the same
        ledger) where the one-token answers are in a narrow format, else None."""
        shared = self._shared(d, outputs)
        H = self.n_heads or 1
        self._check_plan(ledger, d, outputs)  # n_attention_queries and the budget, before any
        # query (the budget: the oracle's and n_queries, the whole fit's cap)
        with ledger.stage("V"):
            V_sum, beta = self._read_values(ledger, d)
        served = self._served_route() if self._served_answers is not None else None
        if served is not None:  # float32, float16 or bfloat16 answers
            self.served_ = served
            self.served_.outputs_ = outputs
            self.served_._fit_layer(ledger, rng, d, outputs)
            return self.served_
        V = V_sum[None]
        split = split_queries(d, H, self._split_tolerances()) if H > 1 else 0
        if not shared:  # the plan from V's rank (its tokens per query; r = d as checked above)
            N, n = self._plan(d, V_sum, H, outputs)
            ledger.check_budget(split + n + int(self.verify),
                                f"the split of the value maps ({split} queries), the attention "
                                f"stage ({n} queries of {N} tokens) and the check")
        elif H > 1:
            ledger.check_budget(split, "the split of the value maps (at most)")
        if H > 1:
            with ledger.stage("split"):
                V = self._split_values(ledger, V_sum, beta, H, rng)
        self.V_, self.output_bias_ = V, beta
        if shared:
            self._fit_shared(ledger, rng, d, V_sum, V, beta)
        else:
            # the split's plan is spent whole: what it left is asked in the attention stage,
            # so that the fit spends exactly what it planned (and a budget that pays for the
            # plan pays for the fit)
            if H > 1 and self._spend_split_plan:
                n += max(split - ledger.counts()["split"], 0)
            self._fit_dense(ledger, rng, V, beta, outputs, N, n)
        self.head_groups_ = np.arange(H)
        self.frequencies_ = np.zeros(0)

    def _shared(self, d: int, outputs: str) -> bool:
        """Whether the heads' (W, c) are read by the shared-token route: every token's outputs
        without a causal mask, and more than :data:`DENSE_UNKNOWNS` unknowns."""
        return outputs == "all" and not self.causal and d * (d + 1) > DENSE_UNKNOWNS

    def _check_plan(self, ledger, d: int, outputs: str) -> None:
        """Refuse, before any query, what the fit's plan cannot do: heads beyond the dense least
        squares where the shared-token route does not apply, ``n_attention_queries`` too few for
        the unknowns (ConfigError), and a budget (the oracle's, or ``n_queries``) below what the
        fit spends (BudgetExceededError).

        The plan is the float64 route's for a summed value map of rank d (a layer's split
        needs it; a single head's map of lower rank gives shorter queries, and so more of
        them, which the fit checks again once the value stage has measured the rank). A
        served box's answers are read with more queries than these (the served route), so a
        plan refused here is refused there too."""
        H = self.n_heads or 1
        unknowns = d * (d + int(self.fit_bias))
        shared = self._shared(d, outputs)
        if not shared and unknowns > DENSE_MAX_UNKNOWNS:
            raise ConfigError(
                f"each head's (W, c) has {unknowns} unknowns at d = {d}, more than the dense "
                f"least squares holds ({DENSE_MAX_UNKNOWNS}); only every token's outputs "
                "without a causal mask (outputs='all', causal=False) are read by the "
                "shared-token route so far")
        values = d + int(self.fit_bias)
        split = split_queries(d, H, ROWS if outputs == "all" else EXACT) if H > 1 else 0
        if shared:
            N = shared_tokens(d, d, H)
            least = PILOT_QUERIES + 2 * group_size(d, N)
            if self.n_attention_queries is not None and self.n_attention_queries < least:
                raise ConfigError(
                    f"n_attention_queries={self.n_attention_queries}: the shared-token route "
                    f"asks {PILOT_QUERIES} "
                    f"pilot queries and at least two groups of {group_size(d, N)} queries of "
                    f"{N} tokens at d = {d}; at least {least} are needed")
            attention, what = least, f"at least {least} attention queries of {N} tokens"
        else:
            N, attention = self._plan_size(d, d, H, outputs, VectorLayerRoute._all_fill,
                                           VectorLayerRoute._last_fill)
            what = f"{attention} attention queries of {N} tokens"
        ledger.check_budget(
            values + split + attention + int(self.verify),
            f"the fit ({values} one-token queries, {split} of the split of the value maps, "
            f"{what} and {int(self.verify)} check queries)")

    def _served_route(self):
        """The estimator that reads answers in a narrow format, or None (this route reads them
        as float64 answers and its check refuses them); :class:`~attnquery.learners.vector.
        VectorLayerLearner` gives :class:`~attnquery.learners.vector.served.
        ServedVectorLearner`."""
        return None

    def _fit_dense(self, ledger, rng, V, beta, outputs, N: int, n: int) -> None:
        """The attention stage's n random queries of N tokens and each head's (W, c) from the
        dense least squares of its d (d + 1) unknowns."""
        H = V.shape[0]
        self.attention_route_, self.n_groups_, self.refine_iterations_ = "dense", 0, 0
        with ledger.stage("attention"):
            X, A = self._ask_attention(ledger, rng, n, N, V, beta, outputs)
        fits = [solve_logits(X, A[h], outputs, bool(self.causal), bool(self.fit_bias),
                             min_weight=self._min_weight())
                for h in range(H)]
        self.W_ = np.stack([f[0] for f in fits])
        self.key_bias_ = np.stack([f[1] for f in fits])
        self.logit_residual_ = max(f[2] for f in fits)
        self.head_ranks_ = np.linalg.matrix_rank(self.W_)

    def _fit_shared(self, ledger, rng, d, V_sum, V, beta) -> None:
        """Every head's (W, c) by the shared-token route (:mod:`._heads`), from every
        token's outputs without a causal mask."""
        H, d_out = V.shape[0], V.shape[2]
        s = np.linalg.svd(V_sum, compute_uv=False)
        r = int(np.count_nonzero(s > RANK_RTOL * s[0]))
        N = shared_tokens(d, d_out, H, r)
        self.attention_route_, self.rank_, self.tokens_per_query_ = "shared", r, N

        def budget(n, what):
            ledger.check_budget(n + int(self.verify), f"{what} and the check")

        with ledger.stage("attention"):
            W, c, info = fit_shared(
                ledger, rng, d, H, N, lambda X, O: self._attention(X, O, V, beta,
                                                                             "all"),
                lambda A: spreads(A, "all", bool(self.causal)), fit_bias=bool(self.fit_bias),
                max_rescale=MAX_RESCALE, min_weight=self._min_weight(),
                n_attention_queries=self.n_attention_queries, need=budget, values=(V, beta),
                **self._shared_options())
        self.W_, self.key_bias_ = W, c
        self.logit_residual_ = info["residual"]
        self.token_scale_ = info["token_scale"]
        self.head_ranks_ = info["rank"]
        self.n_groups_ = info["groups"]
        self.refine_iterations_ = info["refine_iterations"]

    def _read_values(self, oracle, d: int) -> tuple[np.ndarray, np.ndarray]:
        """V and beta from one batch of one-token queries: ``0`` (with ``fit_bias``) and the
        basis vectors."""
        X = np.eye(d)[:, None, :]
        if self.fit_bias:
            X = np.concatenate([np.zeros((1, 1, d)), X])
        y = np.asarray(oracle(X), dtype=np.float64)
        y = y[:, 0] if y.ndim == 3 else y
        fmt = answer_format(y)  # a served box's answers: its served route reads them
        self._served_answers = None if fmt == "float64" else fmt
        beta = y[0] if self.fit_bias else np.zeros(y.shape[1])
        V = y[int(self.fit_bias):] - beta
        if not np.any(V):
            raise NotIdentifiableError("every one-token answer is the offset (V = 0): the "
                                       "attention weights, and so W, are not identifiable")
        return V, beta

    def _plan(self, d: int, V: np.ndarray, H: int, outputs: str) -> tuple[int, int]:
        """Tokens per query N and queries n of the attention stage; sets ``rank_`` and
        ``tokens_per_query_``."""
        s = np.linalg.svd(V, compute_uv=False)
        r = int(np.count_nonzero(s > RANK_RTOL * s[0]))
        N, n = self._plan_size(d, r, H, outputs, self._all_fill, self._last_fill)
        self.rank_, self.tokens_per_query_ = r, N
        return N, n

    def _plan_size(self, d: int, r: int, H: int, outputs: str, all_fill: float,
                   last_fill: float) -> tuple[int, int]:
        """Tokens per query N and queries n of the attention stage for a summed value map of
        rank r, with queries of ``all_fill`` (every token's outputs) or ``last_fill`` (the last
        token's) of d / H tokens; ConfigError where ``n_attention_queries`` is too few for the
        unknowns."""
        if outputs == "all":
            # half of d: at d = 64, W to 8e-14 from 7 queries of 32 tokens (3e-13 from 3 of 48,
            # 4e-14 from 26 of 16; 2 of 64 leave the equations singular)
            N = max(2, min(r // H, math.ceil(all_fill * d / H)))
            per_query = N * (N - 1) // (2 if self.causal else 1)
        else:
            # three quarters of d: at d = 64, W to 2.8e-13 from 133 queries of 48 tokens,
            # 1.1e-10 from 100 of 64 (the square systems [X V, 1] are ill-conditioned)
            N = max(2, min(r // H + 1, math.ceil(last_fill * d / H)))
            per_query = N - 1
        unknowns = d * (d + int(self.fit_bias))
        n = self.n_attention_queries
        if n is None:
            n = math.ceil(OVERSAMPLE * unknowns / per_query)
            if outputs == "last":
                n = max(n, d + 2)
        elif n * per_query < unknowns:
            rank = "" if r >= d else f" (the summed value map has rank {r} < d = {d})"
            raise ConfigError(
                f"n_attention_queries={n} queries of {N} tokens{rank} give {n * per_query} logit "
                f"differences for {unknowns} unknowns of (W, c); at least "
                f"{math.ceil(unknowns / per_query)} are needed")
        return N, int(n)

    def _ask_attention(self, oracle, rng, n, N, V, beta, outputs):
        """The attention stage's queries X (n, N, d) and the heads' attention matrices
        (H, n, M, N), from the heads' value maps V (H, d, d_out).

        A pilot (one query in :data:`PILOT_SHARE`) of tokens of norm about 1 measures how
        peaked the head's attention is; the other queries' tokens are scaled so that a row's
        logits spread over about :data:`TARGET_SPREAD` (logits are quadratic in the tokens'
        scale). Sets ``token_scale_``."""
        d = V.shape[1]
        X = rng.standard_normal((n, N, d)) / np.sqrt(d)
        k = max(1, n // PILOT_SHARE)
        A = self._attention(X[:k], oracle(X[:k]), V, beta, outputs)
        scale = 1.0
        if k < n:
            spread = float(np.median(spreads(A, outputs, bool(self.causal))))
            if spread > 0:
                scale = float(np.clip(np.sqrt(TARGET_SPREAD / spread), 1 / MAX_RESCALE,
                                      MAX_RESCALE))
            X[k:] *= scale
            A = np.concatenate(
                [A, self._attention(X[k:], oracle(X[k:]), V, beta, outputs)], axis=1)
        self.token_scale_ = scale
        return X, A

    def _attention(self, X, O, V, beta, outputs) -> np.ndarray:
        """:func:`~attnquery.learners.vector._attention.attention_matrices`, its residual kept
        in ``attention_residual_``."""
        A, self.attention_residual_ = attention_matrices(X, O, V, beta, outputs,
                                                         bool(self.causal),
                                                         tol=self._attention_tol())
        return A

    # -- the tolerances: float64 rounding's (the served route's, its answers' format's) --------
    def _attention_tol(self) -> float:
        """Largest residual of the attention matrices (and negative weight) the answers'
        rounding explains (:data:`~._attention.ATTENTION_TOL`)."""
        return ATTENTION_TOL

    def _min_weight(self) -> float:
        """Attention weights below this are left out of the logit equations."""
        return MIN_WEIGHT

    def _verify_tol(self) -> float:
        """The check's relative tolerance (:data:`VERIFY_RTOL`)."""
        return VERIFY_RTOL

    def _verify_scale(self) -> float:
        """The norm of the check queries' tokens (1; the served route's is larger)."""
        return 1.0

    def _split_tolerances(self) -> SplitTolerances:
        """The split's tolerances: :data:`~._split.ROWS` for every token's outputs (the
        points of a key difference in one query), else :data:`~._split.EXACT`."""
        return ROWS if self.outputs_ == "all" else EXACT

    def _split_values(self, ledger, V_sum, beta, H: int, rng) -> np.ndarray:
        """The heads' value maps: :func:`~._split.split_values` with
        :meth:`_split_tolerances`."""
        return split_values(ledger, V_sum, beta, H, rng, self._split_tolerances())

    def _shared_options(self) -> dict:
        """The shared-token route's group oversampling and rank tolerance (its defaults)."""
        return {}

    def _verify(self, oracle, rng) -> None:
        """``verify`` fresh queries spread over :data:`CHECK_LENGTHS` (up to ``check_length``
        tokens); raise ModelMismatchError when the estimate's answers differ from the box's by
        more than :meth:`_verify_tol` (:func:`~._check.verify_fit`)."""
        verify_fit(self, oracle, rng, int(self.verify),
                   check_lengths(self.check_length, CHECK_LENGTHS),
                   "a single head as declared (positions, soft-capped logits, several heads, "
                   "noise beyond its answers' format)", allowed=self._verify_tol(),
                   token_scale=self._verify_scale())

    # -- prediction ------------------------------------------------------------------------------
    def predict(self, X) -> np.ndarray:
        """The recovered layer's outputs on X (B, N, d), in the oracle's shape: (B, N, d_out)
        for every token's outputs, (B, d_out) for the last token's."""
        if getattr(self, "rotary_", None) is not None:
            return self.rotary_.predict(X)
        if not hasattr(self, "W_"):
            raise ConfigError("predict() needs a fitted learner; call fit(oracle) first")
        return bilinear_layer(self.W_, self.key_bias_, self.V_, self.output_bias_,
                              causal=bool(self.causal), outputs=self.outputs_)(X)
