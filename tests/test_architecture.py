"""The package's shape, measured from its sources: the import rules of attnquery._imports (no
cycle at any package level, no import back up to an enclosing package, a library that never
imports the study or the command line, modules and learner classes of bounded size), no import
cycle at all, experiments that never import each other (nor figure modules each other),
learner registries that match the schema, and configuration defaults that live in the schema
only."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys

import pytest

from attnquery import _imports
from attnquery._imports import Import, cycles, import_breaks, imports, level_graph
from attnquery.experiments import FAMILIES, get_experiment
from attnquery.schema import load_schema
from attnquery.study.bookkeeping import PACKAGE_DIR, _dependencies, module_closure

MODULES = _imports.modules()


def _report(breaks: list[str]) -> str:
    return "\n".join(breaks)


# ---------------------------------------------------------------------------------------------
# the rules of attnquery._imports, on the package's sources
# ---------------------------------------------------------------------------------------------
def test_the_walker_reads_every_kind_of_import():
    assert len(MODULES) > 150 and "attnquery.study.pipeline" in MODULES
    run_shard = imports("attnquery.study.pipeline")
    # relative, inside a function, to a sibling of the study package
    assert Import("attnquery.study.pipeline", "attnquery.study.bookkeeping",
                  next(i.line for i in run_shard if i.target.endswith(".bookkeeping")),
                  True) in run_shard
    # relative two floors up, at module level, to a package's __init__
    assert any(i.target == "attnquery.experiments" and not i.in_function for i in run_shard)
    # an old path of attnquery._moved is read as the module it names now
    own = _imports._own("attnquery.vector_models.VectorAttentionLayer")
    assert own == "attnquery.models.vector"


@pytest.mark.parametrize("rule", ["levels", "up", "library"])
def test_the_package_keeps_the_import_rule(rule):
    # levels: no cycle among the direct children of any package (a subpackage one node);
    # up: no module imports the __init__ of a package it sits in;
    # library: nothing but study/, cli/ and __main__ imports study/ or cli/
    found = {m: imports(m) for m in MODULES}
    breaks = import_breaks(found, {m for m in MODULES if _imports.is_package(m)})[rule]
    assert breaks == [], f"{len(breaks)} imports break rule {rule}:\n{_report(breaks)}"


@pytest.mark.parametrize("rule", ["lines", "learners"])
def test_the_package_keeps_the_size_rule(rule):
    # lines: no module over 700 lines; learners: no class of learners/ over 400
    breaks = _imports.size_breaks()[rule]
    assert breaks == [], f"over the limit:\n{_report(breaks)}"


def test_the_command_line_script_prints_the_graph_and_no_violation():
    out = subprocess.run([sys.executable, "-m", "attnquery._imports"], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    assert "attnquery.learners:" in out.stdout and out.stdout.rstrip().endswith(
        "0 violation(s)")


def _made_up(edges: dict[str, list[str]], in_function=False) -> dict[str, tuple[Import, ...]]:
    return {m: tuple(Import(m, t, n + 1, in_function) for n, t in enumerate(ts))
            for m, ts in edges.items()}


def test_the_rules_find_a_cycle_between_two_subpackages_and_name_its_imports():
    # learners/vector -> learners/_base at module level, learners/_base -> learners/vector/_x
    # inside a function: a cycle at the level of attnquery.learners, whatever the depth
    found = _made_up({"attnquery.learners.vector._layer": ["attnquery.learners._base"],
                      "attnquery.learners._base": ["attnquery.learners.vector._heads"],
                      "attnquery.learners.vector._heads": []}, in_function=True)
    breaks = import_breaks(found, {"attnquery", "attnquery.learners",
                                   "attnquery.learners.vector"})
    assert breaks["levels"] == [
        "attnquery.learners: cycle attnquery.learners._base <-> attnquery.learners.vector: "
        "attnquery.learners._base:1 -> attnquery.learners.vector._heads (in a function); "
        "attnquery.learners.vector._layer:1 -> attnquery.learners._base (in a function)"]
    assert breaks["up"] == breaks["library"] == []
    assert level_graph("attnquery.learners", {"attnquery.learners.vector._layer":
                                              {"attnquery.learners._base"}}) == {
        "attnquery.learners.vector": {"attnquery.learners._base"}}


def test_the_rules_find_an_import_up_and_a_library_module_importing_the_study():
    found = _made_up({"attnquery.learners.vector._layer": ["attnquery.learners",
                                                           "attnquery.learners.vector"],
                      "attnquery.experiments.noise": ["attnquery.study.bookkeeping"],
                      "attnquery.cli.app": ["attnquery.study"],
                      "attnquery.study.pipeline": ["attnquery.cli._common"]})
    breaks = import_breaks(found, {"attnquery", "attnquery.learners", "attnquery.learners.vector",
                                   "attnquery.study", "attnquery.cli"})
    assert breaks["up"] == ["attnquery.learners.vector._layer:1 -> attnquery.learners",
                            "attnquery.learners.vector._layer:2 -> attnquery.learners.vector"]
    assert breaks["library"] == ["attnquery.experiments.noise:1 -> attnquery.study.bookkeeping"]


def test_the_package_has_no_import_cycle():
    # among the imports a module runs when it is imported, and among all of them
    module_level = {m: {i.target for i in imports(m) if not i.in_function} for m in MODULES}
    assert module_level["attnquery.experiments.noise"], "the walker finds no import at all"
    assert cycles(module_level) == []
    assert cycles(_imports.graph()) == []


def test_the_code_version_graph_has_no_cycle():
    # every import, those inside functions too, each name read at the module that defines it:
    # what a cell's code version follows (attnquery.study.module_closure)
    graph = {m: set(_dependencies(m)) for m in MODULES}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("family", FAMILIES)
def test_an_experiment_never_imports_another_experiment(family):
    others = {f"attnquery.experiments.{f}" for f in FAMILIES if f != family}
    closure = {str(p.relative_to(PACKAGE_DIR)) for p in
               module_closure([f"attnquery.experiments.{family}"])}
    banned = sorted(c for c in closure if c.startswith("experiments/")
                    and f"attnquery.experiments.{c[len('experiments/'):-3]}" in others)
    assert not banned, f"experiments/{family}.py depends on {banned}"


def test_a_noise_cell_depends_on_no_real_weights_code():
    closure = {str(p.relative_to(PACKAGE_DIR)) for p in
               module_closure([get_experiment("noise").run.__module__])}
    assert not any(c.startswith("realheads/") for c in closure)
    assert "learners/lowprecision.py" not in closure
    assert {"experiments/noise.py", "learners/noisy.py", "oracles/__init__.py",
            "oracles/_base.py"} <= closure


def test_a_noise_cell_depends_on_no_module_of_the_low_precision_package():
    # learners/lowprecision/ is a package (its old single module's path names no file now)
    closure = {str(p.relative_to(PACKAGE_DIR)) for p in
               module_closure([get_experiment("noise").run.__module__])}
    assert not any(c.startswith("learners/lowprecision") for c in closure)
    lowprecision = {str(p.relative_to(PACKAGE_DIR)) for p in
                    module_closure([get_experiment("lowprecision").run.__module__])}
    assert "learners/lowprecision/_pairs.py" in lowprecision  # the closure sees the package


def test_a_figure_module_never_imports_another_figure_module():
    import attnquery.figures as figs

    names = [m.name for m in pkgutil.iter_modules(figs.__path__) if not m.name.startswith("_")]
    for name in names:
        deps = _dependencies(f"attnquery.figures.{name}")
        others = sorted(d for d in deps if d.startswith("attnquery.figures.")
                        and not d.rsplit(".", 1)[1].startswith("_"))
        assert not others, f"figures/{name}.py imports {others}"


@pytest.mark.parametrize("name", ["noise", "rounding", "realheads"])
def test_a_learner_table_is_what_the_experiment_takes_and_the_schema_leaves_names_to_it(name):
    # the schema checks a name's form; the experiment (its TAKES: its own learners, and the
    # registry's that fit) checks the name when the grid is expanded
    import importlib

    module = importlib.import_module(get_experiment(name).run.__module__)
    assert tuple(module.LEARNERS) == module.TAKES.own
    items = load_schema()["$defs"][name]["properties"]["learners"]["items"]
    assert "enum" not in items and items["type"] == "string"


def test_every_learner_a_grid_names_is_registered():
    import importlib

    from attnquery.study.config import check_config, load_config

    cells = check_config(load_config(PACKAGE_DIR.parents[1] / "config" / "quick.yaml"))
    for name, cs in cells.items():
        module = importlib.import_module(get_experiment(name).run.__module__)
        table = getattr(module, "LEARNERS", None)
        if name == "lowrank_scale":
            table = module.SCALE_LEARNERS
        if isinstance(table, dict):
            assert {c["learner"] for c in cs} <= set(table), name


def _literal_get_defaults(path) -> list[str]:
    """``x.get(key, <literal>)`` calls in a source file: a default written in code."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and len(node.args) == 2):
            try:
                ast.literal_eval(node.args[1])
            except ValueError:
                continue  # a fallback to another key (``seeds``), not a constant
            owner = ast.unparse(node.func.value)
            if owner not in ("cell", "src", "exc"):  # a cell's optional parameter
                out.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_config_defaults_live_in_the_schema_only():
    found = [hit for p in sorted((PACKAGE_DIR / "experiments").glob("*.py"))
             for hit in _literal_get_defaults(p)]
    found += _literal_get_defaults(PACKAGE_DIR / "study" / "config.py")
    assert found == []


