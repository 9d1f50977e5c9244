"""AttentionLayerLearner(route="served", n_queries=...): whole layers with their biases
extracted from served answers (float32, ours and onnxruntime's), within the budget, and named
refusals."""

import numpy as np
import pytest

from attnquery.errors import (
    AssumptionViolation,
    BudgetExceededError,
    ConfigError,
    ModelMismatchError,
    NoiseAboveFormatWarning,
    SearchLimitError,
)
from attnquery.learners import AttentionLayerLearner
from attnquery.learners.multihead_generic import layer_dof
from attnquery.learners.multihead_generic.served import NOISE_QUERIES, value_queries
from attnquery.metrics import functional_error, match_heads
from attnquery.oracles import ValueOracle
from attnquery.precision import rounding_floor
from attnquery.realheads import (
    ModuleBlackBox,
)

from .boxes import checkpoint_layer, in_dtype, relative_noise, soft_capped
from .onnx_boxes import module_box

D, H = 32, 4
DOF = layer_dof(D, H, D // H)
NAMED = (SearchLimitError, AssumptionViolation, ModelMismatchError, BudgetExceededError)


def _errors(est, truth):
    m = match_heads(est.W_, est.v_, [h.W for h in truth.heads], [h.v for h in truth.heads])
    c = max(float(np.linalg.norm(est.key_bias_[m["perm"][j]] - h.key_bias)
                  / np.linalg.norm(h.key_bias)) for j, h in enumerate(truth.heads))
    return m["max_rel_err_W"], m["max_rel_err_v"], c


def _fit_engine(path, engine, precision, seed):
    """The layer learner fitted within 20 layer_dof to ``engine``'s box ("ours" or
    "onnxruntime") of the checkpoint's layer 0 in ``precision``: (est, oracle, budget)."""
    box = (ModuleBlackBox(path, 0, precision=precision) if engine == "ours"
           else module_box(path, 0, None, precision))
    oracle = ValueOracle(box, D)
    budget = 20 * DOF
    est = AttentionLayerLearner(n_heads=H, route="served",
                                n_queries=budget, random_state=seed).fit(oracle)
    return est, oracle, budget


@pytest.mark.parametrize("engine", ["ours", "onnxruntime"])
def test_float32_layer_within_the_budget(layer_ckpt, engine):
    est, oracle, budget = _fit_engine(layer_ckpt, engine, "float32", seed=0)
    truth = checkpoint_layer(layer_ckpt)
    eW, ev, ec = _errors(est, truth)
    # measured: W 6.3e-7 (onnxruntime 9.0e-7), v 1.6e-7, function 5.2e-8; before the left
    # sketch was read in full, each probe at its own scale and V read again
    # (docs/notes/2026-11-27-served.md):
    # W 2.1e-6 (2.9e-6), v 1.4e-7, c 8.9e-7, function 1.1e-7; before the sharper probes: W
    # 6.8e-6 (7.2e-6), c 4.9e-6; before the v's were measured again from saturated queries:
    # W 9e-5, v 3e-5, function 8e-6
    assert eW <= 3e-6 and ev <= 1e-6 and ec <= 1e-5
    assert functional_error(truth, est.predict, D, np.random.default_rng(1)) <= 1e-6
    assert abs(est.offset_ - truth.total_offset) <= 1e-5 * max(1.0, abs(truth.total_offset))
    # the noise is float32's, measured (within half its floor: 0.26 to 0.41 of it over five
    # measurements, ours and onnxruntime's); the budget holds and every query is counted
    assert 1e-8 <= est.noise_level_ <= 0.5 * est.noise_floor_
    assert est.answer_format_ == "float32" and not est.noise_above_format_
    assert est.noise_floor_ == rounding_floor("float32", D)
    assert est.n_queries_ == oracle.n_queries <= budget
    assert est.n_queries_ == sum(est.n_queries_by_stage_.values())
    assert est.n_passes_ >= 2 and est.verify_error_ <= 3e-5
    # the value vectors measured again: one least-squares fit of saturated queries per head
    assert est.n_queries_by_stage_["values"] == H * value_queries(D)


def test_float32_layer_from_seed_to_seed(layer_ckpt):
    # measured: learner seeds 1 to 8 give a worst W of 6.1e-7 to 8.5e-7 (1.7e-6 to 2.9e-6
    # before the left sketch was read in full, 5.2e-6 to 1.0e-5 before the sharper probes),
    # v 1e-7 to 2.3e-7 and a function error of 3.8e-8 to 6.0e-8 (1.1e-7 to 1.2e-7 before);
    # before the saturated v's and the row-space
    # sketches (random right sketches, whose r x r core reached a condition number of 1.3e3)
    # other seeds of this layer gave 1.6e-5 to 1.9e-4, 7.2e-3, and a refusal by the check
    truth = checkpoint_layer(layer_ckpt)
    for seed in (1, 2, 3):
        oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D)
        est = AttentionLayerLearner(n_heads=H, route="served",
                                    n_queries=20 * DOF, random_state=seed).fit(oracle)
        eW, ev, _ = _errors(est, truth)
        assert eW <= 3e-6 and ev <= 1e-6
        assert functional_error(truth, est.predict, D, np.random.default_rng(seed)) <= 1e-6


