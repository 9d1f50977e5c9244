"""The study's bookkeeping: what a cell's result depends on, which cells are computed already, and
what to ask a cluster for.

**Identity of a cell.** A cell's result is a pure function of its parameters, the study seed, the
data it reads (a checkpoint) and the code that computes it. :func:`code_version` hashes that
code: the experiment's module and every module of the package it imports, followed import by
import (:func:`module_closure`), plus the versions of the numerical libraries. So editing a
learner changes the code version of exactly the experiments that import it, and editing a figure
changes none. A cell's ``cell_key`` hashes all four.

**Cache.** Every computed cell is stored in a shard table ``results/<experiment>/shards/<digest>``
named by the keys of its cells. :func:`plan_experiment` reads the keys stored in the shard tables
already there and plans new shards for the cells that no table holds, so a rerun computes only
the cells whose identity changed, and adding a grid value computes only the new cells. The
experiment's table ``results/<experiment>.parquet`` is assembled from the shards that hold its
cells. A cell's row does not depend on which run computed it.

**Resources.** Each experiment carries a cost model (``Experiment.seconds``, seconds per cell,
measured); a shard's runtime request is the start-up of a job (``resources.job_overhead_s``:
Snakemake parses the workflow again inside each cluster job) plus its cells' estimated seconds
times a safety factor, within ``[1 minute, resources.max_runtime_min]``, and shards are cut so
that no request exceeds the cap (:func:`shard_runtime_min`, :func:`study_size`).
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._imports import PACKAGE, PACKAGE_DIR
from .._imports import absolute as _absolute
from .._imports import is_package as _is_package
from .._imports import module_path as _module_path
from .._imports import parsed as _parsed
from ..errors import ConfigError

__all__ = [
    "PACKAGE_DIR",
    "module_closure",
    "outside_closure",
    "source_digest",
    "REGISTRY_MODULES",
    "code_version",
    "experiment_module",
    "figure_sources",
    "cell_config_hash",
    "cell_key",
    "keyed_cells",
    "data_identity",
    "data_sources",
    "ShardPlan",
    "plan_experiment",
    "read_shard_keys",
    "shard_runtime_min",
    "resource_settings",
    "study_size",
]


#: libraries whose version is part of every code version (their arithmetic is in every result)
LIBRARIES = ("numpy", "scipy", "cvxpy", "scs", "clarabel")

#: resources of the compute jobs when the config's ``resources`` section leaves a key out

_TIMEOUT_LIMIT = re.compile(r"time limit of ([0-9.eE+-]+) s")


# ---------------------------------------------------------------------------------------------
# code versions
# ---------------------------------------------------------------------------------------------
def _binding(package: str, name: str, seen: frozenset = frozenset()) -> str | None:
    """The module that defines ``name`` re-exported by ``package``'s ``__init__`` (or None)."""
    if (package, name) in seen:
        return None
    path = _module_path(package)
    for node in _parsed(path).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = _absolute(package, node)
                    if _module_path(f"{source}.{alias.name}") is not None:
                        return f"{source}.{alias.name}"
                    if _is_package(source):
                        deeper = _binding(source, alias.name, seen | {(package, name)})
                        return deeper or source
                    return source if _module_path(source) else None
    return None


def _import_targets(tree: ast.Module, modname: str, is_package: bool) -> set[str]:
    """Modules of this package that the import statements of ``tree`` (the source of module
    ``modname``, a package's ``__init__`` when ``is_package``) name, and the absolute names of
    every other module they import (those outside the package, as written).

    ``from package import name`` names the module that defines ``name``: a submodule, or the
    module an ``__init__`` re-exports it from, so importing a class through
    ``attnquery.learners`` names that class's module only; a name defined in the ``__init__``
    itself names the ``__init__``.
    """
    deps: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(modname, node, is_package)
            if _module_path(source) is None:
                deps.add(source)
                deps.update(f"{source}.{a.name}" for a in node.names)
                continue
            for alias in node.names:
                if _module_path(f"{source}.{alias.name}") is not None:
                    deps.add(f"{source}.{alias.name}")
                elif _is_package(source):
                    deps.add(_binding(source, alias.name) or source)
                else:
                    deps.add(source)
    return deps


