"""``attnquery extract --answers all|last``: a user's box that answers vectors, learnt by
``--method vector``, with the command line's one-line errors and exit statuses."""

import json

import numpy as np
import pytest

from attnquery.cli import main
from attnquery.models.vector import bilinear_layer, random_vector_layer

D = 8
#: the user's module: boxes built from seeded layers the tests build again as ground truth
BOXES = f'''
import numpy as np
from attnquery.models.vector import random_vector_layer

ONE = random_vector_layer({D}, 1, 0, bias=0.3)
LAST = random_vector_layer({D}, 1, 0, bias=0.3, outputs="last")
TWO = random_vector_layer({D}, 2, 1, bias=0.3)
ROPE = random_vector_layer({D}, 1, 0, bias=0.3, causal=True, outputs="last", rope_base=1e4)


def every(X):
    return ONE(X)


def last(X):
    return LAST(X)


def two_heads(X):
    return TWO(X)


def rope_last(X):  # one causal rotary head, the last token's outputs
    return ROPE(X)


def flat(X):  # every token's outputs, flattened: a bad shape
    return ONE(X).reshape(X.shape[0], -1)


def with_nan(X):
    out = ONE(X)
    out[:, 0, 0] = np.nan
    return out
'''


@pytest.fixture
def boxes(tmp_path):
    path = tmp_path / "user_boxes.py"
    path.write_text(BOXES)
    return path


def _extract(boxes, fn, *args):
    try:
        return main(["extract", "--oracle", f"{boxes}:{fn}", "--d", str(D), "--no-progress",
                     *args])
    except SystemExit as exc:  # argparse's usage errors exit
        return exc.code


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("fn, answers", [("every", "all"), ("last", "last")])
def test_one_head_is_extracted_and_saved(boxes, tmp_path, capsys, fn, answers):
    truth = random_vector_layer(D, 1, 0, bias=0.3, outputs=answers)
    out = tmp_path / "head.npz"
    assert _extract(boxes, fn, "--answers", answers, "--out", str(out), "--json") == 0
    s = json.loads(capsys.readouterr().out)
    assert s["method"] == "vector" and s["answers"] == answers and s["n_heads"] == 1
    assert s["n_tokens"] > s["n_queries"] > 0
    assert sum(s["n_queries_by_stage"].values()) == s["n_queries"]
    assert s["verify_error"] < 1e-8
    with np.load(out) as f:
        saved = {k: f[k] for k in f.files}
    assert _rel(saved["W"], truth.head_W()) < 1e-9
    assert _rel(saved["V"], truth.value_maps()) < 1e-9
    assert _rel(saved["key_bias"], truth.key_bias()) < 1e-9
    assert _rel(saved["output_bias"], truth.output_bias) < 1e-9
    assert int(saved["meta_n_queries"]) == s["n_queries"]
    assert str(saved["meta_answers"]) == answers
    # the saved head runs in simulation (--model with --answers), its errors against it
    assert main(["extract", "--model", str(out), "--answers", answers, "--no-progress",
                 "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["answers"] == answers and again["positions"] == "none"
    assert max(again["rel_err_W"], again["rel_err_V"], again["func_err"]) < 1e-9


def test_a_layer_of_two_heads_with_n_heads(boxes, tmp_path, capsys):
    truth = random_vector_layer(D, 2, 1, bias=0.3)
    out = tmp_path / "layer.npz"
    assert _extract(boxes, "two_heads", "--answers", "all", "--param", "n_heads=2", "--out",
                    str(out)) == 0
    text = capsys.readouterr().out
    assert "a layer of 2 head(s)" in text and "by stage: V " in text and str(out) in text
    with np.load(out) as f:
        f = {k: f[k] for k in f.files}
    est = bilinear_layer(f["W"], f["key_bias"], f["V"], f["output_bias"])
    X = np.random.default_rng(7).standard_normal((16, 12, D))
    assert _rel(est(X), truth(X)) < 1e-9  # the heads in any order: compare the function
    # the test can fail: one head of the two is another function
    one = bilinear_layer(f["W"][:1], f["key_bias"][:1], 2 * f["V"][:1], f["output_bias"])
    assert _rel(one(X), truth(X)) > 1e-3


def test_one_rotary_head_from_the_last_tokens_outputs(boxes, tmp_path, capsys):
    from attnquery.realheads import load_vector_layer

    truth = random_vector_layer(D, 1, 0, bias=0.3, causal=True, outputs="last", rope_base=1e4)
    out = tmp_path / "rope.npz"
    assert _extract(boxes, "rope_last", "--answers", "last", "--param", "positions=rotary",
                    "--param", "causal=true", "--out", str(out), "--json") == 0
    s = json.loads(capsys.readouterr().out)
    assert s["positions"] == "rotary" and s["n_heads"] == s["n_kv_heads"] == 1
    np.testing.assert_allclose(s["frequencies"], truth.frequencies, rtol=0, atol=1e-15)
    layer, _ = load_vector_layer(out)
    assert layer.outputs == "last" and layer.causal
    rng = np.random.default_rng(5)
    for N in (1, 3, 64, 512):
        X = rng.standard_normal((4, N, D)) / np.sqrt(D)
        assert layer(X).shape == (4, D) and _rel(layer(X), truth(X)) < 1e-8, N


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err and "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("fn, args, status, says", [
    # the box answers badly or is not what the learner assumes: exit 1
    ("flat", ["--answers", "all"], 1, "AnswerError"),
    ("last", ["--answers", "all"], 1, "AnswerError"),
    ("every", ["--answers", "last"], 1, "AnswerError"),
    ("with_nan", ["--answers", "all"], 1, "NaN"),
    ("two_heads", ["--answers", "all"], 1, "ModelMismatchError"),
    ("every", ["--answers", "all", "--budget", "5"], 1, "budget"),
    # usage errors: exit 2
    ("every", ["--method", "vector"], 2, "--method vector needs --answers all|last"),
    ("every", ["--answers", "all", "--method", "exact"], 2, "learnt by --method vector"),
    ("every", ["--answers", "all", "--param", "n_heads=3"], 1, "heads that fill d"),
    ("every", ["--answers", "both"], 2, "invalid choice"),
])
def test_bad_boxes_and_options_get_one_line(boxes, capsys, fn, args, status, says):
    assert _extract(boxes, fn, *args) == status
    assert says in _one_line_error(capsys)


