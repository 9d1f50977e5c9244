"""Compare the result tables of two runs of the workflow byte for byte.

Usage: python tests/cluster/compare_results.py RUN_A RUN_B

Every ``results/**/*.parquet`` of each run is compared, shard tables included, except the
``*.timing.parquet`` tables (wall-clock times differ from run to run by nature). The two runs
must hold the same set of tables, and each table must have identical bytes: results are a
deterministic function of the configuration, whatever executes the jobs. Exits 1 naming every
table that is missing or differs (and, for differing tables, the first differing column).
"""

import sys
from pathlib import Path


def tables(run):
    """Relative paths of the result tables of ``run`` (timing tables excluded)."""
    root = Path(run, "results")
    return {
        p.relative_to(run).as_posix()
        for p in root.rglob("*.parquet")
        if not p.name.endswith(".timing.parquet")
    }


def first_difference(a, b):
    """A short description of how two Parquet files differ in content."""
    import pyarrow.parquet as pq

    ta, tb = pq.read_table(a), pq.read_table(b)
    if ta.schema != tb.schema:
        return "schemas differ"
    if ta.num_rows != tb.num_rows:
        return f"{ta.num_rows} rows vs {tb.num_rows}"
    for name in ta.column_names:
        if not ta.column(name).equals(tb.column(name)):
            return f"column {name!r} differs"
    return "same content, different bytes (metadata or encoding)"


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    run_a, run_b = argv[1], argv[2]
    ta, tb = tables(run_a), tables(run_b)
    if not ta:
        print(f"compare_results: no result tables under {run_a}/results", file=sys.stderr)
        return 1
    problems = [f"only in {run_a}: {p}" for p in sorted(ta - tb)]
    problems += [f"only in {run_b}: {p}" for p in sorted(tb - ta)]
    for rel in sorted(ta & tb):
        a, b = Path(run_a, rel), Path(run_b, rel)
        if a.read_bytes() != b.read_bytes():
            problems.append(f"differs: {rel} ({first_difference(a, b)})")
    if problems:
        print("compare_results: the runs' results differ:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"compare_results: {len(ta & tb)} result tables identical byte for byte")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
