"""Assemble an experiment's table from its shards (shim around attnquery.pipeline.aggregate)."""
from attnquery.pipeline import aggregate

aggregate(
    [p for p in snakemake.input if not p.endswith(".timing.parquet")],
    snakemake.params.cell_keys,
    snakemake.output.rows,
    snakemake.output.timing,
    log=snakemake.log[0],
)
