"""Compute one shard of one experiment (thin shim around attnquery.study.pipeline.run_shard)."""
from attnquery.study.pipeline import run_shard

run_shard(
    snakemake.wildcards.experiment,
    snakemake.params.cells,
    snakemake.params.seed,
    snakemake.params.time_limit,
    snakemake.output.rows,
    snakemake.output.timing,
    log=snakemake.log[0],
)
