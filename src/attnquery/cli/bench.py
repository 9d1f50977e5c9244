"""``attnquery bench``: the benchmarks of :mod:`attnquery.study.bench` (pinned configurations,
queries counted by the oracle, errors and wall time), printed as Markdown tables."""

from __future__ import annotations

__all__ = ["register", "run"]


def register(sub) -> None:
    """Add the ``bench`` subcommand to the subparsers ``sub``."""
    from ..study.bench import BENCHMARKS

    b = sub.add_parser(
        "bench", help="run the benchmarks (counted queries, errors, wall time)",
        description="Run benchmarks of pinned configurations and print each as a Markdown "
        "table: the queries the oracle counted, the errors and the wall time (the tables in "
        "docs are measured this way; 'make bench' runs them all).")
    b.add_argument("names", nargs="*", metavar="NAME",
                   help=f"benchmarks to run (default: all): {', '.join(sorted(BENCHMARKS))}")
    b.set_defaults(func=run)


def run(args) -> int:
    """Run ``attnquery bench``; an unknown name is a usage error, found before any runs."""
    from ..study.bench import run_benchmarks

    run_benchmarks(args.names)
    return 0
