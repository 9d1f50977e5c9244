"""Assemble an experiment's table from its shards (shim around
attnquery.study.pipeline.aggregate)."""
from attnquery.results import is_timing_table
from attnquery.study.pipeline import aggregate

aggregate(
    [p for p in snakemake.input if not is_timing_table(p)],
    snakemake.params.cell_keys,
    snakemake.output.rows,
    snakemake.output.timing,
    log=snakemake.log[0],
)
