"""Collect the figures' numbers into results/numbers.json and .tex (attnquery.findings)."""
from attnquery.findings import write_numbers

write_numbers(snakemake.input, snakemake.output.json, snakemake.output.tex, log=snakemake.log[0])
