"""Checks of a results folder against the result schema and the configured grid.

:func:`validate_results` returns a list of problems (empty when everything holds); the pipeline's
final rule, the tests and ``attnquery validate`` call it. The checks:

* every Parquet table in the folder has exactly the result schema
  (:data:`attnquery.results.RESULT_SCHEMA`, or :data:`~attnquery.results.TIMING_SCHEMA` for
  ``*.timing.parquet``): same column names, order and types, the schema version in the file's
  metadata and in the ``schema_version`` column equal to :data:`~attnquery.results.SCHEMA_VERSION`;
* every cell of every enabled experiment's grid has exactly one row in
  ``<experiment>.parquet`` (no missing, duplicated or unexpected cell ids), and in
  ``all.parquet`` when it exists; every row has a timing row;
* statuses are known, and a row whose status is not ok carries a message;
* evidence: an experiment none of whose cells succeeded (every row ``error`` or ``timeout``)
  fails; :func:`error_shares` counts the cells without an answer per experiment (whether each
  was refused as designed or failed is :mod:`attnquery.outcomes`'s question);
* metrics: in rows with status ``ok``, ``n_queries`` is present and non-negative, and no float
  metric is NaN or infinite. A null metric means "does not apply" and is accepted, except for
  the :data:`CORE_METRICS` (errors, queries, success): one that an experiment's learner reports
  in some ok rows must be in all of them. Rows whose status is not ok may hold anything.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..results import (
    METRIC_COLUMNS,
    RESULT_SCHEMA,
    SCHEMA_VERSION,
    STATUSES,
    TIMING_SCHEMA,
    experiment_tables,
    is_timing_table,
    timing_path,
)

__all__ = ["validate_results", "check_table_schema", "check_metrics", "table_to_frame",
           "error_shares", "CORE_METRICS", "FAILED_STATUSES"]

#: statuses of cells that give no evidence (the cell did not run to an answer)
FAILED_STATUSES = ("error", "timeout")

_VERSION_KEY = b"attnquery_schema_version"

#: metrics that, once a learner's ok rows report them, every ok row of that learner must report
#: (other metrics, such as a theorem's bound, may be undefined in some rows: null there)
CORE_METRICS = ("n_queries", "rel_err_W", "abs_err_W", "rel_err_v", "err_v", "func_err",
                "success")


def check_table_schema(schema: pa.Schema, expected: pa.Schema, name: str) -> list[str]:
    """Differences between a table's schema and the expected one (names, order, types, version)."""
    problems = []
    have = {f.name: f.type for f in schema}
    want = {f.name: f.type for f in expected}
    missing = [k for k in want if k not in have]
    extra = [k for k in have if k not in want]
    if missing:
        problems.append(f"{name}: missing columns {missing}")
    if extra:
        problems.append(f"{name}: unexpected columns {extra}")
    for k in want:
        if k in have and have[k] != want[k]:
            problems.append(f"{name}: column {k!r} has type {have[k]}, expected {want[k]}")
    if not missing and not extra and list(have) != list(want):
        problems.append(f"{name}: columns are not in the schema's order")
    meta = schema.metadata or {}
    version = meta.get(_VERSION_KEY)
    if version is None:
        problems.append(f"{name}: no schema version in the file's metadata")
    elif version.decode() != str(SCHEMA_VERSION):
        problems.append(
            f"{name}: schema version {version.decode()} in the file's metadata, expected "
            f"{SCHEMA_VERSION}"
        )
    return problems


def _float_metrics():
    return [k for k, t in METRIC_COLUMNS.items() if pa.types.is_floating(t)]