def test_small_budget_plans_every_stage_within_it(layer_ckpt):
    # 10 layer_dof: one rough pass, 2 passes (3 before the left sketch was read in full), the
    # missing directions a multiple of them; every stage's queries as planned and the whole
    # within the budget
    oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D)
    est = AttentionLayerLearner(n_heads=H, route="served",
                                n_queries=10 * DOF, random_state=0).fit(oracle)
    r = D // H
    assert est.n_missing_passes_ % est.n_passes_ == 0 and est.n_passes_ >= 2
    assert est.n_queries_by_stage_["missing"] == (1 + est.n_missing_passes_) * 2 * H * (H - 1) * (
        r + 1)
    assert oracle.n_queries == est.n_queries_ <= 10 * DOF
    eW, ev, _ = _errors(est, checkpoint_layer(layer_ckpt))
    assert eW <= 1e-5 and ev <= 1e-6  # measured 1.0e-6 (2.7e-6, 7.9e-6 before) and 1.6e-7


def test_exact_mode_still_refuses_served_answers(layer_ckpt):
    # route="auto" is the exact learner: float32 answers fail its circle scan, as before
    oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D)
    with pytest.raises(SearchLimitError):
        AttentionLayerLearner(n_heads=H, random_state=0).fit(oracle)


def test_served_mode_on_exact_answers(layer_ckpt):
    truth = checkpoint_layer(layer_ckpt)
    est = AttentionLayerLearner(n_heads=H, route="served", n_queries=20 * DOF, random_state=0)
    est.fit(ValueOracle(ModuleBlackBox(layer_ckpt, 0), D))
    assert est.noise_level_ < 1e-14
    assert max(_errors(est, truth)) <= 1e-9


def test_budget_too_small_is_refused_before_the_first_query(layer_ckpt):
    # 4 DOF (8,196) is below the 8,289 queries any fit asks besides its circle scan at d = 32
    oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D)
    est = AttentionLayerLearner(n_heads=H, route="served", n_queries=4 * DOF, random_state=0)
    with pytest.raises(ConfigError, match=f"n_queries = {4 * DOF} does not pay"):
        est.fit(oracle)
    assert oracle.n_queries == 0


@pytest.mark.parametrize("engine", ["ours", "onnxruntime"])
def test_float16_layer_is_extracted(layer_ckpt, engine):
    # before the narrow-format scan (docs/notes/2026-11-27-served.md) float16 was refused with
    # SearchLimitError at every budget: the start scale, read at a circle whose answers are
    # rounding, was 2.6e4 times too small, so the 8 scales never separated the heads.
    # Measured (20 layer_dof, learner seed 0): ours W 1.5e-2 (floor 3.1e-4), v 5.5e-4 (floor
    # 4.9e-4), c 8.9e-3, function 2.5e-4, noise 5.8e-4; onnxruntime W 3.5e-2, v 5.0e-4,
    # function 3.3e-4 (a wrong head is off by O(1)). The fit is refused by name on some seeds:
    # over learner seeds 0 to 9, 3 with our box (0, 3, 4; its sums in float64) and 2 with the
    # box summing in float32 (4, 6; before 2026-11-27), though the two boxes' float16 answers
    # differ on 0.4% of inputs (docs/notes/2026-11-27-cross-machine.md). Seed 1: ours W 4.5e-3,
    # onnxruntime W 3.1e-3
    est, oracle, budget = _fit_engine(layer_ckpt, engine, "float16", seed=1)
    truth = checkpoint_layer(layer_ckpt)
    eW, ev, ec = _errors(est, truth)
    assert eW <= 0.1 and ev <= 2e-3 and ec <= 0.1
    assert functional_error(truth, est.predict, D, np.random.default_rng(1)) <= 2e-3
    assert 1e-4 <= est.noise_level_ <= 2e-3
    # within two of float16's floors (measured 0.42 to 1.03; refused beyond 4)
    assert est.answer_format_ == "float16" and est.noise_level_ <= 2 * est.noise_floor_
    assert est.n_queries_ == oracle.n_queries <= budget
    # the check's tolerance is tied to the narrow format's noise (64 units), not 1e3 units
    assert est.verify_error_ <= 64 * est.noise_level_ < 0.05


def test_bfloat16_layer_is_refused_by_name_at_once(layer_ckpt):
    # measured: in bfloat16 (noise 3.1e-3 to 4.1e-3) every fit tried (20, 50, 100 layer_dof,
    # learner seeds 0 to 3) failed by name after spending 7 to 19 layer_dof (no separating
    # circle, or rough heads too rough for the saturated and missing-direction probes); the
    # learner now says so after reading V, beta and the noise (LAYER_MAX_NOISE)
    oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="bfloat16"), D)
    with pytest.raises(AssumptionViolation, match="bfloat16"):
        AttentionLayerLearner(n_heads=H, route="served",
                              n_queries=20 * DOF, random_state=0).fit(oracle)
    assert oracle.n_queries <= 2 * (D + 1 + 2 * NOISE_QUERIES)


