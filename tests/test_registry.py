"""The learner registry: every built-in learner declares its spec, plug-ins are found through the
entry-point group ``attnquery.learners``, loaded only when used, and a broken one is named."""

from __future__ import annotations

import inspect
import sys
import types
import warnings

import numpy as np
import pytest

import attnquery.learners as learners
from attnquery.errors import ConfigError
from attnquery.learners._base import BaseLearner
from attnquery.learners._registry import (
    REQUIRED,
    LearnerSpec,
    get_entry,
    get_learner,
    learner_parameters,
    learner_table,
    registry,
)
from attnquery.models import random_head
from attnquery.oracles import ValueOracle


@pytest.fixture(params=["as installed", "with plug-ins"])
def installed(request, monkeypatch):
    """The registry as this environment has it, and with plug-ins installed (one that loads,
    one that cannot): the tests of the built-in learners hold either way."""
    if request.param == "with plug-ins":
        mod = types.ModuleType("attnquery_test_plugins")
        mod.Child = _Child
        monkeypatch.setitem(sys.modules, "attnquery_test_plugins", mod)
        request.getfixturevalue("entry_points")(
            aa_child="attnquery_test_plugins:Child", zz_gone="attnquery_gone:Gone")
    return request.param


def _builtin(entries):
    """The built-in learners' names among ``entries`` (names or a registry mapping)."""
    reg = registry()
    return [n for n in entries if not reg[n].plugin]


def _learner_classes():
    return [getattr(learners, n) for n in learners.__all__
            if inspect.isclass(getattr(learners, n))
            and issubclass(getattr(learners, n), BaseLearner)]


def test_every_exported_learner_declares_its_own_spec_and_is_registered(installed):
    classes = _learner_classes()
    assert len(classes) == 13
    reg = registry()
    for cls in classes:
        assert isinstance(cls.__dict__.get("spec"), LearnerSpec), cls.__name__
        entry = reg[cls.spec.name]
        assert entry.load() is cls and not entry.plugin
    assert len(_builtin(reg)) == len(classes)
    assert all(reg[n].module.startswith("attnquery.learners.") for n in _builtin(reg))


def test_the_command_lines_names_are_the_registrys(installed):
    names = [n for n in _builtin(registry()) if get_entry(n).spec.command_line
             and get_entry(n).spec.returns in ("head", "layer", "rotary head")]
    assert names == ["exact", "sketch", "nuclear", "noisy", "membership", "layer", "rotary"]


@pytest.mark.parametrize("name", ["exact", "sketch"])
def test_a_spec_names_the_stages_its_fit_counts(name):
    d = 6
    head = random_head(d, np.random.default_rng(3), rank=2 if name == "sketch" else None)
    est = get_entry(name).make(random_state=0).fit(ValueOracle(head, d))
    assert list(est.n_queries_by_stage_) == list(get_entry(name).spec.stages)
    assert sum(est.n_queries_by_stage_.values()) == est.n_queries_


def test_every_variant_builds_its_learner_with_its_parameters(installed):
    n = 0
    for name in _builtin(registry()):
        entry = get_entry(name)
        for variant, params in entry.spec.variants.items():
            required = {k: 1.0 for k, p in entry.parameters().items()
                        if p["default"] is REQUIRED}
            est = entry.make(variant, **required)
            assert {k: getattr(est, k) for k in params} == dict(params), (name, variant)
            n += 1
    assert n >= 3  # exact's and membership's paper choices, noisy's unclipped baseline
    with pytest.raises(ConfigError, match=r"no variant 'fast'; its variants: \['paper'\]"):
        get_entry("exact").make("fast")


def test_the_papers_exact_variant_recovers_a_head():
    d = 5
    head = random_head(d, np.random.default_rng(0))
    est = get_entry("exact").make("paper", random_state=1).fit(ValueOracle(head, d))
    assert est.probes == "gaussian"
    assert np.linalg.norm(est.W_ - head.W) <= 1e-8 * np.linalg.norm(head.W)


def test_parameters_come_from_the_constraints_where_a_class_has_them():
    params = learner_parameters(learners.NoisyValueQueryLearner)
    assert params["W_bound"]["default"] is REQUIRED and params["clip"]["default"] is True
    assert all(p["constraints"] is not None for p in params.values())

    class Constrained(learners.ExactValueQueryLearner):
        _parameter_constraints = {"probes": [("basis", "gaussian", "orthogonal")]}

    params = learner_parameters(Constrained)
    assert params["probes"] == {"default": "basis",
                                "constraints": [("basis", "gaussian", "orthogonal")]}
    assert params["verify"]["constraints"] is None
    assert list(params) == list(inspect.signature(Constrained).parameters)


