"""The package's shape, measured from its sources: no import cycle, experiments that never
import each other (nor figure modules each other), learner registries that match the schema,
and configuration defaults that live in the schema only."""

from __future__ import annotations

import ast
import pkgutil

import pytest

import attnquery
from attnquery.experiments import FAMILIES, get_experiment
from attnquery.schema import load_schema
from attnquery.study import PACKAGE_DIR, _dependencies, _module_path, module_closure

MODULES = sorted(["attnquery"] + [m.name for m in pkgutil.walk_packages(attnquery.__path__,
                                                                         "attnquery.")])


def _module_level_imports(modname: str) -> set[str]:
    """Modules of the package that ``modname`` imports when it is imported (its top-level
    ``import`` statements, those under a top-level ``if``/``try`` included)."""
    path = _module_path(modname)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = modname if path.name == "__init__.py" else modname.rsplit(".", 1)[0]
    out: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If | ast.Try):
            todo.extend(node.body + node.orelse + getattr(node, "finalbody", [])
                        + [s for h in getattr(node, "handlers", []) for s in h.body])
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("attnquery"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("attnquery"):
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                out.add(sub if _module_path(sub) is not None else source)
    out.discard(modname)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    graph = {m: _module_level_imports(m) for m in MODULES}
    assert graph["attnquery.experiments.noise"], "the walker finds no import at all"
    assert _cycles(graph) == []


def test_the_code_version_graph_has_no_cycle():
    # every import, those inside functions too: what a cell's code version follows
    # (attnquery.study.module_closure)
    graph = {m: set(_dependencies(m)) for m in MODULES}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


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

    from attnquery.config import check_config, load_config

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
    found += _literal_get_defaults(PACKAGE_DIR / "config.py")
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

    from attnquery.config import check_config, load_config
    from attnquery.extraction import METHODS

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
