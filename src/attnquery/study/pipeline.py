"""Glue between the Snakemake workflow and the library.

The workflow's scripts are thin shims around these functions, which tests call directly.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from ..experiments import get_experiment, run_cells
from ..outcomes import count_outcomes, summary_line
from ..results import (
    RESULT_SCHEMA,
    TIMING_SCHEMA,
    is_timing_table,
    read_results,
    timing_path,
    write_rows,
    write_table,
)
from .provenance import provenance

__all__ = ["run_shard", "aggregate", "render_figure", "merge_all", "Logger",
           "ClaimsText", "claims_path", "claims_rst", "validate_study", "make_tables"]


class Logger:
    """Write progress lines to a log file (and stderr), flushing each line.

    Calling the logger writes a line to the file and to stderr (the console of a workflow run);
    :meth:`detail` writes it to the file alone (to stderr only when there is no file).
    """

    def __init__(self, path=None, echo: bool = True):
        self.fh = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self.echo = echo

    def __call__(self, line: str) -> None:
        if self.fh:
            self.fh.write(line.rstrip("\n") + "\n")
            self.fh.flush()
        if self.echo:
            print(line, file=sys.stderr, flush=True)

    def detail(self, line: str) -> None:
        """Write ``line`` to the log file only (to stderr when there is no file)."""
        if self.fh:
            self.fh.write(line.rstrip("\n") + "\n")
            self.fh.flush()
        elif self.echo:
            print(line, file=sys.stderr, flush=True)

    def close(self):
        if self.fh:
            self.fh.close()


def run_shard(name: str, cells, seed: int, time_limit: float | None, out, timing_out,
              log=None) -> int:
    """Compute the cells of one shard of experiment ``name`` and write their rows.

    ``cells`` carry their keys (:func:`attnquery.study.keyed_cells`); the code version each was
    planned with (its learner's, :func:`attnquery.study.code_version`) must still be the code's,
    or the shard stops before computing anything (the sources changed while the workflow ran:
    run it again). Every cell gives a row, including failed ones. Each cell's line goes to the
    log file; the console (stderr) gets only the tracebacks of failures (an error the
    experiment does not declare as a refusal, or a timeout: :mod:`attnquery.outcomes`).
    Returns the number of rows written.
    """
    from ..errors import AttnQueryError, VacuousCheckWarning
    from .bookkeeping import code_version

    logger = Logger(log)
    try:
        cells = [dict(c) for c in cells]
        now = {lr: code_version(name, lr) for lr in {c.get("learner") for c in cells}}
        planned = {c["code_version"] for c in cells}
        version = ", ".join(sorted(set(now.values())))
        if any(c["code_version"] != now[c.get("learner")] for c in cells):
            raise AttnQueryError(
                f"experiment {name}: the code changed since the workflow planned this shard "
                f"(planned with code version {sorted(planned)}, the sources now give {version}); "
                "run the workflow again")
        logger.detail(f"experiment {name}: {len(cells)} cells, code version {version}, study "
                      f"seed {seed}, time limit {time_limit} s per cell")
        # a check that could not fail is recorded in its row (verify_vacuous), not printed
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", VacuousCheckWarning)
            rows, timings = run_cells(cells, seed, time_limit=time_limit,
                                      provenance=provenance(), log=logger.detail,
                                      alert=logger)
        write_rows(rows, timings, out, timing_out)
        counts = count_outcomes(name, rows, get_experiment(name).refusals)
        logger.detail(f"wrote {len(rows)} rows to {out}: {summary_line(counts)}")
        return len(rows)
    finally:
        logger.close()


def _concat(paths, schema):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(p, schema=schema) for p in paths]
    return pa.concat_tables(tables).sort_by([("experiment", "ascending"),
                                             ("cell_id", "ascending")])


def aggregate(inputs, keys, out, timing_out, log=None) -> int:
    """Assemble an experiment's table from the shard tables that hold its cells.

    ``keys`` are the ``cell_key`` of every cell of the grid; each is taken from the first shard
    in ``inputs`` that holds it (with its timing row from the same shard). Raises
    :class:`~attnquery.errors.AttnQueryError` when a key is in no shard. The log gets the
    experiment's cells ok, refused as designed and failed
    (:func:`attnquery.outcomes.summary_line`); the console shows that line once, from
    :func:`validate_study`.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ..errors import AttnQueryError

    logger = Logger(log)
    try:
        wanted = set(keys)
        taken: set[str] = set()
        rows, timings = [], []
        for p in sorted(Path(x) for x in inputs):
            t = pq.read_table(p, schema=RESULT_SCHEMA)
            shard_keys = t.column("cell_key").to_pylist()
            mask = [k in wanted and k not in taken for k in shard_keys]
            if not any(mask):
                continue
            t = t.filter(pa.array(mask))
            taken.update(t.column("cell_key").to_pylist())
            tt = pq.read_table(timing_path(p), schema=TIMING_SCHEMA)
            tt = tt.filter(pc.is_in(tt.column("cell_id"), value_set=t.column("cell_id")))
            rows.append(t)
            timings.append(tt)
        missing = wanted - taken
        if missing:
            raise AttnQueryError(f"{len(missing)} cells are in no shard table "
                                 f"(e.g. {sorted(missing)[:3]}); run the workflow again")
        order = [("experiment", "ascending"), ("cell_id", "ascending")]
        table = (pa.concat_tables(rows) if rows else RESULT_SCHEMA.empty_table()).sort_by(order)
        write_table(table, out)
        timing = pa.concat_tables(timings) if timings else TIMING_SCHEMA.empty_table()
        write_table(timing.sort_by(order), timing_out)
        logger.detail(f"assembled {table.num_rows} rows from {len(rows)} shard tables into "
                      f"{out}")
        for o in table_outcomes(table):
            logger.detail(summary_line(o))
        return table.num_rows
    finally:
        logger.close()


def table_outcomes(table) -> list:
    """The outcomes of each experiment's rows in a result table (a pyarrow table or a
    DataFrame), by experiment name (:func:`attnquery.outcomes.count_outcomes`, with the
    refusals each experiment declares)."""
    rows = table.to_pylist() if hasattr(table, "to_pylist") else table.to_dict("records")
    names = sorted({r["experiment"] for r in rows})
    return [count_outcomes(n, [r for r in rows if r["experiment"] == n],
                           get_experiment(n).refusals) for n in names]


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


def validate_study(inputs, config, out, log=None) -> None:
    """Validate a study's result tables (:func:`attnquery.study.validate.validate_results`).

    ``inputs`` are the tables to check (``results/<experiment>.parquet``, their timing tables
    and ``results/all.parquet``). When the results are valid, writes to ``out`` one line per
    experiment with its cells *ok*, *refused as designed* (with the reason each experiment
    declares, :attr:`attnquery.experiments.Experiment.refusals`) and *failed*
    (:mod:`attnquery.outcomes`); raises :class:`~attnquery.errors.AttnQueryError` listing every
    problem otherwise (so the workflow fails), without writing ``out``.
    """
    from ..errors import AttnQueryError
    from ..results import atomic_write_bytes
    from .validate import validate_results

    logger = Logger(log)
    try:
        inputs = [Path(p) for p in inputs]
        results_dir = inputs[0].parent if inputs else Path("results")
        problems = validate_results(results_dir, config, files=inputs)
        if problems:
            for p in problems:
                logger(f"violation: {p}")
            raise AttnQueryError(
                f"{len(problems)} problems in {results_dir}:\n  " + "\n  ".join(problems)
            )
        tables = [p for p in inputs if p.name != "all.parquet"
                  and not is_timing_table(p)]
        outcomes = table_outcomes(read_results(tables))
        failed = sum(o.failed for o in outcomes)
        lines = [f"valid: {len(inputs)} tables checked ({', '.join(p.name for p in inputs)})",
                 "cells: ok (an answer, or parameters found not identifiable), refused as "
                 "designed (a named error the experiment expects of that cell, and why), "
                 "failed (any other error, or a timeout)"]
        lines += [summary_line(o) for o in outcomes]
        lines.append(f"failed: {failed} cells" if failed else "failed: none")
        text = "\n".join(lines) + "\n"
        for line in lines:
            logger(line)
        atomic_write_bytes(out, text.encode())
    finally:
        logger.close()


def claims_path(pdf) -> Path:
    """Where the claims of the figure written to ``pdf`` are stored (``figures/claims/*.rst``)."""
    p = Path(pdf)
    return p.parent / "claims" / f"{p.stem}.rst"


def _rst_text(text: str) -> str:
    """Plain text for reStructuredText: markup characters escaped (``|v_i|`` is not a
    substitution, ``W_`` not a reference)."""
    for ch in "\\|*`_":
        text = text.replace(ch, "\\" + ch)
    return text


def claims_rst(claims) -> str:
    """The claims of a figure as a reStructuredText bullet list, with their verdicts."""
    if not claims:
        return "- (this figure states no claim)\n"
    lines = []
    for c in claims:
        lines.append(f"- **{c.verdict}**: {_rst_text(c.statement)} ({_rst_text(c.detail)})")
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


def render_figure(name: str, inputs, pdf, png, claims_out=None, log=None, numbers_out=None):
    """Render figure ``name`` from result files; log its claims and write them to
    ``claims_out`` (by default ``figures/claims/<name>.rst`` beside the figure), and the claims
    with the numbers their checks computed to ``numbers_out`` (JSON,
    :func:`attnquery.study.findings.figure_record`; by default ``figures/claims/<name>.json``)."""
    import json

    from ..figures import get_spec, render
    from ..results import atomic_write_bytes
    from .findings import figure_record

    logger = Logger(log)
    try:
        df = read_results(list(inputs), with_timing=True)
        claims = render(name, df, pdf, png)
        for c in claims:
            logger(f"claim {c.name}: {c}")
        claims_out = Path(claims_out or claims_path(pdf))
        atomic_write_bytes(claims_out, claims_rst(claims).encode())
        spec = get_spec(name)
        tables = [str(p) for p in inputs if not str(p).endswith(".timing.parquet")]
        record = figure_record(name, claims, tables, caption=spec.caption,
                               timing=spec.uses_timing)
        atomic_write_bytes(numbers_out or claims_out.with_suffix(".json"),
                           (json.dumps(record, indent=1) + "\n").encode())
        return claims
    finally:
        logger.close()
