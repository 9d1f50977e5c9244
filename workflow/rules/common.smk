# Helpers shared by every rule file (no rules here).
import functools
from pathlib import Path

from attnquery.config import check_config, enabled_experiments
from attnquery.errors import ConfigError
from attnquery.experiments import n_shards
from attnquery.pipeline import ClaimsText

# Semantic checks beyond the JSON schema: every enabled grid is expanded before any job starts.
try:
    CELLS = check_config(config)
except ConfigError as _exc:
    raise WorkflowError(f"invalid configuration: {_exc}")

ENABLED = enabled_experiments(config)

# Every rule that runs library code depends on the library's sources, so a change to src/
# re-runs exactly the rules that use it.
LIBRARY_SOURCES = sorted(
    str(p.relative_to(workflow.basedir)) if not os.path.isabs(workflow.basedir) else str(p)
    for p in Path(workflow.basedir, "src", "attnquery").rglob("*.py")
)


wildcard_constraints:
    experiment="|".join(ENABLED),
    shard=r"\d+",


def section(name):
    """The config section of experiment ``name``."""
    return config["experiments"][name]


def shards_of(name):
    """Number of shards (jobs) of experiment ``name``."""
    return n_shards(len(CELLS[name]), section(name)["cells_per_shard"])


def shard_files(wildcards):
    """The shard tables of the experiment in ``wildcards``."""
    name = wildcards.experiment
    return [f"results/{name}/shards/{i}.parquet" for i in range(shards_of(name))]


def result_files(*names):
    """Result and timing tables of the given experiments (those enabled)."""
    return [
        f"results/{n}{suffix}"
        for n in names
        if n in ENABLED
        for suffix in (".parquet", ".timing.parquet")
    ]


FIGURES = {}  # figure name -> experiments it reads; filled by the rule files


def figure_files():
    """PDF and PNG of every figure whose experiments are all enabled."""
    return [
        f"figures/{fig}.{ext}"
        for fig, exps in FIGURES.items()
        if all(e in ENABLED for e in exps)
        for ext in ("pdf", "png")
    ]


def claims_text(figure):
    """The checked claims of ``figure``, for its report caption (``{{ snakemake.params.claims }}``)."""
    return ClaimsText(f"figures/claims/{figure}.rst")


def final_outputs():
    return [
        "results/all.parquet",
        "results/validation.txt",
        *figure_files(),
        *[f"results/tables/{name}.tex" for name in ENABLED],
    ]
