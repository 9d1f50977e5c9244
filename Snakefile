# attnquery: the study's workflow. `snakemake --cores 8` reproduces every figure; see README.md.
import os
import sys

# One BLAS thread per job: jobs run in parallel, and results stay bit-identical whatever the
# number of cores.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
# The library is imported from this source tree, by the workflow and by its scripts; a
# PYTHONPATH given (a plug-in learner installed with pip --target) follows it, in the jobs too.
_SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, _SRC)
os.environ.update(PYTHONPATH=os.pathsep.join(
    [_SRC] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _SRC]))

import warnings

from snakemake.utils import min_version, validate

# Snakemake's own: building the report evaluates the run_shard jobs' resources, and its handling
# of an input-size coroutine it cannot run there (snakemake/rules.py, NestedCoroutineError)
# leaves the coroutine unawaited, which Python reports when it is collected. Nothing of ours.
warnings.filterwarnings("ignore", category=RuntimeWarning,
                        message=r"coroutine 'InputFiles\._predicated_size_files\.<locals>\.sizes' "
                        r"was never awaited")
warnings.filterwarnings("ignore", category=RuntimeWarning,
                        message="Enable tracemalloc to get the object allocation traceback")

min_version("9.20")


# A config file given on the command line (--configfile) defines the whole study: an experiment
# section it leaves out is not run. Without one, the default study config/config.yaml runs.
# (A `configfile:` directive alone would be merged with the command line's file.)
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


validate(config, "config/schema.yaml")


include: "workflow/rules/common.smk"


# Wildcards match exactly what is planned: the enabled experiments, the shards to compute (a
# shard computed earlier is a stored table, not a job) and the figures drawn.
wildcard_constraints:
    experiment=alternatives(ENABLED),
    shard=alternatives(NEW_SHARDS),
    figure=alternatives(FIGURES),


include: "workflow/rules/checkpoints.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/findings.smk"


rule all:
    input:
        final_outputs(),
    default_target: True


# On a cluster (profiles/slurm) only the compute jobs (run_shard: one shard of an experiment's
# cells each) are submitted. Every other rule (fetching a checkpoint, which needs the network,
# assembling, merging, validating, tables, figures) is light and runs in the Snakemake process.
# This is what a `localrules:` directive does, with the names computed from the rules above.
workflow.localrules(*(r.name for r in workflow.rules if r.name != "run_shard"))
