# attnquery: the study's workflow. `snakemake --cores 8` reproduces every figure; see README.md.
import os
import sys

# One BLAS thread per job: jobs run in parallel, and results stay bit-identical whatever the
# number of cores.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
# The library is imported from this source tree, by the workflow and by its scripts.
_SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, _SRC)
os.environ.update(PYTHONPATH=_SRC)

from snakemake.utils import min_version, validate

min_version("9.20")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


validate(config, "config/schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/exact.smk"
include: "workflow/rules/lowrank.smk"
include: "workflow/rules/noise.smk"
include: "workflow/rules/membership.smk"
include: "workflow/rules/realheads.smk"
include: "workflow/rules/multihead.smk"
include: "workflow/rules/transformer.smk"


rule all:
    input:
        final_outputs(),
    default_target: True


# On a cluster (profiles/slurm) only the compute jobs, the run_shard* rules (one shard of an
# experiment's cells each), are submitted. Every other rule (fetching a checkpoint, which needs
# the network, aggregation, merging, validation, tables, plot_*) is light and runs in the
# Snakemake process. This is what a `localrules:` directive does, with the names computed from
# the rules defined above.
workflow.localrules(*(r.name for r in workflow.rules if not r.name.startswith("run_shard")))
