"""Check the result tables the rule declares as inputs; fail on a violation."""
from attnquery.study.pipeline import validate_study

validate_study(list(snakemake.input), snakemake.config, snakemake.output[0], log=snakemake.log[0])
