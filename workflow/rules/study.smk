# Running every experiment: one job per shard of cells, then one table per experiment.


rule run_shard:
    input:
        LIBRARY_SOURCES,
    output:
        rows="results/{experiment}/shards/{shard}.parquet",
        timing="results/{experiment}/shards/{shard}.timing.parquet",
    params:
        section=lambda w: section(w.experiment),
        shards=lambda w: shards_of(w.experiment),
        seed=config["seed"],
        time_limit=config["cell_time_limit_s"],
    log:
        "logs/{experiment}/shard_{shard}.log",
    resources:
        runtime=lambda w: int(config["cell_time_limit_s"] * section(w.experiment)["cells_per_shard"] / 60) + 10,
        mem_mb=4000,
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/run_shard.py"


rule aggregate_results:
    input:
        shard_files,
    output:
        rows="results/{experiment}.parquet",
        timing="results/{experiment}.timing.parquet",
    log:
        "logs/{experiment}/aggregate.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/aggregate_results.py"


rule merge_results:
    input:
        [f"results/{name}.parquet" for name in ENABLED],
    output:
        "results/all.parquet",
    log:
        "logs/merge_results.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/merge_results.py"


rule validate_results:
    input:
        tables=[f"results/{name}{suffix}" for name in ENABLED
                for suffix in (".parquet", ".timing.parquet")],
        merged="results/all.parquet",
    output:
        "results/validation.txt",
    log:
        "logs/validate_results.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/validate_results.py"


rule make_tables:
    input:
        [f"results/{name}.parquet" for name in ENABLED],
    output:
        [f"results/tables/{name}.tex" for name in ENABLED],
    log:
        "logs/make_tables.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/make_tables.py"


rule figures:
    """Target: every figure and table, re-rendered from stored results by `make figures`."""
    input:
        figure_files(),
        [f"results/tables/{name}.tex" for name in ENABLED],
