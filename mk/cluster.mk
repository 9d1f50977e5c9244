# Cluster targets, included by the Makefile.
#   make cluster-test        the full test: install SLURM (Debian packages), start a one-node
#                            cluster on 127.0.0.1, run config/quick.yaml through profiles/slurm,
#                            compare with a local run, stop the daemons (needs root)
#   make cluster-test-light  its light form, part of `make test`: the profile linted, and a
#                            two-cell study run through the SLURM executor plugin with stand-ins
#                            for sbatch/squeue/srun, no SLURM needed (tests/test_cluster_profile.py)
VENV ?= .venv

.PHONY: cluster-test cluster-test-light

cluster-test: install
	VENV=$(VENV) tests/cluster/run_cluster_test.sh

cluster-test-light: install
	$(VENV)/bin/python -m pytest tests/test_cluster_profile.py -q
