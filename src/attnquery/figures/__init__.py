"""Figures of the study: one function per figure, each rendered from result tables only.

Every figure function takes a pandas DataFrame of result rows (see :mod:`attnquery.results`)
and returns ``(figure, claims)``, where ``claims`` is a list of :class:`attnquery.claims.Claim`
the figure states. :func:`render` applies the shared style and writes PDF and PNG with fixed
metadata, so identical results give identical bytes.

The registry (:func:`register_figure`, :data:`FIGURES`) is what the workflow is driven by: a
figure's entry names the experiments whose tables it reads, its report category and caption, and
whether it plots wall-clock timings. :data:`PAPER_ORDER` is the order of the paper, which the
appendix (:mod:`attnquery.study.appendix`) and the findings pages follow (:func:`paper_order`).
Figure modules import results, claims, metrics and
:mod:`attnquery.theory`, never learners, oracles or experiments, so that editing a learner does
not re-render figures and editing a figure recomputes nothing.
"""

from ._core import (
    FIGURES,
    PAPER_ORDER,
    STYLE,
    Figure,
    all_figures,
    draw,
    experiment_order,
    figures_for,
    get_figure,
    get_spec,
    log2_ticks,
    mark_empty_axes,
    paper_order,
    paper_section,
    register_figure,
    render,
    save_figure,
    tight_layout,
    timing_figures,
    with_evidence,
)

__all__ = ["STYLE", "FIGURES", "Figure", "register_figure", "render", "save_figure",
           "get_figure", "get_spec", "figures_for", "all_figures", "log2_ticks",
           "timing_figures", "with_evidence", "tight_layout", "mark_empty_axes", "PAPER_ORDER",
           "paper_section", "paper_order", "experiment_order", "draw"]