def check_metrics(df, name: str) -> list[str]:
    """Problems with the statuses, messages and metrics of the rows of one table (a DataFrame)."""
    problems = []
    if df.empty:
        return problems
    bad_status = sorted(set(df["status"].dropna()) - set(STATUSES)) + (
        ["null"] if df["status"].isna().any() else [])
    if bad_status:
        problems.append(f"{name}: unknown status values {bad_status}; known: {list(STATUSES)}")
    not_ok = df[df["status"] != "ok"]
    no_msg = not_ok[not_ok["message"].isna() | (not_ok["message"].fillna("") == "")]
    for cid, st in zip(no_msg["cell_id"], no_msg["status"], strict=True):
        problems.append(f"{name}: cell {cid} has status {st} but no message")
    ok = df[df["status"] == "ok"]
    for cid, n in zip(ok["cell_id"], ok["n_queries"], strict=True):
        if n is None or pd.isna(n) or not np.isfinite(float(n)):
            problems.append(f"{name}: cell {cid} has status ok but no n_queries")
        elif n < 0:
            problems.append(f"{name}: cell {cid} has a negative n_queries ({n})")
    # NaN and inf in float metrics (null is "does not apply"; NaN is a failed computation)
    for col in _float_metrics():
        if col not in ok.columns:
            continue
        for cid, x in zip(ok["cell_id"], ok[col], strict=True):
            if x is not None and x is not pd.NA and not np.isfinite(float(x)):
                problems.append(f"{name}: cell {cid} has status ok but {col} = {x}")
    # a core metric present in some ok rows of an (experiment, learner) must be in all of them
    metric_cols = [c for c in CORE_METRICS if c in df.columns]
    for (exp, learner), g in ok.groupby(["experiment", "learner"], dropna=False, sort=True):
        for col in metric_cols:
            present = _present(g[col])
            if present.any() and not present.all():
                missing = list(g["cell_id"][~present])
                shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
                problems.append(
                    f"{name}: {col} is missing in {len(missing)} of {len(g)} ok rows of "
                    f"experiment {exp}, learner {learner} ({shown})"
                )
    return problems


def _present(series) -> np.ndarray:
    """Entries holding a value. In float metric columns read by :func:`table_to_frame` a null is
    None and a NaN is a value (a failed computation); elsewhere every missing value is null."""
    if series.dtype == object:
        return np.array([x is not None and x is not pd.NA for x in series], dtype=bool)
    return series.notna().to_numpy()


def _read(path: Path, schema: pa.Schema, problems: list[str]):
    try:
        pf = pq.ParquetFile(path)
        table = pf.read()
    except Exception as exc:
        problems.append(f"{path.name}: unreadable Parquet file ({type(exc).__name__}: {exc})")
        return None
    problems += check_table_schema(table.schema, schema, path.name)
    return table


def table_to_frame(table: pa.Table):
    """DataFrame keeping nulls (None / NA) distinct from NaN in the float metric columns."""
    df = table.to_pandas()
    for col in _float_metrics():
        if col in table.column_names:
            arr = table.column(col)
            if pa.types.is_floating(arr.type):
                # pandas turns nulls into NaN; rebuild as object: null -> None, NaN stays NaN
                df[col] = np.array(arr.to_pylist(), dtype=object)
    return df


