"""One-layer transformers from value queries (paper Sec. 4.1).

The transformer ``TF(X) = w_o^T ReLU(A^T X^T alpha(X, W))`` is learned in two independent parts:

* attention: antisymmetric queries ``VQ(X) - VQ(-X) = alpha(X, W)^T X v`` with ``v = A w_o``
  (:class:`~attnquery.oracles.AntisymmetricOracle`) turn the transformer into a single attention
  head, which :class:`~attnquery.learners.ExactValueQueryLearner` recovers exactly;
* FFN: one-row queries ``VQ([x]) = w_o^T ReLU(A^T x)`` expose the FFN, which
  :class:`~attnquery.learners.ffn.ReLUNetworkLearner` recovers as a network computing the same
  function.

The two parts are fitted without their own checks; the whole transformer is then checked on fresh
random queries of 2 to ``check_length`` (4,096) tokens and prefix-permuted copies of the longest.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, NotIdentifiableError
from ..oracles import AntisymmetricOracle
from ._base import (
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    N_QUERIES_PARAM,
    BaseLearner,
    check_oracle,
    check_verify_param,
)
from ._params import Options
from ._registry import LearnerSpec
from .exact import PROBE_DESIGNS, ExactValueQueryLearner
from .ffn import FFN_VERIFY_RTOL, ReLUNetworkLearner

__all__ = ["ReLUNetworkLearner", "TransformerLearner", "FFN_LEARNERS"]

#: the stages ``n_queries_by_stage_`` counts
STAGES = ("attention", "ffn", "verify")
#: FFN learners TransformerLearner knows
FFN_LEARNERS = ("kinks",)


class TransformerLearner(BaseLearner):
    """Learn a one-layer transformer ``w_o^T ReLU(A^T X^T alpha(X, W))`` from value queries.

    W and ``v = A w_o`` come from antisymmetric queries ``VQ(X) - VQ(-X)`` (two value queries
    each) with the exact single-head learner (Sec. 4.1, Theorem 4.1); the FFN from one-row
    queries with :class:`ReLUNetworkLearner`.

    Parameters
    ----------
    ffn : {"kinks"}
        The FFN learner.
    probes : {"basis", "gaussian"}
        Probe design of the exact learner (default: the paper's deterministic set).
    ffn_params : dict, optional
        Extra parameters of :class:`ReLUNetworkLearner` (its own check is replaced by the
        transformer's).
    verify : int
        Check queries spent after fitting (0: no check)
        (default 8: 6 fresh random queries of 2 to ``check_length`` tokens and copies of the
        two longest with their first N - 1 tokens permuted, which the box must answer alike;
        :func:`~attnquery.learners._base.check_plan`): the transformer
        found must agree with the oracle to :data:`FFN_VERIFY_RTOL`, else
        :class:`~attnquery.errors.ModelMismatchError`.
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is such a transformer on
        every input of up to ``check_length`` tokens, such as one with a wider sliding window,
        passes.
    n_queries : int, optional
        The most queries the whole fit asks, its check's included (default None: no cap;
        :class:`~attnquery.learners.base.BaseLearner` says how a cap is kept).
    random_state : int, sequence of ints, Generator or None
        Seed of the attention part's probes, the FFN learner and the check queries.

    Attributes
    ----------
    W_ : ndarray (d, d)
    v_ : ndarray (d,)
        ``A w_o`` read by the attention part.
    A_, w_o_ : ndarray (d, m_hat), (m_hat,)
        An FFN computing the same function as the true one.
    ffn_ : ReLUNetworkLearner
        The fitted FFN learner (diagnostics: ``width_recovered_``, ``verify_error_``, ...).
    n_queries_attention_ : int
        Value queries used by the attention part (twice the antisymmetric queries).
    n_queries_ffn_ : int
        Value queries used by the FFN part.
    n_queries_by_stage_ : dict
        Queries per stage: ``attention``, ``ffn`` and ``verify`` (``n_queries_attention_`` and
        ``n_queries_ffn_`` read it).
    n_queries_ : int
        All value queries counted by the oracle during ``fit`` (the check queries included).
    n_verify_queries_ : int
        Check queries (``verify``).
    verify_error_ : float
        Largest disagreement on the check queries, relative to the largest answer.
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        "n_queries": [N_QUERIES_PARAM, None],
        "ffn": [Options(FFN_LEARNERS)],
        "probes": [Options(PROBE_DESIGNS)],
        "ffn_params": [dict, None],
    }
    spec = LearnerSpec(
        name="transformer", oracle="value", returns="transformer", stages=STAGES,
        description="a one-layer transformer, its attention head and its ReLU network "
        "(Section 4.1)", label="transformer (Sec. 4.1)")

    def __init__(self, *, ffn: str = "kinks", probes: str = "basis",
                 ffn_params: dict | None = None, verify: int = DEFAULT_VERIFY,
                 check_length: int = CHECK_LENGTH, n_queries: int | None = None, random_state=None):
        self.ffn = ffn
        self.probes = probes
        self.ffn_params = ffn_params
        self.verify = verify
        self.check_length = check_length
        self.n_queries = n_queries
        self.random_state = random_state

    def _validate_extra(self):
        """``ffn_params`` are the FFN learner's parameters, checked by its constraints
        (``verify`` is set to 0 and ``random_state`` drawn from this learner's seed)."""
        ffn_params = self.ffn_params or {}
        names = set(ReLUNetworkLearner._parameter_constraints) - {"random_state"}
        unknown = sorted(set(ffn_params) - names, key=str)
        if unknown:
            raise ConfigError(f"ffn_params has no parameter {unknown[0]!r} of "
                              f"ReLUNetworkLearner; valid: {sorted(names)}")
        try:
            ReLUNetworkLearner(**{**ffn_params, "verify": 0})._validate_params()
        except ConfigError as exc:
            raise ConfigError(f"ffn_params: {exc}") from None

    @property
    def n_queries_attention_(self) -> int:
        """Queries of the attention part (``n_queries_by_stage_["attention"]``)."""
        return self._stage_count("attention")

    @property
    def n_queries_ffn_(self) -> int:
        """Queries of the FFN part (``n_queries_by_stage_["ffn"]``)."""
        return self._stage_count("ffn")

    def fit(self, oracle):
        """Recover (W, v) and an equivalent FFN from ``oracle``; returns self.

        Raises
        ------
        NotIdentifiableError
            If ``A w_o = 0``: every antisymmetric query answers 0 and W is not identifiable.
        SearchLimitError
            The FFN learner's search reached its cap (answers that are not piecewise linear:
            noise, lower precision).
        ModelMismatchError
            The transformer found disagrees with the check queries.
        """
        self._validate_params()
        d = check_oracle(oracle)
        rng = self._rng()
        r_att, r_ffn = rng.spawn(2)
        with self._open_ledger(oracle, STAGES) as ledger:
            ledger.need(2 * (d * d + d) + check_verify_param(self.verify),
                        "the attention part (2 (d^2 + d) queries) and the check")
            with ledger.stage("attention"):
                att = self._fit_attention(oracle, r_att)
            with ledger.stage("ffn"):
                ffn_params = {**(self.ffn_params or {}), "verify": 0}
                ffn = ReLUNetworkLearner(random_state=r_ffn, **ffn_params).fit(oracle)
            self.W_ = att.W_
            self.v_ = att.v_
            self.A_ = ffn.A_
            self.w_o_ = ffn.w_o_
            self.attention_ = att
            self.ffn_ = ffn
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, rng.spawn(1)[0], rtol=FFN_VERIFY_RTOL,
                                 n0=ledger.n0, what="the transformer found",
                                 hint="the box may not be a bias-free one-layer transformer, or "
                                 "its answers may carry noise or lower precision than float64",
                                 check_length=self.check_length)
        return self

    def _fit_attention(self, oracle, rng) -> ExactValueQueryLearner:
        """W and ``v = A w_o`` from antisymmetric queries (two value queries each)."""
        try:
            return ExactValueQueryLearner(probes=self.probes, random_state=rng,
                                          verify=0).fit(AntisymmetricOracle(oracle))
        except NotIdentifiableError:
            raise NotIdentifiableError(
                "A w_o = 0: every antisymmetric query VQ(X) - VQ(-X) answers 0, so W is not "
                "identifiable (paper Sec. 4.1)"
            ) from None

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered transformer on inputs X (B, N, d)."""
        from ..models import OneLayerTransformer

        return OneLayerTransformer(self.W_, self.A_, self.w_o_)(X)
