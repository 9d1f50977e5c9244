"""The served layer learner's circle scan refuses a circle whose value vectors do not isolate the
heads (isolation by the value, :func:`attnquery.learners.multihead_generic.served.isolation_test`)
and tries the next one; docs/served.md, *Whole layers*."""

from pathlib import Path

import numpy as np
import pytest

from attnquery.errors import SearchLimitError
from attnquery.learners import AttentionLayerLearner
from attnquery.learners._base import QueryLedger
from attnquery.learners.multihead_generic import ExactLayerLearner, ServedLayerLearner, layer_dof
from attnquery.learners.multihead_generic import served as S
from attnquery.learners.multihead_generic._state import _Layer
from attnquery.metrics import functional_error, match_heads
from attnquery.oracles import ValueOracle
from attnquery.realheads import ModuleBlackBox

from .boxes import checkpoint_layer

D, H = 32, 4
DOF = layer_dof(D, H, D // H)
MINILM = Path(__file__).resolve().parents[1] / "data" / "minilm" / "model.safetensors"


def _leaky(vs):
    """The signature of a wrong arc gradient between two crossings of the same sign: two v's
    off by opposite amounts (their sum, and V, unchanged; both of the scan's checks pass)."""
    out = np.array(vs, dtype=float)
    e = 0.5 * out[2] + 0.3 * np.linalg.norm(out[0]) * np.eye(out.shape[1])[0]
    out[0] += e
    out[1] -= e
    return out


def _test_on(layer_ckpt, vs, seed=0):
    """isolation_test on the float32 box with the given v's, at a scale that saturates."""
    truth = checkpoint_layer(layer_ckpt)
    oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D)
    run = _Layer(QueryLedger(oracle), sum(h.v for h in truth.heads), truth.total_offset,
                 noise=3e-7)
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(D) / np.sqrt(D)
    a = min(np.linalg.norm(h.W @ x0 + h.key_bias) for h in truth.heads)
    worst, n_sat = S.isolation_test(run, np.array(vs), x0, 1e4 * np.sqrt(D) / a, rng)
    assert oracle.n_queries == S.isolation_queries(H)
    return worst, n_sat


def test_isolation_test_accepts_the_true_values_and_refuses_leaky_ones(layer_ckpt):
    true_v = [h.v for h in checkpoint_layer(layer_ckpt).heads]
    worst, n_sat = _test_on(layer_ckpt, true_v)
    assert n_sat >= S.ISOLATION_SAMPLES * H - 2 and worst <= 1e-4  # measured 1e-6 or less
    worst, n_sat = _test_on(layer_ckpt, _leaky(true_v))
    assert n_sat >= S.ISOLATION_SAMPLES * H - 2 and worst > 10 * S.ISOLATION_TOL


def _corrupting(monkeypatch, calls):
    """The scan's check fed leaky v's on its first ``calls`` calls (the real check runs)."""
    real = S.isolation_test
    seen = []

    def fake(run, vs, x0, scale, rng):
        seen.append(real(run, _leaky(vs) if len(seen) < calls else vs, x0, scale, rng)[0])
        return seen[-1], 0

    monkeypatch.setattr(S, "isolation_test", fake)
    return seen


def test_scan_refuses_a_leaky_circle_and_tries_the_next(layer_ckpt, monkeypatch):
    seen = _corrupting(monkeypatch, 1)
    oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D)
    est = AttentionLayerLearner(n_heads=H, route="served",
                                n_queries=20 * DOF, random_state=0).fit(oracle)
    assert len(seen) == 2 and seen[0] > 10 * S.ISOLATION_TOL and seen[1] <= 1e-3
    assert est.scan_["rejected"] == 1 and est.scan_["planes"] >= 2
    assert est.scan_["isolation"] == seen[1]
    truth = checkpoint_layer(layer_ckpt)
    m = match_heads(est.W_, est.v_, [h.W for h in truth.heads], [h.v for h in truth.heads])
    assert m["max_rel_err_W"] <= 3e-5 and m["max_rel_err_v"] <= 1e-6
    assert functional_error(truth, est.predict, D, np.random.default_rng(1)) <= 1e-6
    assert est.n_queries_ == oracle.n_queries <= 20 * DOF


def test_no_isolating_circle_is_a_search_limit(layer_ckpt, monkeypatch):
    seen = _corrupting(monkeypatch, 10**6)
    oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D)
    est = AttentionLayerLearner(n_heads=H, route="served",
                                n_queries=20 * DOF, max_planes=2, random_state=0)
    with pytest.raises(SearchLimitError, match="did not isolate the heads"):
        est.fit(oracle)
    assert 1 <= len(seen) <= 2 and min(seen) > S.ISOLATION_TOL
    assert oracle.n_queries <= 20 * DOF


