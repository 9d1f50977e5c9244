"""The figures' registry, order and rendering (what every figure module imports), re-exported
by :mod:`attnquery.figures`, whose docstring describes them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..errors import ConfigError  # noqa: E402
from ..results import atomic_path  # noqa: E402
from ._layout import tidy  # noqa: E402

__all__ = ["STYLE", "FIGURES", "Figure", "register_figure", "render", "save_figure",
           "get_figure", "get_spec", "figures_for", "all_figures", "log2_ticks",
           "timing_figures", "with_evidence", "tight_layout", "mark_empty_axes", "PAPER_ORDER",
           "paper_section", "paper_order", "experiment_order", "draw"]

STYLE = str(Path(__file__).with_name("attnquery.mplstyle"))

#: The paper's order: each figure module (this package's modules, one per experiment family)
#: with the result of the paper its figures measure, the paper's core results first (Theorem 4.1)
#: and the study's results beyond the paper last. The appendix's figures, tables and numbers
#: and the sections of the findings pages (README's table, docs/findings.md) follow it.
PAPER_ORDER: tuple[tuple[str, str], ...] = (
    ("exact", "Theorem 4.1: exact recovery from value queries"),
    ("transformer", "Section 4.1: one-layer transformers"),
    ("lowrank", "Theorem 5.1: low-rank heads"),
    ("noise", "Theorem 6.1: answers within a tolerance"),
    ("rounding", "Theorem 6.1: rounded answers"),
    ("lowprecision", "Theorem 6.1: answers rounded to a float format"),
    ("membership", "Appendix B: sign-only (membership) answers"),
    ("multihead", "Section 7 and Appendix C: multi-head attention"),
    ("multihead_generic", "Section 7 and Appendix C: generic multi-head attention"),
    ("realheads", "Beyond the paper: real heads"),
    ("reallayer", "Beyond the paper: whole real layers"),
    ("served", "Beyond the paper: served heads"),
    ("served_layers", "Beyond the paper: served layers"),
    ("rotary", "Beyond the paper: rotary heads and grouped-query layers"),
    ("vector", "Beyond the paper: vector answers"),
    ("llm", "Beyond the paper: a real open LLM"),
)
_RANK = {module: i for i, (module, _) in enumerate(PAPER_ORDER)}

@dataclass(frozen=True)
class Figure:
    """A registered figure.

    Attributes
    ----------
    name : str
    function : callable(DataFrame) -> (Figure, list of Claim)
    experiments : tuple of str
        Experiments whose tables the figure needs (it is drawn when all are enabled).
    optional : tuple of str
        Experiments whose tables it also draws when they are enabled.
    category : str
        Section of the HTML report.
    caption : str
        reStructuredText caption (the checked claims are appended in the report).
    uses_timing : bool
        Drawn from wall-clock timings: not expected to be byte-identical across runs.
    """

    name: str
    function: Callable
    experiments: tuple[str, ...]
    optional: tuple[str, ...] = ()
    category: str = ""
    caption: str = ""
    uses_timing: bool = False

    def reads(self, enabled: Iterable[str]) -> list[str]:
        """The experiments whose tables the figure reads when ``enabled`` are enabled."""
        enabled = list(enabled)
        return [e for e in (*self.experiments, *self.optional) if e in enabled]

    def drawn(self, enabled: Iterable[str]) -> bool:
        """Whether the figure is drawn when the experiments ``enabled`` are enabled."""
        enabled = set(enabled)
        return all(e in enabled for e in self.experiments)


#: figure name -> its registry entry
FIGURES: dict[str, Figure] = {}


def register_figure(name: str, *, experiments: Iterable[str], category: str, caption: str,
                    optional: Iterable[str] = (), uses_timing: bool = False):
    """Decorator registering a figure function under ``name`` (see :class:`Figure`)."""

    def deco(fn):
        if name in FIGURES and FIGURES[name].function is not fn:
            raise ConfigError(f"figure {name!r} is registered twice")
        FIGURES[name] = Figure(name, fn, tuple(experiments), tuple(optional), category,
                               caption.strip(), bool(uses_timing))
        return fn

    return deco


def _load_all() -> None:
    # importing the modules registers their figures (one module per experiment family, every
    # module of this package)
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__package__}.{module.name}")


def all_figures() -> dict[str, Figure]:
    """Every registered figure (all figure modules loaded)."""
    _load_all()
    return dict(FIGURES)


def timing_figures() -> set[str]:
    """Names of the figures drawn from wall-clock timings (all figure modules loaded)."""
    return {name for name, f in all_figures().items() if f.uses_timing}


def figures_for(enabled: Iterable[str]) -> list[str]:
    """Names of the figures drawn when the experiments ``enabled`` are enabled, sorted."""
    enabled = list(enabled)
    return sorted(name for name, f in all_figures().items() if f.drawn(enabled))


def _module(spec: Figure) -> str:
    return spec.function.__module__.rpartition(".")[2]


def paper_section(name: str) -> tuple[int, str]:
    """Where figure ``name`` stands in :data:`PAPER_ORDER`: its module's position and the
    result of the paper it measures. A figure module :data:`PAPER_ORDER` does not place raises
    ``ConfigError``."""
    module = _module(get_spec(name))
    if module not in _RANK:
        raise ConfigError(f"figure {name!r}: its module {module!r} has no place in "
                          "attnquery.figures.PAPER_ORDER (add it there)")
    return _RANK[module], PAPER_ORDER[_RANK[module]][1]


def paper_order(names: Iterable[str]) -> list[str]:
    """The figures ``names`` in the paper's order (:data:`PAPER_ORDER`); a module's figures by
    name."""
    return sorted(names, key=lambda name: (paper_section(name)[0], name))


def experiment_order(names: Iterable[str]) -> list[str]:
    """The experiments ``names`` in the paper's order: each where the first figure that reads
    its tables stands (:func:`paper_order`); an experiment no figure reads comes last."""
    figures = paper_order(all_figures())
    first = {}
    for i, fig in enumerate(figures):
        for e in (*FIGURES[fig].experiments, *FIGURES[fig].optional):
            first.setdefault(e, i)
    return sorted(names, key=lambda e: (first.get(e, len(figures)), e))


def get_spec(name: str) -> Figure:
    """The registry entry of figure ``name``."""
    _load_all()
    if name not in FIGURES:
        raise ConfigError(f"unknown figure {name!r}; known: {sorted(FIGURES)}")
    return FIGURES[name]


def get_figure(name: str) -> Callable:
    """The function that draws figure ``name``."""
    return get_spec(name).function


def log2_ticks(ax, values, axis: str = "x") -> None:
    """Put ticks at ``values`` (e.g. the grid's d) on a log axis, labelled as plain integers."""
    import numpy as np
    from matplotlib.ticker import FixedLocator, NullLocator

    vals = np.unique(np.asarray(values, dtype=float))
    vals = vals[vals > 0]
    if vals.size == 0:
        return
    if vals.size > 8:  # keep every other tick when the grid is dense
        vals = vals[:: int(np.ceil(vals.size / 8))]
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_locator(FixedLocator(vals))
    a.set_minor_locator(NullLocator())
    a.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))


