"""``attnquery validate``: check a results folder against the schema and the configured grid."""

from __future__ import annotations

from pathlib import Path

from ._common import load_config, one_line, print_json

__all__ = ["register", "run"]


def register(sub) -> None:
    """Add the ``validate`` subcommand to the subparsers ``sub``."""
    v = sub.add_parser(
        "validate", help="check a results folder against the schema and the configured grid",
        description="Check every Parquet table of RESULTS_DIR against the result schema and its "
        "version, that every cell of the configured grid has exactly one row, and that ok rows "
        "have finite metrics. Exits 1 and lists the problems if any.",
    )
    v.add_argument("results_dir", type=Path, metavar="RESULTS_DIR")
    v.add_argument("--config", type=Path, default=Path("config/config.yaml"),
                   help="study configuration (default config/config.yaml)")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.set_defaults(func=run)


def run(args) -> int:
    """Run ``attnquery validate``; 1 when problems were found."""
    cfg = load_config(args.config)
    problems = _validate(args.results_dir, cfg)
    if args.json:
        print_json({"results_dir": str(args.results_dir), "config": str(args.config),
                    "ok": not problems, "problems": problems})
    elif problems:
        print(f"{args.results_dir}: {len(problems)} problem(s):")
        for p in problems:
            print(f"  - {p}")
    else:
        print(f"{args.results_dir}: every table matches schema version and the grid of "
              f"{args.config}")
    return 1 if problems else 0


def _validate(results_dir, cfg) -> list[str]:
    """:func:`attnquery.study.validate.validate_results`; a table too damaged for its row checks is
    reported by its schema problems instead of stopping the command."""
    from ..study.validate import validate_results

    try:
        return validate_results(results_dir, cfg)
    except (KeyError, ValueError, TypeError, OSError) as exc:
        import pyarrow.parquet as pq

        from ..results import RESULT_SCHEMA, TIMING_SCHEMA, is_timing_table
        from ..study.validate import check_table_schema

        problems = []
        for path in sorted(Path(results_dir).glob("*.parquet")):
            schema = TIMING_SCHEMA if is_timing_table(path) else RESULT_SCHEMA
            try:
                problems += check_table_schema(pq.read_schema(path), schema, path.name)
            except Exception as err:  # noqa: BLE001 - any unreadable file is a problem to list
                problems.append(f"{path.name}: unreadable Parquet file ({one_line(err)})")
        return problems or [f"{results_dir}: the tables cannot be checked "
                            f"({type(exc).__name__}: {one_line(exc)})"]
