"""The study: the machinery that runs the library's experiments as a Snakemake workflow and
reports them. It sits on top of the library (``models``, ``oracles``, ``learners``,
``experiments``, ``figures``, ...), which never imports it.

* :mod:`.bookkeeping`: code versions, cell keys, the cache of computed cells, job sizes (every
  public name of it is importable from ``attnquery.study`` itself);
* :mod:`.config`: loading and checking a study config;
* :mod:`.pipeline`: what the workflow's scripts call (run a shard, assemble, render, validate);
* :mod:`.validate`: the checks of the result tables;
* :mod:`.tables`: the LaTeX tables;
* :mod:`.findings`: the numbers the figures state, the committed findings;
* :mod:`.appendix`: the LaTeX appendix;
* :mod:`.provenance`: the machine, versions and commit a run records;
* :mod:`.reproducible`: ``attnquery check-reproducible``;
* :mod:`.bench`: the benchmarks (``attnquery bench``).

Each of these modules was a module of ``attnquery`` itself (``attnquery.pipeline``, ...); the
old paths still import them (:data:`attnquery._moved.MOVED`).
"""

from .bookkeeping import (
    PACKAGE_DIR,
    REGISTRY_MODULES,
    ShardPlan,
    cell_config_hash,
    cell_key,
    code_version,
    data_identity,
    data_sources,
    experiment_module,
    figure_sources,
    keyed_cells,
    module_closure,
    outside_closure,
    plan_experiment,
    read_shard_keys,
    resource_settings,
    shard_runtime_min,
    source_digest,
    study_size,
)

__all__ = [
    "PACKAGE_DIR",
    "module_closure",
    "outside_closure",
    "source_digest",
    "REGISTRY_MODULES",
    "code_version",
    "experiment_module",
    "figure_sources",
    "cell_config_hash",
    "cell_key",
    "keyed_cells",
    "data_identity",
    "data_sources",
    "ShardPlan",
    "plan_experiment",
    "read_shard_keys",
    "shard_runtime_min",
    "resource_settings",
    "study_size",
]