@functools.cache
def _dependencies(modname: str) -> frozenset[str]:
    """Modules of this package that ``modname`` imports (anywhere in its source; see
    :func:`_import_targets`)."""
    deps = {m for m in _import_targets(_parsed(_module_path(modname)), modname,
                                       _is_package(modname)) if _module_path(m)}
    deps.discard(modname)
    return frozenset(deps)


#: modules a closure does not follow: the learner registry maps a name to a class (the learner
#: modules import it for :class:`~attnquery.learners.LearnerSpec`); a cell's code version covers
#: the module of the class its learner's name resolves to instead (:func:`code_version`)
REGISTRY_MODULES = frozenset({f"{PACKAGE}.learners._registry"})
#: modules through which an experiment builds a learner of the registry by name (a plug-in that
#: joins it, :mod:`attnquery.experiments._learners`): as the registry, for :func:`code_version`
JOINING_MODULES = frozenset({f"{PACKAGE}.experiments._learners"})


def module_closure(modnames: Iterable[str]) -> list[Path]:
    """Source files of ``modnames`` and of every module of the package they import, transitively.

    Imports inside functions count too; the learner registry (:data:`REGISTRY_MODULES`) is not
    followed. Sorted, as absolute paths.
    """
    todo = [m for m in modnames]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m in seen or m in REGISTRY_MODULES or _module_path(m) is None:
            continue
        seen.add(m)
        todo.extend(_dependencies(m) - seen)
    return sorted(_module_path(m) for m in seen)


def _library_versions() -> dict[str, str]:
    from .provenance import _version

    return {lib: _version(lib) for lib in LIBRARIES}


@functools.cache
def _file_digest(path: Path) -> bytes:
    return hashlib.sha256(path.read_bytes()).digest()


