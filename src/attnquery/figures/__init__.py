"""Figures of the study: one function per figure, each rendered from result tables only.

Every figure function takes a pandas DataFrame of result rows (see :mod:`attnquery.results`)
and returns ``(figure, claims)``, where ``claims`` is a list of :class:`attnquery.claims.Claim`
the figure states. :func:`render` applies the shared style and writes PDF and PNG with fixed
metadata, so identical results give identical bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..errors import ConfigError  # noqa: E402
from ..results import atomic_path  # noqa: E402

__all__ = ["STYLE", "FIGURES", "TIMING_FIGURES", "register_figure", "render", "save_figure",
           "get_figure", "log2_ticks", "timing_figures"]

STYLE = str(Path(__file__).with_name("attnquery.mplstyle"))

#: figure name -> function(DataFrame) -> (Figure, list of claims)
FIGURES: dict[str, Callable] = {}

#: figures drawn from wall-clock timings: not expected to be byte-identical across runs
TIMING_FIGURES: set[str] = set()


def register_figure(name: str, uses_timing: bool = False):
    """Decorator registering a figure function under ``name``.

    Pass ``uses_timing=True`` for a figure drawn from wall-clock timings (it is then excluded
    from the byte-for-byte reproducibility check).
    """

    def deco(fn):
        FIGURES[name] = fn
        if uses_timing:
            TIMING_FIGURES.add(name)
        return fn

    return deco


def _load_all() -> None:
    # importing the modules registers their figures (one module per experiment family)
    import importlib

    from ..experiments import FAMILIES

    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}")


def timing_figures() -> set[str]:
    """Names of the figures drawn from wall-clock timings (all figure modules loaded)."""
    _load_all()
    return set(TIMING_FIGURES)


def get_figure(name: str) -> Callable:
    _load_all()
    if name not in FIGURES:
        raise ConfigError(f"unknown figure {name!r}; known: {sorted(FIGURES)}")
    return FIGURES[name]


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


def render(name: str, df, pdf_path, png_path=None):
    """Render figure ``name`` from ``df`` to files; returns the claims it states."""
    fn = get_figure(name)
    with plt.style.context(STYLE):
        fig, claims = fn(df)
        save_figure(fig, pdf_path, png_path)
        plt.close(fig)
    return claims
