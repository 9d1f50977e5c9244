"""A plug-in learner joins every experiment whose box it can ask and whose result it returns:
the section's ``learners`` name it, the grid gets its cells (on the grid of the experiment's
reference learner), a cell of it runs and its rows carry its name; every other experiment
refuses it by name when the grid is expanded, saying why. The default grids do not change."""

from __future__ import annotations

import functools
import sys
import tempfile
import types
from pathlib import Path

import pytest

from attnquery.errors import ConfigError
from attnquery.experiments import all_experiments, expand_cells, run_cells
from attnquery.learners import (
    AttentionLayerLearner,
    ExactValueQueryLearner,
    MembershipLearner,
    MultiHeadLearner,
    RotaryValueQueryLearner,
    TransformerLearner,
    VectorLayerLearner,
)
from attnquery.learners._registry import LearnerSpec, get_entry
from attnquery.realheads import write_test_checkpoint, write_test_gguf
from attnquery.results import rows_to_table
from attnquery.study.config import validate_config

SEED = 11


def _spec(name, parent, **kw):
    base = parent.spec
    return LearnerSpec(name=name, oracle=kw.pop("oracle", base.oracle),
                       returns=kw.pop("returns", base.returns), stages=base.stages,
                       fits_bias=base.fits_bias, description=f"{parent.__name__} under a test name",
                       **kw)


class ValueHead(ExactValueQueryLearner):
    """One head from value queries (with its biases): the plug-in of the issue's example."""

    spec = _spec("value_head", ExactValueQueryLearner, label="value head (test plug-in)")


class Inherited(ExactValueQueryLearner):
    """A plug-in that inherits the exact learner's spec (and so, once, its label)."""


class Membership(MembershipLearner):
    spec = _spec("membership_head", MembershipLearner, label="membership (test plug-in)")


class Heads(MultiHeadLearner):
    spec = _spec("heads_plugin", MultiHeadLearner, label="heads (test plug-in)")


class Layer(AttentionLayerLearner):
    spec = _spec("layer_plugin", AttentionLayerLearner, label="layer (test plug-in)")


class Block(TransformerLearner):
    spec = _spec("block_plugin", TransformerLearner, label="block (test plug-in)")


class Rotary(RotaryValueQueryLearner):
    spec = _spec("rotary_plugin", RotaryValueQueryLearner, label="rotary (test plug-in)")


class Vector(VectorLayerLearner):
    spec = _spec("vector_plugin", VectorLayerLearner, label="vector (test plug-in)")


PLUGINS = {"value_head": "ValueHead", "inherited": "Inherited", "membership_head": "Membership",
           "heads_plugin": "Heads", "layer_plugin": "Layer", "block_plugin": "Block",
           "rotary_plugin": "Rotary", "vector_plugin": "Vector"}


@pytest.fixture
def plugins(monkeypatch, entry_points):
    mod = types.ModuleType("attnquery_joining_plugins")
    for cls in PLUGINS.values():
        setattr(mod, cls, globals()[cls])
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    entry_points(**{name: f"{mod.__name__}:{cls}" for name, cls in PLUGINS.items()})


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    return str(write_test_checkpoint(path, n_layers=1, n_heads=2, d=16, seed=0))


@functools.cache
def gguf_file() -> str:
    """A small Llama-architecture GGUF file (the llm experiment's checkpoint)."""
    path = Path(tempfile.mkdtemp()) / "model.gguf"
    return str(write_test_gguf(path, n_layers=1, d=16, n_heads=2, n_kv_heads=1, seed=0))


