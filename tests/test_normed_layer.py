"""The attention half of a decoder layer, ``x -> x + attn(RMSNorm(x))``, read through its norm
(``input_norm="rms"``, ``residual=True``) without saturating a head: the split by spans
(``split="spans"``), the measured eps, the gauge (the gain folded into the fitted maps), the
layer's outputs on inputs of any scale, the saved layer, and refusals by name."""

import json

import numpy as np
import pytest

from attnquery.cli import main
from attnquery.errors import ConfigError, ModelMismatchError
from attnquery.learners import VectorLayerLearner
from attnquery.learners.vector import _spans
from attnquery.learners.vector.rotary_layer import RotaryLayerVectorLearner
from attnquery.models.vector import VectorAttentionLayer, random_vector_layer
from attnquery.oracles import VectorOracle
from attnquery.realheads import (
    NormedResidualAttention,
    attention_half,
    load_gguf,
    load_vector_layer,
    save_vector_layer,
    write_test_gguf,
)
from tests.test_cli_refusals import run

D, H, G, EPS = 32, 4, 2, 1e-5
#: the goal's accuracy: the function to this (relative) on fresh inputs
FUNCTION_TOL = 1e-9


def half_layer(seed=3, d=D, eps=EPS):
    module = random_vector_layer(d, H, seed=seed, n_kv_heads=G, causal=True, rope_base=1e4)
    gain = np.random.default_rng(seed).uniform(0.05, 0.5, d)
    return NormedResidualAttention(module, gain, eps), module, gain


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def fit_half(box, **params):
    oracle = box if isinstance(box, VectorOracle) else VectorOracle(box, box.d, outputs="all")
    params = {"n_heads": H, "n_kv_heads": G, "positions": "rotary", "rope_base": 1e4,
              "causal": True, "fit_bias": False, "input_norm": "rms", "residual": True,
              "check_length": 128, "random_state": 0, **params}
    return VectorLayerLearner(**params).fit(oracle), oracle


@pytest.fixture(scope="module")
def fitted():
    box, module, gain = half_layer()
    est, oracle = fit_half(box)
    return est, oracle, box, module, gain


def test_the_attention_half_is_read_through_its_norm(fitted):
    est, oracle, box, _, _ = fitted
    assert est.route_ == "rotary" and est.split_ == "spans"
    assert est.n_queries_ == oracle.n_queries == sum(est.n_queries_by_stage_.values())
    assert abs(est.norm_eps_ - EPS) <= 1e-9 * EPS
    rng = np.random.default_rng(5)
    # inputs of every scale: the norm takes each token's scale away, the residual keeps it
    for N, scale in [(1, 1.0), (3, 30.0), (40, 0.01), (128, 3.0)]:
        X = scale * rng.standard_normal((2, N, D))
        assert rel(est.predict(X), box(X)) <= FUNCTION_TOL, (N, scale)
    assert est.verify_error_ <= FUNCTION_TOL


def test_the_gain_folds_into_the_value_maps(fitted):
    """The gauge: only ``diag(g) V`` is identifiable, scaled by the folded tokens' scale."""
    est, _, _, module, gain = fitted
    want = (est.norm_scale_ * gain)[:, None] * module.value_maps().sum(axis=0)
    assert np.max(np.abs(est.V_.sum(axis=0) - want)) <= 1e-10 * np.max(np.abs(want))


def test_no_query_reaches_attention_beyond_the_norm(fitted):
    """Every token the fit asked reached the attention with mean square below the norm's
    bound (``mean(z^2) < 1`` for ``z = x / sqrt(mean(x^2) + eps)``): nothing saturates."""
    box, _, _ = half_layer()
    seen = []

    def spy(X):
        X = np.asarray(X)
        seen.append(float(np.max(np.mean(X * X, axis=-1) / (np.mean(X * X, axis=-1) + EPS))))
        return box(X)

    spy.d = D
    est, _ = fit_half(spy, verify=0)
    assert est.split_ == "spans" and max(seen) < 1.0


