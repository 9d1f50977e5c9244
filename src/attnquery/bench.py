"""Benchmarks: pinned configurations, queries counted by the oracle, errors and wall time.

Run ``python -m attnquery.bench NAME`` (or ``all``); ``make bench`` runs them all. Each benchmark
prints a table; the README reproduces the tables measured on a 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np

__all__ = ["BENCHMARKS", "register_benchmark", "main", "print_table"]

#: benchmark name -> function() -> list of row dicts
BENCHMARKS: dict[str, Callable[[], list[dict]]] = {}


def register_benchmark(name: str):
    """Decorator registering a benchmark."""

    def deco(fn):
        BENCHMARKS[name] = fn
        return fn

    return deco


def print_table(name: str, rows: list[dict], file=sys.stdout) -> None:
    """Print rows as a Markdown table."""
    if not rows:
        print(f"{name}: no rows", file=file)
        return
    cols = list(rows[0])
    fmt = {
        float: lambda x: f"{x:.3g}",
    }
    print(f"\n### {name}\n", file=file)
    print("| " + " | ".join(cols) + " |", file=file)
    print("|" + "|".join("---" for _ in cols) + "|", file=file)
    for r in rows:
        cells = [fmt.get(type(r[c]), str)(r[c]) for c in cols]
        print("| " + " | ".join(cells) + " |", file=file)
    file.flush()


@register_benchmark("exact")
def bench_exact() -> list[dict]:
    """Theorem 4.1 at d in {64, 256, 1024}, every probe design, default-scale dense heads."""
    from .learners import ExactValueQueryLearner
    from .metrics import relative_error
    from .models import random_head
    from .oracles import ValueOracle

    rows = []
    for d in (64, 256, 1024):
        for probes in ("gaussian", "basis", "orthogonal"):
            head = random_head(d, np.random.default_rng([d, 2026]), zero_frac=0.25)
            oracle = ValueOracle(head, d)
            t0 = time.perf_counter()
            est = ExactValueQueryLearner(probes=probes, random_state=0).fit(oracle)
            wall = time.perf_counter() - t0
            rows.append({
                "d": d,
                "probes": probes,
                "queries (counted)": oracle.n_queries,
                "d^2 + d": d * d + d,
                "rel. error W": relative_error(est.W_, head.W),
                "rel. error v": relative_error(est.v_, head.v),
                "wall time (s)": round(wall, 2),
            })
    return rows


@register_benchmark("sketch")
def bench_sketch() -> list[dict]:
    """Sketch learner (rank found from the answers) on factored heads up to d = 4096, r = 128."""
    from .experiments.lowrank import factored_error
    from .learners import SketchLowRankLearner
    from .learners.lowrank import lowrank_floor
    from .models import random_head
    from .oracles import ValueOracle

    rows = []
    for d, r in ((1024, 32), (1024, 128), (4096, 128)):
        head = random_head(d, np.random.default_rng([d, r, 2026]), rank=r)
        box = _TimedBox(head)
        oracle = ValueOracle(box, d)
        t0 = time.perf_counter()
        est = SketchLowRankLearner(random_state=0).fit(oracle)
        wall = time.perf_counter() - t0
        L, R = est.W_factors_
        floor = lowrank_floor(d, r)
        rows.append({
            "d": d,
            "r": r,
            "rank found": est.rank_,
            "queries (counted)": oracle.n_queries,
            "floor r(2d-r)+d": floor,
            "queries / floor": round(oracle.n_queries / floor, 4),
            "rel. error W": factored_error(L, R, head.K, head.Q)[1],
            "wall time (s)": round(wall, 2),
            "of which in the head (s)": round(box.seconds, 2),
        })
    return rows


class _TimedBox:
    """A black box that adds up the time spent evaluating the model it wraps."""

    def __init__(self, model):
        self.model = model
        self.seconds = 0.0

    def __call__(self, X):
        t0 = time.perf_counter()
        try:
            return self.model(X)
        finally:
            self.seconds += time.perf_counter() - t0


@register_benchmark("nuclear")
def bench_nuclear() -> list[dict]:
    """Nuclear-norm learner (Theorem 5.1) at r = 1, m = 4 r (2d), d from 8 to 64, with SCS and
    with Clarabel (an interior-point method: about a minute at d = 48 and five at d = 64 here)."""
    from .learners import NuclearNormROPLearner
    from .learners.lowrank import lowrank_floor
    from .metrics import relative_error
    from .models import random_head
    from .oracles import ValueOracle

    rows = []
    r = 1
    for solver, dims in (("SCS", (8, 16, 24, 32, 48, 64)), ("CLARABEL", (8, 16, 24, 32, 48, 64))):
        for d in dims:
            head = random_head(d, np.random.default_rng([d, r, 2026]), rank=r)
            oracle = ValueOracle(head, d)
            m = 4 * r * 2 * d
            t0 = time.perf_counter()
            est = NuclearNormROPLearner(n_measurements=m, rank=r, solver=solver,
                                        random_state=0).fit(oracle)
            wall = time.perf_counter() - t0
            rows.append({
                "solver": solver,
                "d": d,
                "r": r,
                "queries (counted)": oracle.n_queries,
                "floor r(2d-r)+d": lowrank_floor(d, r),
                "status": est.solver_status_,
                "rel. error W (raw)": relative_error(est.W_raw_, head.W),
                "rel. error W": relative_error(est.W_, head.W),
                "solve time (s)": round(est.solve_time_s_, 2),
                "wall time (s)": round(wall, 2),
            })
    return rows


@register_benchmark("layer")
def bench_layer() -> list[dict]:
    """AttentionLayerLearner on random layers with biases, H heads of rank r = d / H, over d and H:
    where it recovers every head (the failure map), its errors, queries and wall time."""
    from .errors import AttnQueryError
    from .learners import AttentionLayerLearner
    from .learners.multihead_generic import layer_dof
    from .metrics import functional_error, match_heads
    from .models import MultiHeadAttention, random_head
    from .oracles import ValueOracle

    rows = []
    for d in (64, 128, 384):
        for H in (2, 4, 8, 12, 16, 32):
            r = d // H
            if r < 2:
                continue
            model = MultiHeadAttention([random_head(d, [d, H, h], rank=r, key_bias=0.5)
                                        for h in range(H)], offset=0.1)
            oracle = ValueOracle(model, d)
            t0 = time.perf_counter()
            row = {"d": d, "H": H, "r": r}
            try:
                est = AttentionLayerLearner(n_heads=H, random_state=0).fit(oracle)
            except AttnQueryError as exc:
                row.update({"status": type(exc).__name__, "heads within 1e-6": 0,
                            "max rel. error W_h": float("nan"), "func. error": float("nan")})
            else:
                m = match_heads(est.W_, est.v_, [h.W for h in model.heads],
                                [h.v for h in model.heads])
                row.update({"status": "ok",
                            "heads within 1e-6": int(np.sum(np.asarray(m["rel_err_W"]) <= 1e-6)),
                            "max rel. error W_h": m["max_rel_err_W"],
                            "func. error": functional_error(model, est.predict, d,
                                                            np.random.default_rng(0), n=64)})
            row.update({"queries (counted)": oracle.n_queries,
                        "queries / dof": round(oracle.n_queries / layer_dof(d, H, r), 3),
                        "wall time (s)": round(time.perf_counter() - t0, 1)})
            rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnquery.bench", description=__doc__)
    parser.add_argument("name", nargs="?", default="all",
                        help=f"benchmark to run: all, {', '.join(sorted(BENCHMARKS))}")
    args = parser.parse_args(argv)
    names = sorted(BENCHMARKS) if args.name == "all" else [args.name]
    for n in names:
        if n not in BENCHMARKS:
            parser.error(f"unknown benchmark {n!r}; known: {', '.join(sorted(BENCHMARKS))}")
        print_table(n, BENCHMARKS[n]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