def save_figure(fig, pdf_path, png_path=None) -> None:
    """Write ``fig`` as PDF (and PNG) atomically, without timestamps or varying metadata."""
    os.environ.setdefault("SOURCE_DATE_EPOCH", "0")
    with atomic_path(pdf_path) as tmp:
        fig.savefig(tmp, format="pdf", metadata={"CreationDate": None, "ModDate": None})
    if png_path is not None:
        with atomic_path(png_path) as tmp:
            fig.savefig(tmp, format="png", metadata={"Software": None})


def with_evidence(name: str, df, claims) -> list:
    """``claims`` of figure ``name``, each "not supported (no data)" when no cell of the
    experiments the figure needs ran to an answer (no evidence, no success)."""
    from ..claims import no_data

    spec = get_spec(name)
    rows = df[df["experiment"].isin(spec.experiments)]
    if (rows["status"] == "ok").any():
        return list(claims)
    why = (f"no successful run of {', '.join(spec.experiments)}: "
           f"{len(rows)} rows, none with status ok")
    return [no_data(c, why) for c in claims]


def tight_layout(fig) -> None:
    """``fig.tight_layout()``, after empty panels are marked (see :func:`mark_empty_axes`)."""
    mark_empty_axes(fig)
    fig.tight_layout()


def mark_empty_axes(fig) -> None:
    """Panels without data (no cell of theirs succeeded) say so, on linear axes: a log axis
    with nothing positive on it cannot be drawn."""
    import numpy as np

    for ax in fig.axes:
        lim = ax.dataLim
        if getattr(ax, "_attnquery_empty", False):
            continue
        if not ax.has_data() or not np.all(np.isfinite([lim.x0, lim.x1, lim.y0, lim.y1])):
            ax._attnquery_empty = True
            ax.set_xscale("linear")
            ax.set_yscale("linear")
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center",
                    color="0.4")
            continue
        if ax.get_xscale() == "log" and lim.x1 <= 0:
            ax.set_xscale("linear")
        if ax.get_yscale() == "log" and lim.y1 <= 0:
            ax.set_yscale("linear")


def draw(name: str, df):
    """Figure ``name`` drawn from ``df`` in the shared style, empty panels marked and laid out
    (:func:`attnquery.figures._layout.tidy`): ``(figure, claims)``. The rows of plug-in
    learners a config added to an experiment are not the figure's nor its claims': they are
    drawn in panels added below it, by their labels (:mod:`attnquery.figures._joined`). Call it
    inside ``plt.style.context(STYLE)`` to keep the style for saving."""
    from ._joined import add_joined_panels, split_joined

    df, joined = split_joined(df)
    fig, claims = get_figure(name)(df)
    spec = get_spec(name)
    joined = joined[joined["experiment"].isin([*spec.experiments, *spec.optional])]
    if not joined.empty:  # plug-ins a config added: below, by their own labels
        add_joined_panels(fig, joined)
    mark_empty_axes(fig)
    tidy(fig)
    return fig, claims


def render(name: str, df, pdf_path, png_path=None):
    """Render figure ``name`` from ``df`` to files; returns the claims it states (see
    :func:`with_evidence`)."""
    with plt.style.context(STYLE):
        fig, claims = draw(name, df)
        save_figure(fig, pdf_path, png_path)
        plt.close(fig)
    return with_evidence(name, df, claims)
