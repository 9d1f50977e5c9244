"""Which learner ``attnquery extract`` runs, and which of its options apply to it.

The learner is chosen from the learner registry's spec (:class:`~attnquery.learners._registry.
LearnerSpec`) by the oracle it asks and what it returns, never by its name, so a plug-in that
takes vector answers, or returns a layer, gets the options a built-in learner of that kind gets.
:data:`OPTIONS` is the one table of the options that apply only to some runs: an option given
where it does not apply is a usage error naming the option and what it applies to, raised before
any file is read or any query is asked (:func:`check_options`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from ..extraction import methods

__all__ = ["Choice", "OPTIONS", "choose", "check_options"]


@dataclass(frozen=True)
class Choice:
    """The run the command line asks for: where the box comes from (``"oracle"``, ``"model"``,
    ``"module"`` or ``"checkpoint"``), the learner (``method``), the oracle it asks and what it
    returns (its spec's), its parameters' names (``takes_any``: it takes ``**kwargs``), and
    ``--answers``."""

    source: str
    method: str
    oracle: str
    returns: str
    parameters: frozenset
    takes_any: bool
    answers: str | None

    def takes(self, name: str) -> bool:
        """Whether the learner takes the parameter ``name``."""
        return self.takes_any or name in self.parameters


def _source(args) -> str:
    if getattr(args, "checkpoint", None) is not None:
        return "checkpoint"
    return "module" if args.module is not None else "model" if args.model is not None \
        else "oracle"


def _learners(pred) -> str:
    """The built-in learners for which ``pred(method)`` holds, for messages (plug-ins are not
    imported to say it)."""
    from ..extraction import Method

    names = [n for n, m in methods().items() if isinstance(m, Method) and pred(m)]
    return " or ".join(names) or "(none built in)"


def _default_method(args) -> str:
    """The learner when ``--method`` is not given: ``vector`` for a box answering vectors,
    ``layer`` for a checkpoint's whole layer, else ``exact``."""
    if args.answers is not None:
        return "vector"
    if args.module is not None and args.head is None:
        return "layer"
    return "exact"


def choose(args) -> Choice:
    """The learner ``args`` ask for, checked against the box: vector answers (``--answers``)
    go to a learner asking a vector oracle and no other, a checkpoint's whole layer (``--module``
    without ``--head``, scalar answers) to a learner that returns a layer, one head to a
    learner that does not (ConfigError naming the cause otherwise)."""
    name = args.method or _default_method(args)
    method = methods()[name]
    oracle, returns = method.oracle, method.returns  # the spec's (a plug-in's loaded here)
    if args.answers is not None and oracle != "vector":
        raise ConfigError(
            f"--answers {args.answers}: a box that answers vectors is learnt by --method "
            f"{_learners(lambda m: m.oracle == 'vector')} (a learner of vector answers), not "
            f"--method {name}, which asks a {oracle} oracle")
    if args.answers is None and getattr(args, "checkpoint", None) is not None:
        raise ConfigError("--checkpoint needs --answers all|last (its attention module answers "
                          "every token's output vector, or the last token's)")
    if args.answers is None and oracle == "vector":
        raise ConfigError(f"--method {name} needs --answers all|last (it learns from vector "
                          "answers: what the box returns, every token's output vector or the "
                          "last token's)")
    if args.module is not None and args.answers is None:
        if args.head is None and returns != "layer":
            raise ConfigError(
                f"--method {name} learns one head; without --head the box is the whole layer: "
                f"give --head H, or --method {_learners(lambda m: m.returns == 'layer')} (a "
                "learner that returns a layer)")
        if args.head is not None and returns == "layer":
            raise ConfigError(f"--method {name} learns a whole layer: leave out --head")
    params = inspect.signature(method.load()).parameters
    names = frozenset(n for n, p in params.items()
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return Choice(_source(args), name, oracle, returns, names, takes_any, args.answers)


@dataclass(frozen=True)
class Option:
    """An option that applies only to some runs: its ``dest`` in the parsed arguments, whether
    it was given (``given(args)``), whether it applies to a :class:`Choice` (``applies(choice,
    args)``), and what it applies to (words)."""

    dest: str
    given: Callable
    applies: Callable
    applies_to: str

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


def _given(dest):
    """Whether the option was given (its value is not the default None or False; 0 is)."""
    return lambda args: getattr(args, dest) is not None and getattr(args, dest) is not False


def _takes(param):
    return lambda c, a: c.takes(param)


_MODULE = "--module (a checkpoint's attention module)"
_READOUT = "--module without --answers (a module read out along a vector r, answering scalars)"

#: every option of ``extract`` that applies only to some runs, with what it applies to (the
#: others, --d, --method, --budget, --seed, --param, --out, --json, --no-progress, apply to every
#: run; --answers chooses the learner, :func:`choose`)
OPTIONS = (
    Option("tau", _given("tau"), lambda c, a: c.oracle == "approximate value",
           "a learner that asks an approximate value oracle ({approximate})"),
    Option("noise", _given("noise"),
           lambda c, a: c.oracle == "approximate value" and c.source == "model",
           "--model HEAD.npz and a learner that asks an approximate value oracle "
           "({approximate}): the simulated oracle's noise (a box's own answers are taken as "
           "they are)"),
    Option("rank", _given("rank"),
           lambda c, a: c.takes("rank") and not (c.source == "module" and c.answers),
           "a learner with a rank parameter ({rank}), and not with --module and --answers"),
    Option("eps", _given("eps"), _takes("eps"), "a learner with an eps parameter ({eps})"),
    Option("probes", _given("probes"), _takes("probes"),
           "a learner with a probes parameter ({probes})"),
    Option("layer", _given("layer"), lambda c, a: c.source in ("module", "checkpoint"),
           "--module or --checkpoint (a checkpoint's attention module)"),
    Option("box", _given("box"), lambda c, a: c.source == "checkpoint",
           "--checkpoint (a GGUF file's layer)"),
    Option("head", _given("head"), lambda c, a: c.source == "module", _MODULE),
    Option("no_biases", _given("no_biases"), lambda c, a: c.source == "module", _MODULE),
    Option("n_heads", _given("n_heads"),
           lambda c, a: c.source == "module" or (c.source == "oracle" and c.takes("n_heads")),
           "--module, or --oracle with a learner that has an n_heads parameter ({n_heads}; "
           "the same as --param n_heads)"),
    Option("readout", _given("readout"), lambda c, a: c.source == "module" and not c.answers,
           _READOUT),
    Option("readout_seed", _given("readout_seed"),
           lambda c, a: c.source == "module" and not c.answers
           and (a.readout is None or a.readout[0] == "gaussian"),
           _READOUT[:-1] + ", and --readout gaussian, the default: the seed of its random r)"),
    Option("force", _given("force"), lambda c, a: True, "--out (a file that exists)"),
)


def _what(choice: Choice) -> str:
    """The run in words, for messages."""
    source = {"oracle": "--oracle", "model": "--model", "module": "--module",
              "checkpoint": "--checkpoint"}[choice.source]
    answers = f" --answers {choice.answers}" if choice.answers else ""
    return f"{source} --method {choice.method}{answers}: {choice.oracle} oracle, returns a " \
           f"{choice.returns}"


def check_options(args, choice: Choice) -> None:
    """ConfigError naming every option of :data:`OPTIONS` given where it does not apply (and
    ``--force`` without ``--out``), grouped by what they apply to: ``--head, --no-biases: only
    with --module (...)``, then the run that was asked for."""
    bad = [o for o in OPTIONS if o.given(args) and not (
        o.applies(choice, args) and (o.dest != "force" or args.out is not None))]
    if not bad:
        return
    lists = _Missing(approximate=_learners(lambda m: m.oracle == "approximate value"))
    for param in ("rank", "eps", "probes", "n_heads"):
        if any("{" + param + "}" in o.applies_to for o in bad):
            lists[param] = _learners(
                lambda m, p=param: p in inspect.signature(m.load()).parameters)
    groups: dict[str, list[str]] = {}
    for o in bad:
        groups.setdefault(o.applies_to.format_map(lists), []).append(o.flag)
    why = "; ".join(f"{', '.join(flags)}: only with {to}" for to, flags in groups.items())
    raise ConfigError(f"{why} (this run: {_what(choice)})")


class _Missing(dict):
    def __missing__(self, key):
        return ""
