"""The experiments' registry and runner (what every experiment module imports), re-exported
by :mod:`attnquery.experiments`, whose docstring describes them."""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import math
import pkgutil
import signal
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, NotIdentifiableError
from ..outcomes import find_refusal

__all__ = [
    "Experiment",
    "register",
    "get_experiment",
    "all_experiments",
    "EXPERIMENTS",
    "FAMILIES",
    "cell_id",
    "cell_rng",
    "expand_cells",
    "shard_cells",
    "n_shards",
    "run_cells",
    "grid",
    "CellTimeout",
]


def _one_second(cell: Mapping) -> float:
    return 1.0


def _no_data(section: Mapping) -> dict:
    return {}


def checkpoint_source(cfg: Mapping) -> dict:
    """``{path: source}`` of the checkpoint a config section (``checkpoint`` with ``fetch`` or
    ``synthetic``) names: the :attr:`Experiment.data` of the experiments on real weights."""
    if cfg.get("fetch") and cfg.get("synthetic"):
        raise ConfigError("give at most one of fetch (download) and synthetic (test checkpoint)")
    if cfg.get("fetch"):
        return {cfg["checkpoint"]: {"fetch": dict(cfg["fetch"])}}
    if cfg.get("synthetic"):
        return {cfg["checkpoint"]: {"synthetic": dict(cfg["synthetic"]),
                                    "n_heads": int(cfg["n_heads"])}}
    return {cfg["checkpoint"]: {}}


def readout_args(cell: Mapping) -> dict:
    """``readout`` and ``readout_seed`` (keyword arguments of :mod:`attnquery.realheads`) from a
    cell's ``readout`` string ``"kind:seed"``."""
    kind, _, seed = cell["readout"].partition(":")
    return {"readout": kind, "readout_seed": int(seed or 0)}


@dataclass(frozen=True)
class Experiment:
    """An experiment family: how to expand its grid and how to run one cell.

    Attributes
    ----------
    name : str
    cells : callable(section) -> list of dict
        The grid's cells (see the module docstring).
    run : callable(cell, rng) -> dict
        Run one cell; return its metrics.
    description : str
    seconds : callable(cell) -> float
        Estimated seconds one cell takes on one core (a cost model measured on the default study;
        the cluster's runtime requests are made from it, see :mod:`attnquery.study`).
    data : callable(section) -> dict
        Files the cells read (a checkpoint), each with where it comes from:
        ``{path: {"fetch": {...}}}`` (downloaded by the workflow), ``{path: {"synthetic":
        {...}, "n_heads": H}}`` (written by it) or ``{path: {}}`` (given: it must exist). They
        are inputs of every compute job, and what identifies them (the sha256 they are fetched
        with, the parameters they are written from, or the file's digest) is part of every cell's
        key (:func:`attnquery.study.data_identity`).
    params : dict of str to pyarrow.DataType
        The result columns of the cell parameters this experiment adds to the shared ones of
        :mod:`attnquery.results` (name -> arrow type). Two experiments may declare the same
        column, with the same type.
    metrics : dict of str to pyarrow.DataType
        The result columns of the metrics this experiment adds to the shared ones.
    refusals : tuple of attnquery.outcomes.Refusal
        The refusals the experiment is designed to meet: which cells, by which named errors,
        and why. A cell that raises one of them is *refused as designed*; every other error
        is a failure (:mod:`attnquery.outcomes`).
    """

    name: str
    cells: Callable[[Mapping], list[dict]]
    run: Callable[[dict, np.random.Generator], dict]
    description: str = ""
    seconds: Callable[[Mapping], float] = _one_second
    data: Callable[[Mapping], dict] = _no_data
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    refusals: tuple = ()

    def refusal(self, cell: Mapping, error: type[BaseException] | None):
        """The declared :class:`~attnquery.outcomes.Refusal` an ``error`` (type) raised by
        ``cell`` is, or None when it is a failure."""
        return find_refusal(self.refusals, cell, error)


EXPERIMENTS: dict[str, Experiment] = {}


def register(exp: Experiment) -> Experiment:
    """Add an experiment to the registry (names are unique)."""
    if exp.name in EXPERIMENTS and EXPERIMENTS[exp.name] is not exp:
        raise ConfigError(f"experiment {exp.name!r} is registered twice")
    EXPERIMENTS[exp.name] = exp
    return exp


#: the experiment families, discovered as the figures are: every public module of this package
#: (each has one in attnquery.figures too); adding an experiment is adding its module
FAMILIES = tuple(sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                        if not m.name.startswith("_")))


def _load_all() -> None:
    # importing the modules registers their experiments
    for family in FAMILIES:
        importlib.import_module(f"{__package__}.{family}")


def all_experiments() -> list[Experiment]:
    """Every registered experiment, in the order they were registered (the families' modules
    imported first)."""
    _load_all()
    return list(EXPERIMENTS.values())


def get_experiment(name: str) -> Experiment:
    """The registered experiment called ``name``."""
    _load_all()
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; known: {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def grid(**axes) -> list[dict]:
    """Cartesian product of the given axes, as a list of dicts (axes order kept)."""
    keys = list(axes)
    for k, vals in axes.items():
        if not isinstance(vals, list | tuple) or len(vals) == 0:
            raise ConfigError(f"grid axis {k!r} must be a non-empty list; got {vals!r}")
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*axes.values())]


