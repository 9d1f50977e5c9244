"""``attnquery extract --answers all|last``: a user's box that answers vectors, learnt by
``--method vector``, with the command line's one-line errors and exit statuses."""

import json

import numpy as np
import pytest

from attnquery.cli import main
from attnquery.vector_models import bilinear_layer, random_vector_layer

D = 8
#: the user's module: boxes built from seeded layers the tests build again as ground truth
BOXES = f'''
import numpy as np
from attnquery.vector_models import random_vector_layer

ONE = random_vector_layer({D}, 1, 0, bias=0.3)
LAST = random_vector_layer({D}, 1, 0, bias=0.3, outputs="last")
TWO = random_vector_layer({D}, 2, 1, bias=0.3)


def every(X):
    return ONE(X)


def last(X):
    return LAST(X)


def two_heads(X):
    return TWO(X)


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


def test_answers_only_with_an_oracle(tmp_path, capsys):
    from attnquery.models import random_head
    from attnquery.realheads import save_head

    path = tmp_path / "head.npz"
    save_head(path, random_head(4, 0))
    assert main(["extract", "--model", str(path), "--answers", "all"]) == 2
    assert "only with --oracle" in _one_line_error(capsys)