def test_the_split_by_spans_reads_every_head_of_a_module():
    layer = random_vector_layer(D, H, seed=4, n_kv_heads=G, bias=0.3, causal=True,
                                rope_base=1e4)
    oracle = VectorOracle(layer, D, outputs="all")
    est = RotaryLayerVectorLearner(n_heads=H, n_kv_heads=G, check_length=128, split="spans",
                                   random_state=0).fit(oracle)
    assert est.n_queries_by_stage_["split"] == _spans.spans_queries(D, H)
    truth = layer.value_maps()
    for V in est.V_:
        assert min(np.max(np.abs(V - W)) for W in truth) <= 1e-11 * np.max(np.abs(truth))
    X = np.random.default_rng(2).standard_normal((2, 100, D)) / np.sqrt(D)
    assert rel(est.predict(X), layer(X)) <= FUNCTION_TOL


def test_the_saved_layer_keeps_its_norm(fitted, tmp_path):
    est, _, box, _, _ = fitted
    save_vector_layer(tmp_path / "half.npz", est.rotary_.form_layer(), causal=1, answers="all")
    layer, _ = load_vector_layer(tmp_path / "half.npz")
    assert layer.norm_eps == est.norm_eps_ and layer.residual
    X = 4.0 * np.random.default_rng(3).standard_normal((2, 20, D))
    assert np.array_equal(layer(X), est.predict(X))
    assert rel(layer(X), box(X)) <= FUNCTION_TOL


@pytest.mark.parametrize("params, match", [
    (dict(positions="none", rope_base=None, n_kv_heads=None),
     "apply to positions='rotary' layers"),
    (dict(input_norm="layer"), "input_norm"),
])
def test_bad_parameters_are_refused_before_any_query(params, match):
    box, _, _ = half_layer()
    oracle = VectorOracle(box, D, outputs="all")
    with pytest.raises(ConfigError, match=match):
        fit_half(oracle, **params)
    assert oracle.n_queries == 0


def test_the_saturated_split_is_refused_through_the_norm():
    box, _, _ = half_layer()
    oracle = VectorOracle(box, D, outputs="all")
    with pytest.raises(ConfigError, match="input_norm='rms' is read from every token's "
                       "outputs with split='spans'"):
        RotaryLayerVectorLearner(n_heads=H, n_kv_heads=G, input_norm="rms", residual=True,
                                 split="saturate").fit(oracle)
    assert oracle.n_queries == 0


def test_the_last_tokens_outputs_are_refused_through_the_norm():
    box, module, gain = half_layer()
    last = NormedResidualAttention(
        VectorAttentionLayer(module.W_Q, module.W_K, module.W_V, module.W_O, causal=True,
                             outputs="last", rope_base=1e4), gain, EPS)
    oracle = VectorOracle(last, D, outputs="last")
    with pytest.raises(ConfigError, match="the oracle answers the last token's"):
        VectorLayerLearner(n_heads=H, n_kv_heads=G, positions="rotary", rope_base=1e4,
                           causal=True, input_norm="rms", residual=True).fit(oracle)
    assert oracle.n_queries == 0


def test_a_module_without_a_norm_is_refused_by_name():
    _, module, _ = half_layer()
    with pytest.raises(ModelMismatchError, match="no RMS norm before the attention"):
        fit_half(module, residual=False)


def test_another_number_of_heads_is_refused_by_the_spans():
    box, _, _ = half_layer()
    with pytest.raises(ModelMismatchError, match="another number of heads"):
        fit_half(box, n_heads=2, n_kv_heads=None)


pytest.importorskip("gguf", reason="the llm extra (pip install gguf==0.19.0) is absent")


def test_the_cli_extracts_the_attention_half_of_a_gguf_layer(tmp_path, capsys):
    path = write_test_gguf(tmp_path / "m.gguf", n_layers=1, d=D, n_heads=H, n_kv_heads=G,
                           quantization="Q8_0", seed=3)
    out = tmp_path / "half.npz"
    argv = ["extract", "--checkpoint", str(path), "--layer", "0", "--answers", "all",
            "--box", "half", "--param", "check_length=128", "--out", str(out), "--json",
            "--no-progress"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["func_err"] < FUNCTION_TOL and s["verify_error"] < FUNCTION_TOL
    half = attention_half(load_gguf(path, layers=[0]), 0, "all")
    learned, _ = load_vector_layer(out)
    X = 2.0 * np.random.default_rng(9).standard_normal((3, 40, D))
    assert rel(learned(X), half(X)) <= FUNCTION_TOL
    status, line = run(["extract", "--checkpoint", str(path), "--layer", "0", "--answers",
                        "last", "--box", "half"], capsys)
    assert status == 2 and "--box half is read from every token's outputs" in line
