"""``attnquery check-reproducible``: run a study twice (1 core, then several) and compare every
result table and figure byte for byte (:mod:`attnquery.study.reproducible`)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import AttnQueryError
from ._common import int_at_least, load_config

__all__ = ["register", "run", "StudyRunError"]


class StudyRunError(AttnQueryError):
    """A run of the workflow failed (its exit status is in the message)."""


def register(sub) -> None:
    """Add the ``check-reproducible`` subcommand to the subparsers ``sub``."""
    c = sub.add_parser(
        "check-reproducible", help="run a study twice (1 core, then several) and compare "
        "every output byte for byte",
        description="Run the workflow with --config once on 1 core and once on --cores cores, "
        "into two fresh folders, and compare every result table and figure (timing tables and "
        "the figures drawn from them excluded). Exits 1 and lists the differences if any.")
    c.add_argument("--config", type=Path, default=Path("config/quick.yaml"),
                   help="study configuration (default config/quick.yaml)")
    c.add_argument("--cores", type=int_at_least(1), default=os.cpu_count() or 2,
                   help="cores of the second run (default: all; the first uses 1)")
    c.add_argument("--workdir", type=Path, default=None,
                   help="folder for the two runs (default: a new temporary folder)")
    c.set_defaults(func=run)


def run(args) -> int:
    """Run ``attnquery check-reproducible``; 1 when the two runs differ or one failed."""
    import subprocess

    from ..study import reproducible

    load_config(args.config)  # a missing or malformed configuration: a usage error, first
    try:
        problems, n = reproducible.check_reproducible(
            args.config, args.cores, args.workdir, say=lambda line: print(line, flush=True))
    except subprocess.CalledProcessError as exc:
        raise StudyRunError(f"the workflow failed with exit status {exc.returncode} (its log "
                            "is above)") from None
    return reproducible.report(problems, n)