def _sections(ckpt) -> dict:
    """A tiny section of every experiment (its smallest grid)."""
    real = {"checkpoint": ckpt, "n_heads": 2, "layers": [0]}
    return {
        "exact": {"seeds": 1, "d": [3], "probes": ["basis", "gaussian"]},
        "lowrank_phase": {"seeds": 1, "d": [6], "rank": [1], "c": [2.0, 4.0]},
        "lowrank_scale": {"seeds": 1, "d": [6], "rank": [1], "learners": ["sketch"]},
        "realheads": {**real, "heads": [0], "biases": True, "learners": ["exact"]},
        "reallayer": {**real, "biases": False},
        "noise": {"seeds": 1, "d": [3], "tau": [1e-9], "mu": [0.2], "W_bound": [4.0],
                  "noise": ["uniform"], "learners": ["noisy"]},
        "rounding": {"seeds": 1, "d": [4], "digits": [12], "learners": ["exact"], "rank": 1,
                     "mu": 0.1, "W_bound": 4.0},
        "lowprecision": {"seeds": 1, "precisions": ["float64"], "queries_per_unknown": [3],
                         "random": {"d": [4]}},
        "membership": {"seeds": 1, "d": [2], "eps": [0.1], "W_bound": 4.0, "mu": 0.05},
        "multihead_generic": {"seeds": 1, "d": [4], "n_heads": [2]},
        "transformer": {"seeds": 1, "d": [4], "width": [2]},
        "multihead": {"seeds": 1, "known": {"d": [4], "n_heads": [2]}},
        "rotary": {"seeds": 1, "d": [8], "head_fraction": [0.5], "rope_base": [10000.0],
                   "routes": ["dense"]},
        "served": {**real, "heads": [0], "precisions": ["float32"],
                   "queries_per_unknown": {"float32": [6]}},
        "vector": {"seeds": 1, "heads": {"last": [4]}},
        "llm": {"checkpoint": gguf_file(), "layers": [0], "check_length": 64},
    }


#: experiment -> the plug-in of this module that joins it
JOINS = {"exact": "value_head", "lowrank_phase": "value_head", "lowrank_scale": "value_head",
         "realheads": "value_head", "noise": "value_head", "rounding": "value_head",
         "lowprecision": "value_head", "served": "value_head", "membership": "membership_head",
         "multihead_generic": "heads_plugin", "multihead": "heads_plugin",
         "reallayer": "layer_plugin", "transformer": "block_plugin", "rotary": "rotary_plugin",
         "vector": "vector_plugin", "llm": "vector_plugin"}

#: why an experiment refuses the value-head plug-in
REFUSES = {"membership": "asks the value oracle", "multihead_generic": "returns a head",
           "multihead": "returns a head", "reallayer": "returns a head",
           "transformer": "returns a head", "rotary": "returns a head",
           "vector": "asks the value oracle", "llm": "asks the value oracle"}


def _with(section: dict, name: str) -> dict:
    learners = section.get("learners")
    return {**section, "learners": [*learners, name] if learners else [name]}


def test_every_experiment_says_what_it_takes():
    # (experiments whose names start with "_" are registered by tests)
    assert {e.name for e in all_experiments() if not e.name.startswith("_")} == set(JOINS)
    assert set(REFUSES) | {n for n, p in JOINS.items() if p == "value_head"} == set(JOINS)


@pytest.mark.parametrize("experiment", sorted(JOINS))
def test_a_plugin_runs_as_a_grid_cell_of_every_experiment_that_takes_it(experiment, plugins,
                                                                        ckpt):
    name = JOINS[experiment]
    section = _sections(ckpt)[experiment]
    before = expand_cells(experiment, section)
    assert all(c["learner"] != name for c in before)
    joined = _with(section, name)
    validate_config({"seed": SEED, "experiments": {experiment: dict(joined)}})  # the schema
    cells = expand_cells(experiment, joined)
    mine = [c for c in cells if c["learner"] == name]
    assert mine, experiment
    # the experiment's own cells are the ones it had (ids included)
    assert [c for c in cells if c["learner"] != name] == before
    rows, _ = run_cells(mine[:1], SEED)
    df = rows_to_table(rows).to_pandas()
    row = df.iloc[0]
    assert row["learner"] == name and row["status"] == "ok", row["message"]
    assert row["n_queries"] > 0  # counted by the oracle
    # judged as the experiment judges its own learners (its tolerance, its error columns)
    if experiment == "served":  # the exact learner assumes float64 answers: on a float32 head
        # it refuses its estimate (recorded), which misses the float32 goal
        assert not row["verified"] and not row["success"] and row["rel_err_W"] < 1e-3
    else:
        assert row["success"] == True, (experiment, row["rel_err_W"])  # noqa: E712


@pytest.mark.parametrize("experiment", sorted(REFUSES))
def test_an_experiment_refuses_a_plugin_it_cannot_run_by_name(experiment, plugins, ckpt):
    section = _with(_sections(ckpt)[experiment], "value_head")
    with pytest.raises(ConfigError, match=rf"experiments\.{experiment}\.learners: 'value_head' "
                       rf"{REFUSES[experiment]}.*{experiment} takes \["):
        expand_cells(experiment, section)