def source_digest(files: Iterable[Path], extra: Mapping | None = None,
                  modules: Mapping[str, Path] | None = None) -> str:
    """A 16-hex-digit digest of files' names (relative to the package) and contents, and of
    ``modules`` outside the package (a plug-in's), named by their module name."""
    h = hashlib.sha256()
    for f in sorted(Path(p) for p in files):
        h.update(str(f.relative_to(PACKAGE_DIR)).encode() + b"\0")
        h.update(_file_digest(f))
    for name, f in sorted((modules or {}).items()):
        h.update(f"<module {name}>".encode() + b"\0")
        h.update(_file_digest(Path(f)))
    if extra:
        h.update(json.dumps(extra, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _outside_path(modname: str) -> Path | None:
    """The source file of a module outside the package (None if it has no Python source)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(modname)
    except (ImportError, ValueError):  # "pkg.mod.Class": not a module
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    return Path(origin).resolve() if origin and origin.endswith(".py") else None


def outside_closure(modname: str) -> tuple[dict[str, Path], set[str]]:
    """A module outside the package (a plug-in learner's) and what it imports, transitively:
    ``({module name: source file}, modules of this package it imports)``. Followed are the
    modules of its own top-level package; those of this package go to the second set (their
    closure is :func:`module_closure`'s)."""
    top = modname.split(".")[0]
    files: dict[str, Path] = {}
    inside: set[str] = set()
    todo = [modname]
    while todo:
        m = todo.pop()
        if m in files:
            continue
        path = _outside_path(m)
        if path is None:
            continue
        files[m] = path
        for dep in _import_targets(_parsed(path), m, path.name == "__init__.py"):
            if _module_path(dep) is not None:
                inside.add(dep)
            elif dep.split(".")[0] == top and dep != m:
                todo.append(dep)
    return files, inside


def experiment_module(name: str) -> str:
    """The module that defines experiment ``name`` (``attnquery.experiments.<family>``)."""
    from ..experiments import get_experiment

    return get_experiment(name).run.__module__


def code_version(name: str, learner: str | None = None) -> str:
    """The version of the code that experiment ``name``'s cells run: a digest of its module
    closure and of the numerical libraries' versions.

    An experiment whose module imports the learner registry (or
    :mod:`attnquery.experiments._learners`) builds a cell's learner from its name
    (``learner``, the cell's ``learner``): its cells' version then covers the module the
    registry's entry for that name names, too: a built-in learner's module closure (no file more
    where the experiment imports that learner already), or a plug-in's source files by module
    name (:func:`outside_closure`) with the package modules they import.
    """
    module = experiment_module(name)
    modules, outside = [module], {}
    if learner is not None and (REGISTRY_MODULES | JOINING_MODULES) & _dependencies(module):
        from ..learners._registry import registry

        entry = registry().get(learner)
        if entry is not None and _module_path(entry.module) is not None:
            modules.append(entry.module)
        elif entry is not None:
            outside, inside = outside_closure(entry.module)
            modules.extend(sorted(inside))
    return source_digest(module_closure(modules), _library_versions(), outside)


def figure_sources(name: str) -> list[Path]:
    """Source files figure ``name`` is drawn by: its module's closure and the style sheet."""
    from ..figures import STYLE, get_figure

    return [*module_closure([get_figure(name).__module__]), Path(STYLE)]


# ---------------------------------------------------------------------------------------------
# identities and the cache
# ---------------------------------------------------------------------------------------------
def _digest(obj) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=float)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cell_config_hash(cell: Mapping, study_seed: int, data: Mapping | None = None) -> str:
    """Hash of what configures a cell: its parameters, the study seed and its data's identity."""
    params = {k: v for k, v in cell.items() if k != "cell_id"}
    return _digest({"cell": params, "seed": int(study_seed), "data": dict(data or {})})


def cell_key(config_hash: str, version: str) -> str:
    """A cell's identity: its configuration and the version of the code that computes it."""
    return _digest({"config": config_hash, "code": version})


def keyed_cells(name: str, cells: list[dict], section: Mapping, study_seed: int,
                version: str | None = None) -> list[dict]:
    """``cells`` with their provenance keys ``config_hash``, ``code_version`` (that of the cell's
    learner, :func:`code_version`; ``version`` for every cell where given) and ``cell_key`` (new
    dicts; the cells keep their order)."""
    from ..experiments import get_experiment

    versions: dict = {}  # the cells' learners' code versions (code_version)
    data = data_identity(get_experiment(name).data(section))
    out = []
    for c in cells:
        learner = c.get("learner")
        if learner not in versions:
            versions[learner] = version or code_version(name, learner)
        ch = cell_config_hash(c, study_seed, data)
        out.append({**c, "config_hash": ch, "code_version": versions[learner],
                    "cell_key": cell_key(ch, versions[learner])})
    return out


@functools.cache
def _checkpoint_sha256(path: str, size: int, mtime_ns: int) -> str:
    """Hex sha256 of the file at (resolved) ``path``, once per process for a given size and
    modification time (which are part of the key so that a rewritten file is hashed again)."""
    from ..realheads import sha256_file

    return sha256_file(path)


def _file_sha256(path) -> str:
    p = Path(path).resolve()
    st = p.stat()
    return _checkpoint_sha256(str(p), st.st_size, st.st_mtime_ns)


def data_identity(sources: Mapping[str, Mapping]) -> dict:
    """What identifies the files an experiment reads (see
    :attr:`attnquery.experiments.Experiment.data`): the sha256 a fetched file is checked
    against, the parameters a written one is made from, or a given file's own digest.

    Raises
    ------
    ConfigError
        When a given file does not exist (naming it, and the two ways to get one).
    """
    out = {}
    for path, src in sorted(sources.items()):
        if src.get("fetch"):
            out[path] = {"sha256": src["fetch"]["sha256"]}
        elif src.get("synthetic"):
            out[path] = {"synthetic": dict(src["synthetic"]), "n_heads": src.get("n_heads")}
        elif Path(path).is_file():
            out[path] = {"sha256": _file_sha256(path)}
        else:
            raise ConfigError(
                f"checkpoint: {path} does not exist. Either download all-MiniLM-L6-v2 by giving "
                "the section's fetch (as config/config.yaml does), or write a small seeded test "
                "checkpoint by giving its synthetic (as config/quick.yaml does); or put a "
                "safetensors checkpoint at that path")
    return out


def data_sources(config: Mapping, names: Iterable[str]) -> dict[str, dict]:
    """``{path: source}`` of the files the experiments ``names`` read, merged; raises
    :class:`ConfigError` when two experiments give one path different sources."""
    from ..experiments import get_experiment

    out: dict[str, dict] = {}
    for name in names:
        for path, src in get_experiment(name).data(config["experiments"][name]).items():
            if path in out and out[path] != src:
                raise ConfigError(f"experiments.{name}: {path} is given two different sources "
                                  f"({out[path]} and {src})")
            out[path] = dict(src)
    return out


def read_shard_keys(path) -> dict[str, tuple[str, str]] | None:
    """``cell_key -> (status, message)`` of a shard table, or None when the table cannot serve as
    a cache (unreadable, without keys, or without its timing table)."""
    import pyarrow.parquet as pq

    from ..results import timing_path

    p = Path(path)
    if not timing_path(p).is_file():
        return None
    try:
        t = pq.read_table(p, columns=["cell_key", "status", "message"])
    except Exception:  # an old schema or a damaged file is not a cache: its cells are recomputed
        return None
    keys = t.column("cell_key").to_pylist()
    if any(k is None for k in keys):
        return None
    return dict(zip(keys, zip(t.column("status").to_pylist(), t.column("message").to_pylist(),
                              strict=True), strict=True))


def _reusable(status: str, message: str | None, time_limit: float | None) -> bool:
    """Whether a stored row can stand for its cell now: every outcome is deterministic except a
    timeout, which is recomputed when the time limit has been raised since."""
    if status != "timeout":
        return True
    m = _TIMEOUT_LIMIT.search(message or "")
    return bool(m) and time_limit is not None and float(m.group(1)) >= float(time_limit)


@dataclass
class ShardPlan:
    """How experiment ``name``'s table is assembled: stored shards and shards to compute."""

    name: str
    #: every cell of the grid, with its keys, sorted by cell id
    cells: list[dict]
    #: stored shard tables that hold some of the cells (paths)
    stored: list[str] = field(default_factory=list)
    #: shards to compute: digest -> cells
    new: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        return sorted(c["cell_key"] for c in self.cells)

    def shard_path(self, digest: str, results_dir="results") -> str:
        from ..results import shard_path

        return shard_path(self.name, digest, results_dir)

    def inputs(self, results_dir="results") -> list[str]:
        """The shard tables the experiment's table is assembled from."""
        return sorted(self.stored + [self.shard_path(s, results_dir) for s in self.new])


def _chunks(cells: list[dict], per_shard: int, seconds, budget_s: float) -> list[list[dict]]:
    """Consecutive groups of at most ``per_shard`` cells whose estimated seconds stay within
    ``budget_s`` (a cell costlier than that alone is a group of its own)."""
    out, cur, cur_s = [], [], 0.0
    for c in cells:
        s = float(seconds(c))
        if cur and (len(cur) >= per_shard or cur_s + s > budget_s):
            out.append(cur)
            cur, cur_s = [], 0.0
        cur.append(c)
        cur_s += s
    if cur:
        out.append(cur)
    return out


def plan_experiment(name: str, cells: list[dict], section: Mapping, study_seed: int,
                    time_limit: float | None = None, results_dir="results",
                    resources: Mapping | None = None) -> ShardPlan:
    """Plan experiment ``name``: which stored shards hold its cells, which cells to compute.

    ``cells`` are the experiment's cells (:func:`attnquery.experiments.expand_cells`). Cells no
    stored shard holds are cut into new shards of at most ``cells_per_shard`` cells, in cell-id
    order, each within the runtime cap; a new shard is named by the digest of its cells' keys.
    """
    from ..experiments import get_experiment
    from ..results import is_timing_table, shard_path

    exp = get_experiment(name)
    keyed = sorted(keyed_cells(name, cells, section, study_seed), key=lambda c: c["cell_id"])
    wanted = {c["cell_key"] for c in keyed}
    holder: dict[str, str] = {}
    for p in sorted(Path(results_dir, name, "shards").glob("*.parquet")):
        if is_timing_table(p):
            continue
        stored = read_shard_keys(p)
        for k, (status, message) in (stored or {}).items():
            if k in wanted and k not in holder and _reusable(status, message, time_limit):
                holder[k] = shard_path(name, p.stem, results_dir)
    plan = ShardPlan(name, keyed, stored=sorted(set(holder.values())))
    missing = [c for c in keyed if c["cell_key"] not in holder]
    res = resource_settings(resources)
    budget_s = _cell_budget_s(res)
    for group in _chunks(missing, int(section["cells_per_shard"]), exp.seconds, budget_s):
        plan.new[_digest(sorted(c["cell_key"] for c in group))] = group
    return plan


# ---------------------------------------------------------------------------------------------
# resources
# ---------------------------------------------------------------------------------------------
def resource_settings(resources: Mapping | None) -> dict:
    """The config's ``resources`` section with the schema's defaults filled in, checked."""
    from ..schema import fill_defaults

    res = copy.deepcopy(dict(resources or {}))
    fill_defaults({"seed": 0, "experiments": {}, "resources": res})
    if not res["runtime_safety"] >= 1:
        raise ConfigError(f"resources.runtime_safety must be >= 1; got {res['runtime_safety']}")
    if not res["max_runtime_min"] >= 1:
        raise ConfigError(f"resources.max_runtime_min must be >= 1; got {res['max_runtime_min']}")
    if not 0 <= res["job_overhead_s"] < 60 * res["max_runtime_min"]:
        raise ConfigError("resources.job_overhead_s must be >= 0 and below max_runtime_min; got "
                          f"{res['job_overhead_s']}")
    return res


def _cell_budget_s(res: Mapping) -> float:
    """Estimated seconds of cells that one job may hold within the runtime cap."""
    return (60.0 * res["max_runtime_min"] - res["job_overhead_s"]) / res["runtime_safety"]


def shard_runtime_min(name: str, cells: list[dict], resources: Mapping | None = None) -> int:
    """Runtime request in minutes of a shard of ``cells``: a job's start-up plus the estimated
    seconds times the safety factor, within [1, ``max_runtime_min``]."""
    from ..experiments import get_experiment

    res = resource_settings(resources)
    seconds = sum(float(get_experiment(name).seconds(c)) for c in cells)
    minutes = math.ceil((res["job_overhead_s"] + res["runtime_safety"] * seconds) / 60.0)
    return int(min(max(minutes, 1), res["max_runtime_min"]))


def study_size(config: Mapping, cells_by_experiment: Mapping[str, list[dict]] | None = None
               ) -> dict[str, dict]:
    """Jobs, estimated CPU-hours and the largest runtime request of each experiment of a study
    run from scratch (``attnquery info --config``)."""
    from ..experiments import get_experiment
    from .config import check_config

    cells_by_experiment = cells_by_experiment or check_config(dict(config))
    res = resource_settings(config.get("resources"))
    budget_s = _cell_budget_s(res)
    out = {}
    for name, cells in cells_by_experiment.items():
        section = config["experiments"][name]
        exp = get_experiment(name)
        ordered = sorted(cells, key=lambda c: c["cell_id"])
        shards = _chunks(ordered, int(section["cells_per_shard"]), exp.seconds, budget_s)
        seconds = sum(float(exp.seconds(c)) for c in ordered)
        requests = [shard_runtime_min(name, s, res) for s in shards]
        out[name] = {"cells": len(cells), "jobs": len(shards), "cpu_hours": seconds / 3600.0,
                     "max_request_min": max(requests), "min_request_min": min(requests),
                     "request_hours": sum(requests) / 60.0}
    return out
