"""A checkpoint's attention module answering its output vectors:
``realheads.ModuleBlackBox(..., outputs="all" | "last")`` and ``attnquery extract --module
CHECKPOINT --layer L --answers all|last``."""

import json

import numpy as np
import pytest

from attnquery.cli import main
from attnquery.engines import vector_layer_of
from attnquery.errors import ModelError
from attnquery.metrics import layer_errors
from attnquery.models.vector import VectorAttentionLayer
from attnquery.realheads import ModuleBlackBox, write_test_checkpoint

D, H = 32, 4  # the project's small BERT-style test checkpoint


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return write_test_checkpoint(tmp_path_factory.mktemp("bert") / "model.safetensors",
                                 n_layers=2, n_heads=H, d=D)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return write_test_checkpoint(tmp_path_factory.mktemp("gpt2") / "model.safetensors",
                                 style="gpt2", n_layers=1, n_heads=H, d=D)


def _inputs(B=6, N=9, seed=0):
    return np.random.default_rng(seed).standard_normal((B, N, D))


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("outputs", ["all", "last"])
def test_outputs_are_the_vector_layer_of_the_same_weights(bert, outputs):
    X = _inputs()
    got = ModuleBlackBox(bert, 1, outputs=outputs)(X)
    want = vector_layer_of(bert, 1, outputs)(X)
    assert got.shape == ((6, 9, D) if outputs == "all" else (6, D))
    assert _rel(got, want) < 1e-14
    # the scalar box is the readout of the last token's output
    scalar = ModuleBlackBox(bert, 1)
    last = got[:, -1] if outputs == "all" else got
    assert _rel(last @ scalar.r, scalar(X)) < 1e-13


def test_one_head_and_no_biases_match_their_vector_layer(bert):
    X = _inputs(seed=1)
    box = ModuleBlackBox(bert, 0, 2, biases=False, outputs="all")
    truth = box.vector_layer()
    assert truth.n_heads == 1 and not np.any(truth.output_bias)
    full = vector_layer_of(bert, 0)
    assert _rel(truth.head_W()[0], full.head_W()[2]) < 1e-14
    assert _rel(box(X), truth(X)) < 1e-14


def test_gpt2_module_is_causal(gpt2):
    X = _inputs(seed=2)
    box = ModuleBlackBox(gpt2, 0, outputs="all")
    plain = vector_layer_of(gpt2, 0)
    causal = VectorAttentionLayer(plain.W_Q, plain.W_K, plain.W_V, plain.W_O, b_Q=plain.b_Q,
                                  b_K=plain.b_K, b_V=plain.b_V, b_O=plain.b_O, causal=True)
    assert box.causal and box.vector_layer().causal
    assert _rel(box(X), causal(X)) < 1e-14
    assert _rel(box(X), plain(X)) > 1e-3  # the mask matters on every row but the last
    assert _rel(box(X)[:, -1], plain(X)[:, -1]) < 1e-14


@pytest.mark.parametrize("precision, tol", [("float32", 1e-6), ("bfloat16", 3e-2)])
def test_served_precisions_round_every_operation(bert, precision, tol):
    X = _inputs(seed=3)
    exact = ModuleBlackBox(bert, 1, outputs="all")(X)
    served = ModuleBlackBox(bert, 1, outputs="all", precision=precision)(X)
    assert 0 < _rel(served, exact) < tol
    assert np.array_equal(served, served.astype(np.float32))  # values of the format


def test_bad_outputs_is_refused_by_name(bert):
    with pytest.raises(ModelError, match="outputs must be None, 'all' or 'last'"):
        ModuleBlackBox(bert, 0, outputs="every")


def _extract(*args):
    try:
        return main(["extract", "--no-progress", *args])
    except SystemExit as exc:
        return exc.code


def _saved_errors(path, truth):
    with np.load(path) as f:
        W, V, c = f["W"], f["V"], f["key_bias"]
    return layer_errors(list(W), [a.ravel() for a in V], list(c), list(truth.head_W()),
                        [a.ravel() for a in truth.value_maps()], list(truth.key_bias()))


@pytest.mark.parametrize("answers", ["all", "last"])
def test_extract_module_layer_from_vectors(bert, tmp_path, capsys, answers):
    out = tmp_path / f"{answers}.npz"
    assert _extract("--module", str(bert), "--layer", "1", "--answers", answers,
                    "--out", str(out), "--json") == 0
    s = json.loads(capsys.readouterr().out)
    assert s["method"] == "vector" and s["answers"] == answers and s["n_heads"] == H
    assert s["rel_err_W"] < 1e-8 and s["rel_err_V"] < 1e-8 and s["rel_err_c"] < 1e-8
    assert s["func_err"] < 1e-9
    m = _saved_errors(out, vector_layer_of(bert, 1))  # every head's W and V, as saved
    assert m["max_rel_err_W"] < 1e-8 and m["max_rel_err_v"] < 1e-8
    # the scalar route (a readout, --method layer) on the same layer
    assert _extract("--module", str(bert), "--layer", "1", "--json") == 0
    scalar = json.loads(capsys.readouterr().out)
    # measured: all 1,961 and last 2,146 queries against 4,467
    assert 2 * s["n_queries"] < scalar["n_queries"]
    assert s["n_tokens"] > s["n_queries"]


def test_extract_one_head_from_vectors(bert, capsys):
    assert _extract("--module", str(bert), "--layer", "1", "--head", "2", "--answers", "all",
                    "--json") == 0
    s = json.loads(capsys.readouterr().out)
    assert s["n_heads"] == 1 and s["rank_found"] == D // H
    assert s["rel_err_W"] < 1e-8 and s["rel_err_V"] < 1e-8
    assert s["n_queries"] < D * D  # measured 70; the exact learner needs d^2 + 2d + 1


def test_extract_module_summary_names_the_errors(bert, capsys):
    assert _extract("--module", str(bert), "--layer", "0", "--head", "0",
                    "--answers", "last") == 0
    text = capsys.readouterr().out
    assert "against the checkpoint's weights" in text and "rel. error V" in text
    assert "of dimension d = 32" in text and "tokens" in text


@pytest.mark.parametrize("args, says", [
    (["--readout", "ones"], "--readout: only with --module without --answers"),
    (["--rank", "8"], "--rank: only with a learner with a rank parameter (sketch or nuclear or "
     "layer or rotary), and not with --module and --answers"),
    (["--method", "layer"], "learnt by --method vector (a learner of vector answers), not "
     "--method layer, which asks a value oracle"),
])
def test_bad_combinations_exit_2_with_one_line(bert, capsys, args, says):
    assert _extract("--module", str(bert), "--layer", "0", "--answers", "all", *args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and says in err
