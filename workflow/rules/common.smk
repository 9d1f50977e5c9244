# Helpers shared by the other rule files (no rules here). The logic lives in the library;
# attnquery.study plans the cells (what is computed already, what to compute, what to request),
# attnquery.figures holds the figure registry.
import json
from pathlib import Path

from attnquery.study.config import check_config, enabled_experiments
from attnquery.errors import ConfigError
from attnquery.experiments import get_experiment
from attnquery.figures import figures_for, get_spec
from attnquery.study.pipeline import ClaimsText
from attnquery.results import experiment_tables, timing_path
from attnquery.study import (
    figure_sources,
    data_sources,
    module_closure,
    plan_experiment,
    resource_settings,
    shard_runtime_min,
    source_digest,
)

# Semantic checks beyond the JSON schema: every enabled grid is expanded, and the data each
# experiment reads are checked, before any job starts.
try:
    CELLS = check_config(config)
    ENABLED = enabled_experiments(config)
    RESOURCES = resource_settings(config.get("resources"))
    # Files the experiments read (checkpoints), with where each comes from.
    DATA = data_sources(config, ENABLED)
    # What every experiment's table is assembled from: the shards already computed that hold
    # its cells (the cache, keyed by each cell's parameters, seed, data and code version) and
    # new shards for the cells none holds.
    PLANS = {
        name: plan_experiment(name, CELLS[name], config["experiments"][name], config["seed"],
                              config["cell_time_limit_s"], "results", RESOURCES)
        for name in ENABLED
    }
except ConfigError as _exc:
    raise WorkflowError(f"invalid configuration: {_exc}")

FIGURES = figures_for(ENABLED)
NEW_SHARDS = sorted(s for plan in PLANS.values() for s in plan.new)


def alternatives(names):
    """A regular expression matching exactly ``names`` (and nothing when there are none)."""
    return "|".join(names) if names else "(?!x)x"


def canonical(obj):
    """``obj`` as JSON with sorted keys: a parameter that does not change with the order of the
    config file's keys (Snakemake reruns a job whose parameters change)."""
    return json.dumps(obj, sort_keys=True, default=str)


def section(name):
    """The config section of experiment ``name``."""
    return config["experiments"][name]


def shard_cells(wildcards):
    """The cells of the shard in ``wildcards`` (with their keys)."""
    return PLANS[wildcards.experiment].new[wildcards.shard]


def shard_runtime(wildcards):
    """Runtime request (minutes) of the shard in ``wildcards``, from the cost model."""
    return shard_runtime_min(wildcards.experiment, shard_cells(wildcards), RESOURCES)


def shard_inputs(wildcards):
    """Rows and timing tables of the shards experiment ``wildcards.experiment`` is built from."""
    rows = PLANS[wildcards.experiment].inputs()
    return rows + [str(timing_path(p)) for p in rows]


def result_files(names):
    """Result and timing tables of the given experiments."""
    return [f for n in names for f in experiment_tables(n)]


def figure_tables(wildcards):
    """The tables figure ``wildcards.figure`` reads."""
    return result_files(get_spec(wildcards.figure).reads(ENABLED))


def figure_code(wildcards):
    """Digest of the code that draws figure ``wildcards.figure`` (a change re-renders it)."""
    return source_digest(figure_sources(wildcards.figure))


#: the templates the findings pages are rendered from (results/findings/<name>), in this source
#: tree: the workflow may run in another working directory (--directory, check-reproducible)
FINDINGS_TEMPLATES = [
    str(Path(workflow.basedir) / "docs" / "templates" / name)
    for name in ("readme_table.md", "findings.md")
]


TABLE_CODE = source_digest(module_closure(["attnquery.study.tables"]))


def final_outputs():
    return [
        "results/all.parquet",
        "results/validation.txt",
        *[f"figures/{fig}.{ext}" for fig in FIGURES for ext in ("pdf", "png")],
        *[f"results/tables/{name}.tex" for name in ENABLED],
        "results/numbers.json",
        "results/numbers.tex",
        *[f"results/findings/{Path(t).name}" for t in FINDINGS_TEMPLATES],
    ]