def test_answers_with_a_model_need_a_vector_layers_file(tmp_path, capsys):
    from attnquery.models import random_head
    from attnquery.realheads import save_head

    path = tmp_path / "head.npz"
    save_head(path, random_head(4, 0))
    assert main(["extract", "--model", str(path), "--answers", "all"]) == 2
    assert "a head or layer file (value vectors 'v'), not a vector layer file" in \
        _one_line_error(capsys)
    # and a vector layer's file without --answers
    layer = random_vector_layer(4, 1, 0)
    np.savez(path, V=layer.value_maps(), W=layer.head_W(), key_bias=layer.key_bias(),
             output_bias=layer.output_bias)
    assert main(["extract", "--model", str(path)]) == 2
    assert "with --model, give --answers all|last" in _one_line_error(capsys)


# -- a rotary GQA layer (--param positions=rotary) ------------------------------------------------
#: the fixture's layer: d = 32, 4 query heads over 2 key/value heads, causal, RoPE, biases
ROTARY = ["--oracle", "tests.fixtures:rotary_gqa_layer", "--d", "32", "--n-heads", "4",
          "--param", "n_kv_heads=2", "--param", "positions=rotary", "--param", "causal=true",
          "--no-progress"]
#: the goal in float64: the forms, value maps and function to this (relative)
ROTARY_TOL = 1e-8


