"""Extraction as a library: the learners reachable by name, black boxes, oracles, one run.

What ``attnquery extract`` does, without the command line:

* :data:`METHODS` maps a method name (``--method``) to its learner: the learner registry's
  (:mod:`attnquery.learners._registry`), built-in learners and plug-ins of the entry-point group
  ``attnquery.learners``; a plug-in is imported only when used, so one that fails fails with a
  clear message naming it while the others work. :data:`BIAS_METHODS` are the methods whose
  spec says they fit a module head's key bias and offset;
  :func:`make_learner` builds one with checked parameters (:func:`construct`);
* :func:`load_black_box` imports a user's black box given as ``MODULE:FUNCTION`` or
  ``path/to/file.py:FUNCTION``; :func:`black_box_files` names the files it would run, without
  running them;
* :func:`make_oracle` puts the oracle a method needs around a callable (the paper's value
  oracle, Section 3; approximate value oracle, Section 6; membership oracle, Appendix B);
* :func:`run_extraction` runs one :class:`ExtractionSpec` and returns its summary and the
  learned model.

Every failure is an :class:`~attnquery.errors.AttnQueryError`: a :class:`ConfigError` for what
the caller asked wrongly (an unknown name, a missing or ill-typed learner parameter, a black box
that cannot be imported), another subclass for a run that failed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from . import theory
from ._truth_errors import _errors, _form
from .blackbox import black_box_files, load_black_box
from .errors import AttnQueryError, ConfigError
from .learners._registry import loads
from .oracles import ForwardingOracle

# METHODS and BIAS_METHODS are made from the learner registry when first asked for (__getattr__)
__all__ = ["METHODS", "Method", "methods", "BIAS_METHODS", "REPORTABLE", "construct",  # noqa: F822
           "make_learner", "make_oracle",
           "DeclaredApproximateOracle", "ProgressOracle", "expected_queries", "load_black_box",
           "black_box_files", "ExtractionSpec", "run_extraction"]


#: what ``attnquery extract`` can report and save: one head, a layer, a rotary head
REPORTABLE = ("head", "layer", "rotary head", "vector layer")


@dataclass(frozen=True)
class Method:
    """A learner reachable from ``--method``: where its class lives, what oracle it needs, what
    it returns (``"head"``, ``"layer"`` or ``"rotary head"``) and whether it fits a module head's
    key bias and offset. :func:`methods` makes one from each registry entry
    (:mod:`attnquery.learners._registry`)."""

    module: str
    cls: str
    oracle: str  # "value", "approximate value", "membership" or "vector"
    description: str
    returns: str = "head"
    fits_bias: bool = False

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

    available = property(loads, doc="Whether :meth:`load` succeeds.")


class _PluginMethod:
    """The :class:`Method` of a plug-in learner: its class is imported, and its spec read, only
    when a field is first asked for; a plug-in that cannot be loaded, or returns what the command
    line cannot report, raises a ConfigError naming it then (and is not :attr:`available`)."""

    def __init__(self, entry):
        self._entry = entry

    module = property(lambda self: self._entry.module)
    cls = property(lambda self: self._entry.qualname)

    @property
    def _spec(self):
        spec = self._entry.spec
        if not spec.command_line or spec.returns not in REPORTABLE:
            raise ConfigError(f"learner {spec.name!r} ({self._entry.where()}) returns a "
                              f"{spec.returns}: attnquery extract reports a "
                              f"{', a '.join(REPORTABLE)}")
        return spec

    oracle = property(lambda self: self._spec.oracle)
    description = property(lambda self: self._spec.description)
    returns = property(lambda self: self._spec.returns)
    fits_bias = property(lambda self: self._spec.fits_bias)

    def load(self):
        """Import and return the learner class (ConfigError naming the plug-in if it cannot)."""
        self._spec  # noqa: B018 (refused here too when the command line cannot report it)
        return self._entry.load()

    available = property(loads, doc="Whether :meth:`load` succeeds.")

    def __repr__(self) -> str:
        return f"_PluginMethod({self._entry.name!r}, {self._entry.target!r})"


_METHODS: dict[str, Method] | None = None


def methods() -> dict[str, Method]:
    """``--method`` name -> :class:`Method`: the registry's learners that the command line
    offers (a spec with ``command_line`` that returns a head, a layer or a rotary head), built
    in first, then every plug-in (imported when it is used). Built once per process; the same
    dict as :data:`METHODS`."""
    global _METHODS
    if _METHODS is None:
        from .learners._registry import registry

        out: dict[str, Method] = {}
        for name, entry in registry().items():
            if entry.plugin:
                out[name] = _PluginMethod(entry)
                continue
            spec = entry.spec
            if spec.command_line and spec.returns in REPORTABLE:
                out[name] = Method(entry.module, entry.qualname, spec.oracle, spec.description,
                                   spec.returns, spec.fits_bias)
        _METHODS = out
    return _METHODS


def __getattr__(name):
    # METHODS and BIAS_METHODS are read from the learner registry when first asked for
    if name == "METHODS":
        return methods()
    if name == "BIAS_METHODS":  # every plug-in is imported (one that cannot be is left out)
        return tuple(k for k, m in methods().items() if m.available and m.fits_bias)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    each must satisfy the class's declared ``_parameter_constraints`` (a learner's), or else
    be of the kind its default is (a number, an integer, a string, a bool);
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
    declared = getattr(cls, "_parameter_constraints", {})  # a learner's (learners/_params.py)
    if declared:
        from .learners._params import validate_parameter_constraints

        validate_parameter_constraints(declared, kwargs, getattr(cls, "_parameter_errors", {}))
    for k, val in kwargs.items():
        if k not in declared:
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
    if method not in methods():
        raise ConfigError(f"unknown method {method!r}; choose from {sorted(methods())}")
    cls = methods()[method].load()
    required = {"rank": rank, "tau": tau, "eps": eps, "probes": probes, **(params or {})}
    return construct(cls, optional={"random_state": seed}, required=required)


class DeclaredApproximateOracle(ForwardingOracle):
    """A user's black box taken as an approximate value oracle with a declared tolerance.

    Used when ``--method noisy`` is run against a real black box: its answers are already
    approximate, so no noise is added; ``tau`` is the tolerance the user declares. The count
    and the budget are the wrapped value oracle's
    (:class:`~attnquery.oracles.ForwardingOracle`).
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
                simulated: bool = False, outputs: str | None = None):
    """The oracle ``method``'s learner needs, around the callable ``fn``.

    For a simulated head (``simulated=True``) the approximate value oracle adds noise of size
    ``tau`` (noise model ``noise``); for a user's black box its answers are taken as they are.
    A vector method's oracle answers every token's output vector (``outputs="all"``) or the
    last token's (``"last"``); another method's oracle takes no ``outputs``.
    """
    from . import oracles

    kind = methods()[method].oracle
    if (kind == "vector") != (outputs is not None):
        raise ConfigError(f"--method {method} needs --answers all|last (a box that answers "
                          "vectors)" if kind == "vector" else
                          f"--answers {outputs}: a box that answers vectors is learnt by "
                          f"--method vector, not {method}")
    if kind == "vector":
        if outputs not in oracles.VectorOracle.OUTPUTS:
            raise ConfigError(f"--answers must be one of {oracles.VectorOracle.OUTPUTS}; got "
                              f"{outputs!r}")
        return oracles.VectorOracle(fn, d, outputs=outputs, budget=budget)
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
    progress bar), or None if unknown: Theorem 4.1's ``d^2 + d`` for ``exact``, the
    degrees-of-freedom floor ``r (2d - r) + d`` for ``sketch`` (:mod:`attnquery.theory`)."""
    if method == "exact":
        return theory.exact_queries(d) + n_check
    if method == "sketch" and rank is not None:
        return theory.lowrank_floor(d, rank) + n_check
    return None


class ProgressOracle(ForwardingOracle):
    """A thin wrapper with the oracle interface that advances a progress bar on every batch.

    Everything but ``__call__`` is delegated to the wrapped oracle, so the kind, the counts and
    the budget are the wrapped oracle's own
    (:class:`~attnquery.oracles.ForwardingOracle`).
    """

    def __init__(self, oracle, bar):
        self._inner = oracle
        self._bar = bar

    def __call__(self, X):
        y = self._inner(X)
        self._bar.update(int(np.shape(X)[0]))
        return y

    query = __call__

    def __getattr__(self, name):
        if name in ("_inner", "_bar"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def _learned_model(est, d: int, returns: str):
    """The learner's estimate as the model its spec says it returns (``returns``): an
    AttentionHead (with the key bias and offset a ``fit_bias`` learner found), a
    MultiHeadAttention for a layer, the RotaryAttentionHead of a rotary learner, or the
    VectorAttentionLayer of a vector learner (:func:`~attnquery.models.vector.bilinear_layer` of
    its ``W_``, ``key_bias_``, ``V_`` and ``output_bias_``)."""
    from .models import AttentionHead, MultiHeadAttention, RotaryAttentionHead

    what = type(est).__name__
    if returns == "vector layer":
        from .models.vector import bilinear_layer

        if getattr(est, "rotary_", None) is not None:  # positions="rotary": the forms
            return est.rotary_.form_layer()
        return bilinear_layer(est.W_, est.key_bias_, est.V_, est.output_bias_,
                              causal=bool(est.causal), outputs=est.outputs_)
    if returns == "rotary head":
        head = getattr(est, "head_", None)
        if not isinstance(head, RotaryAttentionHead):
            raise ConfigError(f"{what} returns a rotary head but did not produce head_")
        return head
    if returns == "layer":
        heads = getattr(est, "heads_", None)  # rotary heads with positions="rotary"
        if not (isinstance(heads, list) and heads and (
                all(isinstance(h, AttentionHead) for h in heads)
                or all(isinstance(h, RotaryAttentionHead) for h in heads))):
            raise ConfigError(f"{what} returns a layer but did not produce heads_")
        return MultiHeadAttention(heads, offset=float(getattr(est, "offset_", 0.0)))
    if returns != "head":
        raise ConfigError(f"{what} returns a {returns}: attnquery extract reports a "
                          f"{', a '.join(REPORTABLE)}")
    W = getattr(est, "W_", None)
    v = getattr(est, "v_", None)
    if W is None or v is None:
        raise ConfigError(f"{what} did not produce W_ and v_")
    c = getattr(est, "key_bias_", None)  # a head's key bias and offset, where it fits them
    return AttentionHead(np.asarray(v, dtype=float).reshape(d), W=np.asarray(W, dtype=float),
                         key_bias=None if c is None else np.asarray(c, dtype=float),
                         offset=float(getattr(est, "offset_", 0.0)))


@dataclass(frozen=True)
class ExtractionSpec:
    """One extraction: the learner, the black box, and the run's options.

    Parameters
    ----------
    method : str
        A key of :data:`METHODS`.
    fn : callable
        The black box: a float64 array (B, N, d) -> (B,).
    d : int
        Token dimension.
    truth : AttentionHead or MultiHeadAttention, optional
        The ground truth (a model of the kind the method learns): the summary then holds the
        errors against it.
    budget : int, optional
        Maximum number of queries, the check queries included.
    seed : int, optional
        The learner's ``random_state`` (and the simulated noise's seed).
    rank, tau, eps, probes : optional
        Learner options, passed when given; one the learner does not take is a ConfigError.
    noise : str, optional
        Noise model of a simulated approximate value oracle.
    params : mapping, optional
        Further learner constructor parameters, by name.
    progress : bool
        Show a progress bar on stderr (only when it is a terminal).
    simulated : bool, optional
        Whether the approximate value oracle adds its own noise to exact answers of ``fn``
        (default: whether ``truth`` is given); a real black box's answers are taken as they
        are.
    outputs : {"all", "last"}, optional
        For ``method="vector"`` (and only then): ``fn`` answers every token's output vector,
        ``(B, N, d_out)``, or the last token's, ``(B, d_out)``.
    """

    method: str
    fn: Callable
    d: int
    truth: object = None
    budget: int | None = None
    seed: int | None = None
    rank: int | None = None
    tau: float | None = None
    eps: float | None = None
    probes: str | None = None
    noise: str | None = None
    params: Mapping = field(default_factory=dict)
    progress: bool = False
    simulated: bool | None = None
    outputs: str | None = None

    def __post_init__(self):
        if self.method not in methods():
            raise ConfigError(f"unknown method {self.method!r}; choose from "
                              f"{sorted(methods())}")

    @property
    def simulates_noise(self) -> bool:
        """Whether the approximate value oracle adds noise (``simulated``, else ``truth``)."""
        return self.truth is not None if self.simulated is None else bool(self.simulated)


def run_extraction(spec: ExtractionSpec) -> tuple[dict, object]:
    """Run one extraction and return ``(summary, learned model)``.

    The learned model is an :class:`~attnquery.models.AttentionHead` (with the key bias and
    offset a ``fit_bias`` learner found) or, for ``method="layer"``, a
    :class:`~attnquery.models.MultiHeadAttention`. ``spec.truth`` (a model of the same kind)
    adds the errors against it to the summary. The query count is the oracle's own (the
    learner's check queries included, and reported apart as ``n_verify_queries``); a run that
    reports 0 queries raises an error rather than printing 0. A learner whose check fails
    raises :class:`~attnquery.errors.ModelMismatchError`.
    """
    from tqdm import tqdm

    from .errors import BudgetExceededError

    method, d = spec.method, spec.d
    approximate = methods()[method].oracle == "approximate value"
    oracle = make_oracle(method, spec.fn, d, budget=spec.budget, tau=spec.tau, noise=spec.noise,
                         seed=spec.seed, simulated=spec.simulates_noise, outputs=spec.outputs)
    learner = make_learner(method, seed=spec.seed, rank=spec.rank,
                           tau=spec.tau if approximate else None, eps=spec.eps,
                           probes=spec.probes, params=dict(spec.params))
    vector = methods()[method].oracle == "vector"
    total = expected_queries(method, d, spec.rank, int(getattr(learner, "verify", 0) or 0))
    # a bar only when stderr is a terminal (never in logs or pipes), after 2 s
    show = spec.progress and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
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
    n = _counted_queries(method, oracle, learner)
    learned = _learned_model(learner, d, methods()[method].returns)
    summarize = _vector_summary if vector else _summary
    summary = summarize(spec, learner, oracle, learned, n, elapsed)
    if spec.truth is not None:
        summary.update(_errors_against(method, learned, spec.truth, d))
    return summary, learned


def _counted_queries(method: str, oracle, learner) -> int:
    """The oracle's query count, checked: never 0 for a completed run, and equal to the count
    the learner reports."""
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
    return n


def _summary(spec: ExtractionSpec, learner, oracle, learned, n: int, elapsed: float) -> dict:
    """What a run found and spent, without the errors against a ground truth."""
    from .models import MultiHeadAttention

    layer = isinstance(learned, MultiHeadAttention)
    heads = learned.heads if layer else (learned,)
    rank_found = getattr(learner, "rank_", None)
    if rank_found is None:
        W = learned.W
        sv = np.linalg.svd(W, compute_uv=False)
        tol = sv.max() * max(W.shape) * np.finfo(float).eps * 1e3 if sv.size and sv.max() else 0
        rank_found = int(np.sum(sv > tol))
    verify_error = float(getattr(learner, "verify_error_", float("nan")))
    return {
        "method": spec.method,
        "learner": repr(learner),
        "d": spec.d,
        "n_heads": len(heads),
        "n_queries": n,
        "n_verify_queries": int(getattr(learner, "n_verify_queries_", 0) or 0),
        "verify_error": verify_error if np.isfinite(verify_error) else None,
        "n_calls": int(getattr(oracle, "n_calls", 0)),
        "time_s": elapsed,
        "rank_found": int(rank_found),
        "W_fro": float(np.sqrt(sum(np.sum(_form(h, 0) ** 2) for h in heads))),
        "fit_bias": bool(getattr(learner, "fit_bias", False)),
        "offset": float(learned.total_offset if layer else learned.offset),
        "budget": spec.budget,
        **_rotary_summary(learner),
    }


def _vector_summary(spec: ExtractionSpec, learner, oracle, learned, n: int,
                    elapsed: float) -> dict:
    """What a vector learner's run found and spent: queries and tokens, per stage too."""
    verify_error = float(getattr(learner, "verify_error_", float("nan")))
    if learned.rotary:  # the rotary routes: their frequencies and heads' groups, no W
        shape = {"positions": "rotary", "n_kv_heads": int(learned.n_kv_heads),
                 "head_groups": learned.head_groups.tolist(),
                 "frequencies": learned.frequencies.tolist()}
    else:
        shape = {"positions": "none", "rank_found": int(learner.rank_),
                 "tokens_per_query": int(learner.tokens_per_query_),
                 "W_fro": float(np.linalg.norm(learner.W_))}
    return {
        "method": spec.method,
        "learner": repr(learner),
        "d": spec.d,
        "d_out": int(learned.d_out),
        "answers": spec.outputs,
        "n_heads": int(learned.n_heads),
        "n_queries": n,
        "n_tokens": int(oracle.n_tokens),
        "n_queries_by_stage": {k: int(v) for k, v in learner.n_queries_by_stage_.items()},
        "n_verify_queries": int(learner.n_verify_queries_),
        "verify_error": verify_error if np.isfinite(verify_error) else None,
        "n_calls": int(getattr(oracle, "n_calls", 0)),
        "time_s": elapsed,
        "V_fro": float(np.linalg.norm(learner.V_)),
        "fit_bias": bool(learner.fit_bias),
        "causal": bool(learner.causal),
        "budget": spec.budget,
        **shape,
    }


def _rotary_summary(learner) -> dict:
    """The rotated dimensions and frequencies a rotary learner found (empty for the others)."""
    freqs = getattr(learner, "frequencies_", None)
    if freqs is None:
        return {}
    return {"rotary_dim": int(learner.rotary_dim_),
            "frequencies": [float(t) for t in np.asarray(freqs)]}


def _errors_against(method: str, learned, truth, d: int) -> dict:
    """The errors of ``learned`` against ``truth``; a membership learner's v against the
    direction of the truth's (membership answers fix v only up to a positive scale)."""
    from .models import AttentionHead

    out = {}
    if methods()[method].oracle == "membership":
        norm = float(np.linalg.norm(truth.v))
        truth = AttentionHead(truth.v / norm, W=truth.W) if norm > 0 else truth
        out["v_compared"] = "direction (v / ||v||)"
    out.update(_errors(learned, truth, d))
    return out
