"""Merge every experiment's table into results/all.parquet."""
from attnquery.study.pipeline import Logger, merge_all

n = merge_all(snakemake.input, snakemake.output[0])
log = Logger(snakemake.log[0])
log(f"merged {n} rows from {len(snakemake.input)} experiments into {snakemake.output[0]}")
log.close()
