# Computing the study: one job per shard of cells not computed yet, then one table per
# experiment assembled from the shards that hold its cells, the merged table and its validation.


rule run_shard:
    input:
        lambda w: list(get_experiment(w.experiment).data(section(w.experiment))),
    output:
        rows="results/{experiment}/shards/{shard}.parquet",
        timing=str(timing_path("results/{experiment}/shards/{shard}.parquet")),
    params:
        cells=shard_cells,
        seed=config["seed"],
        time_limit=config["cell_time_limit_s"],
    log:
        "logs/{experiment}/shard_{shard}.log",
    resources:
        # minutes: the cells' estimated seconds (measured cost models) x a safety factor,
        # within [1, resources.max_runtime_min]; the per-cell time limit stays a limit
        runtime=shard_runtime,
        mem_mb=RESOURCES["mem_mb"],
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/run_shard.py"


rule aggregate_results:
    input:
        shard_inputs,
    output:
        rows="results/{experiment}.parquet",
        timing=str(timing_path("results/{experiment}.parquet")),
    params:
        cell_keys=lambda w: PLANS[w.experiment].keys,
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
        result_files(ENABLED) + ["results/all.parquet"],
    output:
        "results/validation.txt",
    log:
        "logs/validate_results.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/validate_results.py"


rule make_table:
    input:
        "results/{experiment}.parquet",
    output:
        "results/tables/{experiment}.tex",
    params:
        code=TABLE_CODE,
    log:
        "logs/tables/{experiment}.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/make_tables.py"
