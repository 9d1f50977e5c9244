"""Concatenate an experiment's shard tables (thin shim around attnquery.pipeline.aggregate)."""
from attnquery.pipeline import aggregate

aggregate(snakemake.input, snakemake.output.rows, snakemake.output.timing, log=snakemake.log[0])
