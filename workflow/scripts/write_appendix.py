"""Write appendix/appendix.tex and appendix/body.tex from a run (attnquery.study.appendix)."""
import json
from pathlib import Path

from attnquery.study.appendix import write_appendix

out = write_appendix(snakemake.input.records, snakemake.input.tables, snakemake.input.numbers,
                     snakemake.input.results, json.loads(snakemake.params.config),
                     Path(snakemake.output.tex).parent, numbers_tex=snakemake.input.numbers_tex)
Path(snakemake.log[0]).write_text(f"wrote {out} and {snakemake.output.body}\n")
