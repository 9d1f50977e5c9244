"""Render one figure from result tables (thin shim around attnquery.pipeline.render_figure)."""
from attnquery.pipeline import render_figure

render_figure(
    snakemake.wildcards.figure,
    [p for p in snakemake.input if not p.endswith(".timing.parquet")],
    snakemake.output.pdf,
    snakemake.output.png,
    claims_out=snakemake.output.claims,
    numbers_out=getattr(snakemake.output, "numbers", None),
    log=snakemake.log[0],
)
