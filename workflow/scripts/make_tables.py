"""Write one booktabs table per experiment (thin shim around attnquery.pipeline.make_tables)."""
from attnquery.pipeline import make_tables

make_tables(snakemake.input, snakemake.output, log=snakemake.log[0])
