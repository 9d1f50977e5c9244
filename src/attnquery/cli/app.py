"""The ``attnquery`` parser and entry point: one-line errors and the documented exit statuses."""

from __future__ import annotations

import argparse
import os

from ..errors import AttnQueryError, ConfigError
from . import bench, extract, heads, info, reproducible, validate
from ._common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, one_line, say

__all__ = ["build_parser", "main", "SUBCOMMANDS"]

#: the subcommands' modules, in the order ``--help`` lists them; each has ``register(sub)``,
#: which adds its parser, and ``run(args)``, which runs it and returns the exit status
SUBCOMMANDS = (extract, heads, validate, info, bench, reproducible)


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line (exit status 2)."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``attnquery`` argument parser, every subcommand included."""
    from .._version import __version__

    p = _Parser(
        prog="attnquery",
        description="Learn attention heads from queries (Bhattamishra et al., ICML 2026).",
    )
    p.add_argument("--version", action="version", version=f"attnquery {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.register(sub)
    return p


def main(argv=None) -> int:
    """Entry point of the ``attnquery`` command; returns the exit status.

    0: success; 1: the extraction or check failed (the black box raised or answered badly, the
    budget is too small, the answers are not what the learner assumes, an output could not be
    written, the results or the study's two runs differ); 2: a usage error (bad option, unknown
    name, missing learner parameter, an option that does not apply, unreadable input file or
    configuration, an ``--out`` that cannot be written, is not a regular file, exists (``extract``
    without ``--force``), is one of the inputs or a file the black box's import read or wrote);
    130: interrupted. Every
    error is one line on stderr, never a traceback (``ATTNQUERY_TRACEBACK=1`` shows one for an
    unexpected error).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    prefix = f"attnquery {args.command}: "
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        say(prefix + "error: " + one_line(exc))
        return EXIT_USAGE
    except AttnQueryError as exc:
        say(prefix + f"error: {one_line(exc)} ({type(exc).__name__})")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        say(prefix + "interrupted (KeyboardInterrupt)")
        return EXIT_INTERRUPTED
    except MemoryError as exc:
        say(prefix + f"error: out of memory ({one_line(exc) or 'no details'}); a smaller d, or a "
            "learner of fewer queries, may fit (MemoryError)")
        return EXIT_FAILURE
    except SystemExit as exc:
        say(prefix + f"error: SystemExit({exc.code!r}) was raised while running the command")
        return EXIT_FAILURE
    except BaseException as exc:  # the last resort: one line, never a traceback
        if os.environ.get("ATTNQUERY_TRACEBACK"):
            raise
        say(prefix + f"unexpected error: {type(exc).__name__}: {one_line(exc)} (set "
            "ATTNQUERY_TRACEBACK=1 to see where)")
        return EXIT_FAILURE
