"""The package's import graph, read from its sources, and the rules it keeps.

Every ``import`` statement of every module is read with :mod:`ast` (those at module level and
those inside functions alike; relative imports resolved; an old path of
:data:`attnquery._moved.MOVED` read as the module it names now). ``from package import name``
names the submodule ``package.name`` when there is one, else the package's ``__init__``.

The rules (:func:`violations`; ``tests/test_architecture.py`` asserts there are none):

* **levels**: at every package level, the graph among its direct children (a subpackage
  collapsed into one node) has no cycle;
* **up**: no module imports the ``__init__`` of a package it sits in (an arrow running back up);
* **library**: the library (every module but those of ``study/`` and ``cli/``, and
  ``__main__``) imports neither ``study/`` nor ``cli/``;
* **lines**: no module is over :data:`MAX_LINES` lines;
* **learners**: no class of ``learners/`` spans over :data:`MAX_CLASS_LINES` lines.

Run ``python -m attnquery._imports`` to print the graph of each package level and every
violation (exit status 1 when there is one); ``--module NAME`` prints one module's imports.
"""

from __future__ import annotations

import argparse
import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from ._moved import MOVED

__all__ = [
    "PACKAGE",
    "PACKAGE_DIR",
    "TOP_LAYERS",
    "MAX_LINES",
    "MAX_CLASS_LINES",
    "Import",
    "module_path",
    "is_package",
    "parsed",
    "absolute",
    "modules",
    "imports",
    "graph",
    "level_graph",
    "cycles",
    "import_breaks",
    "size_breaks",
    "violations",
    "main",
]

PACKAGE = "attnquery"
PACKAGE_DIR = Path(__file__).resolve().parent

#: the packages that sit on top of the library: they may import it, it never imports them
TOP_LAYERS = (f"{PACKAGE}.study", f"{PACKAGE}.cli")

#: the longest module, in lines
MAX_LINES = 700
#: the longest class of ``learners/``, in lines (from its ``class`` line to its last line)
MAX_CLASS_LINES = 400


def module_path(modname: str) -> Path | None:
    """The source file of module ``modname`` of this package (None if it is not one)."""
    parts = modname.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def is_package(modname: str) -> bool:
    """Whether ``modname`` is a package of this package (its source an ``__init__.py``)."""
    p = module_path(modname)
    return p is not None and p.name == "__init__.py"


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of a source file (parsed once per process)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def absolute(modname: str, node: ast.ImportFrom, package: bool | None = None) -> str:
    """The absolute module named by a (possibly relative) ``from ... import`` in ``modname`` (a
    package's ``__init__`` when ``package``; default: whether it is one of this package)."""
    if node.level == 0:
        return node.module or ""
    package = is_package(modname) if package is None else package
    base = (modname if package else modname.rsplit(".", 1)[0]).split(".")
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def modules() -> list[str]:
    """Every module of the package (packages by their own name), sorted."""
    out = []
    for path in PACKAGE_DIR.rglob("*.py"):
        rel = path.relative_to(PACKAGE_DIR).with_suffix("").parts
        if rel[-1] == "__init__":
            rel = rel[:-1]
        out.append(".".join((PACKAGE, *rel)))
    return sorted(out)


@dataclass(frozen=True)
class Import:
    """One module of the package that a module imports."""

    #: the importing module
    source: str
    #: the module imported (a package names its ``__init__``)
    target: str
    #: line of the import statement
    line: int
    #: whether the statement runs only when a function is called
    in_function: bool

    def __str__(self) -> str:
        where = " (in a function)" if self.in_function else ""
        return f"{self.source}:{self.line} -> {self.target}{where}"


def _new(name: str) -> str:
    """``name`` with an old path of :data:`MOVED` (or a parent of one) read as the new one."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return name


def _own(name: str) -> str | None:
    """The module of the package ``name`` is, or the longest one it sits in (None if outside)."""
    name = _new(name)
    while name and module_path(name) is None:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def imports(modname: str) -> tuple[Import, ...]:
    """The imports of ``modname`` that name modules of the package, in source order."""
    tree = parsed(module_path(modname))
    package = is_package(modname)
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                              | ast.Lambda)
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                source = _new(absolute(modname, child, package))
                for alias in child.names:
                    sub = _new(f"{source}.{alias.name}")
                    targets.append(sub if module_path(sub) is not None else source)
            for t in targets:
                own = _own(t)
                found = Import(modname, own, child.lineno, in_function)
                if own is not None and own != modname and found not in out:
                    out.append(found)
            visit(child, inner)

    visit(tree, False)
    return tuple(out)


def graph() -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, every import counted."""
    return {m: {i.target for i in imports(m)} for m in modules()}


