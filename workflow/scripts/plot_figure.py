"""Render one figure from result tables (thin shim around
attnquery.study.pipeline.render_figure)."""
from attnquery.results import is_timing_table
from attnquery.study.pipeline import render_figure

render_figure(
    snakemake.wildcards.figure,
    [p for p in snakemake.input if not is_timing_table(p)],
    snakemake.output.pdf,
    snakemake.output.png,
    claims_out=snakemake.output.claims,
    numbers_out=getattr(snakemake.output, "numbers", None),
    log=snakemake.log[0],
)
