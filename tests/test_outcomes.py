"""Refusals are rows, not tracebacks: a cell the experiment declares it expects to be refused is
*refused as designed* (one line of the log), any other error a failure (its traceback); the
console and results/validation.txt count ok, refused as designed and failed."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from attnquery.errors import AssumptionViolation, ModelMismatchError, SearchLimitError
from attnquery.experiments import EXPERIMENTS, expand_cells, get_experiment, run_cells
from attnquery.outcomes import (
    FAILED,
    OK,
    REFUSED,
    Refusal,
    count_outcomes,
    error_type,
    outcome,
    summary_line,
)
from attnquery.study import keyed_cells
from attnquery.study.pipeline import aggregate, run_shard, validate_study

#: a small noise grid: the exact learner refuses the larger tau, Theorem 6.1's learner never
NOISE = {"seeds": 2, "d": [4], "tau": [1.0e-9, 1.0e-2], "mu": [0.2], "W_bound": [2.0],
         "noise": ["adversarial"], "learners": ["noisy", "exact"], "oversample": [],
         "eps": 0.5}
SEED = 7


def noise_cells():
    return expand_cells("noise", NOISE)


# the noise cells' vacuous checks are the rows' verify_vacuous, not the test's subject
@pytest.mark.filterwarnings("ignore::attnquery.errors.VacuousCheckWarning")
def test_a_declared_refusal_is_one_line_and_anything_else_its_traceback(monkeypatch):
    """The exact learner's AssumptionViolation on noisy answers is declared by the noise
    experiment: logged in one line, no traceback. The same error where the experiment does not
    expect it (Theorem 6.1's learner), or any other exception, is a failure with its
    traceback."""
    exp = get_experiment("noise")
    cells = noise_cells()
    log, alert = [], []
    rows, _ = run_cells(cells, SEED, log=log.append, alert=alert.append)
    refused = [r for r in rows if r["status"] == "error"]
    assert refused and all(r["learner"] == "exact" for r in refused)
    assert all(outcome(r, exp.refusals)[0] == REFUSED for r in refused)
    assert alert == []
    lines = [s for s in log if "refused as designed" in s]
    assert len(lines) == len(refused)
    assert all("AssumptionViolation: " in s and "\n" not in s for s in lines)

    def run(cell, rng):
        if cell["learner"] == "noisy" and cell["tau"] > 1e-3:
            raise AssumptionViolation("not expected of Theorem 6.1's learner")
        if cell["learner"] == "noisy":
            raise ZeroDivisionError("a bug")
        return exp.run(cell, rng)

    monkeypatch.setitem(EXPERIMENTS, "noise", dataclasses.replace(exp, run=run))
    log, alert = [], []
    rows, _ = run_cells(cells, SEED, log=log.append, alert=alert.append)
    counts = count_outcomes("noise", rows, exp.refusals)
    assert counts.failed == 4 and counts.n_refused == len(refused)
    tracebacks = [s for s in alert if s.startswith("Traceback")]
    assert len(tracebacks) == 4
    assert sum("ZeroDivisionError: a bug" in s for s in tracebacks) == 2
    assert sum("failed: AssumptionViolation: not expected" in s for s in alert) == 2


def test_outcome_reads_the_status_the_named_error_and_the_cell():
    refusals = (Refusal("wide heads", (SearchLimitError,), where=lambda c: c["d"] > 4),)
    row = {"status": "error", "d": 8, "message": "SearchLimitError: no circle\nmore"}
    assert outcome(row, refusals) == (REFUSED, "wide heads")
    assert outcome({**row, "d": 4}, refusals) == (FAILED, "")  # not where it is expected
    assert outcome({**row, "message": "AssumptionViolation: x"}, refusals) == (FAILED, "")
    assert outcome({**row, "message": "RuntimeError: x"}, refusals) == (FAILED, "")
    assert outcome({**row, "status": "timeout"}, refusals) == (FAILED, "")
    assert outcome({**row, "status": "ok"}, refusals) == (OK, "")
    assert outcome({**row, "status": "not_identifiable"}, refusals) == (OK, "")
    # a subclass of a declared error is that refusal; a name outside attnquery.errors is none
    assert error_type("ModelMismatchError: answers differ") is ModelMismatchError
    assert Refusal("r").covers({}, ModelMismatchError)
    assert error_type("ValueError: x") is None and error_type(None) is None


def test_the_summary_line_counts_each_word_and_names_each_reason():
    refusals = (Refusal("first reason", where=lambda c: c["k"] == 1),
                Refusal("second reason", where=lambda c: c["k"] == 2))
    bad = {"status": "error", "message": "AssumptionViolation: no"}
    rows = ([{"status": "ok", "k": 0}] * 1850 + [{**bad, "k": 1}] * 3 + [{**bad, "k": 2}] * 2
            + [{**bad, "k": 0}] + [{"status": "timeout", "k": 1, "message": "slow"}])
    line = summary_line(count_outcomes("noise", rows, refusals))
    assert line == ("noise: 1,850 ok, 5 refused as designed (first reason: 3; second reason: 2),"
                    " 2 failed")
    one = summary_line(count_outcomes("noise", rows[:1853], refusals))
    assert one == "noise: 1,850 ok, 3 refused as designed (first reason), 0 failed"
    assert summary_line(count_outcomes("x", rows[:2])) == "x: 2 ok, 0 refused as designed, 0 failed"


def _shard(tmp_path, cells, capsys):
    keyed = keyed_cells("noise", cells, NOISE, SEED)
    out = tmp_path / "shard_0.parquet"
    run_shard("noise", keyed, SEED, None, out, tmp_path / "shard_0.timing.parquet",
              log=tmp_path / "shard.log")
    return keyed, out, capsys.readouterr().err, (tmp_path / "shard.log").read_text()


def test_a_study_prints_no_traceback_for_refusals_and_one_line_per_experiment(tmp_path, capsys):
    """run_shard, aggregate and validate_study as the workflow runs them: the console gets no
    traceback and no line per cell; each experiment's line counts the three words, in the log
    and in results/validation.txt, which says what each word means."""
    cells = noise_cells()
    keyed, out, err, log = _shard(tmp_path, cells, capsys)
    assert err == ""  # nothing failed: the console stays quiet
    assert "Traceback" not in log
    assert log.count("refused as designed (the exact learner") >= 1
    results = tmp_path / "results"
    rows = results / "noise.parquet"
    aggregate([out], [c["cell_key"] for c in keyed], rows, results / "noise.timing.parquet",
              log=tmp_path / "aggregate.log")
    n_refused = sum(r["status"] == "error" for r in pa.parquet.read_table(rows).to_pylist())
    line = (f"noise: {len(cells) - n_refused} ok, {n_refused} refused as designed (the exact "
            "learner (Theorem 4.1) given noisy answers), 0 failed")
    assert line in (tmp_path / "aggregate.log").read_text()
    assert capsys.readouterr().err == ""
    cfg = {"seed": SEED, "experiments": {"noise": {**NOISE, "enabled": True}}}
    validate_study([rows, results / "noise.timing.parquet"], cfg, results / "validation.txt")
    text = (results / "validation.txt").read_text()
    assert line + "\n" in text and text.endswith("failed: none\n")
    assert "refused as designed (a named error the experiment expects of that cell" in text
    assert line in capsys.readouterr().err


def test_an_unexpected_error_reaches_the_console_with_its_traceback(tmp_path, capsys,
                                                                     monkeypatch):
    from attnquery.experiments import noise

    learner = noise.LEARNERS["noisy"]

    def noisy(cell, d, rng):
        if cell["tau"] > 1e-3 and cell["seed"] == 0:
            raise ZeroDivisionError("a bug")
        return learner(cell, d, rng)

    monkeypatch.setitem(noise.LEARNERS, "noisy", noisy)
    _, _, err, log = _shard(tmp_path, noise_cells(), capsys)
    assert err.count("Traceback") == 1 and "ZeroDivisionError: a bug" in err
    assert "Traceback" in log and "refused as designed" in log
    assert "refused as designed" not in err  # a refusal as designed stays in the log


@pytest.mark.parametrize("name", ["noise", "rotary", "multihead", "multihead_generic"])
def test_the_declared_refusals_name_cells_of_the_experiment(name):
    """Each declared refusal covers some cells of the default study and not all of them."""
    from attnquery.study.config import load_config

    cfg = load_config("config/config.yaml")
    exp = get_experiment(name)
    cells = expand_cells(name, cfg["experiments"][name])
    assert exp.refusals
    for r in exp.refusals:
        covered = [c for c in cells if r.where(c)]
        assert 0 < len(covered) < len(cells), r.reason


def test_the_rotary_refusals_are_the_failure_maps_refused_side():
    """A layer may be refused exactly where the claim rotary_layers_map predicts it is not
    recovered; a served head exactly where rotary_served_map predicts the goal is missed."""
    import pandas as pd

    from attnquery.experiments.rotary import refused_layer, refused_served
    from attnquery.figures import rotary as fig
    from attnquery.study.config import load_config

    cfg = load_config("config/config.yaml")
    cells = pd.DataFrame(expand_cells("rotary", cfg["experiments"]["rotary"]))
    layers = cells[cells["variant"] == "layer"].reset_index(drop=True)
    predicted = ((fig._per_group(layers) <= layers["rank"].astype(int).to_numpy())
                 & ~fig._biased(layers))
    assert [refused_layer(c) for c in layers.to_dict("records")] == list(~predicted)
    served = cells[cells["variant"] == "served"].reset_index(drop=True)
    met = (served["rounding"] == "float32").to_numpy() & fig._half_or_less(served)
    assert [refused_served(c) for c in served.to_dict("records")] == list(~met)


def test_the_separation_refusal_is_below_the_claims_threshold():
    from attnquery.experiments.multihead_generic import SEPARATION_RESOLVED
    from attnquery.figures.multihead_generic import SEPARATION_CLAIM

    assert SEPARATION_RESOLVED == SEPARATION_CLAIM