def test_an_experiment_section_gets_the_schema_defaults():
    from attnquery.schema import section_with_defaults

    given = {"d": [4], "tau": [1e-3], "mu": [0.1], "W_bound": [4.0], "noise": ["uniform"],
             "learners": ["noisy"], "seeds": 1}
    filled = section_with_defaults("noise", given)
    assert "zero_frac" not in given  # the given section is left as it is
    assert filled["zero_frac"] == 0.25 and filled["eps"] == 0.01 and filled["oversample"] == []
    # a $ref-defined default (Snakemake's validate leaves these out)
    assert filled["enabled"] is True and filled["cells_per_shard"] == 20
    filled["oversample"].append(1)
    assert section_with_defaults("noise", given)["oversample"] == []  # never shared


def test_a_learner_name_the_command_line_and_an_experiment_share_is_one_class():
    # the experiments' LEARNERS name configured learners, the command line's METHODS classes
    # (docs/design.md, "Registries"); where a name is in both, it must build the same class
    import importlib

    import numpy as np

    from attnquery.extraction import METHODS
    from attnquery.study.config import check_config, load_config

    cells = check_config(load_config(PACKAGE_DIR.parents[1] / "config" / "quick.yaml"))
    shared = []
    for name, cs in cells.items():
        table = getattr(importlib.import_module(get_experiment(name).run.__module__),
                        "LEARNERS", None)
        if not isinstance(table, dict):
            continue
        for learner, factory in table.items():
            cell = next((c for c in cs if c["learner"] == learner), None)
            if learner not in METHODS or cell is None or not callable(factory):
                continue
            est = factory(cell, int(cell.get("d", 8)), np.random.default_rng(0))
            assert type(est) is METHODS[learner].load(), (name, learner)
            shared.append((name, learner))
    assert len(shared) >= 3, shared  # noise's noisy, rounding's exact and noisy at least


@pytest.mark.parametrize("package", ["attnquery.models", "attnquery.realheads"])
def test_a_package_split_from_one_module_exports_every_public_name_of_its_modules(package):
    # models.py and realheads.py became packages: every public name of their modules is still
    # importable from the package, the very object, and listed in its __all__
    import importlib

    pkg = importlib.import_module(package)
    modules = [m.name for m in pkgutil.iter_modules(pkg.__path__)]
    assert len(modules) >= 4, modules
    for name in modules:
        module = importlib.import_module(f"{package}.{name}")
        for public in module.__all__:
            assert public in pkg.__all__, f"{package}.{name}.{public} is not in {package}.__all__"
            assert getattr(pkg, public) is getattr(module, public), f"{package}.{public}"
    assert len(set(pkg.__all__)) == len(pkg.__all__)
    assert all(hasattr(pkg, public) for public in pkg.__all__)
