"""Tidy result rows and their Parquet storage.

One row per cell (experiment, learner, model parameters, seed). Every experiment writes the same
explicit pyarrow schema, so the tables of all experiments concatenate into ``results/all.parquet``
without conversion. A column a cell does not use is null.

Columns come in groups:

* identity: ``experiment``, ``cell_id`` (a stable hash of the cell's parameters), ``learner``,
  ``seed``;
* parameters (:data:`PARAM_COLUMNS`), one typed column each;
* metrics (:data:`METRIC_COLUMNS`): queries counted by the oracle, errors, success flag;
  parameters and metrics are the shared ones (:data:`SHARED_PARAM_COLUMNS`,
  :data:`SHARED_METRIC_COLUMNS`) and those each experiment declares with its
  :class:`~attnquery.experiments.Experiment` (``params``, ``metrics``), assembled by
  :func:`assemble_columns` when first used;
  ``n_queries`` counts the queries that learnt the parameters and ``verify_queries`` the
  check queries the learner spent afterwards (``verified``: whether the estimate passed its
  check, ``verify_error`` the disagreement seen), so the learning count stays what the paper
  states (``d^2 + d`` for Theorem 4.1); ``total_queries`` is their sum, every query the
  oracle counted: what a learner counts in ``n_queries_`` and caps with its parameter
  ``n_queries`` (:func:`make_row` fills it where a row has both parts);
* outcome: ``status`` (one of :data:`STATUSES`) and ``message``;
* provenance: package version, git commit, library versions, ``config_hash`` (the cell's
  parameters, the study seed and the identity of the data it reads), ``code_version`` (the
  code its experiment runs), ``cell_key`` (both: the cell's identity, the key of the cache, see
  :mod:`attnquery.study`) and the schema version.

Timings (wall time, solver time) are not deterministic, so they are stored in a separate table
with the schema :data:`TIMING_SCHEMA` (``results/<experiment>.timing.parquet``), keyed by
``cell_id``; :func:`read_results` joins them back on request. The result tables themselves are
bit-identical for the same configuration and seed.

Files are written atomically (:func:`atomic_path`: a temporary file in the same folder, flushed
to disk, renamed over the target, and the folder's entry flushed too), with fixed Parquet
settings, so identical rows give identical bytes.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ConfigError

__all__ = [
    "SCHEMA_VERSION",
    "STATUSES",
    "SHARED_PARAM_COLUMNS",
    "SHARED_METRIC_COLUMNS",
    "assemble_columns",
    "PARAM_COLUMNS",  # noqa: F822 (assembled on first use, see __getattr__)
    "METRIC_COLUMNS",  # noqa: F822 (assembled on first use, see __getattr__)
    "TIMING_COLUMNS",
    "PROVENANCE_COLUMNS",
    "RESULT_SCHEMA",  # noqa: F822 (assembled on first use, see __getattr__)
    "TIMING_SCHEMA",
    "make_row",
    "rows_to_table",
    "write_table",
    "write_rows",
    "read_results",
    "atomic_write_bytes",
    "atomic_path",
    "check_writable",
    "fsync_path",
    "TIMING_SUFFIX",
    "timing_path",
    "is_timing_table",
    "shard_path",
    "experiment_tables",
]

#: version 2 added ``verify_queries``, ``verify_error`` and ``verified`` (``n_queries`` no longer
#: counts the check queries), and the per-cell provenance ``code_version`` and ``cell_key``;
#: version 3 added ``verify_vacuous`` (the check could not have failed); version 4 added the
#: parameter ``n_kv_heads`` (key/value heads of a grouped-query layer); version 5 the vector
#: experiment's named cases' ``head_dim``, ``key_dim``, ``causal`` and ``goal``; version 6 their
#: ``check_length`` (the longest sequence the learner's check asks); version 7 added
#: ``total_queries`` (every query the oracle counted, the check's included: a learner's
#: ``n_queries_``, and what its ``n_queries`` caps); version 8 the llm experiment's
#: ``base_measured`` (the RoPE base measured from the answers, not declared)
SCHEMA_VERSION = 8

#: every status a row can have
STATUSES = ("ok", "not_identifiable", "error", "timeout", "skipped")

#: cell parameters every experiment may use: name -> arrow type. A column two experiments'
#: modules use is declared here, once; an experiment declares the parameters only it adds in
#: :attr:`attnquery.experiments.Experiment.params`. ``logit_scale`` is written by no experiment
#: today and kept so the stored schema stays as it was
SHARED_PARAM_COLUMNS: dict[str, pa.DataType] = {
    "d": pa.int64(),
    "logit_scale": pa.float64(),
    # the head or layer: its rank, heads, a named variant of the experiment's cells
    "rank": pa.int64(),
    "n_heads": pa.int64(),
    "variant": pa.string(),
    "family": pa.string(),
    "probes": pa.string(),
    "oversample": pa.int64(),
    # a random head's scale (Theorem 6.1's constants W_bound and mu, the target eps)
    "W_spectral": pa.float64(),
    "W_fro": pa.float64(),
    "W_bound": pa.float64(),
    "mu": pa.float64(),
    "zero_frac": pa.float64(),
    "eps": pa.float64(),
    # the answers: noise of size tau, rounding to a precision, the budget
    "tau": pa.float64(),
    "noise": pa.string(),
    "rounding": pa.string(),
    "queries_per_unknown": pa.float64(),
    # a head or layer of a checkpoint (attnquery.realheads), with or without its biases
    "layer": pa.int64(),
    "head": pa.int64(),
    "checkpoint": pa.string(),
    "readout": pa.string(),
    "biases": pa.bool_(),
    # a layer of grouped-query heads with rotary positions
    "rope_base": pa.float64(),
    "n_kv_heads": pa.int64(),
    # the longest sequence a learner's check asks (a rotary route also reads its forms to it)
    "check_length": pa.int64(),
}

#: metrics every experiment may write (those of :func:`attnquery.metrics.fit_counted` and
#: :func:`attnquery.metrics.head_errors`, the functional error, the success flag, ``extra``,
#: and every metric more than one experiment's module writes, declared here once):
#: name -> arrow type, deterministic values only (timings go to TIMING_COLUMNS). An experiment
#: declares the metrics it adds in :attr:`attnquery.experiments.Experiment.metrics`
SHARED_METRIC_COLUMNS: dict[str, pa.DataType] = {
    "n_queries": pa.int64(),
    "verify_queries": pa.int64(),
    "total_queries": pa.int64(),
    "verify_error": pa.float64(),
    "verified": pa.bool_(),
    "verify_vacuous": pa.bool_(),
    "rel_err_W": pa.float64(),
    "abs_err_W": pa.float64(),
    "rel_err_v": pa.float64(),
    "err_v": pa.float64(),
    "func_err": pa.float64(),
    "success": pa.bool_(),
    "extra": pa.string(),
    # the key bias and offset of a head with biases; ranks and heads a learner found
    "rel_err_c": pa.float64(),
    "rel_err_offset": pa.float64(),
    "rank_found": pa.int64(),
    "n_heads_found": pa.int64(),
    # Theorem 6.1: the tolerance it requires, its error bounds and whether they held
    "required_tau": pa.float64(),
    "bound_W": pa.float64(),
    "bound_v": pa.float64(),
    "within_bound": pa.bool_(),
    # two sets of heads' parameters apart (multi-head identifiability)
    "param_distance": pa.float64(),
}

#: where the parameter and metric columns stand in the stored tables (schema version 8); a
#: column declared later and not named here follows them, in the order the experiments are
#: registered
_STORED_ORDER = (
    "d", "rank", "n_heads", "width", "probes", "W_spectral", "W_fro", "logit_scale", "W_bound",
    "mu", "zero_frac", "tau", "noise", "rounding", "oversample", "queries_per_unknown", "eps",
    "v_method", "c", "n_measurements", "solver", "separation", "fd_step", "family", "variant",
    "layer", "head", "checkpoint", "readout", "biases", "rope_base", "n_kv_heads", "head_dim",
    "key_dim", "causal", "goal", "check_length", "base_measured",
    "n_queries", "verify_queries", "total_queries", "verify_error", "verified",
    "verify_vacuous", "n_queries_attention", "n_queries_ffn", "n_queries_v", "n_queries_W",
    "queries_computed",
    "rel_err_W", "abs_err_W", "rel_err_v", "err_v", "rel_err_c", "rel_err_offset", "func_err",
    "success", "rank_found", "n_heads_found", "solver_status", "solver_iterations",
    "required_tau", "bound_W", "bound_v", "within_bound", "param_distance", "output_difference",
    "head_separation", "func_err_max", "func_err_median", "func_err_ffn", "neuron_err",
    "width_found", "basis_err", "extra",
)

#: non-deterministic measurements, stored apart from the result rows
TIMING_COLUMNS: dict[str, pa.DataType] = {
    "wall_time_s": pa.float64(),
    "solve_time_s": pa.float64(),
}

PROVENANCE_COLUMNS: dict[str, pa.DataType] = {
    "package_version": pa.string(),
    "git_commit": pa.string(),
    "python_version": pa.string(),
    "numpy_version": pa.string(),
    "scipy_version": pa.string(),
    "cvxpy_version": pa.string(),
    "config_hash": pa.string(),
    "code_version": pa.string(),
    "cell_key": pa.string(),
    "schema_version": pa.int64(),
}

IDENTITY_COLUMNS: dict[str, pa.DataType] = {
    "experiment": pa.string(),
    "cell_id": pa.string(),
    "learner": pa.string(),
    "seed": pa.int64(),
}

OUTCOME_COLUMNS: dict[str, pa.DataType] = {
    "status": pa.string(),
    "message": pa.string(),
}


def assemble_columns(experiments) -> tuple[dict[str, pa.DataType], dict[str, pa.DataType]]:
    """The parameter and metric columns of the result tables: the shared ones and those the
    ``experiments`` declare (:attr:`~attnquery.experiments.Experiment.params`,
    :attr:`~attnquery.experiments.Experiment.metrics`), in their stored order.

    Parameters
    ----------
    experiments : iterable of attnquery.experiments.Experiment

    Returns
    -------
    params, metrics : dict of str to pyarrow.DataType

    Raises
    ------
    ConfigError
        A column declared with two types, as a parameter and a metric, or with the name of an
        identity, outcome, provenance or timing column; the message names it and the experiment.
    """
    reserved = {**IDENTITY_COLUMNS, **OUTCOME_COLUMNS, **PROVENANCE_COLUMNS, **TIMING_COLUMNS}
    params, metrics = dict(SHARED_PARAM_COLUMNS), dict(SHARED_METRIC_COLUMNS)
    for exp in experiments:
        for kind, declared, into, other in (("parameter", exp.params, params, metrics),
                                            ("metric", exp.metrics, metrics, params)):
            for name, typ in declared.items():
                if not isinstance(typ, pa.DataType):
                    raise ConfigError(f"experiment {exp.name!r}: {kind} column {name!r} needs a "
                                      f"pyarrow type; got {typ!r}")
                if name in reserved or name in other:
                    raise ConfigError(f"experiment {exp.name!r}: {kind} column {name!r} is "
                                      "already a result column of another kind")
                if name in into and into[name] != typ:
                    raise ConfigError(f"experiment {exp.name!r}: {kind} column {name!r} is "
                                      f"{typ}, but it is already declared as {into[name]}")
                into[name] = typ
    position = {name: i for i, name in enumerate(_STORED_ORDER)}

    def ordered(cols):  # a stable sort: new columns keep the order they were declared in
        return {n: cols[n] for n in sorted(cols, key=lambda n: position.get(n, len(position)))}

    return ordered(params), ordered(metrics)


@functools.cache
def _registered() -> tuple[dict, dict, pa.Schema]:
    # Imported by name, on purpose: the experiments import this module, and a cell's code
    # version (attnquery.study.module_closure) follows the imports the source shows. The
    # columns other experiments declare change no value of a cell's row, so they stay out of
    # its code version, as the modules the experiments package discovers do.
    experiments = importlib.import_module(f"{__package__}.experiments")
    params, metrics = assemble_columns(experiments.all_experiments())
    schema = _schema(IDENTITY_COLUMNS, params, metrics, OUTCOME_COLUMNS, PROVENANCE_COLUMNS)
    return params, metrics, schema


def __getattr__(name):
    # PARAM_COLUMNS, METRIC_COLUMNS and RESULT_SCHEMA are assembled from the registered
    # experiments on first use (the experiments' modules import this one's neighbours)
    if name in _ASSEMBLED:
        return _registered()[_ASSEMBLED.index(name)]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_ASSEMBLED = ("PARAM_COLUMNS", "METRIC_COLUMNS", "RESULT_SCHEMA")


def _schema(*groups: Mapping[str, pa.DataType], version: int = SCHEMA_VERSION) -> pa.Schema:
    fields = [pa.field(k, t) for g in groups for k, t in g.items()]
    return pa.schema(fields, metadata={b"attnquery_schema_version": str(version).encode()})


TIMING_SCHEMA = _schema(
    {"experiment": pa.string(), "cell_id": pa.string()}, TIMING_COLUMNS
)


def _clean(value):
    """Convert numpy scalars to Python values and non-finite floats to None-safe values."""
    if isinstance(value, np.generic):
        value = value.item()
    return value


def make_row(cell: Mapping, metrics: Mapping | None, status: str, message: str = "",
             provenance: Mapping | None = None) -> tuple[dict, dict]:
    """Build a result row and a timing row from a cell, its metrics and its outcome.

    ``cell`` holds the identity and parameter columns (``experiment``, ``cell_id``,
    ``learner``, ``seed`` and parameters); ``metrics`` may hold metric and timing columns.
    Unknown keys raise :class:`ConfigError`, so nothing is silently dropped.
    """
    if status not in STATUSES:
        raise ConfigError(f"status must be one of {STATUSES}; got {status!r}")
    metrics = dict(metrics or {})
    param_columns, metric_columns, _ = _registered()
    row: dict = {}
    timing: dict = {"experiment": cell["experiment"], "cell_id": cell["cell_id"]}
    for k, val in cell.items():
        if k not in IDENTITY_COLUMNS and k not in param_columns:
            raise ConfigError(
                f"cell parameter {k!r} of experiment {cell['experiment']!r} is not a result "
                "column; declare it in the experiment's params (or add it to "
                "attnquery.results.SHARED_PARAM_COLUMNS)"
            )
        row[k] = _clean(val)
    for k, val in metrics.items():
        if k in TIMING_COLUMNS:
            timing[k] = _clean(val)
        elif k in metric_columns:
            val = _clean(val)
            if k == "extra" and not isinstance(val, str | type(None)):
                val = json.dumps(val, sort_keys=True, default=float)
            row[k] = val
        else:
            raise ConfigError(
                f"metric {k!r} of experiment {cell['experiment']!r} is not a result column; "
                "declare it in the experiment's metrics (or add it to "
                "attnquery.results.SHARED_METRIC_COLUMNS or TIMING_COLUMNS)"
            )
    if row.get("total_queries") is None and None not in (row.get("n_queries"),
                                                         row.get("verify_queries")):
        # the learner's count (n_queries_): the learning queries and the check's
        row["total_queries"] = int(row["n_queries"]) + int(row["verify_queries"])
    row["status"] = status
    row["message"] = message
    row.update(provenance or {})
    row["schema_version"] = SCHEMA_VERSION
    return row, timing


def rows_to_table(rows: Iterable[Mapping], schema: pa.Schema | None = None) -> pa.Table:
    """Rows (dicts) to a table with exactly ``schema`` (default: the result schema), sorted by
    (experiment, cell_id)."""
    if schema is None:
        schema = _registered()[2]
    rows = sorted(rows, key=lambda r: (r.get("experiment", ""), r.get("cell_id", "")))
    cols = {}
    for f in schema:
        vals = [r.get(f.name) for r in rows]
        cols[f.name] = pa.array(vals, type=f.type)
    return pa.table(cols, schema=schema)


def atomic_path(path: str | os.PathLike):
    """Context manager yielding a temporary path next to ``path``, moved onto it on success.

    The temporary file is created in ``path``'s folder (so the rename cannot cross file
    systems); on success it is flushed to disk (``fsync``), given the permissions a new file
    would have, renamed over ``path`` (``os.replace``, atomic) and the folder is flushed so the
    rename itself survives a power loss. On failure the temporary file is removed and ``path``
    is untouched. Errors creating the folder or the file are :class:`OSError`.
    """
    return _AtomicPath(Path(path))


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's) data and metadata to disk."""
    flags = os.O_RDONLY
    if path.is_dir():
        flags |= getattr(os, "O_DIRECTORY", 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_writable(path: str | os.PathLike) -> Path:
    """Check that ``path`` can be written through :func:`atomic_path`, before any work, creating
    nothing.

    Creates a temporary file in the target's folder and removes it; when that folder does not
    exist yet (:func:`atomic_path` creates it), a temporary folder in the nearest folder above
    it that exists, removed too. Raises :class:`OSError` subclasses naming the problem:
    ``IsADirectoryError`` when ``path`` is a folder, ``NotADirectoryError`` when a parent is a
    file (or a link to no folder), ``PermissionError`` or a read-only file system naming the
    folder itself.
    """
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a folder")
    for q in (p.parent, *p.parent.parents):
        if q.exists() or q.is_symlink():
            if not q.is_dir():
                raise NotADirectoryError(f"{q} is not a folder")
            break
    try:
        if q == p.parent:
            fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=q)
            os.close(fd)
            os.unlink(tmp)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=f".{p.name}.", suffix=".tmp", dir=q))
    except OSError as exc:  # named by the folder, not by the probe's random name
        raise OSError(exc.errno, exc.strerror, str(q)) from None
    return p


