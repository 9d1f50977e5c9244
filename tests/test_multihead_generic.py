"""Generic multi-head attention from value queries (MultiHeadLearner), beyond the paper."""

from __future__ import annotations

import numpy as np
import pytest

from attnquery.errors import AssumptionViolation, ConfigError, NotIdentifiableError
from attnquery.experiments import expand_cells, run_cells
from attnquery.figures import render, timing_figures
from attnquery.figures.multihead_generic import multihead_generic_claims
from attnquery.learners import MultiHeadLearner
from attnquery.learners.multihead_generic import (
    fit_tanh_sum,
    head_separation,
    multihead_eval,
    multihead_jacobian,
)
from attnquery.metrics import match_heads
from attnquery.models import AttentionHead, MultiHeadAttention, random_head, random_multihead
from attnquery.oracles import ValueOracle

TOL = 1e-8


def _truth(model):
    return [h.W for h in model.heads], [h.v for h in model.heads]


def _errors(est, model):
    m = match_heads(est.W_, est.v_, *_truth(model))
    return m["max_rel_err_W"], m["max_rel_err_v"]


@pytest.mark.parametrize(("d", "H", "seeds"), [(8, 2, (0, 1, 2)), (10, 3, (0, 1))])
def test_random_heads_recovered_in_every_seed(d, H, seeds):
    for seed in seeds:
        model = random_multihead(d, H, 1000 + seed)
        oracle = ValueOracle(model, d)
        est = MultiHeadLearner(n_heads=H, random_state=seed).fit(oracle)
        eW, ev = _errors(est, model)
        assert est.n_heads_ == H and len(est.W_) == H and len(est.v_) == H
        assert eW <= TOL and ev <= TOL, (seed, eW, ev)
        assert est.n_queries_ == oracle.n_queries == sum(est.n_queries_by_stage_.values())
        assert est.func_err_ <= 1e-10
        assert est.head_separation_ == pytest.approx(head_separation(np.array(est.W_)))
        assert est.head_separation_ > 0.1


def test_number_of_heads_chosen_from_data():
    model = random_multihead(6, 3, 7)
    est = MultiHeadLearner(n_heads=None, random_state=0).fit(ValueOracle(model, 6))
    assert est.n_heads_ == 3
    eW, ev = _errors(est, model)
    assert eW <= TOL and ev <= TOL


def test_shared_w_raises_not_identifiable_naming_merged_head():
    model = random_multihead(6, 2, 3, shared_W=True)
    with pytest.raises(NotIdentifiableError, match="share W") as info:
        MultiHeadLearner(n_heads=2, random_state=0).fit(ValueOracle(model, 6))
    # the identifiable part: one merged head (W, v_1 + v_2)
    W, v = info.value.W, info.value.v
    assert len(W) == len(v) == 1
    np.testing.assert_allclose(W[0], model.heads[0].W, rtol=0, atol=1e-10)
    np.testing.assert_allclose(v[0], model.heads[0].v + model.heads[1].v, rtol=0, atol=1e-10)


def _negated(d, seed):
    head = random_head(d, seed)
    v2 = np.random.default_rng(seed + 1).standard_normal(d)
    return MultiHeadAttention([head, AttentionHead(v2, W=-head.W)])


def test_negated_pair_needs_three_row_queries():
    model = _negated(6, 11)
    with pytest.raises(NotIdentifiableError, match="three-row"):
        MultiHeadLearner(n_heads=2, three_row_queries=False, random_state=0).fit(
            ValueOracle(model, 6))
    est = MultiHeadLearner(n_heads=2, random_state=0).fit(ValueOracle(model, 6))
    eW, ev = _errors(est, model)
    assert est.hidden_ == "pair"
    assert eW <= TOL and ev <= TOL


def test_head_with_zero_w_recovered():
    head = random_head(6, 4)
    model = MultiHeadAttention([head, AttentionHead(np.ones(6), W=np.zeros((6, 6)))])
    est = MultiHeadLearner(n_heads=2, random_state=0).fit(ValueOracle(model, 6))
    eW, ev = _errors(est, model)
    assert est.hidden_ == "zero_head"
    assert ev <= TOL
    m = match_heads(est.W_, est.v_, *_truth(model))
    assert np.linalg.norm(est.W_[m["perm"][1]]) <= 1e-10  # the W = 0 head, absolutely
    assert m["rel_err_W"][0] <= TOL


def test_nearly_coincident_heads_warn_with_separation():
    d = 6
    head = random_head(d, 5)
    rng = np.random.default_rng(6)
    D = rng.standard_normal((d, d))
    D *= np.linalg.norm(head.W) / np.linalg.norm(D)
    model = MultiHeadAttention([head, AttentionHead(rng.standard_normal(d), W=head.W + 5e-3 * D)])
    with pytest.warns(UserWarning, match="nearly coincide"):
        est = MultiHeadLearner(n_heads=2, random_state=0).fit(ValueOracle(model, d))
    assert est.head_separation_ == pytest.approx(5e-3, rel=1e-3)
    eW, ev = _errors(est, model)
    assert eW <= 1e-6 and ev <= 1e-6


