"""Property tests: random sizes, scales and degenerate models drive every oracle and learner.

Only the errors a learner's ``fit`` documents for the box (:data:`REFUSALS`; never a ConfigError,
since every parameter here is valid) may escape, and a learner that returns gives finite
parameters: no other crash, no silent NaN. On boxes that are not what a learner assumes, it
returns an estimate that agrees with the box or raises one of those errors, within its stated
query cap; on boxes that are, it never refuses and recovers the box's parameters.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnquery.errors import (
    AssumptionViolation,
    AttnQueryError,
    ConfigError,
    NotIdentifiableError,
    SearchLimitError,
)
from attnquery.learners import (
    AttentionLayerLearner,
    ExactValueQueryLearner,
    MembershipLearner,
    NoisyValueQueryLearner,
    ReLUNetworkLearner,
    SketchLowRankLearner,
    TransformerLearner,
)
from attnquery.learners._base import output_error_bound
from attnquery.models import (
    AttentionHead,
    membership_head,
    random_head,
    random_transformer,
    theorem_head,
)
from attnquery.oracles import (
    AntisymmetricOracle,
    ApproximateValueOracle,
    MembershipOracle,
    RoundingOracle,
    ValueOracle,
)
from tests.boxes import ARCHITECTURE_BOXES, biased_head, in_dtype, relative_noise, two_heads
from tests.reliability import BOXES as TABLE_BOXES
from tests.reliability import EXEMPT as NOT_IN_TABLE
from tests.reliability import LEARNERS as TABLE_LEARNERS
from tests.reliability import learner_rows, run_cell, uncovered
from tests.vacuous import fit_noting_vacuous

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


#: relative error of a recovered W or v that float64 rounding explains, for the learners exact
#: in float64 (exact, sketch, the transformer's attention part)
TRUTH_RTOL = 1e-6


def _rel(a, b) -> float:
    """Relative Frobenius error of ``a`` against ``b``."""
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(float).tiny))


def _ulps(a) -> float:
    """A few units in the last place of ``a``'s largest entry: the rounding of answers of
    that size."""
    return 16 * np.finfo(float).eps * float(np.max(np.abs(a)))


def _finite(*arrays):
    for a in arrays:
        assert np.all(np.isfinite(np.asarray(a))), "a learner returned a non-finite parameter"


#: the errors each learner's ``fit`` documents for the boxes these tests give it (no budget,
#: valid parameters): a ConfigError is never among them
REFUSALS = {
    "exact": (NotIdentifiableError, AssumptionViolation),
    "sketch": (NotIdentifiableError, AssumptionViolation),
    "noisy": (NotIdentifiableError, AssumptionViolation),
    "membership": (NotIdentifiableError, AssumptionViolation),
    "transformer": (NotIdentifiableError, SearchLimitError, AssumptionViolation),
    "ffn": (SearchLimitError, AssumptionViolation),
}

#: the registry's names of the keys of REFUSALS that differ (the ReLU network learner is "ffn"
#: here)
REFUSAL_LEARNERS = {"ffn": "relu"}


def test_the_refusals_are_of_registered_learners_and_named_errors():
    from attnquery.learners import registry

    names = {REFUSAL_LEARNERS.get(name, name) for name in REFUSALS}
    assert names <= set(registry()), sorted(names - set(registry()))
    for name, errors in REFUSALS.items():
        assert all(issubclass(e, AttnQueryError) and not issubclass(e, ConfigError)
                   for e in errors), name


def _run(make, oracle, learner):
    """Fit; None when the learner refuses with one of its documented :data:`REFUSALS` (the
    box is degenerate or not what it assumes). A ConfigError, which valid parameters never
    raise, and any other error propagate."""
    try:
        return fit_noting_vacuous(make(), oracle)
    except ConfigError:
        raise
    except REFUSALS[learner]:
        return None


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
    est = _run(make, ValueOracle(head, d), learner)
    if est is not None:
        _finite(est.W_, est.v_)


@SETTINGS
@given(head=heads, tau=st.floats(1e-9, 1e-2), noise=st.sampled_from(["uniform", "adversarial"]))
def test_noisy_learner_on_noisy_oracles(head, tau, noise):
    oracle = ApproximateValueOracle(head, head.d, tau=tau, noise=noise, random_state=1)
    est = _run(lambda: NoisyValueQueryLearner(W_bound=max(2.0, np.linalg.norm(head.W)), mu=0.05,
                                              random_state=0), oracle, "noisy")
    if est is not None:
        _finite(est.W_, est.v_)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=heads)
def test_membership_learner(head):
    est = _run(lambda: MembershipLearner(eps=1e-2, W_bound=max(2.0, np.linalg.norm(head.W)),
                                         mu=0.05, random_state=0),
               MembershipOracle(head, head.d), "membership")
    if est is not None:
        _finite(est.W_, est.v_)
        assert np.isclose(np.linalg.norm(est.v_), 1.0)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(1, 5), m=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_transformer_learner(d, m, seed):
    tf = random_transformer(d, m, seed)
    est = _run(lambda: TransformerLearner(random_state=0), ValueOracle(tf, d), "transformer")
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


# -- verified or refused: never a wrong answer silently -----------------------------------------
#
# Every learner, on boxes that are not what it assumes (answers with relative noise, answers in
# float32 or float16, two heads, a head with biases, the sliding-window, ALiBi, rotary and
# attention-sink heads of real architectures), either returns an estimate that agrees with the
# box on fresh queries of 1 to 64 tokens or raises an AttnQueryError; in both cases within its
# stated cap of queries (a saturated probe is asked again at most 9 times, hence the factors 10).
# Each test also fits the learner on the box it assumes and asserts that it is recovered, so that
# none passes vacuously when every wrong box raises.

WRONG_BOXES = {
    # kind: (build from a clean box, the box's own relative imprecision)
    "noise_1e-6": (lambda f, d, s: relative_noise(f, 1e-6, s), 1e-6),
    "noise_1e-4": (lambda f, d, s: relative_noise(f, 1e-4, s), 1e-4),
    "float32": (lambda f, d, s: in_dtype(f, np.float32), 2.0**-24),
    "float16": (lambda f, d, s: in_dtype(f, np.float16), 2.0**-11),
    "two_heads": (lambda f, d, s: two_heads(d, s), 0.0),
    "biased": (lambda f, d, s: biased_head(d, s), 0.0),
    **{name: (lambda f, d, s, name=name: ARCHITECTURE_BOXES[name](d, s), 0.0)
       for name in ARCHITECTURE_BOXES},
}
#: lengths of the queries on which a returned estimate must agree with the box
AGREE_LENGTHS = (1, 2, 3, 4, 5, 8, 16, 32, 64)


def _cap(name, d, est):
    """The most queries ``name`` may ask at dimension d (check queries included)."""
    n_check = est.verify
    if name == "exact":
        return d + 10 * d * d + n_check
    if name == "sketch":
        return 10 * (d + 2 * d * d) + n_check
    if name == "noisy":
        return d + d * d + n_check
    if name == "membership":
        return est.planned_queries(d)["total"] + d + d * d + n_check
    if name == "ffn":
        return est.query_cap(d)
    if name == "transformer":
        return 2 * (d + 10 * d * d) + ReLUNetworkLearner().query_cap(d) + n_check
    raise KeyError(name)


WRONG_LEARNERS = {
    "exact": lambda d: ExactValueQueryLearner(random_state=0),
    "sketch": lambda d: SketchLowRankLearner(random_state=0),
    "noisy": lambda d: NoisyValueQueryLearner(W_bound=8.0, mu=0.01, tau=1e-9, random_state=0),
    "membership": lambda d: MembershipLearner(eps=1e-3, W_bound=8.0, mu=0.01, random_state=0),
}


def _returned_within_cap(name, est, oracle, d) -> bool:
    """Fit; one of the learner's documented :data:`REFUSALS` is fine (a ConfigError is not).
    Either way the oracle counted no more than the cap, and a returned estimate passed its own
    check. Returns whether the learner returned."""
    try:
        est.fit(oracle)
    except ConfigError:
        raise
    except REFUSALS[name]:
        assert oracle.n_queries <= _cap(name, d, est)
        return False
    assert oracle.n_queries == est.n_queries_ <= _cap(name, d, est)
    assert est.verify_error_ >= 0.0 and est.n_verify_queries_ == est.verify
    return True


#: the largest share of random queries on which a sign learner's estimate may disagree with the
#: box: its 64 check queries miss a share p with probability (1 - p)^64, 4% at p = 5%
SIGN_DISAGREEMENT = 0.05


def _agrees(est, box, d, rel_noise, signs=False) -> bool:
    """Whether a returned estimate agrees with the box on fresh queries of every length in
    :data:`AGREE_LENGTHS`: to within 20 times the box's own imprecision (1e-6 at least), or
    twice the error the learner states it can have (the noisy learner: tau plus its per-entry
    bounds carried to the outputs); for signs, on all but :data:`SIGN_DISAGREEMENT` of the
    queries (250 of each length) where the estimate's value is not within 1e-2 of its largest
    (a random check can only find what is not rare)."""
    rng = np.random.default_rng(99)
    for n in AGREE_LENGTHS:
        X = rng.standard_normal((250 if signs else 16, n, d)) / np.sqrt(d)
        y, yhat = np.asarray(box(X), dtype=float), est.predict(X)
        if signs:
            sure = np.abs(yhat) > 1e-2 * np.max(np.abs(yhat))
            if np.mean(sure & ((y > 0) != (yhat > 0))) > SIGN_DISAGREEMENT:
                return False
            continue
        allowed = max(1e-6, 20 * rel_noise) * np.max(np.abs(y))
        if hasattr(est, "err_W_"):
            allowed = np.maximum(allowed, 2 * (est.tau_ + output_error_bound(
                X, est.v_, est.err_W_, est.err_v_)))
        if not np.all(np.abs(y - yhat) <= allowed):
            return False
    return True


def _assumed_box(learner, d, seed):
    """The box ``learner`` (a key of WRONG_LEARNERS) assumes, and its oracle class."""
    if learner == "membership":
        head = random_head(d, seed=seed, W_fro=2.0)
        v = np.abs(head.v) + 0.1
        return AttentionHead(v / np.linalg.norm(v), W=head.W), MembershipOracle
    if learner == "noisy":
        return AttentionHead(np.sign(random_head(d, seed=seed).v) * 0.5,
                             W=random_head(d, seed=seed, W_fro=3.0).W), ValueOracle
    if learner == "sketch":
        return random_head(d, seed=seed, rank=max(1, d // 2)), ValueOracle
    return random_head(d, seed=seed), ValueOracle


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(learner=st.sampled_from(sorted(WRONG_LEARNERS)), kind=st.sampled_from(sorted(WRONG_BOXES)),
       d=st.integers(2, 8), seed=st.integers(0, 2**16))
def test_wrong_boxes_end_verified_or_in_a_named_error(learner, kind, d, seed):
    build, rel_noise = WRONG_BOXES[kind]
    box = build(random_head(d, seed=seed), d, seed)
    signs = learner == "membership"
    oracle = (MembershipOracle if signs else ValueOracle)(box, d)
    est = WRONG_LEARNERS[learner](d)
    if _returned_within_cap(learner, est, oracle, d):
        assert _agrees(est, box, d, rel_noise, signs), f"{learner} returned a wrong answer"
    # not vacuous: the box the learner assumes is recovered, and passes the same agreement test
    own, oracle_cls = _assumed_box(learner, d, seed)
    est = WRONG_LEARNERS[learner](d).fit(oracle_cls(own, d))
    assert not est.verify_vacuous_ and _agrees(est, own, d, 0.0, signs)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["noise_1e-6", "noise_1e-4", "float32", "float16"]),
       learner=st.sampled_from(["transformer", "ffn"]), d=st.integers(2, 6),
       m=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_transformer_and_ffn_learners_on_imprecise_boxes(kind, learner, d, m, seed):
    build, rel_noise = WRONG_BOXES[kind]
    tf = random_transformer(d, m, seed)
    box = build(tf, d, seed)
    oracle = ValueOracle(box, d)
    est = (TransformerLearner if learner == "transformer" else ReLUNetworkLearner)(
        random_state=0)
    if not _returned_within_cap(learner, est, oracle, d):
        return
    if learner == "ffn":
        Z = np.random.default_rng(9).standard_normal((64, d))
        y = box(Z[:, None, :])
        assert np.max(np.abs(est.predict(Z) - y)) <= max(1e-6, 20 * rel_noise) * \
            np.max(np.abs(y))
    else:
        assert _agrees(est, box, d, rel_noise)


# -- never refused: a box that is what the learner assumes ----------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(1, 12), log_scale=st.floats(-3, 3), rank=st.one_of(st.none(),
       st.integers(1, 12)), zero_frac=st.sampled_from([0.0, 0.3, 0.9]),
       spectral=st.one_of(st.none(), st.just(500.0)),
       probes=st.sampled_from(["basis", "gaussian", "orthogonal"]), seed=st.integers(0, 2**32 - 1))
def test_exact_learner_never_refuses_a_single_head(d, log_scale, rank, zero_frac, spectral,
                                                   probes, seed):
    rank = None if rank is None else min(rank, d)
    head = random_head(d, seed=seed, rank=rank, W_fro=None if spectral else 10.0**log_scale,
                       W_spectral=spectral, zero_frac=zero_frac)
    if not np.any(head.v):
        return
    est = ExactValueQueryLearner(probes=probes, random_state=seed).fit(ValueOracle(head, d))
    assert est.verify_error_ <= 1e-9 and est.n_verify_queries_ == 8
    assert _rel(est.W_, head.W) <= TRUTH_RTOL and _rel(est.v_, head.v) <= TRUTH_RTOL


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(2, 24), rank=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
def test_sketch_learner_never_refuses_a_low_rank_head(d, rank, seed):
    rank = min(rank, d // 2)
    if rank < 1:
        return
    head = random_head(d, seed=seed, rank=rank, zero_frac=0.25)
    for r in (None, rank):
        est = SketchLowRankLearner(rank=r, random_state=seed).fit(ValueOracle(head, d))
        assert est.rank_ == rank and est.verify_error_ <= 1e-9
        assert _rel(est.W_, head.W) <= TRUTH_RTOL and _rel(est.v_, head.v) <= TRUTH_RTOL


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(2, 10), tau=st.floats(1e-10, 1e-3), noise=st.sampled_from(
       ["uniform", "adversarial"]), seed=st.integers(0, 2**16))
def test_noisy_learner_never_refuses_a_head_within_its_assumptions(d, tau, noise, seed):
    mu = 0.5 / np.sqrt(d)
    head = theorem_head(d, seed, 4.0, mu, zero_frac=0.25)
    if not tau < mu / 2:
        return
    oracle = ApproximateValueOracle(head, d, tau, noise=noise, random_state=seed)
    est = fit_noting_vacuous(NoisyValueQueryLearner(W_bound=4.0, mu=mu, random_state=seed),
                             oracle)
    assert np.isfinite(est.verify_error_)
    # Theorem 6.1: every entry within the bound the learner states (an adversarial answer
    # off by tau itself reaches it, up to the rounding of the answers)
    assert np.all(np.abs(est.W_ - head.W) <= est.err_W_ + _ulps(head.W))
    assert np.all(np.abs(est.v_ - head.v) <= est.err_v_ + _ulps(head.v))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(1, 6), eps=st.sampled_from([1e-2, 1e-4, 1e-6]), seed=st.integers(0, 2**16))
def test_membership_learner_never_refuses_a_head_within_its_assumptions(d, eps, seed):
    head = membership_head(d, seed, 4.0, 0.05)
    est = MembershipLearner(eps=eps, W_bound=4.0, mu=0.05, random_state=seed).fit(
        MembershipOracle(head, d))
    assert est.verify_error_ == 0.0
    # App. B: W and the direction of v, every entry within the bound the learner states
    u = head.v / np.linalg.norm(head.v)
    assert np.all(np.abs(est.W_ - head.W) <= est.err_W_ + _ulps(head.W))
    assert np.all(np.abs(est.v_ - u) <= est.err_v_ + _ulps(u))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(3, 12), m=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_transformer_learner_never_refuses_a_transformer(d, m, seed):
    tf = random_transformer(d, min(m, d), seed)
    est = fit_noting_vacuous(TransformerLearner(random_state=seed), ValueOracle(tf, d))
    assert est.verify_error_ <= 1e-8
    # W, and v = A w_o (the FFN's neurons are found up to their order and scale)
    assert _rel(est.W_, tf.W) <= TRUTH_RTOL
    assert _rel(est.v_, tf.A @ tf.w_o) <= TRUTH_RTOL


# -- every learner on every box: the table of docs/reliability.md -------------------------------


@pytest.mark.parametrize("learner", sorted(learner_rows()))
def test_every_learner_agrees_with_every_box_or_raises_a_named_error(learner):
    """The measurement behind docs/reliability.md (``python -m tests.reliability``) for one
    learner: on the box it assumes it returns an estimate that agrees on 1 to 64-token inputs;
    on every other box it agrees, raises an AttnQueryError, or returns with a
    VacuousCheckWarning (its check could not fail); never a silent wrong answer."""
    own = run_cell(learner, None)
    assert own["agrees"] is True, own
    for box in TABLE_BOXES:
        r = run_cell(learner, box)
        assert r["outcome"] != "WRONG", (learner, box, r)
        if box.startswith(("window", "alibi", "rotary")) and learner not in ("membership",
                                                                              "rotary"):
            # position-dependent boxes never pass a position-free learner's check
            assert r["agrees"] is None, (learner, box, r)


def test_every_registered_learner_has_a_row_in_the_reliability_table():
    """A learner added to the registry, built in or a plug-in, is measured on every box of
    docs/reliability.md (a row of tests/reliability.py, or one its spec gives), or
    tests/reliability.py's EXEMPT says why not."""
    from attnquery.learners import registry

    assert uncovered() == [], "registered learners without a reliability row or an exemption"
    rows = {name.split()[0] for name in TABLE_LEARNERS}
    for name in rows:
        assert name in registry(), f"reliability row {name!r} names no registered learner"
    assert set(NOT_IN_TABLE) <= set(registry()) - rows, "an exemption of a learner with a row"