class _AtomicPath:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                   dir=self.path.parent)
        os.close(fd)
        self.tmp = Path(tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.tmp.unlink(missing_ok=True)
            return False
        try:
            fsync_path(self.tmp)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self.tmp, 0o666 & ~umask)
            os.replace(self.tmp, self.path)
        except BaseException:
            self.tmp.unlink(missing_ok=True)
            raise
        fsync_path(self.path.parent)
        return False


def atomic_write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_table(table: pa.Table, path) -> None:
    """Write a table as Parquet, atomically and byte-reproducibly."""
    with atomic_path(path) as tmp:
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            compression_level=3,
            use_dictionary=False,
            write_statistics=False,
            store_schema=True,
        )


# ---------------------------------------------------------------------------------------------
# where the tables are stored (the one home of these names)
# ---------------------------------------------------------------------------------------------
#: the name ending of a timing table (beside the result table it belongs to)
TIMING_SUFFIX = ".timing.parquet"


def timing_path(path) -> Path:
    """The timing table stored beside the result table ``path`` (``x.parquet`` ->
    ``x.timing.parquet``)."""
    p = Path(path)
    return p.with_name(p.name.replace(".parquet", TIMING_SUFFIX))


def is_timing_table(path) -> bool:
    """Whether ``path`` names a timing table (``*.timing.parquet``)."""
    return str(path).endswith(TIMING_SUFFIX)