def _run(argv):
    """``main(argv)``: its exit status and what it printed."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    return status, out.getvalue()


@pytest.fixture(scope="module")
def rotary_run(tmp_path_factory, repo):
    """The fixture's layer learnt once from the command line, saved with --out: (summary,
    the saved file)."""
    out = tmp_path_factory.mktemp("rotary") / "layer.npz"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(repo)  # --oracle tests.fixtures:... from the repository root
        status, text = _run(["extract", *ROTARY, "--answers", "all", "--out", str(out),
                             "--json"])
    assert status == 0
    return json.loads(text), out


def test_a_rotary_gqa_layer_is_learnt_from_every_tokens_outputs(rotary_run):
    from attnquery.metrics import rotary_layer_errors
    from attnquery.models.vector import RotaryFormLayer
    from attnquery.realheads import load_vector_layer
    from tests.fixtures import ROTARY_GQA_LAYER as truth

    s, out = rotary_run
    assert s["positions"] == "rotary" and s["n_heads"] == 4 and s["n_kv_heads"] == 2
    assert s["n_tokens"] > s["n_queries"] > 0
    assert sum(s["n_queries_by_stage"].values()) == s["n_queries"]
    # rope_base not given: the base is measured from the answers
    np.testing.assert_allclose(s["frequencies"], truth.frequencies, rtol=1e-12, atol=0)
    assert s["verify_error"] < ROTARY_TOL
    layer, meta = load_vector_layer(out)
    assert isinstance(layer, RotaryFormLayer) and layer.causal and layer.outputs == "all"
    assert meta["n_queries"] == s["n_queries"] and meta["answers"] == "all"
    assert layer.head_groups.tolist() == s["head_groups"]
    # errors against the ground truth: the forms near and far, the value maps, the output bias
    m = rotary_layer_errors(layer, truth, offsets=(-1, -300, -511))
    assert max(m["rel_err_M"].values()) < ROTARY_TOL and m["rel_err_V"] < ROTARY_TOL
    assert m["rel_err_output_bias"] < ROTARY_TOL
    # the head groups are the box's: heads matched to true heads of one key/value head share one
    matched = np.empty(4, dtype=int)
    matched[m["matched"]] = np.arange(4)  # recovered head -> true head
    groups = truth.groups[matched]
    assert np.array_equal(groups[:, None] == groups[None], layer.head_groups[:, None]
                          == layer.head_groups[None])
    rng = np.random.default_rng(3)
    for N in (1, 2, 17, 512):
        X = rng.standard_normal((2, N, 32)) / np.sqrt(32)
        assert _rel(layer(X), truth(X)) < ROTARY_TOL, N
    # the test can fail: the same forms without the causal mask are another function
    unmasked = RotaryFormLayer(**{k: getattr(layer, k) for k in layer.FIELDS}, causal=False)
    assert _rel(unmasked(X), truth(X)) > 1e-3


def test_the_saved_rotary_layer_is_the_learners_predict(rotary_run):
    from attnquery.learners import VectorLayerLearner
    from attnquery.oracles import VectorOracle
    from attnquery.realheads import load_vector_layer
    from tests.fixtures import ROTARY_GQA_LAYER as truth

    s, out = rotary_run
    # the command's learner, again (seed 0, the command's default): deterministic
    est = VectorLayerLearner(n_heads=4, n_kv_heads=2, causal=True, positions="rotary",
                             random_state=0).fit(VectorOracle(truth, 32, outputs="all"))
    assert est.n_queries_ == s["n_queries"]
    layer, _ = load_vector_layer(out)
    rng = np.random.default_rng(4)
    for N in (1, 5, 300):
        X = rng.standard_normal((3, N, 32)) / np.sqrt(32)
        np.testing.assert_array_equal(layer(X), est.predict(X))
    # the last token's outputs of the same layer, when asked for (its row alone: rounding)
    last, _ = load_vector_layer(out, outputs="last")
    assert last(X).shape == (3, 32) and _rel(last(X), est.predict(X)[:, -1]) < 1e-14


def test_a_saved_rotary_layer_runs_in_simulation_with_its_errors(rotary_run, tmp_path):
    s, out = rotary_run
    again = tmp_path / "again.npz"
    status, text = _run(["extract", "--model", str(out), "--answers", "all", "--no-progress",
                         "--out", str(again)])
    assert status == 0
    assert "a layer of 4 rotary head(s) over 2 key/value head(s)" in text
    # the same groups (the heads' order is not identifiable: the refit may number them apart)
    groups = json.loads(text.split("head groups")[1].split("(")[0])
    assert sorted(np.bincount(groups)) == sorted(np.bincount(s["head_groups"]))
    assert "frequencies    4, 1 to 0.001" in text
    errors = {line.split()[2]: float(line.split()[3]) for line in text.splitlines()
              if line.startswith("  rel. error M_") or line.startswith("  rel. error V ")}
    assert set(errors) == {"M_-1", "M_-511", "V"} and max(errors.values()) < ROTARY_TOL
    func = float(text.split("func. error")[1].split()[0])
    assert func < ROTARY_TOL
    assert str(again) in text and again.stat().st_size > 0


def test_a_rotary_gqa_layer_is_learnt_from_the_last_tokens_outputs(tmp_path, capsys,
                                                                   monkeypatch, repo):
    from attnquery.realheads import load_vector_layer
    from tests.fixtures import ROTARY_GQA_LAYER as truth

    monkeypatch.chdir(repo)
    out = tmp_path / "last.npz"
    argv = [a.replace("rotary_gqa_layer", "rotary_gqa_layer_last") for a in ROTARY]
    assert main(["extract", *argv, "--answers", "last", "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["answers"] == "last" and s["n_heads"] == 4 and s["n_kv_heads"] == 2
    assert sum(s["n_queries_by_stage"].values()) == s["n_queries"]
    layer, meta = load_vector_layer(out)
    assert layer.outputs == meta["answers"] == "last"
    rng = np.random.default_rng(6)
    for N in (1, 2, 40, 512):
        X = rng.standard_normal((2, N, 32)) / np.sqrt(32)
        assert _rel(layer(X), truth(X)[:, -1]) < ROTARY_TOL, N


@pytest.mark.parametrize("args, says", [
    (["--param", "n_kv_heads=3"], "n_kv_heads=3 must divide n_heads=4"),
    (["--param", "n_heads=2"], "--n-heads 4 and --param n_heads=2 disagree"),
    (["--method", "exact"], "learnt by --method vector"),
])
def test_bad_rotary_options_are_refused_before_any_query(capsys, monkeypatch, repo, args,
                                                         says):
    import tests.fixtures

    monkeypatch.chdir(repo)
    asked = []
    monkeypatch.setattr(tests.fixtures, "rotary_gqa_layer", lambda X: asked.append(X))
    assert main(["extract", *ROTARY, "--answers", "all", *args]) == 2
    assert says in _one_line_error(capsys)
    assert asked == []  # refused before the box was asked anything


def test_a_rotary_layers_out_is_checked_before_any_query(tmp_path, capsys, monkeypatch, repo):
    import os

    import tests.fixtures

    monkeypatch.chdir(repo)
    asked = []
    monkeypatch.setattr(tests.fixtures, "rotary_gqa_layer", lambda X: asked.append(X))
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert main(["extract", *ROTARY, "--answers", "all", "--out", str(pipe)]) == 2
    assert "not a regular file (it is a FIFO" in _one_line_error(capsys) and asked == []
    assert pipe.exists() and not pipe.is_file()  # left as it was


def test_a_rotary_vector_layers_file_refuses_bad_input(rotary_run, tmp_path, capsys):
    from attnquery.errors import ModelError
    from attnquery.models.vector import RotaryFormLayer
    from attnquery.realheads import load_vector_layer

    _, out = rotary_run
    with np.load(out) as f:
        arrays = {k: f[k] for k in f.files}
    bad = tmp_path / "bad.npz"
    np.savez(bad, **{k: a for k, a in arrays.items() if k != "sin_forms"})
    with pytest.raises(ModelError, match=r"lacks \['sin_forms'\]"):
        load_vector_layer(bad)
    assert main(["extract", "--model", str(bad), "--answers", "all"]) == 2
    assert "lacks ['sin_forms']" in _one_line_error(capsys)
    fields = {k: arrays[k] for k in RotaryFormLayer.FIELDS}
    with pytest.raises(ModelError, match=r"key_bases \(4, 8, 31\) \(expected \(4, 8, 32\)\)"):
        RotaryFormLayer(**{**fields, "key_bases": fields["key_bases"][:, :, :31]})
