"""Benchmarks: pinned configurations, queries counted by the oracle, errors and wall time.

"queries (counted)" are the queries that learnt the parameters, as the oracle counted them; each
learner also spends its check queries after them (8 by default), counted apart.

Run ``attnquery bench NAME`` or ``python -m attnquery.study.bench NAME`` (or ``all``); ``make
bench`` runs them all. Each benchmark prints a table; the README reproduces the tables measured
on a 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = ["BENCHMARKS", "register_benchmark", "run_benchmarks", "main", "print_table"]

#: benchmark name -> function() -> list of row dicts
BENCHMARKS: dict[str, Callable[[], list[dict]]] = {}


def register_benchmark(name: str):
    """Decorator registering a benchmark."""

    def deco(fn):
        BENCHMARKS[name] = fn
        return fn

    return deco


def print_table(name: str, rows: list[dict], file=sys.stdout) -> None:
    """Print rows as a Markdown table: the columns of every row, in the order they first
    appear; a row without a column (a refused cell's) shows ``-`` there."""
    if not rows:
        print(f"{name}: no rows", file=file)
        return
    cols = list(dict.fromkeys(c for r in rows for c in r))
    fmt = {
        float: lambda x: f"{x:.3g}",
    }
    print(f"\n### {name}\n", file=file)
    print("| " + " | ".join(cols) + " |", file=file)
    print("|" + "|".join("---" for _ in cols) + "|", file=file)
    for r in rows:
        cells = [fmt.get(type(r[c]), str)(r[c]) if c in r else "-" for c in cols]
        print("| " + " | ".join(cells) + " |", file=file)
    file.flush()


@register_benchmark("exact")
def bench_exact() -> list[dict]:
    """Theorem 4.1 at d in {64, 256, 1024}, every probe design, default-scale dense heads."""
    from ..learners import ExactValueQueryLearner
    from ..learners.exact import PROBE_DESIGNS
    from ..metrics import fit_counted, relative_error
    from ..models import random_head
    from ..oracles import ValueOracle

    rows = []
    for d in (64, 256, 1024):
        for probes in PROBE_DESIGNS:
            head = random_head(d, np.random.default_rng([d, 2026]), zero_frac=0.25)
            oracle = ValueOracle(head, d)
            t0 = time.perf_counter()
            est = ExactValueQueryLearner(probes=probes, random_state=0)
            counts = fit_counted(est, oracle)
            wall = time.perf_counter() - t0
            rows.append({
                "d": d,
                "probes": probes,
                "queries (counted)": counts["n_queries"],
                "d^2 + d": d * d + d,
                "rel. error W": relative_error(est.W_, head.W),
                "rel. error v": relative_error(est.v_, head.v),
                "wall time (s)": round(wall, 2),
            })
    return rows


@register_benchmark("probes")
def bench_probes() -> list[dict]:
    """The exact learner's probe designs at the same d^2 + d queries: every cell of the default
    study's exact grid (config/config.yaml: d 2..512, ||W||_2 default or 500, a quarter of v
    zero, 3 seeds) and all 72 heads of all-MiniLM-L6-v2 at d = 384 (Gaussian readout, seed 0;
    data/minilm/model.safetensors, skipped when absent). The default design is the one with the
    smallest error on both."""
    from ..experiments import cell_rng, expand_cells, get_experiment
    from ..learners.exact import PROBE_DESIGNS
    from ..realheads import head_from_checkpoint
    from .config import load_config

    root = Path(__file__).resolve().parents[3]
    cfg = load_config(root / "config" / "config.yaml")
    runs: dict[tuple[str, str], list[dict]] = {}
    exact = get_experiment("exact")
    for cell in expand_cells("exact", cfg["experiments"]["exact"]):
        t0 = time.perf_counter()
        m = exact.run(dict(cell), cell_rng(cell, cfg["seed"]))
        m["wall"] = time.perf_counter() - t0
        m["learning_ok"] = m["n_queries"] == cell["d"] ** 2 + cell["d"]
        runs.setdefault(("default study, exact grid", cell["probes"]), []).append(m)
    ckpt = root / "data" / "minilm" / "model.safetensors"
    if ckpt.exists():
        for layer in range(6):
            for h in range(12):
                head = head_from_checkpoint(ckpt, layer, h, n_heads=12, readout="gaussian",
                                            readout_seed=0)
                for probes in PROBE_DESIGNS:
                    runs.setdefault(("MiniLM, 72 heads, d = 384", probes), []).append(
                        _fit_exact(head, probes, [layer, h]))
    rows = []
    for (where, probes), ms in sorted(runs.items(), key=lambda kv: (
            kv[0][0] != "default study, exact grid", PROBE_DESIGNS.index(kv[0][1]))):
        err = np.array([m["rel_err_W"] for m in ms])
        rows.append({
            "heads": where,
            "probes": probes,
            "runs": len(ms),
            "all d^2 + d": all(m["learning_ok"] for m in ms),
            "check queries": int(max(m["verify_queries"] for m in ms)),
            "median rel. error W": float(np.median(err)),
            "worst rel. error W": float(err.max()),
            "runs <= 1e-12": int(np.sum(err <= 1e-12)),
            "worst check error": float(max(m["verify_error"] for m in ms)),
            "wall time (s)": round(sum(m["wall"] for m in ms), 1),
        })
    return rows


def _fit_exact(head, probes: str, seed) -> dict:
    from ..learners import ExactValueQueryLearner
    from ..metrics import fit_counted, relative_error
    from ..oracles import ValueOracle

    t0 = time.perf_counter()
    est = ExactValueQueryLearner(probes=probes, random_state=seed)
    m = fit_counted(est, ValueOracle(head, head.d))
    return {**m, "rel_err_W": relative_error(est.W_, head.W), "wall": time.perf_counter() - t0,
            "learning_ok": m["n_queries"] == head.d ** 2 + head.d}


@register_benchmark("sketch")
def bench_sketch() -> list[dict]:
    """Sketch learner (rank found from the answers) on factored heads up to d = 4096, r = 128."""
    from ..experiments.lowrank import factored_error
    from ..learners import SketchLowRankLearner
    from ..learners.lowrank import lowrank_floor
    from ..metrics import fit_counted
    from ..models import random_head
    from ..oracles import ValueOracle

    rows = []
    for d, r in ((1024, 32), (1024, 128), (4096, 128)):
        head = random_head(d, np.random.default_rng([d, r, 2026]), rank=r)
        box = _TimedBox(head)
        oracle = ValueOracle(box, d)
        t0 = time.perf_counter()
        est = SketchLowRankLearner(random_state=0)
        n = fit_counted(est, oracle)["n_queries"]
        wall = time.perf_counter() - t0
        L, R = est.W_factors_
        floor = lowrank_floor(d, r)
        rows.append({
            "d": d,
            "r": r,
            "rank found": est.rank_,
            "queries (counted)": n,
            "floor r(2d-r)+d": floor,
            "queries / floor": round(n / floor, 4),
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
    from ..learners import NuclearNormROPLearner
    from ..learners.lowrank import lowrank_floor
    from ..metrics import fit_counted, relative_error
    from ..models import random_head
    from ..oracles import ValueOracle

    rows = []
    r = 1
    for solver, dims in (("SCS", (8, 16, 24, 32, 48, 64)), ("CLARABEL", (8, 16, 24, 32, 48, 64))):
        for d in dims:
            head = random_head(d, np.random.default_rng([d, r, 2026]), rank=r)
            oracle = ValueOracle(head, d)
            m = 4 * r * 2 * d
            t0 = time.perf_counter()
            est = NuclearNormROPLearner(n_measurements=m, rank=r, solver=solver,
                                        random_state=0)
            counts = fit_counted(est, oracle)
            wall = time.perf_counter() - t0
            rows.append({
                "solver": solver,
                "d": d,
                "r": r,
                "queries (counted)": counts["n_queries"],
                "floor r(2d-r)+d": lowrank_floor(d, r),
                "status": est.solver_status_,
                "rel. error W (raw)": relative_error(est.W_raw_, head.W),
                "rel. error W": relative_error(est.W_, head.W),
                "solve time (s)": round(est.solve_time_s_, 2),
                "wall time (s)": round(wall, 2),
            })
    return rows


@register_benchmark("lowprecision")
def bench_lowprecision() -> list[dict]:
    """LowPrecisionValueQueryLearner on the MiniLM head of layer 3, head 5 (d = 384) behind float16,
    bfloat16 and 3-significant-digit answers, at 2.1 and 50 queries per unknown (d^2 + d): queries
    counted, errors, the learner's own estimate, wall and CPU time (oracle included) and the time
    spent in the head. Needs ``data/minilm/model.safetensors`` (``make reproduce`` fetches it).
    Run with ``OPENBLAS_NUM_THREADS=1``, as the workflow's jobs do, on a busy machine: threaded
    matrix-vector products in the simulated head slow down tenfold when the cores are shared."""
    import os

    from ..learners import LowPrecisionValueQueryLearner
    from ..metrics import relative_error
    from ..oracles import RoundingOracle
    from ..realheads import head_from_checkpoint

    path = Path("data/minilm/model.safetensors")
    if not path.exists():
        raise SystemExit(f"{path} is missing: run `make reproduce` (or the realheads fetch) first")
    head = head_from_checkpoint(path, 3, 5, n_heads=12)
    d = head.d
    rows = []
    for q in (2.1, 50):
        for spec, kw in (("float16", {"dtype": "float16"}), ("bfloat16", {"dtype": "bfloat16"}),
                         ("3 digits", {"digits": 3})):
            box = _TimedBox(head)
            oracle = RoundingOracle(box, d, **kw)
            t0, c0 = time.perf_counter(), time.process_time()
            est = LowPrecisionValueQueryLearner(n_queries=int(q * (d * d + d)),
                                                random_state=0).fit(oracle)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            rows.append({
                "answers": spec,
                "queries (counted)": oracle.n_queries,
                "per unknown": round(oracle.n_queries / (d * d + d), 3),
                "rel. error W": relative_error(est.W_, head.W),
                "estimate": float(est.W_error_estimate_),
                "rel. error v": relative_error(est.v_, head.v),
                "rank found": est.rank_,
                "wall time (s)": round(wall, 1),
                "CPU time (s)": round(cpu, 1),
                "of which in the head (s)": round(box.seconds, 1),
                "BLAS threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
            })
    return rows


@register_benchmark("layer")
def bench_layer() -> list[dict]:
    """AttentionLayerLearner on random layers with biases, H heads of rank r = d / H, over d and H:
    where it recovers every head (the failure map), its errors, queries and wall time."""
    from ..errors import AttnQueryError
    from ..learners import AttentionLayerLearner
    from ..learners.multihead_generic import layer_dof
    from ..metrics import functional_error, match_heads
    from ..models import MultiHeadAttention, random_head
    from ..oracles import ValueOracle

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


@register_benchmark("rotary")
def bench_rotary() -> list[dict]:
    """RotaryValueQueryLearner on random rotary heads (beyond the paper): dense route at
    d_h = d / 2 and d_h = d, low-rank route at Llama-like shapes; queries counted, frequency
    errors, functional errors on 1, 64 and 4,096 tokens and wall time."""
    from ..learners import RotaryValueQueryLearner
    from ..metrics import max_error_by_length
    from ..models import random_rotary_head
    from ..oracles import ValueOracle

    rows = []
    cases = [("dense", d, d // 2, 1e4) for d in (16, 32, 64, 128)]
    cases += [("dense", d, d, 1e6) for d in (16, 32, 64)]
    cases += [("lowrank", 256, 64, 5e5), ("lowrank", 512, 128, 5e5),
              ("lowrank", 1024, 128, 5e5)]
    for route, d, dh, base in cases:
        head = random_rotary_head(d, [d, dh], head_dim=dh, rope_base=base)
        oracle = ValueOracle(head, d)
        t0 = time.perf_counter()
        est = RotaryValueQueryLearner(rank=dh if route == "lowrank" else None,
                                      random_state=0).fit(oracle)
        wall = time.perf_counter() - t0
        n = est.n_queries_ - est.n_verify_queries_
        row = {"route": route, "d": d, "d_h": dh, "base": f"{base:.0e}",
               "queries (counted)": n, "queries / 2(d^2+d)": round(n / (2 * (d * d + d)), 3),
               "max freq. error": float(np.max(np.abs(est.frequencies_ - head.frequencies))),
               "cond M_-1": float(f"{est.condition_:.3g}")}
        errs = max_error_by_length(head, est.predict, d, np.random.default_rng(1),
                                   {1: 64, 64: 64, 4096: 4})
        row.update({f"func. error N={N}": e for N, e in errs.items()})
        row["wall time (s)"] = round(wall, 1)
        rows.append(row)
    return rows


@register_benchmark("rotary_layer")
def bench_rotary_layer() -> list[dict]:
    """AttentionLayerLearner(positions="rotary") on random Llama-style GQA layers (beyond the
    paper), heads of d / H, base 1e4: issue 23's goal shapes (d = 128, 8 query heads over 2
    key/value heads; d = 512, 8 heads of 64 over 1) and one between; queries counted by stage,
    frequency error, functional error on 1, 64 and 4,096 tokens, wall and CPU time."""
    from ..learners import AttentionLayerLearner
    from ..metrics import max_error_by_length
    from ..models import random_rotary_layer
    from ..oracles import ValueOracle

    rows = []
    for d, H, G in ((128, 8, 2), (256, 8, 2), (512, 8, 1)):
        layer = random_rotary_layer(d, H, G, 0, rope_base=1e4)
        oracle = ValueOracle(layer, d)
        t0, c0 = time.perf_counter(), time.process_time()
        est = AttentionLayerLearner(n_heads=H, n_kv_heads=G, positions="rotary",
                                    fit_bias=False, random_state=0).fit(oracle)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        stages = est.n_queries_by_stage_
        row = {"d": d, "H": H, "G": G, "d_h": d // H,
               "queries (counted)": est.n_queries_ - stages["verify"],
               "circle": stages["circle"], "isolated": stages["isolated"],
               "missing": stages["missing"], "groups found": int(est.n_kv_heads_),
               "max freq. error": float(np.max(np.abs(est.frequencies_ - layer.frequencies)))}
        errs = max_error_by_length(layer, est.predict, d, np.random.default_rng(1),
                                   {1: 64, 64: 64, 4096: 4})
        row.update({f"func. error N={N}": e for N, e in errs.items()})
        row.update({"wall time (s)": round(wall, 1), "CPU time (s)": round(cpu, 1)})
        rows.append(row)
    return rows


#: the vector benchmark's named layers (the default study's ``experiments.vector.cases``)
VECTOR_CASES = [
    {"name": "generic_h8", "d": 32, "n_heads": 8, "key_dim": 32, "goal": 1e-8},
    {"name": "qwen2_gqa", "d": 256, "n_heads": 8, "n_kv_heads": 2, "causal": True,
     "rope_base": 10000.0, "check_length": 512, "goal": 1e-9},
    {"name": "rotary_gqa_last", "d": 64, "n_heads": 8, "n_kv_heads": 2, "causal": True,
     "rope_base": 10000.0, "answers": "last", "goal": 1e-9},
    {"name": "head_float32", "d": 32, "n_heads": 1, "rounding": "float32", "goal_floors": 3},
    {"name": "head_float16", "d": 32, "n_heads": 1, "rounding": "float16", "goal_floors": 3},
    {"name": "head_bfloat16", "d": 32, "n_heads": 1, "rounding": "bfloat16", "goal_floors": 3},
    {"name": "layer_float32", "d": 32, "n_heads": 4, "rounding": "float32", "goal": 1e-5},
    {"name": "layer_float32_d96", "d": 96, "n_heads": 6, "rounding": "float32", "goal": 1e-5},
    {"name": "layer_float16", "d": 32, "n_heads": 4, "rounding": "float16", "goal_floors": 3},
    {"name": "layer_bfloat16", "d": 32, "n_heads": 4, "rounding": "bfloat16", "goal_floors": 3},
]


@register_benchmark("vector")
def bench_vector() -> list[dict]:
    """Extraction from vector answers against scalar answers (beyond the paper): random float64
    layers with biases, one number per query (the exact learner), the last token's output vector
    or every token's (VectorLayerLearner); single heads at d = 32 and 64, layers of heads that
    fill d. Each case is a cell of the ``vector`` experiment (:mod:`attnquery.experiments.vector`):
    queries counted by the oracle (learning, and the check), tokens, the floor, the largest
    error of W, V (v), c, beta and the function on 1 to 256 tokens, and wall time."""
    from ..errors import AttnQueryError
    from ..experiments import cell_rng, expand_cells, get_experiment

    cfg = {"heads": {"scalar": [32, 64], "last": [32, 64], "all": [32, 64]},
           "layers": {"answers": ["all", "last"], "d": [16, 32], "n_heads": [2, 4]},
           "cases": VECTOR_CASES}
    order = {"scalar": 0, "last": 1, "all": 2}
    cells = sorted(expand_cells("vector", cfg),
                   key=lambda c: (c.get("family") or "", c["n_heads"], c["d"],
                                  order[c["variant"]]))
    run = get_experiment("vector").run
    rows = []
    for cell in cells:
        row = {"case": cell.get("family") or "-", "answers": cell["variant"], "d": cell["d"],
               "H": cell["n_heads"]}
        t0 = time.perf_counter()
        try:
            m = run(dict(cell), cell_rng(cell, 0))
        except AttnQueryError as exc:  # a refused cell is a row with its status
            row.update({"status": f"{type(exc).__name__}: {str(exc)[:80]}",
                        "wall time (s)": round(time.perf_counter() - t0, 1)})
            rows.append(row)
            continue
        x = m["extra"]
        errors = ("rel_err_W", "rel_err_v", "rel_err_c", "rel_err_offset", "func_err")
        row.update({"status": "ok", "queries (counted)": m["n_queries"],
                    "check": m["verify_queries"],
                    "tokens": "-" if x["n_tokens"] is None else x["n_tokens"],
                    "floor": x["floor"], "queries / floor": round(x["floor_ratio"], 2),
                    "max error (W, V, c, beta, f)": max(float(m[k]) for k in errors
                                                         if m.get(k) is not None),
                    "wall time (s)": round(time.perf_counter() - t0, 1)})
        rows.append(row)
    return rows


def run_benchmarks(names=None, file=None) -> None:
    """Run the benchmarks ``names`` (default: all, in name order) and print their tables to
    ``file`` (default: standard output).

    An unknown name is a :class:`~attnquery.errors.ConfigError`, raised before any runs.
    """
    from ..errors import ConfigError

    names = sorted(BENCHMARKS) if not names or list(names) == ["all"] else list(names)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ConfigError(f"unknown benchmark {', '.join(map(repr, unknown))}; known: all, "
                          f"{', '.join(sorted(BENCHMARKS))}")
    for n in names:
        print_table(n, BENCHMARKS[n](), file=sys.stdout if file is None else file)


def main(argv=None) -> int:
    """``python -m attnquery.study.bench [NAME]`` (also ``attnquery bench``)."""
    from ..errors import ConfigError

    parser = argparse.ArgumentParser(prog="python -m attnquery.study.bench", description=__doc__)
    parser.add_argument("name", nargs="?", default="all",
                        help=f"benchmark to run: all, {', '.join(sorted(BENCHMARKS))}")
    args = parser.parse_args(argv)
    try:
        run_benchmarks([args.name])
    except ConfigError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