def test_an_unknown_learner_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"unknown learner 'exactt'; registered learners: .*"
                       r"'exact'"):
        get_learner("exactt")


@pytest.mark.parametrize("field, value, match", [
    ("oracle", "values", "oracle must be one of"),
    ("returns", "heads and more", "returns must be one of"),
    ("name", "two words", "must be an identifier"),
    ("variants", {"paper": 3}, "variants must map names to parameter dicts"),
])
def test_a_bad_spec_is_refused_when_declared(field, value, match):
    kwargs = {"name": "x", "oracle": "value", "description": "", field: value}
    with pytest.raises(ConfigError, match=match):
        LearnerSpec(**kwargs)


def test_the_table_lists_every_learner():
    table = learner_table()
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    assert len(rows) == len(registry())
    assert "| `rotary` | `RotaryValueQueryLearner` | value | rotary head |" in table


# ---------------------------------------------------------------------------------------------
# plug-ins
# ---------------------------------------------------------------------------------------------
class _Child(learners.ExactValueQueryLearner):
    """A plug-in that inherits the exact learner's spec."""


class _NoSpec:
    """Not a learner."""


def test_plugins_are_found_loaded_lazily_and_a_broken_one_is_named(monkeypatch,
                                                                  entry_points):
    mod = types.ModuleType("attnquery_test_plugins")
    mod.Child, mod.NoSpec = _Child, _NoSpec
    monkeypatch.setitem(sys.modules, "attnquery_test_plugins", mod)
    entry_points(child="attnquery_test_plugins:Child",
                  broken="attnquery_missing_package.learner:Broken",
                  nospec="attnquery_test_plugins:NoSpec")
    reg = registry()
    assert list(reg)[-3:] == ["broken", "child", "nospec"]
    assert all(reg[n].plugin for n in ("broken", "child", "nospec"))
    # the subclass inherits the exact learner's spec, under the entry point's name
    assert get_learner("child") is _Child
    spec = get_entry("child").spec
    assert spec.name == "child" and spec.oracle == "value" and spec.fits_bias
    # ... but not its label: figures draw it under its own name, not as "exact (Thm 4.1)"
    assert get_entry("exact").spec.label and spec.label == "" and spec.display == "child"
    with pytest.raises(ConfigError, match=r"learner 'broken' \(entry point broken = "
                       r"'attnquery_missing_package.learner:Broken'.*\) cannot be loaded: "
                       r"ModuleNotFoundError"), \
            pytest.warns(UserWarning, match="plug-in learner 'broken' .* it is left out"):
        get_learner("broken")
    with pytest.raises(ConfigError, match="'nospec'.* is not a learner class with a spec"):
        get_learner("nospec")
    # the others still work, and the table says which plug-in is not available
    assert get_learner("exact") is learners.ExactValueQueryLearner
    with pytest.warns(UserWarning, match="'broken'"):
        table = learner_table()
    assert "| `child` | `Child` (plug-in `attnquery_test_plugins`) | value | head |" in table
    assert "| `broken` | `attnquery_missing_package.learner:Broken` | | | not available: " in table


def test_a_plugin_is_not_imported_until_it_is_used(monkeypatch, entry_points):
    entry_points(later="attnquery_not_yet_imported:Later")
    assert "later" in registry() and "attnquery_not_yet_imported" not in sys.modules
    with pytest.warns(UserWarning, match="'later'"):
        assert not get_entry("later").available


class _Labelled(learners.ExactValueQueryLearner):
    spec = LearnerSpec(name="labelled", oracle="value", description="own", label="my label")


def test_a_plugin_with_a_spec_of_its_own_keeps_its_label(monkeypatch, entry_points):
    mod = types.ModuleType("attnquery_test_plugins")
    mod.Labelled = _Labelled
    monkeypatch.setitem(sys.modules, "attnquery_test_plugins", mod)
    entry_points(renamed="attnquery_test_plugins:Labelled")
    spec = get_entry("renamed").spec
    assert (spec.name, spec.label, spec.display) == ("renamed", "my label", "my label")