def _canonical(cell: Mapping) -> str:
    clean = {k: v for k, v in cell.items() if k != "cell_id"}
    return json.dumps(clean, sort_keys=True, separators=(",", ":"), default=float)


def cell_id(cell: Mapping) -> str:
    """A stable 16-hex-digit hash of a cell's parameters (independent of key order)."""
    return hashlib.sha256(_canonical(cell).encode()).hexdigest()[:16]


def cell_rng(cell: Mapping, study_seed: int) -> np.random.Generator:
    """``default_rng([cell_hash, study_seed])`` for this cell."""
    h = int(cell.get("cell_id") or cell_id(cell), 16)
    return np.random.default_rng([h, int(study_seed)])


def expand_cells(name: str, cfg: Mapping) -> list[dict]:
    """The cells of experiment ``name`` for its config section (the schema's defaults filled
    in: :func:`attnquery.schema.section_with_defaults`), sorted by cell id."""
    from ..schema import section_with_defaults

    exp = get_experiment(name)
    cfg = section_with_defaults(name, cfg)
    cells = []
    seen = set()
    for c in exp.cells(cfg):
        c = {"experiment": name, **c}
        c["cell_id"] = cell_id(c)
        if c["cell_id"] in seen:
            continue  # the same parameters twice in a grid describe one cell
        seen.add(c["cell_id"])
        cells.append(c)
    if not cells:
        raise ConfigError(f"experiments.{name}: the grid is empty")
    return sorted(cells, key=lambda c: c["cell_id"])


def n_shards(n_cells: int, cells_per_shard: int) -> int:
    """Number of shards of at most ``cells_per_shard`` cells."""
    if cells_per_shard < 1:
        raise ConfigError(f"cells_per_shard must be >= 1; got {cells_per_shard}")
    return max(1, math.ceil(n_cells / cells_per_shard))


def shard_cells(cells: list[dict], shard: int, shards: int) -> list[dict]:
    """Shard ``shard`` of ``shards``: every ``shards``-th cell (balances cheap and costly)."""
    if not 0 <= shard < shards:
        raise ConfigError(f"shard must be in [0, {shards}); got {shard}")
    return cells[shard::shards]


#: provenance keys a cell may carry into its row (see :func:`attnquery.study.keyed_cells`)
CELL_PROVENANCE = ("config_hash", "code_version", "cell_key")


class CellTimeout(Exception):
    """A cell ran past its time limit."""


def _alarm(signum, frame):
    raise CellTimeout()


def run_cells(cells, study_seed: int, time_limit: float | None = None, provenance=None,
              log=None, alert=None):
    """Run cells and return (result rows, timing rows): one row per cell, whatever happens.

    Parameters
    ----------
    cells : list of dict
        Cells from :func:`expand_cells`, optionally with their provenance keys
        (``config_hash``, ``code_version``, ``cell_key``: :func:`attnquery.study.keyed_cells`),
        which go to the row's provenance columns.
    study_seed : int
    time_limit : float, optional
        Seconds per cell; a cell past it is stopped and recorded with status ``timeout``.
    provenance : dict, optional
        Provenance columns added to every row.
    log : callable, optional
        Called with a line of text for each cell (its outcome; a refusal as designed says so
        and why, in one line).
    alert : callable, optional
        Called with the traceback of an unexpected error and the line of a timeout (default:
        ``log``); a refusal the experiment declares (:attr:`Experiment.refusals`) gives none.
    """
    from ..results import make_row

    log = log or (lambda s: None)
    alert = alert or log
    rows, timings = [], []
    use_alarm = time_limit is not None and time_limit > 0 and hasattr(signal, "SIGALRM")
    for i, keyed in enumerate(cells):
        cell = {k: v for k, v in keyed.items() if k not in CELL_PROVENANCE}
        row_provenance = {**(provenance or {}),
                          **{k: keyed[k] for k in CELL_PROVENANCE if k in keyed}}
        exp = get_experiment(cell["experiment"])
        rng = cell_rng(cell, study_seed)
        t0 = time.perf_counter()
        metrics, status, message, designed = {}, "ok", "", None
        old = signal.signal(signal.SIGALRM, _alarm) if use_alarm else None
        try:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, float(time_limit))
            metrics = dict(exp.run(dict(cell), rng))
        except CellTimeout:
            status, message = "timeout", f"cell ran past its time limit of {time_limit} s"
        except NotIdentifiableError as exc:
            status, message = "not_identifiable", str(exc)
        except Exception as exc:  # a failed cell is a row, never a crashed study
            status = "error"
            message = f"{type(exc).__name__}: {exc}"
            designed = exp.refusal(cell, type(exc))
            if designed is None:
                alert(traceback.format_exc())
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        wall = time.perf_counter() - t0
        metrics["wall_time_s"] = wall
        row, timing = make_row(cell, metrics, status, message, row_provenance)
        rows.append(row)
        timings.append(timing)
        line = (f"[{i + 1}/{len(cells)}] {cell['experiment']} {cell['cell_id']} "
                f"{_describe(cell)} -> {status} ({wall:.2f} s)")
        if designed is not None:
            log(f"{line} refused as designed ({designed.reason}): {_first_line(message)}")
        elif status in ("error", "timeout"):
            alert(f"{line} failed: {_first_line(message)}")
        else:
            log(f"{line}{' ' + _first_line(message) if message else ''}")
    return rows, timings


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else ""


def _describe(cell: Mapping) -> str:
    return " ".join(f"{k}={v}" for k, v in cell.items() if k not in ("experiment", "cell_id"))
