"""The study reads the learner registry: code versions cover the learner a cell names (a
plug-in's source too), and ``lowrank_scale`` runs and draws any registered learner of one head
from value queries."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import textwrap

import pandas as pd
import pytest

from attnquery.errors import AttnQueryError, ConfigError
from attnquery.experiments import expand_cells, run_cells
from attnquery.learners import _registry
from attnquery.results import rows_to_table
from attnquery.study import (
    PACKAGE_DIR,
    code_version,
    keyed_cells,
    module_closure,
    outside_closure,
)

SEED = 7

PLUGIN = '''
"""A plug-in for the tests: the exact learner under its own spec."""
from attnquery.learners import ExactValueQueryLearner
from attnquery.learners._registry import LearnerSpec

from .{helper} import LABEL


class Plugged(ExactValueQueryLearner):
    spec = LearnerSpec(name="plugged", oracle="value", description="the exact learner again",
                       label=LABEL)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """Write a plug-in package and declare it (entry point ``plugged``); returns a function
    that writes another version of it under a new package name and declares that one."""
    made = []

    def make(package: str, label: str = "plugged learner"):
        root = tmp_path / package
        root.mkdir()
        (root / "__init__.py").write_text("")
        (root / "labels.py").write_text(f"LABEL = {label!r}\n")
        (root / "learner.py").write_text(textwrap.dedent(PLUGIN.format(helper="labels")))
        ep = importlib.metadata.EntryPoint("plugged", f"{package}.learner:Plugged",
                                           _registry.ENTRY_POINT_GROUP)
        monkeypatch.setattr(importlib.metadata, "entry_points",
                            lambda *, group=None, **kw: [ep] if group == ep.group else [])
        _registry._registry.cache_clear()
        made.append(package)
        return root

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    _registry._registry.cache_clear()
    for package in made:
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]


# ---------------------------------------------------------------------------------------------
# code versions
# ---------------------------------------------------------------------------------------------
def test_the_registry_module_is_in_no_closure():
    closure = {str(p.relative_to(PACKAGE_DIR)) for p in
               module_closure(["attnquery.experiments.lowrank", "attnquery.learners.exact"])}
    assert "learners/_registry.py" not in closure
    assert {"experiments/lowrank.py", "learners/exact.py", "learners/lowrank/_sketch.py"} <= closure


def test_a_built_in_learner_an_experiment_imports_keeps_its_code_version():
    base = code_version("lowrank_scale")
    assert code_version("lowrank_scale", "sketch") == base
    assert code_version("lowrank_scale", "exact") == base
    assert code_version("lowrank_phase", "nuclear") == code_version("lowrank_phase")
    # a learner module the experiment does not import is added to its cells' version
    assert code_version("lowrank_scale", "multihead") != base
    # every experiment reads the registry (a plug-in may join it): its own learners keep its
    # version, those the registry does not name (its own configured learners) too
    assert code_version("exact", "exact") == code_version("exact")
    assert code_version("membership", "mq_bisection") == code_version("membership")
    assert code_version("noise", "unclipped") == code_version("noise")


def test_a_plugins_source_is_in_its_cells_code_version(plugin):
    root = plugin("plugv1")
    files, inside = outside_closure("plugv1.learner")
    assert files == {"plugv1.learner": root / "learner.py", "plugv1.labels": root / "labels.py"}
    assert "attnquery.learners.exact" in inside
    v1 = code_version("lowrank_scale", "plugged")
    assert v1 != code_version("lowrank_scale")
    cells = expand_cells("lowrank_scale", {"d": [8], "rank": [1], "seeds": 1,
                                           "learners": ["sketch", "plugged"]})
    keyed = {c["learner"]: c["code_version"]
             for c in keyed_cells("lowrank_scale", cells, {}, SEED)}
    assert keyed == {"sketch": code_version("lowrank_scale"), "plugged": v1}
    # the same plug-in with one helper file changed: another code version
    plugin("plugv2", label="another label")
    assert code_version("lowrank_scale", "plugged") not in (v1, code_version("lowrank_scale"))


@pytest.mark.parametrize("experiment", ["exact", "noise", "realheads", "lowrank_phase"])
def test_a_joined_plugins_source_is_in_its_cells_code_version(plugin, experiment):
    # an experiment that a plug-in joins (experiments._learners) covers its source as
    # lowrank_scale does
    plugin("plugj1")
    v1 = code_version(experiment, "plugged")
    assert v1 != code_version(experiment)
    plugin("plugj2", label="another label")
    assert code_version(experiment, "plugged") not in (v1, code_version(experiment))


def test_a_shard_planned_with_another_code_version_stops_before_computing(tmp_path):
    from attnquery.study.pipeline import run_shard

    cells = expand_cells("lowrank_scale", {"d": [8], "rank": [1], "seeds": 1,
                                           "learners": ["sketch"]})
    keyed = keyed_cells("lowrank_scale", cells, {}, SEED)
    stale = [{**c, "code_version": "0" * 16} for c in keyed]
    with pytest.raises(AttnQueryError, match=r"the code changed since the workflow planned "
                       r"this shard \(planned with code version \['0000000000000000'\], the "
                       f"sources now give {code_version('lowrank_scale')}"):
        run_shard("lowrank_scale", stale, SEED, None, tmp_path / "r.parquet",
                  tmp_path / "t.parquet")
    assert not (tmp_path / "r.parquet").exists()


# ---------------------------------------------------------------------------------------------
# lowrank_scale's learners
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, why", [
    ("sketchy", "'sketchy' is not a registered learner"),
    ("noisy", "'noisy' asks the approximate value oracle; lowrank_scale's box answers as "
              "'value'"),
    ("layer", "'layer' returns a layer; lowrank_scale measures a 'head'"),
    ("lowprecision", r"'lowprecision' needs \['n_queries'\]"),
])
def test_lowrank_scale_refuses_a_learner_it_cannot_run_naming_those_it_can(name, why):
    with pytest.raises(ConfigError, match=why + r".*runs the registered learners of one head "
                       r"from value queries: \[(.*)\]") as err:
        expand_cells("lowrank_scale", {"d": [8], "rank": [1], "seeds": 1,
                                       "learners": ["sketch", name]})
    # the built-in ones, then any plug-in of the kind installed here
    named = re.search(r"value queries: \[(.*)\]", str(err.value)).group(1)
    named = [n.strip(" '") for n in named.split(",")]
    reg = _registry.registry()
    assert [n for n in named if not reg[n].plugin] == ["exact", "sketch", "nuclear"]


def test_the_schema_leaves_the_learner_names_to_the_registry():
    from attnquery.schema import load_schema

    items = load_schema()["$defs"]["lowrank_scale"]["properties"]["learners"]["items"]
    assert "enum" not in items and items["type"] == "string"


def test_a_plugin_runs_in_lowrank_scale_and_its_figure_draws_it(plugin):
    from attnquery.figures.lowrank import lowrank_queries, lowrank_time

    plugin("plugfig", label="my plug-in")
    cells = expand_cells("lowrank_scale", {"d": [8, 12, 16], "rank": [2], "seeds": 1,
                                           "learners": ["sketch", "exact", "plugged"]})
    assert {c["learner"] for c in cells} == {"sketch", "exact", "plugged"}
    rows, timings = run_cells(keyed_cells("lowrank_scale", cells, {}, SEED), SEED)
    df = rows_to_table(rows).to_pandas().merge(pd.DataFrame(timings),
                                               on=["experiment", "cell_id"], how="left")
    mine = df[df["learner"] == "plugged"]
    assert len(mine) == 3 and (mine["status"] == "ok").all() and mine["success"].all()
    assert (mine["rel_err_W"] < 1e-10).all()
    # the exact learner under another name: the same queries on the same heads
    exact = df[df["learner"] == "exact"].set_index("d")["n_queries"].to_dict()
    assert mine.set_index("d")["n_queries"].to_dict() == exact
    assert (mine["n_queries"] >= mine["d"] ** 2 + mine["d"]).all()
    fig, _ = lowrank_queries(df)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("my plug-in") for t in labels), labels
    assert any(t.startswith("sketch, rank found") for t in labels)
    fig, _ = lowrank_time(df)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "my plug-in, r = 2" in labels and "exact, r = 2" in labels
