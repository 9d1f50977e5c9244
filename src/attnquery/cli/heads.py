"""``attnquery heads``: build a ground-truth head from a BERT- or GPT-2-style checkpoint."""

from __future__ import annotations

from pathlib import Path

from ._common import check_out, int_at_least, model_usage, print_json, readout, write_model

__all__ = ["register", "run"]


def register(sub) -> None:
    """Add the ``heads`` subcommand to the subparsers ``sub``."""
    h = sub.add_parser(
        "heads", help="build a ground-truth head from a safetensors checkpoint",
        description="Build head H of layer L of a BERT- or GPT-2-style safetensors checkpoint: "
        "W = W_K,h^T W_Q,h / sqrt(d_h), v = W_V,h^T u_h with u_h head h's slice of W_O^T r "
        "for a readout vector r; biases dropped.",
    )
    h.add_argument("checkpoint", type=Path, help="a .safetensors file")
    h.add_argument("--layer", type=int_at_least(0), required=True,
                   help="layer index (from 0)")
    h.add_argument("--head", type=int_at_least(0), required=True,
                   help="head index within the layer")
    h.add_argument("--out", type=Path, required=True, help="output .npz (a regular file, or a "
                   "new one; not the checkpoint or its config.json)")
    h.add_argument("--n-heads", type=int_at_least(1), help="heads per layer (default: "
                   "config.json beside the checkpoint)")
    h.add_argument("--readout", type=readout, default=("gaussian", None),
                   help="readout vector r: 'gaussian' (seeded unit vector, the default), 'ones' "
                   "(normalised) or a coordinate index")
    h.add_argument("--seed", type=int_at_least(0), default=0,
                   help="seed of the Gaussian readout (default 0)")
    h.add_argument("--json", action="store_true", help="print one JSON object")
    h.set_defaults(func=run)


def run(args) -> int:
    """Run ``attnquery heads``; returns the exit status. A checkpoint that is not what it should
    be (missing, corrupt, a bad ``config.json`` beside it, no such layer or head) is a usage
    error, as for ``extract --module``."""
    from ..realheads import (
        build_head,
        checkpoint_files,
        head_summary,
        load_checkpoint,
        readout_vector,
        save_head,
    )

    check_out(args.out, inputs=checkpoint_files(args.checkpoint))
    kind, index = args.readout
    seed = index if kind == "coordinate" else args.seed
    with model_usage(str(args.checkpoint)):
        ckpt = load_checkpoint(args.checkpoint, n_heads=args.n_heads)
        r = readout_vector(ckpt.d, kind, seed)
        head = build_head(ckpt, args.layer, args.head, r)
    write_model(save_head, "head", args.out, head, checkpoint=str(args.checkpoint),
                style=ckpt.style, layer=args.layer, head=args.head, n_heads=ckpt.n_heads,
                readout=kind, readout_seed=int(seed))
    s = head_summary(head)
    s.update({"checkpoint": str(args.checkpoint), "style": ckpt.style, "layer": args.layer,
              "head": args.head, "n_layers": ckpt.n_layers, "n_heads": ckpt.n_heads,
              "d_head": ckpt.d_head, "readout": kind, "readout_seed": int(seed),
              "out": str(args.out)})
    if args.json:
        print_json(s)
        return 0
    print(
        f"head {args.head} of layer {args.layer} of {args.checkpoint} ({ckpt.style}-style, "
        f"{ckpt.n_layers} layers x {ckpt.n_heads} heads, d = {ckpt.d}, head dimension "
        f"{ckpt.d_head})\n"
        f"  readout        {kind} (seed/index {seed})\n"
        f"  rank of W      {s['rank']}\n"
        f"  ||W||_F        {s['W_fro']:.6g}  (spectral {s['W_spectral']:.6g})\n"
        f"  ||v||          {s['v_norm']:.6g}  (min |v_i| {s['min_abs_v']:.3g}, "
        f"max {s['max_abs_v']:.3g})\n"
        f"  saved          {args.out}"
    )
    return 0
