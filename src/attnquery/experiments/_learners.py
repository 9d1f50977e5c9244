"""Which learners an experiment runs: its own, and the registered ones that fit its box.

Every experiment declares, once, a :class:`Takes`: the oracle kinds its box answers as
(:data:`~attnquery.learners.base.ORACLES`), what a learner must return for the experiment to
measure it (:data:`~attnquery.learners.base.RETURNS`), its own learners (the names its cells
and figures have always used), and the parameters it can give a learner besides
``random_state`` (``n_heads`` of a layer, ...).

A config section's ``learners`` may name, besides the experiment's own learners, any learner of
the registry (:func:`attnquery.learners.base.registry`) that fits: its spec's ``oracle`` is one
the box answers, its ``returns`` one the experiment measures, and it needs no parameter the
experiment does not give. The names are checked when the grid is expanded
(:meth:`Takes.check`): a learner that does not fit is a
:class:`~attnquery.errors.ConfigError` naming it and why (wrong oracle, wrong returns, a
parameter it needs), with the names that do fit. Such a *joined* learner is built with its
defaults, the cell's ``random_state`` and the parameters the experiment gives
(:meth:`Takes.make`), and measured like the experiment's own learners; its rows carry its
registry name, and the figures draw it with its spec's label.

Where an experiment's design fixes its learners (a comparison the paper defines), a joined
learner is run on the grid of one of them, its *reference* (:meth:`Takes.join`): the same
truths, the same oracles, and its own label in the rows. The built-in learners an experiment
does not run itself join only ``lowrank_scale`` (``registered=True``), whose figure draws any
learner; elsewhere they are refused by name, so that the study's figures and claims read the
learners they were designed for, and plug-ins beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from ..learners._registry import REQUIRED, get_entry, registry

__all__ = ["Takes", "joined_seconds"]


def joined_seconds(table: Mapping[str, float], default: str) -> Callable[[str], float]:
    """``name -> seconds``: the table's entry, else (a joined learner) ``table[default]``."""
    return lambda name: table.get(name, table[default])


@dataclass(frozen=True)
class Takes:
    """The learners an experiment takes (see the module docstring).

    Attributes
    ----------
    experiment : str
        The experiment's name (for messages).
    oracles : tuple of str
        The oracle kinds (a spec's ``oracle``) its box answers as.
    returns : tuple of str
        What a learner must return (a spec's ``returns``) for the experiment to measure it.
    own : tuple of str
        The experiment's own learners (built by its own code).
    gives : tuple of str
        The parameters besides ``random_state`` it gives a joined learner that has them (their
        values come from the cell, :meth:`make`).
    registered : bool
        Whether a built-in learner it does not run itself may join (else only plug-ins).
    box : str
        What its box is, in words (for messages).
    """

    experiment: str
    oracles: tuple[str, ...]
    returns: tuple[str, ...]
    own: tuple[str, ...]
    gives: tuple[str, ...] = ()
    registered: bool = False
    box: str = ""

    def why_not(self, name: str) -> str | None:
        """Why the experiment cannot run learner ``name`` (None if it can)."""
        if name in self.own:
            return None
        if not isinstance(name, str) or name not in registry():
            return "is not a registered learner"
        entry = get_entry(name)
        if not entry.plugin and not self.registered:
            return (f"is a built-in learner {self.experiment} does not run (its own: "
                    f"{list(self.own)}; a plug-in of the same kind may join them)")
        try:
            spec, params = entry.spec, entry.parameters()
        except ConfigError as exc:
            return f"cannot be loaded ({exc})"
        if spec.oracle not in self.oracles:
            return (f"asks the {spec.oracle} oracle; {self.experiment}'s box "
                    f"{self.box + ' ' if self.box else ''}answers as {_words(self.oracles)}")
        if spec.returns not in self.returns:
            return (f"returns a {spec.returns}; {self.experiment} measures a "
                    f"{_words(self.returns, 'or')}")
        needs = [k for k, p in params.items()
                 if p["default"] is REQUIRED and k not in self.gives]
        if needs or "random_state" not in params:
            gives = ["random_state", *self.gives]
            return (f"needs {needs or ['random_state']}, which {self.experiment} does not give "
                    f"(it builds a learner with its defaults and {gives})")
        return None

    def fitting(self) -> list[str]:
        """The names the experiment takes: its own, then the registered learners that fit (a
        plug-in that cannot be loaded is left out)."""
        return [*self.own, *(n for n in registry()
                             if n not in self.own and self.why_not(n) is None)]

    def check(self, names: Iterable[str], key: str = "learners") -> list[str]:
        """``names`` (duplicates dropped, order kept), each one the experiment takes; else a
        ConfigError naming the first that it does not, why, and those it does."""
        names = list(dict.fromkeys(names))
        for name in names:
            why = self.why_not(name)
            if why is not None:
                raise ConfigError(f"experiments.{self.experiment}.{key}: {name!r} {why}; "
                                  f"{self.experiment} takes {self.fitting()}")
        return names

    def joined(self, names: Iterable[str], key: str = "learners") -> list[str]:
        """The names among ``names`` (checked) that are not the experiment's own."""
        return [n for n in self.check(names, key) if n not in self.own]

    def join(self, cells: list[dict], names: Iterable[str], reference: str,
             drop: Iterable[str] = (), where: Callable[[dict], bool] | None = None,
             key: str = "learners") -> list[dict]:
        """``cells`` and, for each joined learner of ``names``, a copy of the cells of the
        ``reference`` learner (those ``where`` accepts), its ``learner`` replaced and the
        reference's own parameters ``drop`` removed (the copies they told apart are one cell).
        """
        out = list(cells)
        drop = set(drop)
        for name in self.joined(names, key):
            seen = set()
            for c in cells:
                if c["learner"] != reference or (where is not None and not where(c)):
                    continue
                copy = {k: v for k, v in c.items() if k not in drop}
                copy["learner"] = name
                tag = tuple(sorted(copy.items(), key=lambda kv: kv[0]))
                if repr(tag) not in seen:
                    seen.add(repr(tag))
                    out.append(copy)
        return out

    def make(self, cell: Mapping, rng, **given):
        """The joined learner of ``cell`` (its ``learner``, checked): built with its defaults,
        ``random_state=rng`` and those of ``given`` (the experiment's :attr:`gives`) its class
        has."""
        name = cell["learner"]
        why = self.why_not(name)
        if why is not None or name in self.own:
            raise ConfigError(f"{self.experiment}: {name!r} "
                              f"{why or 'is built by the experiment itself'}")
        entry = get_entry(name)
        params = entry.parameters()
        kwargs = {k: v for k, v in given.items() if k in self.gives and k in params}
        return entry.load()(random_state=rng, **kwargs)

    def is_joined(self, cell: Mapping) -> bool:
        """Whether ``cell`` runs a joined learner (not one of the experiment's own)."""
        return cell["learner"] not in self.own

    def spec(self, cell: Mapping):
        """The registry spec of a joined cell's learner."""
        return get_entry(cell["learner"]).spec


def _words(items, last: str = "or") -> str:
    items = [repr(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {last} {items[-1]}"
