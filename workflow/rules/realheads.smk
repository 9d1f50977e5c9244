# Experiment "realheads": every head of a pretrained checkpoint (see
# src/attnquery/experiments/realheads.py). The checkpoint is downloaded (fetch), or written
# (synthetic, config/quick.yaml: no network), or given.
FIGURES["realheads"] = ["realheads"]

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

        # downloads run where the workflow runs (cluster nodes may have no network)
        localrules: fetch_checkpoint

    elif _RH.get("synthetic"):

        rule make_test_checkpoint:
            input:
                LIBRARY_SOURCES,
            output:
                checkpoint=_RH["checkpoint"],
            params:
                synthetic=_RH["synthetic"],
                n_heads=_RH["n_heads"],
            log:
                "logs/realheads/make_test_checkpoint.log",
            conda:
                "../envs/attnquery.yaml"
            script:
                "../scripts/make_test_checkpoint.py"

    # The generic run_shard rule (workflow/rules/study.smk), with the checkpoint as an input.
    rule run_shard_realheads:
        input:
            LIBRARY_SOURCES,
            _RH["checkpoint"],
        output:
            rows="results/{experiment}/shards/{shard}.parquet",
            timing="results/{experiment}/shards/{shard}.timing.parquet",
        wildcard_constraints:
            experiment="realheads",
        params:
            section=_RH,
            shards=lambda w: shards_of("realheads"),
            seed=config["seed"],
            time_limit=config["cell_time_limit_s"],
        log:
            "logs/{experiment}/shard_{shard}.log",
        resources:
            runtime=int(config["cell_time_limit_s"] * _RH["cells_per_shard"] / 60) + 10,
            mem_mb=4000,
        conda:
            "../envs/attnquery.yaml"
        script:
            "../scripts/run_shard.py"

    ruleorder: run_shard_realheads > run_shard


rule plot_realheads:
    input:
        result_files("realheads"),
    output:
        pdf=report(
            "figures/realheads.pdf",
            caption="../report/realheads.rst",
            category="Real heads",
            labels={"figure": "realheads"},
        ),
        png="figures/realheads.png",
    params:
        figure="realheads",
        claims=claims_text("realheads"),
    log:
        "logs/figures/realheads.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"
