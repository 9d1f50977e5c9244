"""The llm experiment on a small written GGUF file: the module and the attention half (through
its RMSNorm) are read to the goal at every length up to their check, the figure's claims
hold, and fail on contrary data."""

import json

import matplotlib.pyplot as plt
import pytest

from attnquery.experiments import expand_cells, run_cells
from attnquery.figures import get_figure
from attnquery.figures.llm import llm_claims
from attnquery.realheads import write_test_gguf
from attnquery.results import rows_to_table

pytest.importorskip("gguf", reason="the llm extra (pip install gguf==0.19.0) is absent")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = write_test_gguf(tmp_path_factory.mktemp("llm") / "m.gguf", n_layers=2, d=32,
                           n_heads=4, n_kv_heads=2, quantization="Q8_0", seed=6)
    cells = expand_cells("llm", {"checkpoint": str(path), "layers": [0, 1],
                                 "boxes": ["module", "half"], "check_length": 256})
    assert len(cells) == 4
    rows, _ = run_cells(cells, 0)
    return rows_to_table(rows).to_pandas()


def test_modules_and_halves_are_read_to_the_goal(table):
    mod = table[table["family"] == "module"]
    assert (mod["status"] == "ok").all(), mod["message"].tolist()
    assert (mod["func_err"] <= 1e-9).all() and mod["success"].all()
    extra = [json.loads(e) for e in mod["extra"]]
    assert all(e["check_lengths"][-1] == 256 and e["rope_base"] == 1e5 for e in extra)
    assert all(q == sum(e["queries_by_stage"].values()) for q, e in
               zip(mod["n_queries"] + mod["verify_queries"], extra, strict=True))
    half = table[table["family"] == "half"]
    assert (half["status"] == "ok").all(), half["message"].tolist()
    assert (half["func_err"] <= 1e-9).all() and half["success"].all()
    extra = [json.loads(e) for e in half["extra"]]
    assert all(e["split"] == "spans" for e in extra)
    assert all(abs(e["norm_eps"] - e["file_rms_eps"]) <= 1e-9 * e["file_rms_eps"]
               for e in extra)
    # the gauge: the value maps with the gain folded in
    assert (half["rel_err_v"] <= 1e-9).all()


def test_claims_hold_and_fail_on_contrary_data(table):
    claims = {c.name: c for c in llm_claims(table)}
    assert set(claims) == {"llm_modules", "llm_half"}
    assert all(c.passed for c in claims.values()), [str(c) for c in claims.values()]
    broken = table.copy()
    broken.loc[broken["family"] == "module", "func_err"] = 1e-6
    assert not {c.name: c for c in llm_claims(broken)}["llm_modules"].passed
    broken = table.copy()
    i = broken.index[broken["family"] == "half"][0]
    broken.loc[i, "func_err"] = 1e-7
    assert not {c.name: c for c in llm_claims(broken)}["llm_half"].passed
    broken = table.copy()
    broken.loc[i, ["status", "message"]] = ["error", "ModelMismatchError: refused"]
    assert not {c.name: c for c in llm_claims(broken)}["llm_half"].passed
    broken = table.copy()
    e = json.loads(broken.loc[i, "extra"])
    e["norm_eps"] = e["file_rms_eps"] * 1.01
    broken.loc[i, "extra"] = json.dumps(e)
    assert not {c.name: c for c in llm_claims(broken)}["llm_half"].passed
    fig, _ = get_figure("llm")(table)
    plt.close(fig)


def test_a_measured_base_is_the_files():
    from attnquery.experiments.llm import cells

    cfg = {"checkpoint": "x.gguf", "layers": [3], "boxes": ["module"], "answers": ["all"],
           "bases": ["measured"], "check_length": 512, "seeds": 1}
    (cell,) = cells(cfg)
    assert cell["base_measured"] and cell["layer"] == 3 and cell["check_length"] == 512
