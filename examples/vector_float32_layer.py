"""A float32 attention layer served by onnxruntime, extracted from every token's outputs.

The layer (``random_vector_layer(d, H, seed, head_dim=d // H, bias=0.3)``: query, key, value
and output projections with biases, H heads whose value maps fill d) is written as an ONNX
graph and answered in float32 by onnxruntime (:func:`attnquery.engines.vector_box`);
:class:`~attnquery.learners.VectorLayerLearner` reads it from the answers alone, and this script
compares what it read with the float64 layer the box rounds: every head's W, value map V and
key bias c (relative to the largest entry; the heads matched by their value maps), the output
offset, and the function on 8 random queries of each of 1, 2, 3, 8, 16, 32, 64 and 128 tokens.

With ``--checkpoint FILE --layer L`` the layer is a real one instead: layer L of a BERT- or
GPT-2-style ``.safetensors`` checkpoint (its attention weights and biases; ``make reproduce``
fetches MiniLM's to data/minilm/model.safetensors), served the same way.

From the repository root (onnx and onnxruntime are test dependencies)::

    OMP_NUM_THREADS=1 python examples/vector_float32_layer.py --d 96 --heads 6
    OMP_NUM_THREADS=2 python examples/vector_float32_layer.py --d 384 --heads 12   # MiniLM size
    OMP_NUM_THREADS=2 python examples/vector_float32_layer.py \
        --checkpoint data/minilm/model.safetensors --layer 0                      # MiniLM's own

The last two are the issue's float32 MiniLM-size layers (d = 384, 12 heads of 32): about 20
minutes each on a 2-core machine (``OMP_NUM_THREADS`` keeps BLAS threads from oversubscribing a
shared machine). docs/benchmarks.md ("Numbers measured once") gives the numbers they printed.
"""

import argparse
import time

import numpy as np

from attnquery import engines
from attnquery.learners import VectorLayerLearner
from attnquery.models.vector import VectorAttentionLayer, random_vector_layer
from attnquery.oracles import VectorOracle

LENGTHS = (1, 2, 3, 8, 16, 32, 64, 128)


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def checkpoint_layer(path, index: int, precision: str = "float64") -> VectorAttentionLayer:
    """Layer ``index`` of a checkpoint as a layer answering every token's outputs."""
    from attnquery.realheads import load_checkpoint

    ck = load_checkpoint(path)
    if not 0 <= index < len(ck.layers):
        raise SystemExit(f"--layer {index}: the checkpoint has layers 0 to {len(ck.layers) - 1}")
    w, H, dh, d = ck.layers[index], ck.n_heads, ck.d_head, ck.d
    biases = {f"b_{n}": w[f"b{n.lower()}"].reshape(H, dh) for n in ("Q", "K", "V")}
    return VectorAttentionLayer(*(w[k].reshape(H, dh, d) for k in ("q", "k", "v")), w["o"],
                                **biases, b_O=w["bo"], precision=precision)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=96, help="token dimension (default 96)")
    parser.add_argument("--heads", type=int, default=6, help="heads, of d / heads each")
    parser.add_argument("--seed", type=int, default=22, help="the layer's seed (default 22)")
    parser.add_argument("--random-state", type=int, default=0, help="the learner's seed")
    parser.add_argument("--checkpoint", help="a .safetensors checkpoint: serve its --layer")
    parser.add_argument("--layer", type=int, default=0, help="the checkpoint's layer (0)")
    args = parser.parse_args(argv)
    if args.checkpoint:
        layer = checkpoint_layer(args.checkpoint, args.layer, "float32")
        exact = checkpoint_layer(args.checkpoint, args.layer)
        H, _, d = exact.W_Q.shape
    else:
        d, H = args.d, args.heads
        if d % H:
            parser.error(f"--heads {H} must divide --d {d}")
        options = dict(head_dim=d // H, bias=0.3)
        layer = random_vector_layer(d, H, seed=args.seed, precision="float32", **options)
        exact = random_vector_layer(d, H, seed=args.seed, **options)
    oracle = VectorOracle(engines.vector_box(layer, "float32", "all"), d)
    start = time.perf_counter()
    est = VectorLayerLearner(n_heads=H, random_state=args.random_state).fit(oracle)
    wall = time.perf_counter() - start
    W, V, c = exact.head_W(), exact.value_maps(), exact.key_bias()
    order = [int(np.argmin([rel(est.V_[h], V[g]) for g in range(H)])) for h in range(H)]
    if sorted(order) != list(range(H)):
        raise SystemExit(f"the value maps read match no one-to-one order of the heads: {order}")
    rng = np.random.default_rng(1)
    function = 0.0
    for n in LENGTHS:
        X = rng.standard_normal((8, n, d)) / np.sqrt(d)
        function = max(function, rel(est.predict(X), exact(X)))
    stages = " / ".join(f"{k} {v:,}" for k, v in est.n_queries_by_stage_.items())
    print(f"d = {d}, {H} heads of {d // H}, float32 (onnxruntime), every token's outputs")
    print(f"queries {est.n_queries_:,} ({stages}), tokens {est.n_tokens_:,}; "
          f"{est.n_groups_} shared-token groups; wall {wall:.0f} s")
    for name, est_, true in (("W", est.W_, W), ("V", est.V_, V), ("c", est.key_bias_, c)):
        print(f"{name}: worst head {max(rel(est_[h], true[g]) for h, g in enumerate(order)):.2e}")
    print(f"beta: {rel(est.output_bias_, exact.output_bias):.2e}")
    print(f"function (1 to 128 tokens): {function:.2e}; the fit's own check "
          f"{est.verify_error_:.2e}")


if __name__ == "__main__":
    main()
