"""Render one figure from result tables (thin shim around attnquery.pipeline.render_figure)."""
from attnquery.pipeline import render_figure
from attnquery.results import is_timing_table

render_figure(
    snakemake.wildcards.figure,
    [p for p in snakemake.input if not is_timing_table(p)],
    snakemake.output.pdf,
    snakemake.output.png,
    claims_out=snakemake.output.claims,
    numbers_out=getattr(snakemake.output, "numbers", None),
    log=snakemake.log[0],
)