class _HeadPlugin(ExactValueQueryLearner):
    """A plug-in learner of one head from value answers (the exact learner's spec)."""


class _LayerPlugin(AttentionLayerLearner):
    """A plug-in learner of a layer (the layer learner's spec): no row follows from its spec."""


# the broken plug-in warns each time the registry's rows are read (asserted once, below)
@pytest.mark.filterwarnings("ignore:plug-in learner 'broken':UserWarning")
def test_a_plugin_learner_is_measured_from_its_spec_or_must_be_exempted(monkeypatch,
                                                                        entry_points):
    import sys
    import types

    from attnquery.learners import registry

    mod = types.ModuleType("attnquery_reliability_plugins")
    mod.Head, mod.Layer = _HeadPlugin, _LayerPlugin
    monkeypatch.setitem(sys.modules, "attnquery_reliability_plugins", mod)
    entry_points(headplug="attnquery_reliability_plugins:Head",
                 layerplug="attnquery_reliability_plugins:Layer",
                 broken="attnquery_missing_package:Broken")
    assert {"headplug", "layerplug", "broken"} <= set(registry())
    # a head learner gets a row from its spec and is measured like the built-in ones (the
    # plug-in that cannot be loaded is named in a warning)
    with pytest.warns(UserWarning, match="plug-in learner 'broken' .* cannot be loaded"):
        assert "headplug" in learner_rows() and "layerplug" not in learner_rows()
    assert run_cell("headplug", None)["agrees"] is True
    assert run_cell("headplug", "two heads")["outcome"] == "ModelMismatchError"
    # a layer learner, or one that cannot be loaded, needs a row or an exemption
    assert uncovered() == ["broken", "layerplug"]
    monkeypatch.setitem(NOT_IN_TABLE, "layerplug", "measured by its own package's tests")
    monkeypatch.setitem(NOT_IN_TABLE, "broken", "not installed")
    assert uncovered() == []