def test_too_few_heads_asked_is_refused():
    model = random_multihead(5, 3, 2)
    with pytest.raises(AssumptionViolation):
        MultiHeadLearner(n_heads=2, random_state=0).fit(ValueOracle(model, 5))


def test_bad_parameters_raise():
    oracle = ValueOracle(random_multihead(4, 2, 0), 4)
    for bad in ({"n_heads": 0}, {"n_heads": 2.5}, {"fit_tol": 0.0}, {"n_t": 2},
                {"refit_factor": 0.5}):
        with pytest.raises(ConfigError):
            MultiHeadLearner(**bad).fit(oracle)
    assert oracle.n_queries == 0


def test_tanh_sum_fit_exact_and_model_selection():
    t = np.geomspace(0.02, 50, 24)
    rates, c = np.array([0.3, 1.0, 3.1]), np.array([0.7, -1.2, 0.4])
    e = np.tanh(0.5 * np.outer(t, rates)) @ c
    (k, r, cc, rel), = fit_tanh_sum(t, e[None], 5, 1e-10)
    assert k == 3 and rel <= 1e-10
    np.testing.assert_allclose(r, rates, rtol=1e-7)
    np.testing.assert_allclose(cc, c, rtol=1e-7)


def test_jacobian_matches_finite_differences():
    rng = np.random.default_rng(0)
    H, d = 2, 3
    W, v = rng.standard_normal((H, d, d)), rng.standard_normal((H, d))
    X = rng.standard_normal((4, 3, d))
    model = MultiHeadAttention([AttentionHead(v[h], W=W[h]) for h in range(H)])
    f, J = multihead_jacobian(W, v, X)
    np.testing.assert_allclose(f, model(X), rtol=1e-13)
    np.testing.assert_allclose(multihead_eval(W, v, X), model(X), rtol=1e-13)
    th = np.concatenate([W.reshape(H, -1), v], axis=1).ravel()
    h = 1e-6
    for i in range(th.size):
        e = np.zeros_like(th)
        e[i] = h
        P1, P2 = (th + e).reshape(H, -1), (th - e).reshape(H, -1)
        fd = (multihead_eval(P1[:, :d * d].reshape(H, d, d), P1[:, d * d:], X)
              - multihead_eval(P2[:, :d * d].reshape(H, d, d), P2[:, d * d:], X)) / (2 * h)
        np.testing.assert_allclose(J[:, i], fd, atol=1e-7)


@pytest.fixture(scope="module")
def experiment_df():
    """Rows of a small multihead_generic study, its timing columns joined (as the figures get)."""
    import pandas as pd

    cfg = {"seeds": 1, "d": [4], "n_heads": [2], "separation_d": 4,
           "separation_eps": [0.0, 1.0], "negated_d": [4]}
    cells = expand_cells("multihead_generic", cfg)
    rows, timings = run_cells(cells, study_seed=1)
    return pd.DataFrame(rows).merge(pd.DataFrame(timings), on=["experiment", "cell_id"])


def test_experiment_rows_support_the_figure_claims(experiment_df):
    df = experiment_df.copy()
    claims = {c.name: c for c in multihead_generic_claims(df)}
    assert set(claims) == {"multihead_generic_small", "multihead_generic_shared_w",
                           "multihead_generic_separation", "multihead_generic_negated"}
    for c in claims.values():
        assert c.passed, str(c)
    # the claims can fail: drop the successes and they must say so
    df.loc[:, "success"] = False
    assert not any(c.passed for c in multihead_generic_claims(df)
                   if c.name != "multihead_generic_shared_w")


def test_wall_times_are_a_figure_of_their_own(experiment_df, tmp_path):
    timed = timing_figures()
    assert "multihead_generic_time" in timed
    assert "multihead_generic" not in timed  # so it is in the byte-for-byte check
    out = {}
    for name in ("multihead_generic", "multihead_generic_time"):
        for scale in (1.0, 1e3):
            df = experiment_df.copy()
            df["wall_time_s"] = df["wall_time_s"] * scale
            pdf = tmp_path / f"{name}-{scale:g}.pdf"
            claims = render(name, df, pdf)
            out[name, scale] = (pdf.read_bytes(), claims)
    # the deterministic figure keeps every claim and does not depend on the wall times
    a, b = out["multihead_generic", 1.0], out["multihead_generic", 1e3]
    assert a[0] == b[0]
    assert {c.name for c in a[1]} == {"multihead_generic_small", "multihead_generic_shared_w",
                                      "multihead_generic_separation", "multihead_generic_negated"}
    # the timing figure draws the wall times (and states no claim)
    t1, t2 = out["multihead_generic_time", 1.0], out["multihead_generic_time", 1e3]
    assert t1[0] != t2[0]
    assert t1[1] == []
