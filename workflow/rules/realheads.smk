# The checkpoint of experiment "realheads" (src/attnquery/experiments/realheads.py): downloaded
# (fetch, config/config.yaml), or written (synthetic, config/quick.yaml: no network), or given
# (the file must then exist: the workflow stops before any job when it does not).

if "realheads" in ENABLED:
    _RH = section("realheads")

    if _RH.get("fetch"):

        rule fetch_checkpoint:
            output:
                checkpoint=_RH["checkpoint"],
            params:
                fetch=_RH["fetch"],
            log:
                "logs/realheads/fetch_checkpoint.log",
            conda:
                "../envs/attnquery.yaml"
            script:
                "../scripts/fetch_checkpoint.py"

    elif _RH.get("synthetic"):

        rule make_test_checkpoint:
            output:
                checkpoint=_RH["checkpoint"],
            params:
                synthetic=_RH["synthetic"],
                n_heads=_RH["n_heads"],
                code=source_digest(module_closure(["attnquery.realheads"])),
            log:
                "logs/realheads/make_test_checkpoint.log",
            conda:
                "../envs/attnquery.yaml"
            script:
                "../scripts/make_test_checkpoint.py"
