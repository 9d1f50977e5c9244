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

__all__ = ["run_shard", "aggregate", "render_figure", "merge_all", "timing_path", "Logger",
           "ClaimsText", "claims_path", "claims_rst", "validate_study", "make_tables"]


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


def make_tables(inputs, outputs, log=None) -> None:
    """Write ``results/tables/<experiment>.tex`` for each experiment table in ``inputs``."""
    from .tables import write_table_tex

    logger = Logger(log)
    try:
        for src, out in zip(inputs, outputs, strict=True):
            df = read_results(src)
            name = Path(src).stem
            write_table_tex(df, name, out)
            logger(f"wrote {out} ({len(df)} rows of {name})")
    finally:
        logger.close()


def validate_study(results_dir, config, out, log=None) -> None:
    """Validate a study's results (:func:`attnquery.validate.validate_results`).

    Writes a summary to ``out`` when the results are valid; raises
    :class:`~attnquery.errors.AttnQueryError` listing every problem otherwise (so the workflow
    fails), without writing ``out``.
    """
    from .errors import AttnQueryError
    from .results import atomic_write_bytes
    from .validate import validate_results

    logger = Logger(log)
    try:
        problems = validate_results(results_dir, config)
        if problems:
            for p in problems:
                logger(f"violation: {p}")
            raise AttnQueryError(
                f"{len(problems)} problems in {results_dir}:\n  " + "\n  ".join(problems)
            )
        tables = sorted(p.name for p in Path(results_dir).glob("*.parquet"))
        text = f"valid: {len(tables)} tables checked ({', '.join(tables)})\n"
        logger(text.strip())
        atomic_write_bytes(out, text.encode())
    finally:
        logger.close()


def claims_path(pdf) -> Path:
    """Where the claims of the figure written to ``pdf`` are stored (``figures/claims/*.rst``)."""
    p = Path(pdf)
    return p.parent / "claims" / f"{p.stem}.rst"


def claims_rst(claims) -> str:
    """The claims of a figure as a reStructuredText bullet list, with their verdicts."""
    if not claims:
        return "- (this figure states no claim)\n"
    lines = []
    for c in claims:
        verdict = "**supported**" if c.passed else "**NOT supported**"
        lines.append(f"- {verdict}: {c.statement} ({c.detail})")
    return "\n".join(lines) + "\n"


class ClaimsText:
    """A figure's checked claims, read when a report caption is rendered.

    Used as a rule parameter (``params: claims=ClaimsText("figures/claims/x.rst")``) and
    written into a caption with ``{{ snakemake.params.claims }}``; the file is read only when
    the report is built, after the figure was rendered.
    """

    def __init__(self, path):
        self.path = str(path)

    def __str__(self) -> str:
        p = Path(self.path)
        if not p.exists():
            return "- (claims not checked yet: the figure has not been rendered)"
        return p.read_text(encoding="utf-8")

    def __repr__(self) -> str:
        return f"ClaimsText({self.path!r})"


def render_figure(name: str, inputs, pdf, png, log=None):
    """Render figure ``name`` from result files; log its claims and store them beside it."""
    from .figures import render
    from .results import atomic_write_bytes

    logger = Logger(log)
    try:
        df = read_results(list(inputs), with_timing=True)
        claims = render(name, df, pdf, png)
        for c in claims:
            logger(f"claim {c.name}: {c}")
        atomic_write_bytes(claims_path(pdf), claims_rst(claims).encode())
        return claims
    finally:
        logger.close()
