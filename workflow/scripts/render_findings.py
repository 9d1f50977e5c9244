"""Render the findings templates from results/numbers.json (attnquery.study.findings)."""
from pathlib import Path

from attnquery.study.findings import render_findings

missing = render_findings(snakemake.input.numbers, snakemake.input.templates, snakemake.output)
Path(snakemake.log[0]).write_text(
    f"rendered {len(snakemake.output)} templates"
    + (f"; no number for: {', '.join(missing)}\n" if missing else "\n"))
