"""The plug-in learners a study config adds to an experiment, drawn apart from its own.

An experiment's figure and claims are about the learners it was designed for; a plug-in that
joins it (its config section's ``learners``: :mod:`attnquery.experiments._learners`) is drawn
in a row of panels added below the figure, labelled with its spec's label
(:attr:`attnquery.learners.base.LearnerSpec.display`): the queries the oracle counted and the
relative error of W, against d. ``lowrank_scale``'s figures draw every learner of its rows
themselves (:data:`DRAWS_ITS_LEARNERS`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DRAWS_ITS_LEARNERS", "split_joined", "learner_label", "add_joined_panels"]

#: experiments whose figures draw every learner their rows have
DRAWS_ITS_LEARNERS = ("lowrank_scale",)

#: height, in inches, of the row of panels added for the plug-ins
PANEL_HEIGHT = 2.6


def learner_label(name: str) -> str:
    """The figure label of learner ``name``: its registry spec's (its name where it cannot be
    loaded)."""
    from ..errors import ConfigError
    from ..learners._registry import get_entry

    try:
        return get_entry(name).spec.display
    except ConfigError:
        return name


def _is_plugin(name) -> bool:
    from ..learners._registry import registry

    entry = registry().get(name) if isinstance(name, str) else None
    return entry is not None and entry.plugin


def split_joined(df):
    """``(own, joined)``: the rows of the experiments' own learners and those of plug-ins
    (outside :data:`DRAWS_ITS_LEARNERS`)."""
    if "learner" not in df.columns or df.empty:
        return df, df.iloc[0:0]
    plugin = df["learner"].map(_is_plugin).astype(bool)
    joined = plugin & ~df["experiment"].isin(DRAWS_ITS_LEARNERS)
    return df[~joined], df[joined]


def add_joined_panels(fig, joined) -> None:
    """Add, below everything ``fig`` draws, a row of two panels of the plug-ins' rows: queries
    and relative error of W against d, one series per (learner, experiment), labelled with the
    learner's spec label. The figure grows by :data:`PANEL_HEIGHT`."""
    w, h = fig.get_size_inches()
    total = h + PANEL_HEIGHT
    fig.set_layout_engine("none")
    for ax in fig.axes:
        p = ax.get_position()
        ax.set_position([p.x0, (p.y0 * h + PANEL_HEIGHT) / total, p.width, p.height * h / total])
    for t in fig.texts:
        x, y = t.get_position()
        t.set_position((x, (y * h + PANEL_HEIGHT) / total))
    fig.set_size_inches(w, total)
    bottom, height = 0.55 / total, (PANEL_HEIGHT - 1.1) / total
    axq = fig.add_axes([0.09, bottom, 0.36, height])
    axe = fig.add_axes([0.58, bottom, 0.36, height])
    ok = joined[joined["status"] == "ok"]
    for k, ((name, exp), g) in enumerate(ok.groupby(["learner", "experiment"], sort=True)):
        x = g["d"].to_numpy(dtype=float) if "d" in g else np.arange(len(g), dtype=float)
        order = np.argsort(x, kind="stable")
        label = f"{learner_label(name)} ({exp})"
        style = dict(marker="os^vD<>"[k % 7], color=f"C{k % 10}", ls="-", label=label)
        axq.plot(x[order], g["n_queries"].to_numpy(dtype=float)[order], **style)
        if "rel_err_W" in g:
            axe.plot(x[order], g["rel_err_W"].to_numpy(dtype=float)[order], **style)
    axq.set(xlabel="d", ylabel="queries counted", title="plug-in learners: queries")
    axe.set(xlabel="d", ylabel="relative error of W", title="plug-in learners: error")
    for ax in (axq, axe):
        if ax.has_data():
            ax.set_yscale("log")
            ax.legend(fontsize="small")
