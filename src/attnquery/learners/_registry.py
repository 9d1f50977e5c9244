"""The learner registry: every learner by name, built in or a plug-in.

A learner declares what it is in one place, a :class:`LearnerSpec` in its class attribute
``spec``: its name, the oracle it needs, what it returns, its query-ledger stages, named
parameter sets (``variants``, e.g. the paper's own choice) and whether it fits a module head's
key bias and offset. Its parameters and their constraints are read from the class itself
(:func:`learner_parameters`: the ``_parameter_constraints`` dict where the class has one, else
the ``__init__`` signature).

The registry (:func:`registry`) finds the learners in two places:

* every class in ``attnquery.learners.__all__`` that declares its own ``spec``;
* the entry-point group ``attnquery.learners`` of the installed distributions
  (``importlib.metadata``): the entry point's name is the learner's name and its value
  ``module:Class``. A plug-in is imported only when it is used; one that fails to import
  (whatever its import raises, ``SystemExit`` included: only ``KeyboardInterrupt`` goes
  through), or whose class has no spec, warns and raises a
  :class:`~attnquery.errors.ConfigError` naming it when it is used, and never hides the others
  nor ends the process. A plug-in class may inherit its spec from a registered
  learner it subclasses; it is registered under the entry point's name either way, and an
  inherited spec gives it no label of its parent's (:attr:`LearnerEntry.spec`).

The command line's ``--method`` (:data:`attnquery.extraction.METHODS`), every experiment's
``learners`` (:mod:`attnquery.experiments._learners`: the plug-ins that fit an experiment join
it) and :func:`learner_table` (the docs' table) read the registry. A
cell's code version covers the module its learner's entry names
(:func:`attnquery.study.code_version`), so a plug-in's source is part of its cells' identity.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import ConfigError
from ._params import DEPRECATED

__all__ = ["LearnerSpec", "LearnerEntry", "ORACLES", "RETURNS", "ENTRY_POINT_GROUP",
           "registry", "get_learner", "get_entry", "learner_parameters", "learner_table",
           "REQUIRED"]

ENTRY_POINT_GROUP = "attnquery.learners"
"""The entry-point group plug-in learners are declared in."""

ORACLES = ("value", "approximate value", "membership", "vector")
"""The oracles a learner may need (the paper's Sections 3 and 6, Appendix B; vector answers)."""

RETURNS = ("head", "layer", "rotary head", "heads", "transformer", "network", "vector layer")
"""What a learner may return: one head (``W_``, ``v_``, and ``key_bias_``, ``offset_`` when it
fits biases), a layer (``heads_``, ``offset_``), a rotary head (``head_``), several heads
without biases (lists ``W_``, ``v_``), a transformer block, a ReLU network, a layer learnt from
vector answers."""

#: the package whose ``__all__`` lists the built-in learners
_BUILTIN_PACKAGE = "attnquery.learners"


class _Required:
    """The default of a parameter that has none (it must be given)."""

    def __repr__(self) -> str:
        return "REQUIRED"


#: :func:`learner_parameters`' default of a parameter that must be given
REQUIRED = _Required()


@dataclass(frozen=True)
class LearnerSpec:
    """What a learner is, declared once on its class (``spec = LearnerSpec(...)``).

    Parameters
    ----------
    name : str
        The learner's name: ``attnquery extract --method NAME``, a study config's learner list.
        A plug-in is registered under its entry point's name instead.
    oracle : {"value", "approximate value", "membership", "vector"}
        The oracle it asks.
    description : str
        One line: what it learns, from how many queries, and the paper's result it implements.
    returns : str
        What ``fit`` produces, one of :data:`RETURNS`.
    stages : tuple of str
        The stages its query ledger counts (``n_queries_by_stage_``).
    variants : mapping of str to mapping
        Named parameter sets, e.g. ``{"paper": {"probes": "gaussian"}}``: the choice the paper
        makes where the default differs (:meth:`LearnerEntry.make`).
    fits_bias : bool
        Whether ``fit_bias=True`` learns a module head's key bias and offset (``key_bias_``,
        ``offset_``), as the command line does for a checkpoint's head with biases.
    label : str
        A short label for figures (default: the name).
    command_line : bool
        Whether ``attnquery extract --method`` offers it (it must return a head, a layer or a
        rotary head).

    Raises
    ------
    ConfigError
        If a field is not one of the values allowed.
    """

    name: str
    oracle: str
    description: str
    returns: str = "head"
    stages: tuple[str, ...] = ()
    variants: Mapping[str, Mapping] = field(default_factory=dict)
    fits_bias: bool = False
    label: str = ""
    command_line: bool = True

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ConfigError(f"a learner's name must be an identifier; got {self.name!r}")
        if self.oracle not in ORACLES:
            raise ConfigError(f"learner {self.name!r}: oracle must be one of {ORACLES}; "
                              f"got {self.oracle!r}")
        if self.returns not in RETURNS:
            raise ConfigError(f"learner {self.name!r}: returns must be one of {RETURNS}; "
                              f"got {self.returns!r}")
        if not isinstance(self.variants, Mapping) or not all(
                isinstance(k, str) and isinstance(v, Mapping) for k, v in self.variants.items()):
            raise ConfigError(f"learner {self.name!r}: variants must map names to parameter "
                              f"dicts; got {self.variants!r}")
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "variants", MappingProxyType(
            {k: MappingProxyType(dict(v)) for k, v in self.variants.items()}))

    @property
    def display(self) -> str:
        """The figure label: ``label``, else the name."""
        return self.label or self.name


