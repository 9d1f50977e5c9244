"""Every figure of a study, drawn from its results, has no collision: no text box on another
(tick labels, titles, axis labels, annotations, legends), no legend on its axes' data, no
annotation on a marker or a bar (:func:`attnquery.figures._layout.collisions`).

The study is the quick one (config/quick.yaml, run here, slow), or the one that ran in the
folder ``ATTNQUERY_STUDY_DIR`` names (the default study's, say). The checker itself is tested on
figures drawn to collide.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from attnquery.figures import STYLE, all_figures, draw, get_spec
from attnquery.figures._layout import collisions
from attnquery.results import read_results

from .quick_study import given_study, quick_study


def _study():
    return given_study() or quick_study("figures")


def _tables(folder, name):
    files = [folder / "results" / f"{e}.parquet" for e in get_spec(name).reads(
        [p.stem for p in (folder / "results").glob("*.parquet")])]
    return [f for f in files if f.is_file()]


def _drawn(folder):
    present = {p.stem for p in (folder / "results").glob("*.parquet")}
    return sorted(n for n, spec in all_figures().items() if spec.drawn(present))


@pytest.mark.slow
def test_every_figure_of_the_study_is_free_of_collisions():
    folder = _study()
    names = _drawn(folder)
    assert names, f"no figure is drawn from {folder / 'results'}"
    found = {}
    for name in names:
        df = read_results(_tables(folder, name), with_timing=True)
        with plt.style.context(STYLE):
            fig, _ = draw(name, df)
            problems = collisions(fig)
            plt.close(fig)
        if problems:
            found[name] = problems
    assert not found, "\n".join(f"{n}: {p}" for n, ps in found.items() for p in ps)


def _figure():
    return plt.subplots(figsize=(4, 3), dpi=100)


def test_overprinted_tick_labels_are_found():
    fig, ax = _figure()
    ax.plot([9, 10, 11], [1, 2, 3])
    ax.set_xticks([9, 9.02, 9.04], ["9", "10", "11"])
    found = collisions(fig)
    plt.close(fig)
    assert any("x tick '9' overlaps" in f and "x tick '10'" in f for f in found), found


def test_a_legend_on_a_title_and_on_rotated_text_is_found():
    fig, ax = _figure()
    ax.plot([0, 1], [0, 1], label="a curve with a long name")
    ax.text(0.02, 0.98, "a note written\ndown the side", rotation=90, transform=ax.transAxes,
            va="top")
    ax.legend(loc="upper left")
    found = collisions(fig)
    plt.close(fig)
    assert any("legend overlaps" in f or "overlaps" in f and "legend" in f for f in found), found


def test_a_legend_on_markers_bars_and_lines_is_found():
    x = np.linspace(0, 1, 11)
    for plot in (lambda ax: ax.plot(x, x**0.1, "o", label="m"),
                 lambda ax: ax.bar([0, 1, 2], [3, 3, 3], label="b"),
                 lambda ax: ax.plot([0, 1], [0, 1], label="l")):
        fig, ax = _figure()
        plot(ax)
        ax.legend(loc="upper right")
        found = collisions(fig)
        plt.close(fig)
        assert any("legend covers" in f for f in found), found


def test_a_clean_figure_has_no_collision():
    fig, (a, b) = plt.subplots(1, 2, figsize=(6, 3), dpi=100)
    a.plot([0, 1, 2], [0, 1, 4], "o-", label="growth")
    a.legend(loc="upper left")
    a.set_xlabel("x")
    a.set_title("(a) growth")
    b.bar([0, 1], [1, 2])
    b.set_title("(b) bars")
    b.annotate("tall", (1, 2), xytext=(0, 4), textcoords="offset points", ha="center",
               va="bottom")
    b.set_ylim(0, 3)
    fig.tight_layout()
    found = collisions(fig)
    plt.close(fig)
    assert found == []
