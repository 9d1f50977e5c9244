"""Collect the figures' numbers into results/numbers.json and .tex (attnquery.study.findings)."""
from attnquery.study.findings import write_numbers

write_numbers(snakemake.input, snakemake.output.json, snakemake.output.tex, log=snakemake.log[0])
