"""Write a small seeded BERT-style checkpoint (thin shim around attnquery.realheads)."""
from attnquery.realheads import write_test_checkpoint
from attnquery.study.pipeline import Logger

log = Logger(snakemake.log[0])
try:
    syn = snakemake.params.synthetic
    path = write_test_checkpoint(
        snakemake.output.checkpoint,
        style="bert",
        n_layers=syn["n_layers"],
        n_heads=snakemake.params.n_heads,
        d=syn["d"],
        seed=syn["seed"],
    )
    log(f"wrote {path}: {syn['n_layers']} layers, {snakemake.params.n_heads} heads, d={syn['d']}")
finally:
    log.close()