def loads(entry) -> bool:
    """Whether ``entry.load()`` succeeds (a ConfigError says it cannot): the ``available`` of
    the registry's entries and of the command line's methods."""
    try:
        entry.load()
    except ConfigError:
        return False
    return True


@dataclass(frozen=True)
class LearnerEntry:
    """A registered learner: its name, where its class lives, and whether it is a plug-in.

    The class is imported by :meth:`load` (once per process), so listing the registry imports
    no plug-in.
    """

    name: str
    target: str  # "module:Class"
    plugin: bool = False
    distribution: str | None = None

    @property
    def module(self) -> str:
        """The module that defines the class."""
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        """The class's name in its module."""
        return self.target.partition(":")[2]

    def where(self) -> str:
        """Where the entry comes from, for messages."""
        if not self.plugin:
            return f"{self.target} (built in)"
        dist = f" of {self.distribution}" if self.distribution else ""
        return f"entry point {self.name} = {self.target!r}{dist} (group {ENTRY_POINT_GROUP})"

    def load(self) -> type:
        """The learner class (ConfigError naming the entry if it cannot be imported or has no
        spec)."""
        return _load(self)

    available = property(loads, doc="Whether :meth:`load` succeeds.")

    @property
    def spec(self) -> LearnerSpec:
        """The class's spec, under this entry's name. A class that inherits its spec (a plug-in
        subclassing a registered learner) is not its parent: its spec has this entry's name and
        no label of its own (figures draw it under its name), the rest as the parent's."""
        cls = self.load()
        spec = cls.spec
        if "spec" not in cls.__dict__:
            return dataclasses.replace(spec, name=self.name, label="")
        return spec if spec.name == self.name else dataclasses.replace(spec, name=self.name)

    def parameters(self) -> dict[str, dict]:
        """The class's parameters (:func:`learner_parameters`)."""
        return learner_parameters(self.load())

    def make(self, variant: str | None = None, **params):
        """An instance: the ``variant``'s parameters (ConfigError naming the known ones if it
        is not one), overridden by ``params``."""
        spec = self.spec
        base = {}
        if variant is not None:
            if variant not in spec.variants:
                raise ConfigError(f"learner {self.name!r} has no variant {variant!r}; its "
                                  f"variants: {sorted(spec.variants)}")
            base = dict(spec.variants[variant])
        return self.load()(**{**base, **params})


@functools.cache
def _load(entry: LearnerEntry) -> type:
    mod_name, _, attr = entry.target.partition(":")
    try:
        obj = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a plug-in's sys.exit() must not end the host
        # a broken plug-in is reported by name, whatever it raises (SystemExit included)
        msg = (f"learner {entry.name!r} ({entry.where()}) cannot be loaded: "
               f"{type(exc).__name__}: {exc}")
        if entry.plugin:
            warnings.warn(f"plug-in {msg}; it is left out", UserWarning, stacklevel=2)
        raise ConfigError(msg) from None
    if not inspect.isclass(obj) or not isinstance(getattr(obj, "spec", None), LearnerSpec):
        raise ConfigError(f"learner {entry.name!r} ({entry.where()}) is not a learner class "
                          "with a spec (a LearnerSpec in its class attribute 'spec', its own or "
                          "inherited from a registered learner)")
    return obj