@pytest.mark.parametrize("body, raised", [
    ("import sys\nsys.exit(0)\n", "SystemExit: 0"),
    ("import sys\nsys.exit('bye')\n", "SystemExit: bye"),
    ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
    ("raise BaseException('odd')\n", "BaseException: odd"),
])
def test_a_plugin_whose_import_exits_or_raises_does_not_end_the_host(
        body, raised, tmp_path, monkeypatch, entry_points, capsys):
    (tmp_path / "attnquery_bad_plugin.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "attnquery_bad_plugin", raising=False)
    entry_points(a_plugin_with_a_long_name="attnquery_bad_plugin:Learner")
    with pytest.warns(UserWarning, match=f"plug-in learner 'a_plugin_with_a_long_name' .* "
                      f"cannot be loaded: {raised}; it is left out"):
        table = learner_table()
    assert f"cannot be loaded: {raised}" in table and "| `exact` |" in table
    with pytest.raises(ConfigError, match=raised), pytest.warns(UserWarning):
        get_learner("a_plugin_with_a_long_name")
    assert get_learner("exact") is learners.ExactValueQueryLearner
    # attnquery info names it, says why, and exits 0; the table's columns stay aligned
    from attnquery.cli.app import main

    monkeypatch.chdir(tmp_path)  # no config/config.yaml here: versions and methods only
    with pytest.warns(UserWarning, match="a_plugin_with_a_long_name"):
        assert main(["info"]) == 0
    out = capsys.readouterr().out
    rows = out.split("methods:\n", 1)[1].split("\nconfig:", 1)[0].splitlines()
    assert rows[-1].startswith("  a_plugin_with_a_long_name ") and raised in rows[-1]
    assert rows[0].startswith("  exact ")
    # the second column (the class) starts at one place, after the longest name
    starts = {len(r) - len(r[2:].split(None, 1)[1]) for r in rows}
    assert starts == {2 + len("a_plugin_with_a_long_name") + 2}, rows


def test_a_plugin_may_not_take_a_built_in_name(monkeypatch, entry_points):
    entry_points(exact="attnquery_test_plugins:Child")
    with pytest.warns(UserWarning, match=r"plug-in learner 'exact' .* is left out: the name is "
                      r"taken by attnquery.learners.exact:ExactValueQueryLearner"):
        reg = registry()
    assert not reg["exact"].plugin


# ---------------------------------------------------------------------------------------------
# the command line's methods read the registry
# ---------------------------------------------------------------------------------------------
def test_the_methods_are_the_registrys_specs(installed):
    import attnquery.extraction as extraction

    methods = extraction.methods()
    assert _builtin(methods) == ["exact", "sketch", "nuclear", "noisy", "membership", "layer",
                                 "rotary", "vector"]
    for name in _builtin(methods):
        m, spec = methods[name], get_entry(name).spec
        assert (m.load(), m.oracle, m.description, m.returns, m.fits_bias) == (
            get_learner(name), spec.oracle, spec.description, spec.returns, spec.fits_bias)
    with warnings.catch_warnings():  # a plug-in that cannot be loaded is named (tested below)
        warnings.simplefilter("ignore", UserWarning)
        bias = extraction.BIAS_METHODS
    assert _builtin(bias) == ["exact", "sketch", "layer", "vector"]


class _Network(learners.ExactValueQueryLearner):
    spec = LearnerSpec(name="net", oracle="value", description="a network", returns="network")


def test_a_plugin_method_extracts_and_one_the_command_line_cannot_report_is_refused(
        monkeypatch, entry_points):
    mod = types.ModuleType("attnquery_test_plugins")
    mod.Child, mod.Network = _Child, _Network
    monkeypatch.setitem(sys.modules, "attnquery_test_plugins", mod)
    entry_points(child="attnquery_test_plugins:Child",
                  net="attnquery_test_plugins:Network", gone="attnquery_gone:Gone")
    from attnquery.extraction import METHODS, ExtractionSpec, run_extraction
    from tests.fixtures import SOME_HEAD, some_head

    assert {"child", "net", "gone"} <= set(METHODS)
    summary, head = run_extraction(ExtractionSpec("child", some_head, 16, truth=SOME_HEAD))
    assert summary["method"] == "child" and summary["rel_err_W"] < 1e-10
    assert summary["n_queries"] == 16 * 16 + 16 + 8
    with pytest.raises(ConfigError, match=r"learner 'net' .* returns a network: attnquery "
                       "extract reports a head, a layer, a rotary head"):
        run_extraction(ExtractionSpec("net", some_head, 16))
    with pytest.raises(ConfigError, match="learner 'gone' .* cannot be loaded"), \
            pytest.warns(UserWarning, match="plug-in learner 'gone'"):
        run_extraction(ExtractionSpec("gone", some_head, 16))
    with pytest.warns(UserWarning, match="plug-in learner 'gone'"):
        assert not METHODS["gone"].available
    assert METHODS["child"].available


def test_a_learner_that_does_not_return_what_its_spec_says_is_named():
    from attnquery.extraction import _learned_model

    est = learners.ExactValueQueryLearner()
    with pytest.raises(ConfigError, match="ExactValueQueryLearner returns a layer but did not "
                       "produce heads_"):
        _learned_model(est, 4, "layer")
    with pytest.raises(ConfigError, match="returns a rotary head but did not produce head_"):
        _learned_model(est, 4, "rotary head")