def test_exact_mode_asks_no_isolation_queries(layer_ckpt, monkeypatch):
    # the exact learner's scan is unchanged (its checks are exact; the fits are hashed in
    # docs/notes/2026-11-27-served.md): the isolation test is served mode's only
    monkeypatch.setattr(S, "isolation_test", None)
    est = AttentionLayerLearner(n_heads=H, random_state=0).fit(
        ValueOracle(ModuleBlackBox(layer_ckpt, 0), D))
    assert est.scan_["rejected"] == 0 and est.scan_["isolation"] is None


@pytest.mark.skipif(not MINILM.exists(), reason="the MiniLM checkpoint is not in data/minilm")
def test_minilm_layer_2_leaky_circle_is_refused(monkeypatch):
    # the served experiment's layer cell of seed 0 (rng default_rng(0)): the scan's first
    # circle passed both arc checks with three v's off by 1.6 to 3.7 relative and the fit was
    # refused later, after 0.9 layer_dof (AssumptionViolation); now that circle is refused
    # (measured: deviation 0.49 of delta^T v_g; the kept circle's 1.6e-4)
    from attnquery.experiments import readout_args
    from attnquery.realheads import layer_from_checkpoint

    cell = {"n_heads": 12, "readout": "gaussian:0"}
    args = dict(n_heads=12, **readout_args(cell))
    truth = layer_from_checkpoint(str(MINILM), 2, biases=True, **args)
    box = ModuleBlackBox(str(MINILM), 2, precision="float32", **args)
    seen, real = [], S.isolation_test

    def spy(run, vs, *a):
        seen.append((real(run, vs, *a)[0], vs.copy()))
        return seen[-1][0], 0

    class Stop(Exception):
        pass

    def stop(self, run, plan, vs, *a):
        raise Stop(vs)

    monkeypatch.setattr(S, "isolation_test", spy)
    monkeypatch.setattr(ServedLayerLearner, "_heads", stop)
    d = 384
    learner_rng = np.random.default_rng(0).spawn(2)[0]
    est = AttentionLayerLearner(n_heads=12, route="served", n_queries=4 * layer_dof(d, 12, 32),
                                random_state=learner_rng)
    with pytest.raises(Stop):
        est.fit(ValueOracle(box, d))
    tv = np.array([h.v for h in truth.heads])

    def worst_v(vs):
        return max(min(np.linalg.norm(v - t) / np.linalg.norm(t) for t in tv) for v in vs)

    assert len(seen) == 2 and est.scan_["rejected"] == 1
    assert seen[0][0] > 0.1 and worst_v(seen[0][1]) > 1.0  # measured 0.49 and 3.7
    # measured 2.1e-4 and 1.7e-3 (1.6e-4 and 4.5e-4 before V and beta were read again in
    # float32, which draws from the learner's generator first); the scan's v's are a start,
    # measured again from saturated queries after the rough pass
    assert seen[1][0] <= 1e-3 and worst_v(seen[1][1]) <= 3e-3


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_narrow_start_scale_stands_out_of_the_rounding(layer_ckpt, precision):
    # the start scale read at T0 = 1e-3 was rounding in float16 and bfloat16 (0.0009 to 0.002
    # on this layer against 17 to 26 exactly): the scan's 8 scales then never reached a circle
    # that separates the heads. Narrow formats grow T0 until the even part is resolved.
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(D) / np.sqrt(D)
    P, _ = np.linalg.qr(rng.standard_normal((D, 2)))
    scales = {}
    for prec in ("float64", precision):
        oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision=prec), D)
        truth = checkpoint_layer(layer_ckpt)
        led = QueryLedger(oracle)
        # bfloat16 is refused by measure_noise (above LAYER_MAX_NOISE): its measured 4.1e-3
        noise = 4.1e-3 if prec == "bfloat16" else S.measure_noise(
            led, D, np.random.default_rng(1), float(np.sqrt(D)))
        run = _Layer(led, sum(h.v for h in truth.heads), truth.total_offset,
                     noise=None if prec == "float64" else noise)
        assert S.narrow(run.noise) == (prec != "float64")
        scales[prec] = ExactLayerLearner(n_heads=H)._start_scale(run, x0, P[:, 0], P[:, 1])
    assert 0.25 <= scales[precision] / scales["float64"] <= 4.0


def test_scan_settings_of_float32_and_exact_mode_are_unchanged():
    for noise, step, pairs in ((None, 0.05, 0), (1e-7, S.STEP_FRACTION, S.MAX_GRADIENT_PAIRS),
                               (9e-6, S.STEP_FRACTION, S.MAX_GRADIENT_PAIRS)):
        cfg = S.scan_settings(noise, 16.0)
        assert (cfg.gradient_scale, cfg.step, cfg.max_pairs) == (16.0, step, pairs)
        assert (cfg.isolation_scale, cfg.isolation_tol) == (S.ISOLATION_SCALE, S.ISOLATION_TOL)
        assert S.verify_units(noise) == S.VERIFY_NOISE
    cfg = S.scan_settings(5.8e-4, 16.0)
    assert cfg.isolation_tol == S.NARROW_ISOLATION_TOL and cfg.step == S.NARROW_STEP_FRACTION
    assert S.verify_units(5.8e-4) == S.NARROW_VERIFY_NOISE