def _builtin_entries() -> dict[str, LearnerEntry]:
    package = importlib.import_module(_BUILTIN_PACKAGE)
    out = {}
    for attr in package.__all__:
        cls = getattr(package, attr)
        spec = cls.__dict__.get("spec") if inspect.isclass(cls) else None
        if isinstance(spec, LearnerSpec):
            if spec.name in out:
                raise ConfigError(f"learner name {spec.name!r} is declared twice "
                                  f"({out[spec.name].target} and {cls.__module__}:{attr})")
            out[spec.name] = LearnerEntry(spec.name, f"{cls.__module__}:{cls.__qualname__}")
    return out


def _plugin_entries(taken) -> dict[str, LearnerEntry]:
    from importlib.metadata import entry_points

    out = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(getattr(ep, "dist", None), "name", None)
        if ep.name in taken or ep.name in out:
            warnings.warn(f"plug-in learner {ep.name!r} ({ep.value!r}"
                          f"{' of ' + dist if dist else ''}) is left out: the name is taken "
                          f"by {(taken.get(ep.name) or out[ep.name]).where()}", stacklevel=3)
            continue
        out[ep.name] = LearnerEntry(ep.name, ep.value, plugin=True, distribution=dist)
    return out


@functools.cache
def _registry() -> MappingProxyType:
    builtin = _builtin_entries()
    return MappingProxyType({**builtin, **_plugin_entries(builtin)})


def registry() -> Mapping[str, LearnerEntry]:
    """Every registered learner, by name: the built-in ones (in the order of
    ``attnquery.learners.__all__``), then the plug-ins (sorted by name). Read once per process;
    no plug-in is imported."""
    return _registry()


def get_entry(name: str) -> LearnerEntry:
    """The registry's entry ``name`` (ConfigError naming the known ones if there is none)."""
    reg = registry()
    if name not in reg:
        raise ConfigError(f"unknown learner {name!r}; registered learners: {sorted(reg)}")
    return reg[name]


def get_learner(name: str) -> type:
    """The class of learner ``name``, imported (ConfigError naming the learner if it is unknown
    or cannot be loaded)."""
    return get_entry(name).load()


def learner_parameters(cls) -> dict[str, dict]:
    """A learner class's parameters: ``{name: {"default": ..., "constraints": ...}}``.

    The constraints are the class's ``_parameter_constraints`` entry (scikit-learn style) where
    the class has that dict, else None; a parameter without a default has :data:`REQUIRED`.
    The names are the ``__init__`` signature's keyword parameters, in order, but for the
    deprecated old names kept for a while (default ``"deprecated"``,
    :data:`~attnquery.learners._params.DEPRECATED`): a learner's budget is listed once, as
    ``n_queries``.
    """
    constraints = getattr(cls, "_parameter_constraints", None)
    out = {}
    for name, p in inspect.signature(cls).parameters.items():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or \
                (isinstance(p.default, str) and p.default == DEPRECATED):
            continue
        out[name] = {"default": REQUIRED if p.default is p.empty else p.default,
                     "constraints": None if constraints is None else constraints.get(name)}
    return out


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def learner_table() -> str:
    """The registry as a markdown table: name, class, oracle, what it returns, description.

    A plug-in that cannot be loaded is a row saying why.
    """
    lines = ["| name | class | oracle | returns | description |", "|---|---|---|---|---|"]
    for name, entry in registry().items():
        try:
            spec = entry.spec
        except ConfigError as exc:
            lines.append(f"| `{name}` | `{entry.target}` | | | {_cell(f'not available: {exc}')} |")
            continue
        cls = f"`{entry.qualname}`" + (f" (plug-in `{entry.module}`)" if entry.plugin else "")
        lines.append(f"| `{name}` | {cls} | {spec.oracle} | {spec.returns} | "
                     f"{_cell(spec.description)} |")
    return "\n".join(lines) + "\n"
