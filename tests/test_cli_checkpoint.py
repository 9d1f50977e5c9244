"""``attnquery extract --checkpoint``: a Llama-architecture GGUF file's attention module (or a
named checkpoint's), answering its output vectors, extracted with the file's heads, RoPE base and
causal mask; the saved layer predicts the module; bad uses are refused by name, with no
traceback and no query."""

import json

import numpy as np
import pytest

from attnquery.cli import main
from attnquery.realheads import (
    attention_module,
    load_gguf,
    load_vector_layer,
    write_test_gguf,
)
from tests.test_cli_refusals import run

pytest.importorskip("gguf", reason="the llm extra (pip install gguf==0.19.0) is absent")

D, H, G = 32, 4, 2


@pytest.fixture
def gguf_file(tmp_path):
    return write_test_gguf(tmp_path / "m.gguf", n_layers=2, d=D, n_heads=H, n_kv_heads=G,
                           quantization="Q8_0", seed=3)


@pytest.mark.parametrize("answers", ["all", "last"])
def test_a_layer_of_a_gguf_file_is_extracted(gguf_file, tmp_path, capsys, answers):
    out = tmp_path / "layer.npz"
    argv = ["extract", "--checkpoint", str(gguf_file), "--layer", "1", "--answers", answers,
            "--param", "check_length=256", "--out", str(out), "--json", "--no-progress"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["n_heads"] == H and s["n_kv_heads"] == G and s["positions"] == "rotary"
    assert s["n_queries"] == sum(s["n_queries_by_stage"].values()) > 0
    assert s["verify_error"] < 1e-9 and s["func_err"] < 1e-9
    # the saved layer is the module's function, from the dequantized weights
    module = attention_module(load_gguf(gguf_file, layers=[1]), 1, answers)
    learned, _ = load_vector_layer(out, outputs=answers)
    X = np.random.default_rng(9).standard_normal((3, 40, D)) / np.sqrt(D)
    assert np.max(np.abs(learned(X) - module(X))) <= 1e-9 * np.max(np.abs(module(X)))


def test_the_human_report_names_the_file_and_the_truth(gguf_file, capsys):
    argv = ["extract", "--checkpoint", str(gguf_file), "--layer", "0", "--answers", "all",
            "--param", "check_length=128", "--no-progress"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"layer 0 of 2: {H} query heads over {G} key/value heads of {D // H}" in text
    assert "RoPE base 100000" in text and "func. error" in text


@pytest.mark.parametrize("extra,match", [
    ([], "--checkpoint needs --answers"),
    (["--answers", "all", "--head", "0"], "--head: only with --module"),
    (["--answers", "all", "--n-heads", "4"], "--n-heads: only with --module"),
    (["--answers", "all", "--no-biases"], "--no-biases: only with --module"),
    (["--answers", "all"], "--checkpoint needs --layer"),
])
def test_bad_uses_are_refused_by_name(gguf_file, capsys, extra, match):
    layer = [] if "--layer" in match else ["--layer", "0"]
    status, line = run(["extract", "--checkpoint", str(gguf_file), *layer, *extra], capsys)
    assert status == 2 and match in line


def test_files_that_are_not_the_module_are_refused(tmp_path, capsys):
    status, line = run(["extract", "--checkpoint", "smollm-9000", "--layer", "0",
                        "--answers", "all"], capsys)
    assert status == 2 and "not a named checkpoint" in line and "smollm2-135m" in line
    status, line = run(["extract", "--checkpoint", str(tmp_path / "absent.gguf"), "--layer", "0",
                        "--answers", "all"], capsys)
    assert status == 2 and "does not exist" in line
    biased = write_test_gguf(tmp_path / "b.gguf", n_layers=1, d=D, n_heads=H, n_kv_heads=G,
                             attn_biases=True)
    status, line = run(["extract", "--checkpoint", str(biased), "--layer", "0",
                        "--answers", "all"], capsys)
    assert status == 2 and "attention biases (blk.0.attn_k.bias" in line
    ok = write_test_gguf(tmp_path / "ok.gguf", n_layers=1, d=D, n_heads=H, n_kv_heads=G)
    status, line = run(["extract", "--checkpoint", str(ok), "--layer", "4",
                        "--answers", "all"], capsys)
    assert status == 2 and "layer 4 out of range" in line


def test_out_never_replaces_the_checkpoint(gguf_file, capsys):
    before = gguf_file.read_bytes()
    status, line = run(["extract", "--checkpoint", str(gguf_file), "--layer", "0",
                        "--answers", "all", "--out", str(gguf_file), "--force"], capsys)
    assert status == 2 and "--out" in line
    assert gguf_file.read_bytes() == before