def validate_results(results_dir, config, files=None) -> list[str]:
    """Check the result tables in ``results_dir`` against the schema and ``config``'s grid.

    Parameters
    ----------
    results_dir : str or Path
        The study's ``results/`` folder (``<experiment>.parquet``, ``<experiment>.timing.parquet``
        and ``all.parquet``; shard folders are not checked).
    config : dict
        A validated study configuration (:func:`attnquery.study.config.load_config`).
    files : list of paths, optional
        Check exactly these tables (the workflow passes the files its rule declares as inputs);
        by default every table in ``results_dir``.

    Returns
    -------
    list of str
        One line per problem; empty when the folder is valid.
    """
    from .config import check_config

    root = Path(results_dir)
    if not root.is_dir():
        return [f"{root} is not a folder"]
    problems: list[str] = []
    expected = {name: {c["cell_id"] for c in cells}
                for name, cells in check_config(config).items()}
    tables = {}
    paths = sorted(root.glob("*.parquet")) if files is None else sorted(Path(f) for f in files)
    for path in paths:
        if not path.exists():
            continue  # reported below, as the table of its experiment
        timing = is_timing_table(path)
        table = _read(path, TIMING_SCHEMA if timing else RESULT_SCHEMA, problems)
        if table is not None:
            tables[path.name] = table
    for name, ids in expected.items():
        fname = f"{name}.parquet"
        if fname not in tables:
            if files is not None or not (root / fname).exists():
                problems.append(f"{fname}: missing (experiment {name} is enabled)")
            continue
        table = tables[fname]
        problems += _check_rows(table, fname, {name: ids})
        tname = timing_path(fname).name
        if tname in tables and {"cell_id"} <= set(tables[tname].column_names) & set(
                table.column_names):  # a missing column is reported by the schema check
            tids = Counter(tables[tname].column("cell_id").to_pylist())
            rids = set(table.column("cell_id").to_pylist())
            lacking = sorted(rids - set(tids))
            if lacking:
                problems.append(f"{tname}: no timing row for {len(lacking)} cells "
                                f"({', '.join(lacking[:5])})")
        elif tname not in tables and (files is not None or not (root / tname).exists()):
            problems.append(f"{tname}: missing")
    if "all.parquet" in tables:
        problems += _check_rows(tables["all.parquet"], "all.parquet", expected, check=False)
    own = {Path(f).name for n in expected for f in experiment_tables(n)}
    problems += [f"{p.name}: missing" for p in paths if not p.exists() and p.name not in own]
    return problems


def _check_rows(table: pa.Table, fname: str, expected: dict, check: bool = True) -> list[str]:
    problems = []
    if "schema_version" in table.column_names:
        versions = set(table.column("schema_version").to_pylist())
        if versions - {SCHEMA_VERSION}:
            wrong = sorted(versions - {SCHEMA_VERSION}, key=str)
            problems.append(f"{fname}: rows with schema_version {wrong}, expected {SCHEMA_VERSION}")
    needed = {"experiment", "cell_id", "status", "message", "learner", "n_queries"}
    if not needed <= set(table.column_names):
        return problems  # the schema check has reported the missing columns
    df = table_to_frame(table)
    for name, ids in expected.items():
        rows = df[df["experiment"] == name]
        counts = Counter(rows["cell_id"])
        missing = sorted(ids - set(counts))
        dups = sorted(k for k, n in counts.items() if n > 1)
        extra = sorted(set(counts) - ids)
        if missing:
            problems.append(f"{fname}: {len(missing)} cells of experiment {name} have no row "
                            f"({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''})")
        for k in dups:
            problems.append(f"{fname}: cell {k} of experiment {name} has {counts[k]} rows")
        if extra:
            problems.append(f"{fname}: {len(extra)} rows of experiment {name} are not cells of "
                            f"the configured grid ({', '.join(extra[:5])}"
                            f"{' ...' if len(extra) > 5 else ''})")
        failed = rows["status"].isin(FAILED_STATUSES)
        if len(rows) and failed.all():
            first = rows["message"].iloc[0]
            problems.append(f"{fname}: no cell of experiment {name} ran to an answer (all "
                            f"{len(rows)} rows are error or timeout; first: {first})")
    others = sorted(set(df["experiment"]) - set(expected))
    if others:
        problems.append(f"{fname}: rows of experiments that are not enabled: {others}")
    if check:
        problems += check_metrics(df, fname)
    return problems


def error_shares(df) -> dict[str, tuple[int, int]]:
    """``experiment -> (cells without an answer, cells)``: cells with status error or timeout,
    refusals as designed included (:func:`attnquery.study.pipeline.table_outcomes` tells the cells
    refused as designed from those that failed)."""
    out = {}
    for name, g in df.groupby("experiment", sort=True):
        out[str(name)] = (int(g["status"].isin(FAILED_STATUSES).sum()), int(len(g)))
    return out