def _noisy_soft_capped(path):
    """The layer with its scores soft-capped to ``30 tanh(s / 30)``, in float32, each answer
    carrying relative noise 5e-6 before it is rounded to float32."""
    return in_dtype(relative_noise(soft_capped(checkpoint_layer(path), cap=30.0), 5e-6), np.float32)


def test_noisy_soft_capped_float32_layer_is_refused_by_its_noise(layer_ckpt):
    """Before the noise was judged against the format, this box was returned for learner
    seed 1 (check 900 units of the noise, within the 1e3 units of its tolerance; the function
    off by 9.2e-5) and refused by the check for seeds 0 and 2. Its noise, 2.2e-6 to 3.3e-6
    measured, is 6.5 to 9.8 of float32's floor at d = 32: refused by name for every seed once
    the noise is measured."""
    for seed in (0, 1, 2):
        oracle = ValueOracle(_noisy_soft_capped(layer_ckpt), D)
        est = AttentionLayerLearner(n_heads=H, route="served",
                                    n_queries=20 * DOF, random_state=seed)
        with pytest.raises(ModelMismatchError, match="float32 values"):
            est.fit(oracle)
        assert est.answer_format_ == "float32"
        assert est.noise_level_ > 6 * est.noise_floor_
        assert oracle.n_queries <= D + 1 + 2 * NOISE_QUERIES


def test_declared_noisy_layer_answers_warn_instead(layer_ckpt):
    """``noise="measured"``: the same box, its noise declared, is fitted as before (learner
    seed 1 passes the check, which stays 1e3 units of the noise), with a warning by name."""
    est = AttentionLayerLearner(n_heads=H, route="served", n_queries=20 * DOF, random_state=1,
                                noise="measured")
    with pytest.warns(NoiseAboveFormatWarning, match="float32 values"):
        est.fit(ValueOracle(_noisy_soft_capped(layer_ckpt), D))
    assert est.noise_above_format_ and est.verify_error_ > 100 * est.noise_level_


def test_wrong_number_of_heads_is_refused(layer_ckpt):
    oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D)
    with pytest.raises(NAMED):
        AttentionLayerLearner(n_heads=3, route="served",
                              n_queries=20 * DOF, random_state=0).fit(oracle)


def test_n_queries_is_checked():
    for bad in (0, -5, 2.5):
        with pytest.raises(ConfigError):
            AttentionLayerLearner(n_heads=H, route="served", n_queries=bad)._validate_params()
    with pytest.raises(ConfigError):
        AttentionLayerLearner(n_heads=H, route="served", n_queries=10**6,
                              positions="rotary")._validate_params()
    with pytest.raises(ConfigError, match="noise"):
        AttentionLayerLearner(n_heads=H, route="served", n_queries=10**6,
                              noise=1e-6)._validate_params()


def test_spare_passes_go_to_the_noisiest_heads():
    from attnquery.learners.multihead_generic._state import _Head
    from attnquery.learners.multihead_generic.served import merged, share_passes

    # the head whose error (spread^2 base / passes) is largest gets the next pass
    assert list(share_passes([1.0, 3.0, 1.0], 2, 4)) == [2, 6, 2]
    assert list(share_passes([1.0, 1.0], 2, 0)) == [2, 2]
    assert list(share_passes([2.0, 1.0], 1, 3)) == [4, 1]
    # two estimates of one head merge into their weighted mean, cut back to its rank
    rng = np.random.default_rng(0)
    B = np.linalg.qr(rng.standard_normal((8, 6)))[0]
    L, R = rng.standard_normal((6, 2)), rng.standard_normal((8, 2))
    E = 1e-3 * rng.standard_normal((6, 8))
    a = _Head(B, L, R, np.ones(6), 1e-6)
    Ub, sb, Vb = np.linalg.svd(L @ R.T + E, full_matrices=False)
    b = _Head(B, Ub[:, :2] * sb[:2], Vb[:2].T, 3 * np.ones(6), 2e-6)
    m = merged(a, b, 1, 3)
    want = 0.25 * (L @ R.T) + 0.75 * (b.L @ b.R.T)
    assert np.linalg.norm(m.L @ m.R.T - want) <= 1e-3 * np.linalg.norm(want)
    assert np.allclose(m.t_c, 2.5) and m.L.shape == (6, 2)
    assert np.isclose(m.spread, np.hypot(0.25e-6, 1.5e-6))


def test_float32_fits_read_v_and_beta_again(layer_ckpt):
    # V and beta, read once from d + 1 one-row queries, carry one answer's rounding into
    # every probe alike: served mode reads them again by least squares (docs/served.md)
    from attnquery.learners.multihead_generic.served import constant_queries

    oracle = ValueOracle(ModuleBlackBox(layer_ckpt, 0, precision="float32"), D)
    est = AttentionLayerLearner(n_heads=H, route="served",
                                n_queries=10 * DOF, random_state=0).fit(oracle)
    assert est.n_queries_by_stage_["v_sum"] >= D + 1 + 2 * NOISE_QUERIES + constant_queries(D)
    assert len(est.head_passes_) == H and min(est.head_passes_) >= est.n_passes_
