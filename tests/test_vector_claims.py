"""The vector experiment, its figure and its claims (claims fail on contrary data)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnquery.errors import ConfigError
from attnquery.experiments import expand_cells, get_experiment
from attnquery.experiments.vector import degrees_of_freedom, floor_queries
from attnquery.figures import render
from attnquery.figures.vector import GAIN, GOAL, vector_claims


def test_cells_and_run():
    cfg = {"heads": {"scalar": [8], "last": [8], "all": [8]},
           "layers": {"answers": ["last"], "d": [8], "n_heads": [2]}}
    cs = expand_cells("vector", cfg)
    assert sorted((c["variant"], c["n_heads"], c["learner"]) for c in cs) == [
        ("all", 1, "vector"), ("last", 1, "vector"), ("last", 2, "vector"),
        ("scalar", 1, "exact")]
    exp = get_experiment("vector")
    for cell in cs:
        m = exp.run(cell, np.random.default_rng(0))
        extra = m["extra"]
        assert m["success"] and max(m[k] for k in ("rel_err_W", "rel_err_v", "rel_err_c",
                                                   "rel_err_offset", "func_err")) < GOAL
        assert extra["queries_total"] == m["n_queries"] + m["verify_queries"]
        assert extra["queries_total"] >= extra["floor"]
        if cell["variant"] == "scalar":  # the exact learner with biases: at its floor
            assert m["n_queries"] == extra["dof"] == extra["floor"] == 8 * 8 + 2 * 8 + 1
            assert extra["n_tokens"] is None
        else:
            assert extra["n_tokens"] > extra["queries_total"]
            assert extra["dof"] == degrees_of_freedom(8, cell["n_heads"], 8, cell["variant"])
    # every token's outputs: 8 numbers per token of the learner's queries
    m = exp.run(next(c for c in cs if c["variant"] == "all"), np.random.default_rng(0))
    assert m["extra"]["numbers_per_answer"] == 8 * m["extra"]["tokens_per_query"]
    per_answer = 8 * m["extra"]["tokens_per_query"]
    assert m["extra"]["floor"] == floor_queries(m["extra"]["dof"], per_answer)


@pytest.mark.parametrize("cfg, says", [
    ({"heads": {"all": [8]}, "layers": {"answers": ["last"], "d": [8], "n_heads": [3]}},
     "does not divide"),
    ({"heads": {"all": [8]}, "layers": {"answers": ["scalar"], "d": [8], "n_heads": [2]}},
     "scalar answers learn single heads"),
    ({"heads": {"first": [8]}}, "unknown answers"),
])
def test_bad_grids_are_refused(cfg, says):
    with pytest.raises(ConfigError, match=says):
        expand_cells("vector", cfg)


def _row(variant, d, n_queries, err=1e-13, n_heads=1, status="ok", verify=8, dof=None):
    dof = degrees_of_freedom(d, n_heads, d, variant) if dof is None else dof
    per = 1 if variant == "scalar" else d * (d // 2 if variant == "all" else 1)
    total = n_queries + verify
    extra = {"queries_total": total, "n_tokens": None if variant == "scalar" else 5000 + total,
             "dof": dof, "numbers_per_answer": per, "floor": floor_queries(dof, per),
             "floor_ratio": total / floor_queries(dof, per), "tokens_per_query": None}
    return {"experiment": "vector", "status": status, "variant": variant, "d": d,
            "n_heads": n_heads, "seed": 0, "n_queries": n_queries, "verify_queries": verify,
            "rel_err_W": err, "rel_err_v": err, "rel_err_c": err, "rel_err_offset": err,
            "func_err": err, "extra": json.dumps(extra)}


def _good():
    rows = [_row("scalar", d, d * d + 2 * d + 1) for d in (8, 32, 64)]
    rows += [_row("all", d, q) for d, q in ((8, 18), (32, 40), (64, 72))]
    rows += [_row("last", d, q) for d, q in ((8, 31), (32, 102))]
    rows += [_row("last", 16, 1164, err=2e-13, n_heads=2)]
    return rows


def _verdicts(rows):
    return {c.name: c.passed for c in vector_claims(pd.DataFrame(rows))}


def test_the_claims_hold_on_the_measured_rows():
    assert _verdicts(_good()) == {
        "vector_runs": True, "vector_goal": True, "vector_queries_all": True,
        "vector_queries_last": True, "vector_gain": True, "vector_scalar_count": True,
        "vector_layers": True}
    claims = {c.name: c for c in vector_claims(pd.DataFrame(_good()))}
    numbers = {n.name: n.value for c in claims.values() for n in c.numbers}
    assert numbers["vectorAllQueries"] == 80 and numbers["vectorScalarQueries"] == 4233
    assert numbers["vectorGain"] == pytest.approx(4233 / 80)


@pytest.mark.parametrize("change, fails", [
    (lambda r: r.append(_row("scalar", 16, 20, status="error")), "vector_runs"),
    (lambda r: r.append(_row("last", 16, 40, err=2 * GOAL)), "vector_goal"),
    (lambda r: r.append(_row("all", 32, 2 * 32 - 8 + 1)), "vector_queries_all"),
    (lambda r: r.append(_row("last", 64, 4 * 64 - 8 + 1)), "vector_queries_last"),
    # fewer than GAIN times fewer at d = 64 is also more than 2d (4233 / 30 > 128)
    (lambda r: r.append(_row("all", 64, int(4233 / (GAIN - 1)) - 8)),
     ("vector_gain", "vector_queries_all")),
    (lambda r: r.append(_row("scalar", 16, 16 * 16 + 2 * 16 + 2)), "vector_scalar_count"),
    (lambda r: r.append(_row("all", 16, 1000, err=2 * GOAL, n_heads=2)), "vector_layers"),
])
def test_each_claim_fails_on_contrary_data(change, fails):
    rows = _good()
    change(rows)
    fails = {fails} if isinstance(fails, str) else set(fails)
    verdicts = _verdicts(rows)
    assert not any(verdicts[f] for f in fails), verdicts
    assert all(v for k, v in verdicts.items() if k not in fails), verdicts


def test_the_figure_renders_and_states_its_claims(tmp_path):
    claims = render("vector", pd.DataFrame(_good()), tmp_path / "v.pdf", tmp_path / "v.png")
    assert (tmp_path / "v.png").stat().st_size > 0
    assert {c.name for c in claims} >= {"vector_goal", "vector_gain"}
    assert all(c.passed for c in claims)


# -- named cases (experiments.vector.cases) ------------------------------------------------------

def test_a_named_case_runs_and_meets_its_goal():
    cfg = {"heads": {"all": [8]},
           "cases": [{"name": "generic", "d": 8, "n_heads": 2, "key_dim": 8, "goal": 1e-8},
                     {"name": "served", "d": 8, "n_heads": 1, "rounding": "float32",
                      "goal_floors": 3}]}
    cs = sorted((c for c in expand_cells("vector", cfg) if c.get("family")),
                key=lambda c: c["family"])
    assert [c["family"] for c in cs] == ["generic", "served"]
    exp = get_experiment("vector")
    full_rank, served = (exp.run(c, np.random.default_rng(0)) for c in cs)
    assert full_rank["success"] and full_rank["rel_err_W"] < 1e-8
    # per head W_Q, W_K (8 x 8), W_V (4 x 8), W_O's 8 x 4, b_Q, b_K (8), b_V (4); b_O (8)
    assert full_rank["extra"]["dof"] == 2 * (2 * 8 * 8 + 4 * 8 + 8 * 4 + 2 * 8 + 4) + 8
    assert cs[1]["goal"] == pytest.approx(3 * 2 ** -24 * np.sqrt(8))
    # float32 answers: near the format's floor, far from float64's rounding
    assert served["success"] and 1e-12 < served["func_err"] < cs[1]["goal"]


@pytest.mark.parametrize("case, says", [
    ({"name": "a", "d": 8, "n_heads": 4, "n_kv_heads": 3, "goal": 1e-8}, "does not divide"),
    ({"name": "a", "d": 8, "n_heads": 1}, "one of goal"),
    ({"name": "a", "d": 8, "n_heads": 1, "goal": 1e-8, "goal_floors": 3}, "one of goal"),
    ({"name": "a", "d": 8, "n_heads": 1, "goal_floors": 3}, "needs a served format"),
    ({"name": "a", "d": 8, "n_heads": 1, "goal": 1e-8, "rounding": "float8"}, "rounding"),
])
def test_bad_cases_are_refused(case, says):
    with pytest.raises(ConfigError, match=says):
        expand_cells("vector", {"heads": {"all": [8]}, "cases": [case]})


def _case_row(name, err, goal=1e-9, status="ok", rounding="float64"):
    row = _row("all", 32, 1000, err=err, n_heads=8)
    row.update(family=name, goal=goal, status=status, rounding=rounding, n_kv_heads=2,
               causal=True, rope_base=10000.0, key_dim=None)
    return row


def test_case_claims_fail_on_contrary_data():
    rows = _good() + [_case_row("qwen2", 3e-10), _case_row("f32", 1e-6, 1e-5, rounding="float32")]
    verdicts = _verdicts(rows)
    assert verdicts["vector_case_qwen2"] and verdicts["vector_case_f32"]
    assert verdicts["vector_layers"]  # the cases are not the grid's layers
    assert not _verdicts(_good() + [_case_row("qwen2", 3e-9)])["vector_case_qwen2"]
    assert not _verdicts(_good() + [_case_row("qwen2", 1e-12, status="error")])[
        "vector_case_qwen2"]
    claims = {c.name: c for c in vector_claims(pd.DataFrame(rows))}
    assert "8 heads over 2 key/value heads, causal, RoPE base 10000" in claims[
        "vector_case_qwen2"].statement
    assert {n.name for n in claims["vector_case_qwen2"].numbers} == {
        "vectorQwen2Queries", "vectorQwen2WorstError"}


def test_the_benchmark_runs_the_default_studys_cases():
    from attnquery.study.bench import VECTOR_CASES
    from attnquery.study.config import load_config

    def case_cells(cases):
        cells = expand_cells("vector", {"heads": {"all": [8]}, "cases": cases})
        return sorted((c for c in cells if c.get("family")), key=lambda c: c["family"])

    path = Path(__file__).resolve().parents[1] / "config" / "config.yaml"
    cases = load_config(path)["experiments"]["vector"]["cases"]
    assert case_cells(cases) == case_cells(VECTOR_CASES) and len(VECTOR_CASES) >= 6
