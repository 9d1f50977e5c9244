"""Property tests: random sizes, scales and degenerate models drive every oracle and learner.

Only documented exceptions (subclasses of attnquery.errors.AttnQueryError) may escape, and a
learner that returns gives finite parameters: no other crash, no silent NaN.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnquery.errors import AttnQueryError
from attnquery.learners import (
    ExactValueQueryLearner,
    MembershipLearner,
    NoisyValueQueryLearner,
    SketchLowRankLearner,
    TransformerLearner,
)
from attnquery.models import AttentionHead, random_head, random_transformer
from attnquery.oracles import (
    AntisymmetricOracle,
    ApproximateValueOracle,
    MembershipOracle,
    RoundingOracle,
    ValueOracle,
)

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

heads = st.builds(
    lambda d, log_scale, rank, zero_frac, seed: random_head(
        d, seed=seed, rank=None if rank is None else min(rank, d), W_fro=10.0**log_scale,
        zero_frac=zero_frac),
    d=st.integers(1, 8),
    log_scale=st.floats(-2, 2),
    rank=st.one_of(st.none(), st.integers(0, 8)),
    zero_frac=st.sampled_from([0.0, 0.5, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)


def _finite(*arrays):
    for a in arrays:
        assert np.all(np.isfinite(np.asarray(a))), "a learner returned a non-finite parameter"


def _run(make, oracle):
    try:
        est = make().fit(oracle)
    except AttnQueryError:
        return None  # documented failure (not identifiable, assumption violated, budget, ...)
    return est


@SETTINGS
@given(head=heads, learner=st.sampled_from(["exact", "sketch", "noisy"]))
def test_value_learners_only_raise_documented_errors(head, learner):
    d = head.d
    make = {
        "exact": lambda: ExactValueQueryLearner(random_state=0),
        "sketch": lambda: SketchLowRankLearner(random_state=0),
        "noisy": lambda: NoisyValueQueryLearner(W_bound=max(2.0, 2 * np.linalg.norm(head.W)),
                                                mu=0.01, random_state=0),
    }[learner]
    est = _run(make, ValueOracle(head, d))
    if est is not None:
        _finite(est.W_, est.v_)


@SETTINGS
@given(head=heads, tau=st.floats(1e-9, 1e-2), noise=st.sampled_from(["uniform", "adversarial"]))
def test_noisy_learner_on_noisy_oracles(head, tau, noise):
    oracle = ApproximateValueOracle(head, head.d, tau=tau, noise=noise, random_state=1)
    est = _run(lambda: NoisyValueQueryLearner(W_bound=max(2.0, np.linalg.norm(head.W)), mu=0.05,
                                              random_state=0), oracle)
    if est is not None:
        _finite(est.W_, est.v_)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=heads)
def test_membership_learner(head):
    est = _run(lambda: MembershipLearner(eps=1e-2, W_bound=max(2.0, np.linalg.norm(head.W)),
                                         mu=0.05, random_state=0),
               MembershipOracle(head, head.d))
    if est is not None:
        _finite(est.W_, est.v_)
        assert np.isclose(np.linalg.norm(est.v_), 1.0)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(1, 5), m=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_transformer_learner(d, m, seed):
    tf = random_transformer(d, m, seed)
    est = _run(lambda: TransformerLearner(random_state=0), ValueOracle(tf, d))
    if est is not None:
        _finite(est.W_, est.v_, est.A_, est.w_o_)
        X = np.random.default_rng(seed).standard_normal((4, 3, d))
        assert np.all(np.isfinite(est.predict(X)))


queries = st.one_of(
    st.builds(lambda B, N, d, s: np.random.default_rng(s).standard_normal((B, N, d)),
              st.integers(0, 3), st.integers(0, 3), st.integers(1, 5), st.integers(0, 9)),
    st.sampled_from([np.full((1, 2, 3), np.nan), np.full((1, 1, 3), np.inf),
                     np.ones((2, 2, 3), dtype=np.float32), np.ones((3, 3)), np.ones(3)]),
)


@SETTINGS
@given(X=queries, kind=st.sampled_from(["value", "approx", "round16", "round4", "member",
                                         "antisym"]))
def test_oracles_answer_or_raise_documented_errors(X, kind):
    d = 3
    head = random_head(d, seed=0)
    oracle = {
        "value": lambda: ValueOracle(head, d),
        "approx": lambda: ApproximateValueOracle(head, d, tau=1e-3, random_state=0),
        "round16": lambda: RoundingOracle(head, d, dtype="float16"),
        "round4": lambda: RoundingOracle(head, d, digits=4),
        "member": lambda: MembershipOracle(head, d),
        "antisym": lambda: AntisymmetricOracle(ValueOracle(head, d)),
    }[kind]()
    try:
        y = oracle(X)
    except AttnQueryError:
        assert oracle.n_queries == 0
        return
    assert y.shape == (X.shape[0],) and np.all(np.isfinite(y))
    assert oracle.n_queries == X.shape[0]


def test_degenerate_models_raise_documented_errors():
    d = 4
    zero_v = AttentionHead(np.zeros(d), W=np.eye(d))
    for make in (lambda: ExactValueQueryLearner(), lambda: SketchLowRankLearner(),
                 lambda: NoisyValueQueryLearner(W_bound=2.0, mu=0.1)):
        with pytest.raises(AttnQueryError):
            make().fit(ValueOracle(zero_v, d))
    with pytest.raises(AttnQueryError):
        MembershipLearner(eps=1e-2, W_bound=2.0, mu=0.1).fit(MembershipOracle(zero_v, d))
