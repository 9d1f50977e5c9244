"""The ``attnquery`` command line.

Subcommands:

* ``attnquery extract``: learn the parameters of a black box (``--oracle MODULE:FUNCTION``) or of
  a saved head in simulation (``--model head.npz``) with one of the learners, and save them;
* ``attnquery heads``: build a ground-truth head from a BERT- or GPT-2-style checkpoint;
* ``attnquery validate``: check a results folder against the schema and the configured grid;
* ``attnquery info``: versions, learners available, configured experiments.

Learners are looked up in :data:`METHODS` and imported only when used, so a method whose learner
is not installed fails with a clear message while the others work.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import inspect
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import AttnQueryError, ConfigError, ModelError


class OutputError(AttnQueryError):
    """Writing an output file failed (disk full, file system turned read-only, ...)."""

__all__ = ["main", "METHODS", "Method", "load_black_box", "make_oracle", "make_learner",
           "ProgressOracle", "run_extraction", "OutputError", "EXIT_OK", "EXIT_FAILURE",
           "EXIT_USAGE", "EXIT_INTERRUPTED"]

#: exit statuses: success, a failed extraction or check, a usage error, Ctrl-C
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass(frozen=True)
class Method:
    """A learner reachable from ``--method``: where its class lives and what oracle it needs."""

    module: str
    cls: str
    oracle: str  # "value", "approximate value" or "membership"
    description: str

    def load(self):
        """Import and return the learner class (ConfigError if it is not available)."""
        try:
            mod = importlib.import_module(self.module)
            return getattr(mod, self.cls)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"learner {self.cls} ({self.module}) is not available in this installation: "
                f"{exc}"
            ) from None

    @property
    def available(self) -> bool:
        try:
            self.load()
        except ConfigError:
            return False
        return True


#: --method name -> learner
METHODS: dict[str, Method] = {
    "exact": Method("attnquery.learners.exact", "ExactValueQueryLearner", "value",
                    "exact value queries, d^2 + d queries (Theorem 4.1)"),
    "sketch": Method("attnquery.learners.lowrank", "SketchLowRankLearner", "value",
                     "low-rank sketch, r(2d - r) + d queries"),
    "nuclear": Method("attnquery.learners.lowrank", "NuclearNormROPLearner", "value",
                      "nuclear-norm minimisation from rank-one projections (Theorem 5.1)"),
    "noisy": Method("attnquery.learners.noisy", "NoisyValueQueryLearner", "approximate value",
                    "approximate value queries within +-tau (Theorem 6.1)"),
    "membership": Method("attnquery.learners.membership", "MembershipLearner", "membership",
                         "membership queries 1[f(X) > 0] (Appendix B)"),
    "layer": Method("attnquery.learners.multihead_generic", "AttentionLayerLearner", "value",
                    "a whole attention layer, H heads of rank d / H with their biases (beyond "
                    "the paper; --param n_heads=H)"),
}

#: --method names whose learners fit a head's key bias and offset (``fit_bias``)
BIAS_METHODS = ("exact", "sketch", "layer")


# ----------------------------------------------------------------------------------------------
# Building blocks (also used by the realheads experiment)
# ----------------------------------------------------------------------------------------------


def _accepts(cls, params=None) -> tuple[set[str], bool]:
    """Keyword names ``cls`` takes, and whether it takes ``**kwargs`` (``params``: its
    signature's parameters, when already in hand)."""
    params = inspect.signature(cls).parameters if params is None else params
    names = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return names, var_kw


def _check_param_type(cls, name: str, value, params=None) -> None:
    """ConfigError when ``value`` is not of the kind the default of ``cls``'s parameter is
    (``params``: its signature's parameters, when already in hand)."""
    param = (inspect.signature(cls).parameters if params is None else params).get(name)
    if param is None or param.default is inspect.Parameter.empty or param.default is None:
        return
    default = param.default
    number = (int, float, np.integer, np.floating)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        want = "true or false"
    elif isinstance(default, number):
        ok = isinstance(value, number) and not isinstance(value, bool)
        if isinstance(default, int | np.integer) and ok:
            ok = float(value) == int(value)
        want = "an integer" if isinstance(default, int | np.integer) else "a number"
    elif isinstance(default, str):
        ok = isinstance(value, str)
        want = "a string"
    else:
        return
    if not ok:
        raise ConfigError(f"{cls.__name__} parameter {name!r} takes {want}; got {value!r}")


def construct(cls, *args, optional=None, required=None):
    """Call ``cls(*args, **kwargs)`` with the ``optional`` keywords its signature accepts.

    ``required`` keywords must all be accepted (ConfigError naming the unaccepted ones), and
    each must be of the kind its default is (a number, an integer, a string, a bool);
    ``optional`` keywords the class does not take are left out. None values are never passed.
    A parameter without a default that is not given is a ConfigError naming it.
    """
    sig_params = inspect.signature(cls).parameters
    names, var_kw = _accepts(cls, sig_params)
    kwargs = {}
    for k, val in (optional or {}).items():
        if val is not None and (var_kw or k in names):
            kwargs[k] = val
    bad = []
    for k, val in (required or {}).items():
        if val is None:
            continue
        if var_kw or k in names:
            kwargs[k] = val
        else:
            bad.append(k)
    if bad:
        raise ConfigError(
            f"{cls.__name__} takes no parameter {', '.join(repr(b) for b in bad)}; "
            f"its parameters: {sorted(names)}"
        )
    for k, val in kwargs.items():
        _check_param_type(cls, k, val, sig_params)
    params = list(sig_params.values())
    missing = [p.name for p in params[len(args):]
               if p.default is inspect.Parameter.empty and p.name not in kwargs
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        raise ConfigError(
            f"{cls.__name__} needs {', '.join(repr(m) for m in missing)}: give "
            + " ".join(f"--param {m}=VALUE" for m in missing))
    return cls(*args, **kwargs)


def make_learner(method: str, *, seed=None, rank=None, tau=None, eps=None, probes=None,
                 params=None):
    """The learner of ``method`` with the given options.

    Parameters
    ----------
    method : str
        A key of :data:`METHODS`.
    seed : int or Generator, optional
        The learner's ``random_state``.
    rank, tau, eps, probes : optional
        Passed when given; an option the learner does not take raises ConfigError.
    params : dict, optional
        Further constructor parameters, by name.
    """
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose from {sorted(METHODS)}")
    cls = METHODS[method].load()
    required = {"rank": rank, "tau": tau, "eps": eps, "probes": probes, **(params or {})}
    return construct(cls, optional={"random_state": seed}, required=required)


class DeclaredApproximateOracle:
    """A user's black box taken as an approximate value oracle with a declared tolerance.

    Used when ``--method noisy`` is run against a real black box: its answers are already
    approximate, so no noise is added; ``tau`` is the tolerance the user declares.
    """

    kind = "approximate value"

    def __init__(self, fn, d: int, tau: float, budget: int | None = None):
        from .oracles import ValueOracle

        self._inner = ValueOracle(fn, d, budget=budget)
        self.tau = float(tau)

    def __call__(self, X):
        return self._inner(X)

    query = __call__

    def __getattr__(self, name):
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


def make_oracle(method: str, fn, d: int, *, budget=None, tau=None, noise=None, seed=None,
                simulated: bool = False):
    """The oracle ``method``'s learner needs, around the callable ``fn``.

    For a simulated head (``simulated=True``) the approximate value oracle adds noise of size
    ``tau`` (noise model ``noise``); for a user's black box its answers are taken as they are.
    """
    from . import oracles

    kind = METHODS[method].oracle
    if kind == "value":
        return oracles.ValueOracle(fn, d, budget=budget)
    if kind == "approximate value":
        if tau is None:
            raise ConfigError(f"--method {method} needs --tau (the answers' tolerance)")
        if not simulated:
            return DeclaredApproximateOracle(fn, d, tau, budget=budget)
        cls = getattr(oracles, "ApproximateValueOracle", None)
        if cls is None:
            raise ConfigError("ApproximateValueOracle is not available in this installation")
        return construct(cls, fn, d, optional={"budget": budget, "seed": seed,
                                                "random_state": seed},
                         required={"tau": tau, "noise": noise})
    cls = getattr(oracles, "MembershipOracle", None)
    if cls is None:
        raise ConfigError("MembershipOracle is not available in this installation")
    return construct(cls, fn, d, optional={"budget": budget})


def expected_queries(method: str, d: int, rank: int | None = None,
                     n_check: int = 0) -> int | None:
    """Queries a method is expected to ask, ``n_check`` check queries included (for the
    progress bar), or None if unknown."""
    if method == "exact":
        return d * d + d + n_check
    if method == "sketch" and rank is not None:
        return rank * (2 * d - rank) + d + n_check
    return None


class ProgressOracle:
    """A thin wrapper with the oracle interface that advances a progress bar on every batch.

    Everything but ``__call__`` is delegated to the wrapped oracle, so the counts and the budget
    are the wrapped oracle's own.
    """

    def __init__(self, oracle, bar):
        self._oracle = oracle
        self._bar = bar

    def __call__(self, X):
        y = self._oracle(X)
        self._bar.update(int(np.shape(X)[0]))
        return y

    query = __call__

    def __getattr__(self, name):
        if name in ("_oracle", "_bar"):
            raise AttributeError(name)
        return getattr(self._oracle, name)


def load_black_box(spec: str):
    """Import ``MODULE:FUNCTION`` (or ``path/to/file.py:FUNCTION``) and return the callable.

    A module is searched in the installed packages first and then in the current directory
    (appended to the end of ``sys.path``), so ``tests.fixtures:some_head`` works from the
    repository root while a file of the user's can never shadow a module the tool imports
    (a ``./tqdm.py`` stays the user's). A module named like an installed one is given by
    path. A path is loaded under a private module name, its folder appended to ``sys.path``
    for its own imports.
    """
    if ":" not in spec:
        raise ConfigError("--oracle must be MODULE:FUNCTION (e.g. "
                          f"examples.black_boxes:some_head); got {spec!r}")
    mod_name, _, attr = spec.rpartition(":")
    if not mod_name or not attr:
        raise ConfigError(f"--oracle must be MODULE:FUNCTION; got {spec!r}")
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        if not path.is_file():
            raise ConfigError(f"--oracle: file {path} does not exist")
        _append_path(str(path.resolve().parent))
        mspec = importlib.util.spec_from_file_location(f"_attnquery_box_{path.stem}", path)
        module = importlib.util.module_from_spec(mspec)
        with _guard_import(str(path)):
            mspec.loader.exec_module(module)
    else:
        _append_path(os.getcwd())
        try:
            with _guard_import(repr(mod_name)):
                module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise ConfigError(f"--oracle: cannot import module {mod_name!r}: {exc}") from None
    try:
        fn = getattr(module, attr)
    except AttributeError:
        where = getattr(module, "__file__", None)
        hint = "" if mod_name.endswith(".py") else (
            f"; a module of yours named like an installed one is given by path "
            f"(--oracle ./{mod_name.replace('.', '/')}.py:{attr})")
        raise ConfigError(f"--oracle: module {mod_name!r} ({where}) has no attribute "
                          f"{attr!r}{hint}") from None
    if not callable(fn):
        raise ConfigError(f"--oracle: {spec} is not callable (it is a {type(fn).__name__})")
    return fn


def _append_path(folder: str) -> None:
    """Put ``folder`` last on ``sys.path`` (installed packages keep precedence)."""
    if folder not in sys.path:
        sys.path.append(folder)


class _guard_import:
    """Turn whatever importing the user's module raises (SystemExit included) into a
    ConfigError naming it; ImportError passes through, to be named by the caller."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None or issubclass(exc_type, ImportError | KeyboardInterrupt):
            return False
        if issubclass(exc_type, Exception | SystemExit):
            raise ConfigError(f"--oracle: importing {self.what} failed: {exc_type.__name__}: "
                              f"{exc}") from None
        return False


def _learned_model(est, d: int):
    """The learner's estimate as a model: an AttentionHead (with the key bias and offset a
    ``fit_bias`` learner found), or a MultiHeadAttention for a layer learner."""
    from .models import AttentionHead, MultiHeadAttention

    heads = getattr(est, "heads_", None)
    if isinstance(heads, list) and heads and all(isinstance(h, AttentionHead) for h in heads):
        return MultiHeadAttention(heads, offset=float(getattr(est, "offset_", 0.0)))
    W = getattr(est, "W_", None)
    v = getattr(est, "v_", None)
    if W is None or v is None:
        raise ConfigError(f"{type(est).__name__} did not produce W_ and v_")
    c = getattr(est, "key_bias_", None)
    return AttentionHead(np.asarray(v, dtype=float).reshape(d), W=np.asarray(W, dtype=float),
                         key_bias=None if c is None else np.asarray(c, dtype=float),
                         offset=float(getattr(est, "offset_", 0.0)))


def _errors(learned, truth, d: int) -> dict:
    """Errors of a learned head or layer against the ground truth (simulations)."""
    from .metrics import functional_error, head_errors, layer_errors, relative_error
    from .models import MultiHeadAttention

    out = {}
    if isinstance(truth, MultiHeadAttention):
        if not isinstance(learned, MultiHeadAttention):
            raise ConfigError("the ground truth is a layer: extract it with --method layer")
        m = layer_errors([h.W for h in learned.heads], [h.v for h in learned.heads],
                         [h.key_bias for h in learned.heads], [h.W for h in truth.heads],
                         [h.v for h in truth.heads], [h.key_bias for h in truth.heads])
        out.update(rel_err_W=m["max_rel_err_W"], rel_err_v=m["max_rel_err_v"],
                   rel_err_c=m["max_rel_err_c"],
                   rel_err_W_heads=m["rel_err_W"].tolist(),
                   matched=m["perm"].tolist())
        out["rel_err_offset"] = relative_error(learned.total_offset, truth.total_offset)
    else:
        out.update(head_errors(learned.W, learned.v, truth.W, truth.v))
        if truth.has_bias or learned.has_bias:
            out["rel_err_c"] = relative_error(learned.key_bias, truth.key_bias)
            out["rel_err_offset"] = relative_error(learned.offset, truth.offset)
    out["func_err"] = functional_error(truth, learned, d, np.random.default_rng(0), n=64)
    return out


def run_extraction(method: str, fn, d: int, *, truth=None, budget=None, seed=None, rank=None,
                   tau=None, eps=None, probes=None, noise=None, params=None,
                   progress: bool = False, simulated: bool | None = None) -> tuple[dict, object]:
    """Run one extraction and return ``(summary, learned model)``.

    The learned model is an :class:`~attnquery.models.AttentionHead` (with the key bias and
    offset a ``fit_bias`` learner found) or, for ``method="layer"``, a
    :class:`~attnquery.models.MultiHeadAttention`. ``truth`` (a model of the same kind) adds
    the errors against it to the summary. ``simulated`` (default: whether ``truth`` is given)
    makes the approximate value oracle add its own noise to exact answers of ``fn``; a real
    black box's answers are taken as they are. The query count is the oracle's own (the
    learner's check queries included, and reported apart as ``n_verify_queries``); a run that
    reports 0 queries raises an error rather than printing 0. A learner whose check fails
    raises :class:`~attnquery.errors.ModelMismatchError`.
    """
    from .errors import BudgetExceededError
    from .models import AttentionHead, MultiHeadAttention

    if simulated is None:
        simulated = truth is not None
    oracle = make_oracle(method, fn, d, budget=budget, tau=tau, noise=noise, seed=seed,
                         simulated=simulated)
    learner = make_learner(method, seed=seed, rank=rank,
                           tau=tau if METHODS[method].oracle == "approximate value" else None,
                           eps=eps, probes=probes, params=params)
    from tqdm import tqdm

    total = expected_queries(method, d, rank, int(getattr(learner, "verify", 0) or 0))
    # a bar only when stderr is a terminal (never in logs or pipes), after 2 s
    show = progress and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    bar = tqdm(total=total, unit="query", unit_scale=True, file=sys.stderr, delay=2.0,
               disable=not show, desc=f"{method} d={d}", leave=False)
    t0 = time.perf_counter()
    try:
        learner.fit(ProgressOracle(oracle, bar))
    except BudgetExceededError as exc:
        raise BudgetExceededError(f"{exc} (raise --budget, or leave it out)") from None
    finally:
        bar.close()
    elapsed = time.perf_counter() - t0
    n = int(oracle.n_queries)
    if n <= 0:
        raise AttnQueryError(
            f"the oracle counted {n} queries for a completed {method} run; the count is wrong"
        )
    reported = getattr(learner, "n_queries_", None)
    if reported is not None and int(reported) != n:
        raise AttnQueryError(
            f"the learner reports {reported} queries but the oracle counted {n}"
        )
    learned = _learned_model(learner, d)
    heads = learned.heads if isinstance(learned, MultiHeadAttention) else (learned,)
    rank_found = getattr(learner, "rank_", None)
    if rank_found is None:
        W = learned.W
        sv = np.linalg.svd(W, compute_uv=False)
        tol = sv.max() * max(W.shape) * np.finfo(float).eps * 1e3 if sv.size and sv.max() else 0
        rank_found = int(np.sum(sv > tol))
    n_check = int(getattr(learner, "n_verify_queries_", 0) or 0)
    verify_error = float(getattr(learner, "verify_error_", float("nan")))
    summary = {
        "method": method,
        "learner": repr(learner),
        "d": d,
        "n_heads": len(heads),
        "n_queries": n,
        "n_verify_queries": n_check,
        "verify_error": verify_error if np.isfinite(verify_error) else None,
        "n_calls": int(getattr(oracle, "n_calls", 0)),
        "time_s": elapsed,
        "rank_found": int(rank_found),
        "W_fro": float(np.sqrt(sum(np.sum(h.W ** 2) for h in heads))),
        "fit_bias": bool(getattr(learner, "fit_bias", False)),
        "offset": float(learned.total_offset if isinstance(learned, MultiHeadAttention)
                        else learned.offset),
        "budget": budget,
    }
    if truth is not None:
        if METHODS[method].oracle == "membership":
            # membership answers fix v only up to a positive scale: compare directions
            norm = float(np.linalg.norm(truth.v))
            truth = AttentionHead(truth.v / norm, W=truth.W) if norm > 0 else truth
            summary["v_compared"] = "direction (v / ||v||)"
        summary.update(_errors(learned, truth, d))
    return summary, learned


# ----------------------------------------------------------------------------------------------
# Subcommands
# ----------------------------------------------------------------------------------------------


def _parse_params(items) -> dict:
    import yaml

    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--param must be KEY=VALUE; got {item!r}")
        k, _, val = item.partition("=")
        try:
            out[k.strip()] = yaml.safe_load(val)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--param {item}: the value is not readable ({_one_line(exc)})") \
                from None
    return out


def _one_line(exc) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split())


def _load_config(path):
    """:func:`attnquery.config.load_config`, with a malformed file as a ConfigError."""
    import yaml

    from .config import load_config

    try:
        return load_config(path)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_one_line(exc)}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None


def _print_json(obj) -> None:
    print(json.dumps(obj, sort_keys=True, default=lambda o: o.item() if hasattr(o, "item")
                     else str(o)))


def _check_out(path) -> None:
    """Usage error (before any work) when ``--out`` cannot be written."""
    from .results import check_writable

    try:
        check_writable(path)
    except OSError as exc:
        raise ConfigError(f"--out {path}: cannot write there ({_os_reason(exc)})") from None


def _write(save, what, path, model, /, **meta) -> None:
    """``save`` (:func:`~attnquery.realheads.save_head` or ``save_layer``, atomic) of the
    ``what`` ("head" or "layer"), with a failed write as an :class:`OutputError`."""
    try:
        save(path, model, **meta)
    except OSError as exc:
        raise OutputError(
            f"--out {path}: writing the {what} failed ({_os_reason(exc)}); nothing was written "
            "there (a file already there is unchanged)") from None


def _module_source(args):
    """``(black box, d, truth, source, learner params)`` for ``extract --module``."""
    from .realheads import ModuleBlackBox, build_head, build_layer, cached_checkpoint

    if args.layer is None:
        raise ConfigError("--module needs --layer (the layer to extract, from 0)")
    kind, index = args.readout
    readout_seed = index if kind == "coordinate" else args.readout_seed
    biases = not args.no_biases
    try:
        ckpt = cached_checkpoint(args.module, args.n_heads)
        box = ModuleBlackBox(args.module, args.layer, args.head, biases=biases,
                             n_heads=args.n_heads, readout=kind, readout_seed=readout_seed)
        if args.head is None:
            truth = build_layer(ckpt, args.layer, box.r, biases=biases)
        else:
            truth = build_head(ckpt, args.layer, args.head, box.r, biases=biases)
    except ModelError as exc:
        raise ConfigError(f"--module: {exc}") from None
    params = {}
    if args.head is None:
        if args.method not in (None, "layer"):
            raise ConfigError(f"--method {args.method} learns one head; without --head the box "
                              "is the whole layer: give --head H, or --method layer")
        args.method = "layer"
        params = {"n_heads": ckpt.n_heads, "fit_bias": biases}
        if args.rank is None:
            args.rank = ckpt.d_head
    else:
        args.method = args.method or "exact"
        if args.method == "layer":
            raise ConfigError("--method layer learns a whole layer: leave out --head")
        if biases and args.method not in BIAS_METHODS:
            raise ConfigError(f"the module's head has biases, which --method {args.method} does "
                              "not fit: use --method exact or sketch, or drop the biases with "
                              "--no-biases (the paper's head)")
        if biases:
            params = {"fit_bias": True}
    what = f"layer {args.layer}" + ("" if args.head is None else f" head {args.head}")
    source = f"{args.module} ({what}, {ckpt.style}-style, readout {kind}:{readout_seed}, " \
             f"{'with' if biases else 'without'} biases)"
    return box, box.d, truth, source, params


def cmd_extract(args) -> int:
    from .realheads import load_head, save_head, save_layer

    module_only = [name for name in ("layer", "head", "n_heads") if getattr(args, name) is not None]
    module_only += ["no_biases"] if args.no_biases else []
    if args.module is None and module_only:
        opts = ", ".join("--" + n.replace("_", "-") for n in module_only)
        raise ConfigError(f"{opts}: only with --module (a checkpoint's attention module)")
    if args.out is not None:
        _check_out(args.out)  # before any query is spent
    truth = None
    meta = {}
    params = _parse_params(args.param)
    simulated = None
    if args.module is not None:
        fn, d, truth, source, extra = _module_source(args)
        for k, val in extra.items():
            params.setdefault(k, val)
        simulated = False  # a real module: its answers are taken as they are
        if args.d is not None and args.d != d:
            raise ConfigError(f"--d {args.d} does not match the module (d = {d})")
    elif args.model is not None:
        try:
            truth, meta = load_head(args.model)
        except ModelError as exc:
            raise ConfigError(f"--model: {exc}") from None
        if args.d is not None and args.d != truth.d:
            raise ConfigError(f"--d {args.d} does not match the head in {args.model} "
                              f"(d = {truth.d})")
        fn, d = truth, truth.d
        source = str(args.model)
    else:
        if args.d is None:
            raise ConfigError("--d is required with --oracle (the black box's token dimension)")
        fn, d = load_black_box(args.oracle), args.d
        source = args.oracle
    method = args.method or "exact"
    progress = not args.no_progress
    summary, learned = run_extraction(
        method, fn, d, truth=truth, budget=args.budget, seed=args.seed, rank=args.rank,
        tau=args.tau, eps=args.eps, probes=args.probes, noise=args.noise,
        params=params, progress=progress, simulated=simulated,
    )
    summary["source"] = source
    layer = method == "layer"
    if args.out is not None:
        _write(save_layer if layer else save_head, "layer" if layer else "head", args.out,
               learned, method=method, n_queries=summary["n_queries"], source=source)
        summary["out"] = str(args.out)
    if args.json:
        _print_json(summary)
        return 0
    what = (f"a layer of {summary['n_heads']} heads of rank {summary['rank_found']}"
            if layer else "a head")
    lines = [
        f"extracted {what} of dimension d = {d} from {source} with --method {method}",
        f"  queries        {summary['n_queries']} (counted by the oracle, "
        f"{summary['n_calls']} batches: {summary['n_queries'] - summary['n_verify_queries']} to "
        f"learn, {summary['n_verify_queries']} to check the result)",
        f"  time           {summary['time_s']:.2f} s",
    ]
    if not layer:
        lines.append(f"  rank found     {summary['rank_found']}")
    lines.append(f"  ||W||_F        {summary['W_fro']:.6g}" + (" (all heads)" if layer else ""))
    if summary["fit_bias"]:
        lines.append(f"  offset beta    {summary['offset']:.6g} (key bias and offset fitted)")
    if summary["verify_error"] is not None:
        lines.append(f"  check          answers and the result agree to "
                     f"{summary['verify_error']:.1e} (relative) on "
                     f"{summary['n_verify_queries']} fresh queries")
    if truth is not None:
        against = " (against the checkpoint's weights)" if args.module is not None else ""
        heads = " (worst head, matched)" if layer else ""
        lines += [
            f"  rel. error W   {summary['rel_err_W']:.3e}{heads}{against}",
            f"  rel. error v   {summary['rel_err_v']:.3e}{heads}",
        ]
        if "rel_err_c" in summary:
            lines += [f"  rel. error c   {summary['rel_err_c']:.3e}{heads}",
                      f"  rel. error beta {summary['rel_err_offset']:.3e}"]
        lines.append(f"  func. error    {summary['func_err']:.3e} (held-out random inputs)")
        if meta:
            lines.insert(1, "  ground truth   " + ", ".join(f"{k}={v}" for k, v in meta.items()))
    if args.out is not None:
        lines.append(f"  saved          {args.out} "
                     + ("(v, c, K, Q per head, beta: attnquery.realheads.load_layer)" if layer
                        else "(v, W" + (", c, beta)" if learned.has_bias else ")")))
    print("\n".join(lines))
    return 0


def _readout(text: str) -> tuple[str, int | None]:
    if text in ("gaussian", "ones"):
        return text, None
    try:
        return "coordinate", int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--readout must be 'gaussian', 'ones' or a coordinate index; got {text!r}"
        ) from None


def cmd_heads(args) -> int:
    from .realheads import build_head, head_summary, load_checkpoint, readout_vector, save_head

    _check_out(args.out)
    ckpt = load_checkpoint(args.checkpoint, n_heads=args.n_heads)
    kind, index = args.readout
    seed = index if kind == "coordinate" else args.seed
    r = readout_vector(ckpt.d, kind, seed)
    head = build_head(ckpt, args.layer, args.head, r)
    _write(save_head, "head", args.out, head, checkpoint=str(args.checkpoint),
           style=ckpt.style, layer=args.layer, head=args.head, n_heads=ckpt.n_heads,
           readout=kind, readout_seed=int(seed))
    s = head_summary(head)
    s.update({"checkpoint": str(args.checkpoint), "style": ckpt.style, "layer": args.layer,
              "head": args.head, "n_layers": ckpt.n_layers, "n_heads": ckpt.n_heads,
              "d_head": ckpt.d_head, "readout": kind, "readout_seed": int(seed),
              "out": str(args.out)})
    if args.json:
        _print_json(s)
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


def cmd_validate(args) -> int:
    cfg = _load_config(args.config)
    problems = _validate(args.results_dir, cfg)
    if args.json:
        _print_json({"results_dir": str(args.results_dir), "config": str(args.config),
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
    """:func:`attnquery.validate.validate_results`; a table too damaged for its row checks is
    reported by its schema problems instead of stopping the command."""
    from .validate import validate_results

    try:
        return validate_results(results_dir, cfg)
    except (KeyError, ValueError, TypeError, OSError) as exc:
        import pyarrow.parquet as pq

        from .results import RESULT_SCHEMA, TIMING_SCHEMA, is_timing_table
        from .validate import check_table_schema

        problems = []
        for path in sorted(Path(results_dir).glob("*.parquet")):
            schema = TIMING_SCHEMA if is_timing_table(path) else RESULT_SCHEMA
            try:
                problems += check_table_schema(pq.read_schema(path), schema, path.name)
            except Exception as err:  # noqa: BLE001 - any unreadable file is a problem to list
                problems.append(f"{path.name}: unreadable Parquet file ({_one_line(err)})")
        return problems or [f"{results_dir}: the tables cannot be checked "
                            f"({type(exc).__name__}: {_one_line(exc)})"]


#: what an OSError means, by errno
_OS_REASONS = {errno.EISDIR: "it is a folder", errno.ENOTDIR: "a parent is not a folder",
               errno.EACCES: "permission denied", errno.EPERM: "permission denied",
               errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on the device",
               errno.ENOENT: "no such file or folder"}


def _os_reason(exc: OSError) -> str:
    """An OSError in words: what it means, and where."""
    reason = _OS_REASONS.get(exc.errno, exc.strerror or _one_line(exc))
    where = exc.filename
    return f"{reason}: {where}" if where else reason


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    out = {"attnquery": __version__, "python": sys.version.split()[0]}
    for pkg in ("numpy", "scipy", "cvxpy", "pyarrow", "pandas", "safetensors", "snakemake",
                "matplotlib"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def cmd_info(args) -> int:
    from .results import SCHEMA_VERSION

    info = {
        "versions": _versions(),
        "schema_version": SCHEMA_VERSION,
        "methods": {k: {"learner": m.cls, "oracle": m.oracle, "available": m.available,
                        "description": m.description} for k, m in METHODS.items()},
    }
    cfg_path = Path(args.config)
    if cfg_path.exists():
        from .config import enabled_experiments

        cfg = _load_config(cfg_path)
        from .config import check_config
        from .study import study_size

        cells = check_config(cfg)
        enabled = enabled_experiments(cfg)
        size = study_size(cfg, cells)
        info["config"] = str(cfg_path)
        info["experiments"] = {
            name: {"enabled": name in enabled, "cells": len(cells.get(name, [])),
                   **size.get(name, {})}
            for name in cfg["experiments"]
        }
    else:
        info["config"] = f"{cfg_path} (not found)"
    if args.json:
        _print_json(info)
        return 0
    v = info["versions"]
    print("attnquery " + v["attnquery"] + f" (result schema version {SCHEMA_VERSION})")
    print("  " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "attnquery"))
    print("methods:")
    for k, m in info["methods"].items():
        mark = "available" if m["available"] else "not available"
        print(f"  {k:<11} {m['learner']} ({m['oracle']} oracle), {mark}: {m['description']}")
    print(f"config: {info['config']}")
    exps = info.get("experiments", {})
    if exps:
        print("  run from scratch: one job per shard; CPU-hours from each experiment's measured\n"
              "  cost model; runtime requests include the safety factor (config key resources)")
        print(f"  {'experiment':<18} {'state':<8} {'cells':>7} {'jobs':>5} {'CPU-hours':>10} "
              f"{'largest request':>16}")
    for name, e in exps.items():
        if not e["enabled"]:
            print(f"  {name:<18} {'disabled':<8} {e['cells']:>7}")
            continue
        print(f"  {name:<18} {'enabled':<8} {e['cells']:>7} {e['jobs']:>5} "
              f"{e['cpu_hours']:>10.3f} {e['max_request_min']:>12} min")
    if any(e["enabled"] for e in exps.values()):
        on = [e for e in exps.values() if e["enabled"]]
        print(f"  {'total':<18} {'':<8} {sum(e['cells'] for e in on):>7} "
              f"{sum(e['jobs'] for e in on):>5} {sum(e['cpu_hours'] for e in on):>10.3f} "
              f"{max(e['max_request_min'] for e in on):>12} min")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line (exit status 2)."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            val = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if val < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}; got {val}")
        return val

    parse.__name__ = f"integer >= {low}"
    return parse


def _positive_float(text: str) -> float:
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (np.isfinite(val) and val > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number; got {text}")
    return val


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .oracles import ApproximateValueOracle

    p = _Parser(
        prog="attnquery",
        description="Learn attention heads from queries (Bhattamishra et al., ICML 2026).",
    )
    p.add_argument("--version", action="version", version=f"attnquery {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = sub.add_parser(
        "extract", help="extract the parameters of a black box, a saved head or a checkpoint's "
        "attention module",
        description="Extract the parameters (W, v) of an attention head from queries, or every "
        "head of a whole layer (--method layer). The black box is a Python callable taking a "
        "float64 array (B, N, d) and returning (B,), or the attention module of a safetensors "
        "checkpoint (--module).",
    )
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--oracle", metavar="MODULE:FUNCTION",
                     help="the black box, e.g. examples.black_boxes:some_head (a path "
                     "file.py:FUNCTION works too)")
    src.add_argument("--model", metavar="HEAD.npz", type=Path,
                     help="a head saved by 'attnquery heads': run in simulation and report errors")
    src.add_argument("--module", metavar="CHECKPOINT", type=Path,
                     help="the self-attention module of layer --layer of a BERT- or GPT-2-style "
                     ".safetensors checkpoint, with its biases, read out along a vector r: one "
                     "head (--head) or the whole layer; errors are reported against its weights")
    e.add_argument("--d", type=_int_at_least(1), help="token dimension of the black box "
                   "(required with --oracle)")
    e.add_argument("--method", choices=sorted(METHODS),
                   help="learner (default: exact; layer for --module without --head)")
    e.add_argument("--out", type=Path, help="write the learned head (v, W) to this .npz")
    e.add_argument("--budget", type=_int_at_least(0), help="maximum number of queries, the "
                   "check queries included (checked before they are spent)")
    e.add_argument("--seed", type=_int_at_least(0), default=0,
                   help="seed of the learner's random probes and check queries (default 0)")
    e.add_argument("--rank", type=_int_at_least(0), help="rank of W (sketch, nuclear)")
    e.add_argument("--tau", type=_positive_float, help="answer tolerance (noisy)")
    e.add_argument("--noise", choices=ApproximateValueOracle.NOISE_MODELS,
                   help="noise model of the simulated approximate oracle (noisy with --model)")
    e.add_argument("--eps", type=_positive_float, help="target accuracy (membership)")
    e.add_argument("--probes", help="probe design (exact: basis, the default; gaussian, the "
                   "paper's Theorem 4.1; orthogonal)")
    e.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="further learner parameter (repeatable)")
    m = e.add_argument_group("with --module")
    m.add_argument("--layer", type=_int_at_least(0), help="layer index (from 0); required")
    m.add_argument("--head", type=_int_at_least(0),
                   help="one head of the layer (the others removed); default: the whole layer")
    m.add_argument("--n-heads", type=_int_at_least(1), help="heads per layer (default: "
                   "config.json beside the checkpoint)")
    m.add_argument("--readout", type=_readout, default=("gaussian", None),
                   help="readout vector r: 'gaussian' (the default), 'ones' or a coordinate index")
    m.add_argument("--readout-seed", type=_int_at_least(0), default=0,
                   help="seed of the Gaussian readout (default 0)")
    m.add_argument("--no-biases", action="store_true",
                   help="drop the module's biases (the paper's head; any method)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")
    e.set_defaults(func=cmd_extract)

    h = sub.add_parser(
        "heads", help="build a ground-truth head from a safetensors checkpoint",
        description="Build head H of layer L of a BERT- or GPT-2-style safetensors checkpoint: "
        "W = W_K,h^T W_Q,h / sqrt(d_h), v = W_V,h^T u_h with u_h head h's slice of W_O^T r "
        "for a readout vector r; biases dropped.",
    )
    h.add_argument("checkpoint", type=Path, help="a .safetensors file")
    h.add_argument("--layer", type=_int_at_least(0), required=True,
                   help="layer index (from 0)")
    h.add_argument("--head", type=_int_at_least(0), required=True,
                   help="head index within the layer")
    h.add_argument("--out", type=Path, required=True, help="output .npz")
    h.add_argument("--n-heads", type=_int_at_least(1), help="heads per layer (default: "
                   "config.json beside the checkpoint)")
    h.add_argument("--readout", type=_readout, default=("gaussian", None),
                   help="readout vector r: 'gaussian' (seeded unit vector, the default), 'ones' "
                   "(normalised) or a coordinate index")
    h.add_argument("--seed", type=_int_at_least(0), default=0,
                   help="seed of the Gaussian readout (default 0)")
    h.add_argument("--json", action="store_true", help="print one JSON object")
    h.set_defaults(func=cmd_heads)

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
    v.set_defaults(func=cmd_validate)

    i = sub.add_parser("info", help="versions, available learners and configured experiments",
                       description="Print versions, the learners available to --method and the "
                       "experiments of a configuration.")
    i.add_argument("--config", type=Path, default=Path("config/config.yaml"),
                   help="study configuration (default config/config.yaml)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=cmd_info)
    return p


def main(argv=None) -> int:
    """Entry point of the ``attnquery`` command; returns the exit status.

    0: success; 1: the extraction or check failed (the black box raised or answered badly, the
    budget is too small, the answers are not what the learner assumes, an output could not be
    written); 2: a usage error (bad option, unknown name, missing learner parameter, unreadable
    input file); 130: interrupted. Every error is one line on stderr, never a traceback
    (``ATTNQUERY_TRACEBACK=1`` shows one for an unexpected error).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    prefix = f"attnquery {args.command}: "
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        _say(prefix + "error: " + _one_line(exc))
        return EXIT_USAGE
    except AttnQueryError as exc:
        _say(prefix + f"error: {_one_line(exc)} ({type(exc).__name__})")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        _say(prefix + "interrupted (KeyboardInterrupt)")
        return EXIT_INTERRUPTED
    except SystemExit as exc:
        _say(prefix + f"error: SystemExit({exc.code!r}) was raised while running the command")
        return EXIT_FAILURE
    except Exception as exc:  # the last resort: one line, never a traceback
        if os.environ.get("ATTNQUERY_TRACEBACK"):
            raise
        _say(prefix + f"unexpected error: {type(exc).__name__}: {_one_line(exc)} (set "
             "ATTNQUERY_TRACEBACK=1 to see where)")
        return EXIT_FAILURE


def _say(line: str) -> None:
    print(line, file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
