"""Reproducibility check: run a study twice and compare every output byte for byte.

``attnquery check-reproducible --config config/quick.yaml`` (or ``python -m
attnquery.study.reproducible``; ``make check-reproducible``) runs the workflow once on 1 core and
once on all cores, into two fresh folders, and compares every result table and every figure. Timing
tables (``*.timing.parquet``) and the figures drawn from them
(:func:`attnquery.figures.timing_figures`) hold wall-clock measurements and are excluded, as
are the wall-clock numbers of ``results/numbers.json`` (and the files rendered from it:
``results/numbers.tex``, ``results/findings/``); everything else must be identical.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["snakemake_command", "run_study", "compared_files", "compare_dirs",
           "check_reproducible", "report", "main"]

REPO = Path(__file__).resolve().parents[3]


def snakemake_command(config, directory, cores: int, *extra: str) -> list[str]:
    """The command line that runs the workflow with ``config`` into ``directory``; ``extra``
    (targets and options) comes first, since ``--quiet`` takes every word after it."""
    return [
        sys.executable, "-m", "snakemake", *extra,
        "-s", str(REPO / "Snakefile"),
        "--configfile", str(Path(config).resolve()),
        "--directory", str(directory),
        "--cores", str(cores),
        "--quiet", "progress",
    ]


def run_study(config, directory, cores: int, *extra: str, log=None) -> None:
    """Run the workflow to completion; raise CalledProcessError on failure."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    subprocess.run(snakemake_command(config, directory, cores, *extra), check=True,
                   stdout=log, stderr=subprocess.STDOUT if log else None)


def compared_files(directory) -> list[str]:
    """Result tables and figures under ``directory`` that must be bit-identical."""
    from ..figures import timing_figures
    from ..results import is_timing_table

    timed = timing_figures()
    d = Path(directory)
    out = []
    for p in sorted((d / "results").rglob("*")) + sorted((d / "figures").rglob("*")):
        if not p.is_file() or p.name.startswith("."):
            continue
        if is_timing_table(p):
            continue
        if p.parent.name in ("figures", "claims") and p.stem in timed:
            continue
        rel = p.relative_to(d)
        if rel.parts[:2] == ("results", "findings") or str(rel) == "results/numbers.tex":
            continue  # rendered from results/numbers.json, wall-clock numbers included
        out.append(str(rel))
    return out


def _digest(p: Path) -> str:
    if p.name == "numbers.json" and p.parent.name == "results":
        # the findings' numbers, less the wall-clock ones (attnquery.study.findings)
        import json

        doc = json.loads(p.read_text(encoding="utf-8"))
        doc["numbers"] = {k: v for k, v in doc.get("numbers", {}).items()
                          if not v.get("timing")}
        doc.pop("machine", None)  # where the wall-clock numbers were measured
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return hashlib.sha256(p.read_bytes()).hexdigest()


def compare_dirs(a, b) -> list[str]:
    """Differences between the outputs of two runs (empty when identical)."""
    fa, fb = compared_files(a), compared_files(b)
    problems = [f"only in {a}: {f}" for f in sorted(set(fa) - set(fb))]
    problems += [f"only in {b}: {f}" for f in sorted(set(fb) - set(fa))]
    for f in sorted(set(fa) & set(fb)):
        if _digest(Path(a, f)) != _digest(Path(b, f)):
            problems.append(f"differs: {f}")
    return problems


def check_reproducible(config, cores: int, workdir=None, say=print) -> tuple[list[str], int]:
    """Run the study ``config`` on 1 core and on ``cores`` cores, into two fresh folders of
    ``workdir`` (default: a new temporary folder), and compare their outputs.

    Returns ``(problems, n_compared)``: the differences (empty when reproducible) and the number
    of result tables and figures compared. ``say`` reports progress, one line per run. A run
    that fails raises :class:`subprocess.CalledProcessError`.
    """
    base = Path(workdir or tempfile.mkdtemp(prefix="attnquery-repro-"))
    one, many = base / "cores1", base / f"cores{cores}"
    say(f"run 1: {config} on 1 core into {one}")
    run_study(config, one, 1)
    say(f"run 2: {config} on {cores} cores into {many}")
    run_study(config, many, cores)
    return compare_dirs(one, many), len(compared_files(one))


def report(problems: list[str], n_compared: int) -> int:
    """Print the outcome of :func:`check_reproducible`; returns the exit status (1 if not
    reproducible)."""
    if problems:
        print("NOT reproducible:\n  " + "\n  ".join(problems))
        return 1
    print(f"reproducible: {n_compared} result tables and figures are byte-identical")
    return 0


def main(argv=None) -> int:
    """``python -m attnquery.study.reproducible`` (also ``attnquery check-reproducible``)."""
    parser = argparse.ArgumentParser(prog="python -m attnquery.study.reproducible",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config/quick.yaml", help="study config")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2,
                        help="cores of the second run (the first uses 1)")
    parser.add_argument("--workdir", default=None,
                        help="folder for the two runs (default: a temporary folder)")
    args = parser.parse_args(argv)
    return report(*check_reproducible(args.config, args.cores, args.workdir,
                                      say=lambda line: print(line, flush=True)))


if __name__ == "__main__":
    sys.exit(main())
