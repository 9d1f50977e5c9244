"""``attnquery extract --method rotary``: a rotary head (RoPE) through the command line."""

import json

import numpy as np

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


def test_rotary_layers_are_refused_before_any_query(capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    assert main(["extract", "--oracle", "tests.fixtures:rotary_head", "--d", "16", "--method",
                 "layer", "--param", "n_heads=2", "--param", "positions=rotary"]) == 2
    assert "learnt from Python" in capsys.readouterr().err
