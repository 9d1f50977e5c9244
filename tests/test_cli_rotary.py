"""``attnquery extract --method rotary``: a rotary head (RoPE) through the command line."""

import json

import numpy as np
import pytest

from attnquery.cli import main
from attnquery.extraction import ExtractionSpec, run_extraction
from attnquery.learners.rotary import rotary_query_count
from attnquery.models import RotaryAttentionHead
from attnquery.realheads import load_head
from tests.fixtures import ROTARY_HEAD


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_extract_rotary_from_an_oracle(tmp_path, capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    d, out = 16, tmp_path / "rope.npz"
    argv = ["extract", "--oracle", "tests.fixtures:rotary_head", "--d", str(d), "--method",
            "rotary", "--param", "rope_base=10000", "--out", str(out)]
    assert main([*argv, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["n_queries"] - s["n_verify_queries"] == rotary_query_count(d) == 2 * (d * d + d)
    assert s["rotary_dim"] == 8 and s["rank_found"] == 8
    np.testing.assert_allclose(s["frequencies"], ROTARY_HEAD.frequencies, rtol=0, atol=1e-12)
    head, meta = load_head(out)
    assert isinstance(head, RotaryAttentionHead) and meta["method"] == "rotary"
    X = np.random.default_rng(0).standard_normal((3, 700, d)) / 4
    assert _rel(head(X), ROTARY_HEAD(X)) < 1e-9
    # the text report names the rotated dimensions and the saved file's arrays
    assert main(argv[:-2]) == 0
    text = capsys.readouterr().out
    assert "rotary         8 rotated dimensions, frequencies 1 to" in text
    # a saved rotary head runs in simulation, with its errors against the truth
    s2 = json.loads((main(["extract", "--model", str(out), "--method", "rotary", "--json"]),
                     capsys.readouterr().out)[1])
    assert s2["rel_err_W"] < 1e-9 and s2["rel_err_M_4095"] < 1e-8 and s2["func_err"] < 1e-9
    # the wrong base is refused, not answered
    assert main(["extract", "--oracle", "tests.fixtures:rotary_head", "--d", "16", "--method",
                 "rotary", "--param", "rope_base=500000"]) == 1
    assert "rope_base" in capsys.readouterr().err


def test_extract_rotary_low_rank_route_and_library():
    d = ROTARY_HEAD.d
    s, learned = run_extraction(ExtractionSpec("rotary", ROTARY_HEAD, d, truth=ROTARY_HEAD,
                                               rank=8, seed=1))
    assert s["n_queries"] - s["n_verify_queries"] == rotary_query_count(d, 8)
    assert s["rel_err_W"] < 1e-9 and s["func_err"] < 1e-9
    assert isinstance(learned, RotaryAttentionHead)


#: the fixture's scalar rotary layer: d = 24, 4 heads over 2, no biases
LAYER = ["extract", "--oracle", "tests.fixtures:rotary_scalar_layer", "--d", "24", "--method",
         "layer", "--param", "n_heads=4", "--param", "positions=rotary"]


def test_extract_a_rotary_layer_from_an_oracle(tmp_path, capsys, monkeypatch, repo):
    from attnquery.learners import AttentionLayerLearner
    from attnquery.models import MultiHeadAttention
    from attnquery.oracles import ValueOracle
    from attnquery.realheads import load_layer
    from tests.fixtures import ROTARY_SCALAR_LAYER as truth

    monkeypatch.chdir(repo)
    out = tmp_path / "rope_layer.npz"
    assert main([*LAYER, "--param", "n_kv_heads=2", "--param", "fit_bias=false", "--out",
                 str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["method"] == "layer" and s["n_heads"] == 4 and s["rotary_dim"] == 6
    np.testing.assert_allclose(s["frequencies"], truth.frequencies, rtol=0, atol=1e-12)
    assert s["verify_error"] < 1e-9
    layer, meta = load_layer(out)
    assert isinstance(layer, MultiHeadAttention) and layer.rotary
    assert meta["n_queries"] == s["n_queries"] and layer.n_heads == 4
    # the saved layer is the learner's (seed 0, the command's default: deterministic)
    est = AttentionLayerLearner(n_heads=4, n_kv_heads=2, positions="rotary", fit_bias=False,
                                random_state=0).fit(ValueOracle(truth, 24))
    assert est.n_queries_ == s["n_queries"]
    rng = np.random.default_rng(0)
    for N in (1, 7, 700):
        X = rng.standard_normal((3, N, 24)) / np.sqrt(24)
        np.testing.assert_array_equal(layer(X), est.predict(X))
        assert _rel(layer(X), truth(X)) < 1e-9, N
    # the test can fail: one head left out is another function
    part = MultiHeadAttention(layer.heads[1:], offset=layer.offset)
    assert _rel(part(X), truth(X)) > 1e-3


def test_a_rotary_layer_in_the_library_with_its_errors():
    from attnquery.models import MultiHeadAttention
    from tests.fixtures import ROTARY_SCALAR_LAYER as box

    truth = MultiHeadAttention(box.heads())
    s, learned = run_extraction(ExtractionSpec(
        "layer", box, 24, truth=truth, seed=1,
        params={"n_heads": 4, "n_kv_heads": 2, "positions": "rotary", "fit_bias": False}))
    assert learned.rotary and s["rel_err_W"] < 1e-9 and s["rel_err_v"] < 1e-9
    assert s["rel_err_M_4095"] < 1e-8 and s["func_err"] < 1e-9


@pytest.mark.parametrize("args, says", [
    (["--param", "n_kv_heads=2"], "positions='rotary' learns layers without biases: "
                                  "fit_bias=False"),
    (["--param", "n_kv_heads=3", "--param", "fit_bias=false"], "n_kv_heads"),
])
def test_bad_rotary_layer_options_are_refused_before_any_query(capsys, monkeypatch, repo, args,
                                                               says):
    import tests.fixtures

    monkeypatch.chdir(repo)
    asked = []
    monkeypatch.setattr(tests.fixtures, "rotary_scalar_layer", lambda X: asked.append(X))
    assert main([*LAYER, *args]) == 2
    assert says in capsys.readouterr().err and asked == []


def test_rotary_layers_refuse_bad_input(tmp_path):
    from attnquery.errors import ModelError
    from attnquery.models import MultiHeadAttention, random_head
    from attnquery.realheads import load_layer, save_layer
    from tests.fixtures import ROTARY_SCALAR_LAYER as box

    heads = box.heads()
    with pytest.raises(ModelError, match="every head a RotaryAttentionHead"):
        MultiHeadAttention([heads[0], random_head(24, 0)])
    with pytest.raises(ModelError, match="float64 only"):
        MultiHeadAttention(heads, precision="float32")
    path = tmp_path / "layer.npz"
    save_layer(path, MultiHeadAttention(heads))
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files if k != "W_K"}
    np.savez(path, **arrays)
    with pytest.raises(ModelError, match=r"not a rotary layer file: it lacks \['W_K'\]"):
        load_layer(path)
    np.savez(path, **{**arrays, "W_K": arrays["W_Q"][:3]})
    with pytest.raises(ModelError, match=r"\['W_K'\] do not hold one entry per head"):
        load_layer(path)
