"""Glue between the Snakemake workflow and the library.

The workflow's scripts are thin shims around these functions, which tests call directly.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from .experiments import expand_cells, run_cells, shard_cells
from .provenance import provenance
from .results import (
    RESULT_SCHEMA,
    TIMING_SCHEMA,
    read_results,
    write_rows,
    write_table,
)

__all__ = ["run_shard", "aggregate", "render_figure", "merge_all", "timing_path", "Logger"]


class Logger:
    """Write progress lines to a log file (and stderr), flushing each line."""

    def __init__(self, path=None, echo: bool = True):
        self.fh = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self.echo = echo

    def __call__(self, line: str) -> None:
        if self.fh:
            self.fh.write(line.rstrip("\n") + "\n")
            self.fh.flush()
        if self.echo:
            print(line, file=sys.stderr, flush=True)

    def close(self):
        if self.fh:
            self.fh.close()


def run_shard(name: str, section: Mapping, shard: int, shards: int, seed: int,
              time_limit: float | None, out, timing_out, log=None) -> int:
    """Run shard ``shard`` of ``shards`` of experiment ``name`` and write its rows.

    Returns the number of rows written. Every cell gives a row, including failed ones.
    """
    logger = Logger(log)
    try:
        cells = shard_cells(expand_cells(name, section), shard, shards)
        logger(f"experiment {name}: shard {shard + 1}/{shards} with {len(cells)} cells, "
               f"study seed {seed}, time limit {time_limit} s per cell")
        rows, timings = run_cells(cells, seed, time_limit=time_limit,
                                  provenance=provenance({"seed": seed, name: dict(section)}),
                                  log=logger)
        write_rows(rows, timings, out, timing_out)
        bad = [r for r in rows if r["status"] not in ("ok", "not_identifiable")]
        logger(f"wrote {len(rows)} rows to {out} ({len(bad)} failed cells)")
        return len(rows)
    finally:
        logger.close()


def _concat(paths, schema):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(p, schema=schema) for p in paths]
    return pa.concat_tables(tables).sort_by([("experiment", "ascending"),
                                             ("cell_id", "ascending")])


def timing_path(path) -> Path:
    """The timing table stored beside a result table."""
    p = Path(path)
    return p.with_name(p.name.replace(".parquet", ".timing.parquet"))


def aggregate(inputs, out, timing_out, log=None) -> int:
    """Concatenate shard tables into one result table and one timing table."""
    logger = Logger(log)
    try:
        inputs = [Path(p) for p in inputs]
        t = _concat(inputs, RESULT_SCHEMA)
        write_table(t, out)
        write_table(_concat([timing_path(p) for p in inputs], TIMING_SCHEMA), timing_out)
        counts = t.group_by("status").aggregate([("cell_id", "count")]).to_pylist()
        logger(f"aggregated {t.num_rows} rows from {len(inputs)} shards into {out}: {counts}")
        return t.num_rows
    finally:
        logger.close()


def merge_all(inputs, out) -> int:
    """Merge every experiment's result table into one (``results/all.parquet``)."""
    table = _concat(inputs, RESULT_SCHEMA)
    write_table(table, out)
    return table.num_rows


def render_figure(name: str, inputs, pdf, png, log=None):
    """Render figure ``name`` from result files; logs the claims it checks."""
    from .figures import render

    logger = Logger(log)
    try:
        df = read_results(list(inputs), with_timing=True)
        claims = render(name, df, pdf, png)
        for c in claims:
            logger(f"claim {c.name}: {c}")
        return claims
    finally:
        logger.close()
