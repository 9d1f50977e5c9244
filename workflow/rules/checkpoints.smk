# The checkpoints the experiments read (realheads, lowprecision): downloaded (fetch, as in
# config/config.yaml), or written (synthetic, config/quick.yaml: no network), or given (the file
# must then exist: the workflow stops before any job when it does not). A written checkpoint
# is rewritten when the code that writes it changes (the closure of attnquery.realheads.checkpoints).
import re

_FETCHED = {p: s for p, s in DATA.items() if s.get("fetch")}
_WRITTEN = {p: s for p, s in DATA.items() if s.get("synthetic")}


rule fetch_checkpoint:
    output:
        checkpoint="{checkpoint}",
    wildcard_constraints:
        checkpoint=alternatives([re.escape(p) for p in _FETCHED]),
    params:
        fetch=lambda w: _FETCHED[w.checkpoint]["fetch"],
    log:
        "logs/checkpoints/fetch_{checkpoint}.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/fetch_checkpoint.py"


rule make_test_checkpoint:
    output:
        checkpoint="{checkpoint}",
    wildcard_constraints:
        checkpoint=alternatives([re.escape(p) for p in _WRITTEN]),
    params:
        synthetic=lambda w: _WRITTEN[w.checkpoint]["synthetic"],
        n_heads=lambda w: _WRITTEN[w.checkpoint]["n_heads"],
        code=source_digest(module_closure(["attnquery.realheads.checkpoints"])),
    log:
        "logs/checkpoints/write_{checkpoint}.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/make_test_checkpoint.py"
