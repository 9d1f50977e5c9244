"""The study's experiments: grids of cells, and how one cell is run.

An experiment is registered with :func:`register` and provides two pure functions:

* ``cells(cfg) -> list[dict]``: expand the experiment's config section into cells. A cell is a
  dict of parameters (the shared ones of :mod:`attnquery.results` or those the experiment
  declares in :attr:`Experiment.params`) plus ``learner`` and ``seed`` (the seed index within the
  grid point).
* ``run(cell, rng) -> dict``: build the ground truth, run the learner against an oracle, and
  return metrics (shared ones, timings, or those declared in :attr:`Experiment.metrics`).

The result schema is assembled from the columns the experiments declare
(:func:`attnquery.results.assemble_columns`).

Every ``run`` function follows one recipe: spawn the cell's generator, build the truth, wrap it
in an oracle, then fit the learner, count its queries and measure its estimate against the truth
with a measure function (:func:`attnquery.experiments._recipe.fit_and_measure`; docs/design.md,
"How an experiment is written").

:func:`run_cells` runs cells one after another and turns each into a result row, whatever
happens: a cell that raises becomes a row with status ``error`` (or ``not_identifiable``), one
that runs past the time limit a row with status ``timeout``. An experiment declares the cells
it expects to be refused (:attr:`Experiment.refusals`, :class:`attnquery.outcomes.Refusal`): such
a refusal is *refused as designed*, logged in one line; any other error is a failure, logged
with its traceback (:mod:`attnquery.outcomes`).

Randomness: a cell's generator is ``numpy.random.default_rng([cell_hash, study_seed])`` where
``cell_hash`` is a stable hash of the cell's own parameters, so a cell's result depends on
nothing but its parameters and the study seed (not on its position in the grid, the shard it
lands in, or the number of cores).
"""

from ._core import (
    CELL_PROVENANCE,
    EXPERIMENTS,
    FAMILIES,
    CellTimeout,
    Experiment,
    all_experiments,
    cell_id,
    cell_rng,
    checkpoint_source,
    expand_cells,
    get_experiment,
    grid,
    n_shards,
    readout_args,
    register,
    run_cells,
    shard_cells,
)

__all__ = [
    "Experiment",
    "register",
    "get_experiment",
    "all_experiments",
    "EXPERIMENTS",
    "FAMILIES",
    "cell_id",
    "cell_rng",
    "expand_cells",
    "shard_cells",
    "n_shards",
    "run_cells",
    "grid",
    "CellTimeout",
    "CELL_PROVENANCE",
    "checkpoint_source",
    "readout_args",
]
