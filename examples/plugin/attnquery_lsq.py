"""A plug-in learner for attnquery: a single head's (W, v) by least squares from random queries.

A probe design of its own, not the paper's: v from ``oversample * d`` random one-token queries
(their answers are ``x^T v``), then W from ``oversample * d^2`` random two-token queries
``[a; b]``. With v known, such an answer gives the attention weight of ``a`` and so the logit

    log(alpha / (1 - alpha)) = a^T W b - b^T W b = (a - b)^T W b,

a linear measurement of W along the rank-one matrix ``(a - b) b^T``. W is the weighted
least-squares solution of all of them (each row weighted by how well its answer fixes its logit).
It asks through the query ledger (``n_queries_by_stage_``: ``v``, ``W``, ``verify``) and checks
itself on fresh queries like every attnquery learner.

Installed with ``pip install examples/plugin``, it is the learner ``lsq`` of the entry-point
group ``attnquery.learners``: ``attnquery extract --method lsq`` and a study's ``lowrank_scale``
learners reach it by that name.
"""

from __future__ import annotations

import numbers

import numpy as np

from attnquery.errors import ConfigError, NotIdentifiableError
from attnquery.learners.base import (
    DEFAULT_VERIFY,
    ROUNDING_RTOL,
    BaseLearner,
    Interval,
    LearnerSpec,
    check_oracle,
)
from attnquery.models import AttentionHead

__all__ = ["LeastSquaresLearner"]

#: the stages the ledger counts
STAGES = ("v", "W", "verify")


class LeastSquaresLearner(BaseLearner):
    """A single attention head (W, v) by least squares from random Gaussian queries.

    Parameters
    ----------
    oversample : int
        Queries per unknown: ``oversample * d`` one-token queries for v and ``oversample * d^2``
        two-token queries for W (at least 2: the rows of a square system of random rank-one
        measurements are too often ill-conditioned).
    token_scale : float
        Standard deviation of the query tokens' entries, times ``1 / sqrt(d)``; the logits grow
        as its square (a head with a large W needs a small one, or its attention weights
        saturate and carry no digits).
    verify : int
        Check queries spent after fitting (0: no check): the answers must agree with the
        estimate's to ``1e-9`` (relative), else
        :class:`~attnquery.errors.ModelMismatchError`.
    random_state : int, Generator or None
        Seed of the queries.

    Attributes
    ----------
    W_ : ndarray (d, d)
    v_ : ndarray (d,)
    n_queries_ : int
        Queries counted by the oracle during ``fit``, the check queries included.
    n_queries_by_stage_ : dict
        Queries per stage: ``v``, ``W``, ``verify``.
    residual_ : float
        Largest weighted residual of the logit equations (relative to the largest logit).
    verify_error_ : float
        Largest disagreement on the check queries, relative to the largest answer.
    """

    spec = LearnerSpec(
        name="lsq", oracle="value", returns="head", stages=STAGES,
        description="least squares from random Gaussian one- and two-token queries, "
        "oversample (d^2 + d) queries (plug-in example)",
        variants={"square": {"oversample": 2, "token_scale": 0.5}}, label="least squares")

    # the values each parameter may take (BaseLearner's own: verify, random_state); fit's
    # validate_params() refuses any other by name, before the first query
    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "oversample": [Interval(numbers.Integral, 2, None, closed="left")],
        "token_scale": [Interval(numbers.Real, 0, None, closed="neither")],
    }

    def __init__(self, *, oversample: int = 2, token_scale: float = 1.0,
                 verify: int = DEFAULT_VERIFY, random_state=None):
        self.oversample = oversample
        self.token_scale = token_scale
        self.verify = verify
        self.random_state = random_state

    def fit(self, oracle):
        """Recover (W, v) from ``oracle``; returns self.

        Raises
        ------
        ConfigError
            A bad parameter.
        NotIdentifiableError
            v = 0 (every answer is 0): W is then not identifiable.
        ModelMismatchError
            The check queries disagree with the estimate (not a single head, noise, biases).
        """
        self.validate_params()
        n_check = int(self.verify)
        d = check_oracle(oracle)
        rng = self.make_rng()
        s = float(self.token_scale) / np.sqrt(d)
        n_v, n_W = self.oversample * d, self.oversample * d * d
        with self.open_ledger(oracle, STAGES) as ledger:
            ledger.check_budget(n_v + n_W + n_check, f"least squares ({n_v + n_W} queries and "
                                f"{n_check} check queries)")
            with ledger.stage("v"):
                X = rng.standard_normal((n_v, d)) * s
                v = np.linalg.lstsq(X, ledger(X[:, None, :]), rcond=None)[0]
            if not np.any(v):
                raise NotIdentifiableError("every one-token answer is 0: v = 0, and W does not "
                                           "change any answer")
            with ledger.stage("W"):
                A = rng.standard_normal((n_W, d)) * s
                B = rng.standard_normal((n_W, d)) * s
                y = ledger(np.stack([A, B], axis=1))
            self.W_, self.residual_ = _solve_W(A, B, y, v)
            self.v_ = v
            with ledger.stage("verify"):
                self.verify_fit(oracle, self.predict, rng.spawn(1)[0], rtol=ROUNDING_RTOL,
                                 n0=ledger.n0)
        return self

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered head on inputs X (B, N, d) (before ``fit``:
        :class:`~attnquery.errors.NotFittedError`, as every learner's)."""
        return AttentionHead(self.v_, W=self.W_)(X)


def _solve_W(A, B, y, v):
    """W from the answers ``y`` to the two-token queries ``[a; b]`` (rows of A, B), and the
    largest weighted residual relative to the largest logit."""
    va, vb = A @ v, B @ v
    diff = va - vb
    alpha = (y - vb) / np.where(diff == 0, np.inf, diff)  # the weight of the first token
    usable = (alpha > 0) & (alpha < 1)
    if usable.sum() < A.shape[1] ** 2:
        raise ConfigError(f"only {int(usable.sum())} of {len(y)} two-token answers fix a logit "
                          "(attention weights saturated at 0 or 1): lower token_scale")
    logit = np.log(alpha[usable]) - np.log1p(-alpha[usable])
    # an answer's rounding moves its logit by about eps |y| / (|diff| alpha (1 - alpha))
    weight = np.abs(diff[usable]) * alpha[usable] * (1 - alpha[usable])
    rows = ((A - B)[usable, :, None] * B[usable, None, :]).reshape(int(usable.sum()), -1)
    w = np.linalg.lstsq(rows * weight[:, None], logit * weight, rcond=None)[0]
    resid = np.max(np.abs(rows @ w - logit) * weight) / max(np.max(np.abs(logit * weight)),
                                                           np.finfo(float).tiny)
    return w.reshape(A.shape[1], A.shape[1]), float(resid)
