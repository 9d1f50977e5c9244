"""Check every result table against the schema and the configured grid; fail on a violation."""
from attnquery.pipeline import validate_study

validate_study("results", snakemake.config, snakemake.output[0], log=snakemake.log[0])