def shard_path(name: str, digest: str, results_dir="results") -> str:
    """The result table of shard ``digest`` of experiment ``name``
    (``<results_dir>/<name>/shards/<digest>.parquet``)."""
    return f"{results_dir}/{name}/shards/{digest}.parquet"


def experiment_tables(name: str, results_dir="results") -> list[str]:
    """The result table of experiment ``name`` and its timing table."""
    rows = f"{results_dir}/{name}.parquet"
    return [rows, str(timing_path(rows))]


def write_rows(rows, timings, path, timing_out) -> None:
    """Write result rows and their timing rows to two Parquet files."""
    write_table(rows_to_table(rows), path)
    write_table(rows_to_table(timings, TIMING_SCHEMA), timing_out)


def read_results(path, with_timing: bool = False):
    """Read one or several result files (a file, a folder, or a list) into a pandas DataFrame.

    With ``with_timing``, the matching ``*.timing.parquet`` files are joined on
    (experiment, cell_id).
    """
    import pandas as pd

    paths = _result_paths(path)
    if not paths:
        return rows_to_table([]).to_pandas()
    df = pd.concat([pq.read_table(p).to_pandas() for p in paths], ignore_index=True)
    if with_timing:
        tpaths = [t for t in map(timing_path, paths) if t.exists()]
        if tpaths:
            t = pd.concat([pq.read_table(p).to_pandas() for p in tpaths], ignore_index=True)
            df = df.merge(t, on=["experiment", "cell_id"], how="left")
    return df


def _result_paths(path) -> list[Path]:
    if isinstance(path, list | tuple):
        return [Path(p) for p in path]
    p = Path(path)
    if p.is_dir():
        return sorted(q for q in p.rglob("*.parquet") if not is_timing_table(q)
                      and "shards" not in q.parts and q.name != "all.parquet")
    return [p]
