"""Write one booktabs table per experiment (thin shim around
attnquery.study.pipeline.make_tables)."""
from attnquery.study.pipeline import make_tables

make_tables(snakemake.input, snakemake.output, log=snakemake.log[0])