def _child(package: str, modname: str) -> str | None:
    """The direct child of ``package`` that ``modname`` is or sits in (None if it is neither)."""
    if not modname.startswith(package + "."):
        return None
    return ".".join(modname.split(".")[: package.count(".") + 2])


def level_graph(package: str, full: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """The graph among the direct children of ``package``: a subpackage is one node holding
    every module below it; an import of ``package``'s own ``__init__`` is left out (rule "up")."""
    full = graph() if full is None else full
    out: dict[str, set[str]] = {}
    for m, targets in full.items():
        a = _child(package, m)
        if a is None:
            continue
        out.setdefault(a, set())
        for t in targets:
            b = _child(package, t)
            if b is not None and b != a:
                out[a].add(b)
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def _is_top(modname: str) -> bool:
    return modname == f"{PACKAGE}.__main__" or any(
        modname == t or modname.startswith(t + ".") for t in TOP_LAYERS)


def import_breaks(found: dict[str, tuple[Import, ...]], packages: set[str]
                  ) -> dict[str, list[str]]:
    """The breaks of the import rules (``levels``, ``up``, ``library``) in ``found``, every
    module's imports, where ``packages`` are the modules that are packages: each cycle of a
    package level with the imports that make its arrows, each import that runs up or into
    the top layers. A pure function of its arguments (the tests give it made-up graphs)."""
    full = {m: {i.target for i in found[m]} for m in found}
    out: dict[str, list[str]] = {"levels": [], "up": [], "library": []}
    for package in sorted(packages):
        for cycle in cycles(level_graph(package, full)):
            members = set(cycle)
            edges = [str(i) for m in sorted(found) if _child(package, m) in members
                     for i in found[m] if _child(package, i.target) in members - {
                         _child(package, m)}]
            out["levels"].append(f"{package}: cycle {' <-> '.join(cycle)}: {'; '.join(edges)}")
    for m in sorted(found):
        for i in found[m]:
            if i.target in packages and m.startswith(i.target + "."):
                out["up"].append(str(i))
            if not _is_top(m) and _is_top(i.target):
                out["library"].append(str(i))
    return out


def size_breaks() -> dict[str, list[str]]:
    """The modules over :data:`MAX_LINES` lines (``lines``) and the classes of ``learners/``
    over :data:`MAX_CLASS_LINES` (``learners``), with their sizes."""
    out: dict[str, list[str]] = {"lines": [], "learners": []}
    for m in modules():
        path = module_path(m)
        rel = path.relative_to(PACKAGE_DIR)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            out["lines"].append(f"{rel}: {lines} lines")
        if m.startswith(f"{PACKAGE}.learners."):
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.ClassDef):
                    span = node.end_lineno - node.lineno + 1
                    if span > MAX_CLASS_LINES:
                        out["learners"].append(f"{rel}:{node.lineno}: class {node.name}: "
                                               f"{span} lines")
    return out


def violations() -> dict[str, list[str]]:
    """Every break of the rules of the package's sources, by rule (``levels``, ``up``,
    ``library``: :func:`import_breaks`; ``lines``, ``learners``: :func:`size_breaks`)."""
    found = {m: imports(m) for m in modules()}
    return {**import_breaks(found, {m for m in found if is_package(m)}), **size_breaks()}


def main(argv: list[str] | None = None) -> int:
    """Print each package level's graph (or one module's imports) and every violation."""
    parser = argparse.ArgumentParser(prog="python -m attnquery._imports", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--module", help="print the imports of this module only")
    parser.add_argument("--quiet", action="store_true", help="print the violations only")
    args = parser.parse_args(argv)
    if args.module:
        for i in imports(args.module):
            print(i)
        return 0
    if not args.quiet:
        full = graph()
        for package in [m for m in modules() if is_package(m)]:
            g = level_graph(package, full)
            if not g:
                continue
            print(f"{package}:")
            for node in sorted(g):
                names = ", ".join(t[len(package) + 1:] for t in sorted(g[node])) or "-"
                print(f"  {node[len(package) + 1:]} -> {names}")
    found = violations()
    total = sum(len(v) for v in found.values())
    for rule, items in found.items():
        for item in items:
            print(f"[{rule}] {item}")
    print(f"{total} violation(s)")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