@pytest.mark.parametrize("name, why", [
    ("nope", "'nope' is not a registered learner"),
    ("sketch", "'sketch' is a built-in learner exact does not run"),
    ("noisy", "'noisy' is a built-in learner exact does not run"),
])
def test_exact_refuses_unknown_and_other_built_in_learners(name, why, plugins):
    with pytest.raises(ConfigError, match=rf"experiments\.exact\.learners: {why}.*exact takes "
                       r"\['exact', 'inherited', 'value_head'\]"):
        expand_cells("exact", {"seeds": 1, "d": [3], "probes": ["basis"], "learners": [name]})


def test_a_learner_needing_a_parameter_the_experiment_does_not_give_is_refused(
        monkeypatch, entry_points):
    class Needs(ExactValueQueryLearner):
        spec = _spec("needs_scale", ExactValueQueryLearner)

        def __init__(self, scale, probes="basis", verify="auto", random_state=None):
            super().__init__(probes=probes, verify=verify, random_state=random_state)
            self.scale = scale

    mod = types.ModuleType("attnquery_needing_plugin")
    mod.Needs = Needs
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    entry_points(needs_scale=f"{mod.__name__}:Needs")
    with pytest.raises(ConfigError, match=r"'needs_scale' needs \['scale'\], which exact does "
                       r"not give"):
        expand_cells("exact", {"seeds": 1, "d": [3], "probes": ["basis"],
                               "learners": ["needs_scale"]})


def test_a_subclass_without_its_own_spec_is_drawn_under_its_name(plugins):
    assert get_entry("inherited").spec.label == ""
    assert get_entry("inherited").spec.display == "inherited"
    assert get_entry("value_head").spec.display == "value head (test plug-in)"
    assert ExactValueQueryLearner.spec.display == "exact (Thm 4.1)"
    cells = expand_cells("exact", {"seeds": 1, "d": [3], "probes": ["basis", "gaussian"],
                                   "learners": ["inherited"]})
    # one cell per head (the exact learner's probe designs are not its parameter)
    mine = [c for c in cells if c["learner"] == "inherited"]
    assert len(mine) == 1 and "probes" not in mine[0]


def test_the_figure_draws_plugins_apart_by_their_labels_and_its_claims_ignore_them(plugins):
    import pandas as pd
    from matplotlib import pyplot as plt

    from attnquery.figures import STYLE, draw
    from attnquery.figures._layout import collisions

    cells = expand_cells("exact", {"seeds": 1, "d": [2, 4, 8], "probes": ["basis"],
                                   "learners": ["value_head", "inherited"]})
    rows, timings = run_cells(cells, SEED)
    df = rows_to_table(rows).to_pandas().merge(pd.DataFrame(timings),
                                               on=["experiment", "cell_id"], how="left")
    own = df[df["learner"] == "exact"]
    assert len(own) == 3 and len(df) == 9 and (df["status"] == "ok").all()
    with plt.style.context(STYLE):
        fig_own, claims_own = draw("exact_queries", own)
        fig, claims = draw("exact_queries", df)
    assert [(c.name, c.passed, c.detail, c.n_runs) for c in claims] == \
        [(c.name, c.passed, c.detail, c.n_runs) for c in claims_own]
    added = fig.axes[len(fig_own.axes):]
    assert len(added) == 2
    labels = [t.get_text() for t in added[0].get_legend().get_texts()]
    assert labels == ["inherited (exact)", "value head (test plug-in) (exact)"]
    assert not any("Thm 4.1" in t for t in labels)
    # the queries drawn are the counted ones: the exact learner's d^2 + d (+ its check) each
    for line in added[0].get_lines():
        assert list(line.get_ydata()) == own.sort_values("d")["n_queries"].tolist()
    assert collisions(fig) == []
    plt.close(fig)
    plt.close(fig_own)


def test_info_aligns_the_methods_to_the_longest_plugin_name(plugins, tmp_path, monkeypatch,
                                                              capsys):
    from attnquery.cli.app import main

    monkeypatch.chdir(tmp_path)  # no config here: versions and methods only
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    rows = out.split("methods:\n", 1)[1].split("\nconfig:", 1)[0].splitlines()
    names = [r.split()[0] for r in rows]
    assert "membership_head" in names and "exact" in names
    longest = max(map(len, names))
    assert longest > 10
    # every row's second column (the class) starts one place after the longest name
    assert {len(r) - len(r[2:].split(None, 1)[1]) for r in rows} == {2 + longest + 2}, rows
