"""The ``attnquery`` command line.

Subcommands, one module each:

* ``attnquery extract`` (:mod:`.extract`): learn the parameters of a black box (``--oracle
  MODULE:FUNCTION``), of a saved head in simulation (``--model head.npz``) or of a checkpoint's
  attention module (``--module``) with one of the learners, and save them;
* ``attnquery heads`` (:mod:`.heads`): build a ground-truth head from a BERT- or GPT-2-style
  checkpoint;
* ``attnquery validate`` (:mod:`.validate`): check a results folder against the schema and the
  configured grid;
* ``attnquery info`` (:mod:`.info`): versions, learners available, configured experiments;
* ``attnquery bench`` (:mod:`.bench`): the benchmarks of :mod:`attnquery.study.bench`;
* ``attnquery check-reproducible`` (:mod:`.reproducible`): :mod:`attnquery.study.reproducible`.

The extraction itself (the learners by name, black boxes, oracles, :func:`run_extraction`) is
the library module :mod:`attnquery.extraction`; this package only parses, reports and maps
errors to exit statuses (:data:`EXIT_OK`, :data:`EXIT_FAILURE`, :data:`EXIT_USAGE`,
:data:`EXIT_INTERRUPTED`).
"""

from ._common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, OutputError
from .app import build_parser, main

__all__ = ["main", "build_parser", "OutputError", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE",
           "EXIT_INTERRUPTED"]
