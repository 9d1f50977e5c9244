"""Collisions in a drawn figure: text over text, a legend or a label over data.

:func:`collisions` draws a matplotlib figure and lists, in words, every pair of text boxes that
overlap (titles, axis labels, tick labels, annotations, legends, colour-bar labels) and every
legend or annotation that covers drawn data (markers, line segments, bars, filled bands, images).
Boxes come from the figure's renderer (``artist.get_window_extent(renderer)``), data from the
display coordinates of the axes' lines, collections, patches and images. The figures of the
study are checked with it (``tests/test_figure_layout.py``). :func:`tidy` is the layout pass
:func:`attnquery.figures.draw` gives every figure: it thins tick labels that overprint and moves
a legend that covers data out of its axes.
"""

from __future__ import annotations

import numpy as np
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.legend import Legend
from matplotlib.path import Path as MplPath
from matplotlib.transforms import Bbox

__all__ = ["collisions", "text_boxes", "tidy", "TOLERANCE_PT"]

#: two boxes collide when they overlap by more than this (points) in both directions: glyph
#: boxes carry a little padding, and boxes that only touch are no collision
TOLERANCE_PT = 1.0


def _shown_text(t) -> bool:
    return t.get_visible() and bool(t.get_text().strip())


def _ticklabels(axis):
    try:  # the ticks drawn: those within the view interval
        ticks = axis._update_ticks()
    except AttributeError:  # pragma: no cover - matplotlib without the private helper
        ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    for tick in ticks:
        for label, on in ((tick.label1, tick.label1.get_visible()),
                          (tick.label2, tick.label2.get_visible())):
            if on and _shown_text(label):
                yield label


def _axes_name(fig, ax) -> str:
    title = (ax.get_title() or ax.get_ylabel() or "").split("\n")[0]
    title = title if len(title) <= 40 else title[:37] + "..."
    return f"axes {fig.axes.index(ax)}" + (f" ({title})" if title else "")


def text_boxes(fig, renderer) -> list[tuple[str, str, object, Bbox]]:
    """Every text box drawn on ``fig``: ``(name, kind, artist, display bbox)``; ``kind`` is
    ``"tick"``, ``"label"``, ``"text"`` (annotations and free text) or ``"legend"``."""
    out = []

    def add(name, kind, artist):
        if isinstance(artist, Legend):
            if artist.get_visible():
                out.append((name, kind, artist, artist.get_window_extent(renderer)))
        elif _shown_text(artist):
            out.append((f"{name} {artist.get_text()!r}", kind, artist,
                        artist.get_window_extent(renderer)))

    for t in fig.texts:
        add("figure text", "text", t)
    for attr in ("_suptitle", "_supxlabel", "_supylabel"):
        if getattr(fig, attr, None) is not None:
            add("figure title", "label", getattr(fig, attr))
    for leg in fig.legends:
        add("figure legend", "legend", leg)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        where = _axes_name(fig, ax)
        for t in (ax.title, ax._left_title, ax._right_title):
            add(f"{where} title", "label", t)
        for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            if not axis.get_visible():
                continue
            add(f"{where} {name} label", "label", axis.label)
            add(f"{where} {name} offset", "label", axis.get_offset_text())
            for t in _ticklabels(axis):
                add(f"{where} {name} tick", "tick", t)
        for t in ax.texts:
            add(f"{where} text", "text", t)
        if ax.get_legend() is not None:
            add(f"{where} legend", "legend", ax.get_legend())
    return out


def _overlap(a: Bbox, b: Bbox, tol: float) -> bool:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w > tol and h > tol


def _shrunk(box: Bbox, tol: float) -> Bbox:
    return Bbox.from_extents(box.x0 + tol, box.y0 + tol, box.x1 - tol, box.y1 - tol)


def _finite_runs(xy):
    """The runs of consecutive finite points of ``xy`` (a NaN breaks a drawn line)."""
    ok = np.all(np.isfinite(xy), axis=1)
    start = None
    for i, good in enumerate([*ok, False]):
        if good and start is None:
            start = i
        elif not good and start is not None:
            yield xy[start:i]
            start = None


def _data_items(ax, renderer):
    """What ``ax`` draws as data: ``(what, points, paths, boxes)`` in display coordinates;
    points are markers, paths line segments, boxes bars and images."""
    for line in ax.lines:
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        label = line.get_label()
        what = f"line {label!r}" if label and not label.startswith("_") else "a line"
        points = xy if line.get_marker() not in (None, "None", "", " ", "none") else None
        paths = [] if line.get_linestyle() in ("None", "", " ", "none") else \
            [run for run in _finite_runs(xy) if len(run) > 1]
        yield what, points, paths, []
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        label = coll.get_label()
        what = f"{type(coll).__name__} {label!r}" if label and not label.startswith("_") \
            else f"a {type(coll).__name__}"
        if isinstance(coll, PathCollection):  # scatter: markers at the offsets
            offsets = np.asarray(coll.get_offsets(), dtype=float)
            if offsets.size:
                yield what, coll.get_offset_transform().transform(offsets), [], []
        elif isinstance(coll, LineCollection):  # error bars, vlines, hlines
            tr = coll.get_transform()
            yield what, None, [tr.transform(np.asarray(p.vertices, dtype=float))
                               for p in coll.get_paths()], []
        elif isinstance(coll, PolyCollection):  # fill_between bands
            yield what, None, [], [coll.get_window_extent(renderer)]
    for patch in ax.patches:
        if patch.get_visible():
            yield "a bar", None, [], [patch.get_window_extent(renderer)]
    for image in ax.images:
        if image.get_visible():
            yield "an image", None, [], [image.get_window_extent(renderer)]


def _covers(box: Bbox, points, paths, boxes, tol: float) -> bool:
    inner = _shrunk(box, tol)
    if inner.width <= 0 or inner.height <= 0:
        return False
    if points is not None and len(points):
        p = np.asarray(points)
        p = p[np.all(np.isfinite(p), axis=1)]
        if np.any((p[:, 0] > inner.x0) & (p[:, 0] < inner.x1) & (p[:, 1] > inner.y0)
                  & (p[:, 1] < inner.y1)):
            return True
    for run in paths:
        for seg in _finite_runs(np.asarray(run, dtype=float)):
            if len(seg) > 1 and MplPath(seg).intersects_bbox(inner, filled=False):
                return True
    return any(_overlap(b, box, tol) for b in boxes)


def collisions(fig, tol_pt: float = TOLERANCE_PT) -> list[str]:
    """Every collision on ``fig`` (drawn here), in words; empty when none.

    Reported: two text boxes that overlap (a tick label on a neighbour, a legend on a title, a
    label on a label), a legend that covers data of its axes (a marker inside it, a line that
    crosses it, a bar, band or image under it) and an annotation that covers a marker or a bar
    of its axes. Boxes overlap when they share more than ``tol_pt`` points in both directions;
two annotations collide when they come closer than ``tol_pt``.
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    tol = tol_pt * fig.dpi / 72.0
    found = []
    boxes = text_boxes(fig, renderer)
    for i, (name_a, kind_a, _, a) in enumerate(boxes):
        for name_b, kind_b, _, b in boxes[i + 1:]:
            # two annotations that only touch read as one ("SearchLimitSearchLimit"): they
            # need a gap of tol
            if _overlap(a, b, -tol if kind_a == kind_b == "text" else tol):
                found.append(f"{name_a} overlaps {name_b}")
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        clip = ax.get_window_extent(renderer)
        items = list(_data_items(ax, renderer))
        covering = [(n, k, b) for n, k, art, b in boxes
                    if (k == "legend" and art is ax.get_legend())
                    or (k == "text" and getattr(art, "axes", None) is ax)]
        for name, kind, box in covering:
            inside = Bbox.intersection(box, clip)
            if inside is None:
                continue
            for what, points, paths, rects in items:
                if kind == "text":  # an annotation sits beside its data (markers, bars) or
                    paths = []    # in its heat map's cell
                    if what == "an image":
                        continue
                if _covers(inside, points, paths, rects, tol):
                    found.append(f"{name} covers {what}")
    return list(dict.fromkeys(found))


# ---------------------------------------------------------------------------------------------
# the layout pass every figure goes through before it is saved
# ---------------------------------------------------------------------------------------------
def _tick_overlaps(axis, renderer, tol: float) -> bool:
    boxes = [t.get_window_extent(renderer) for t in _ticklabels(axis)]
    return any(_overlap(a, b, tol) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def _thin_ticks(axis, renderer, tol: float) -> None:
    """Drop an axis's minor tick labels, then every other major one, until its tick labels no
    longer overlap."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter

    if not _tick_overlaps(axis, renderer, tol):
        return
    if not isinstance(axis.get_minor_formatter(), NullFormatter):
        axis.set_minor_formatter(NullFormatter())
        axis.figure.canvas.draw()
        if not _tick_overlaps(axis, renderer, tol):
            return
    locs = np.asarray(axis.get_majorticklocs())
    fmt = axis.get_major_formatter()
    labels = list(fmt.seq) if isinstance(fmt, FixedFormatter) else None
    for step in (2, 3, 4, 5, 8, 10):
        axis.set_major_locator(FixedLocator(locs[::step]))
        if labels is not None:
            axis.set_major_formatter(FixedFormatter(labels[::step]))
        axis.figure.canvas.draw()
        if not _tick_overlaps(axis, renderer, tol):
            return


def _legend_collides(fig, ax, renderer, tol: float) -> bool:
    legend = ax.get_legend()
    box = legend.get_window_extent(renderer)
    inside = Bbox.intersection(box, ax.get_window_extent(renderer))
    if inside is not None and any(_covers(inside, p, paths, rects, tol)
                                  for _, p, paths, rects in _data_items(ax, renderer)):
        return True
    return any(_overlap(box, b, tol) for _, _, art, b in text_boxes(fig, renderer)
               if art is not legend)


def _relayout(fig) -> None:
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
    else:  # a figure laid out by tight_layout once
        fig.tight_layout()
    fig.canvas.draw()


#: where a legend that covers data is tried first, inside its axes
_INSIDE = ("upper right", "upper left", "lower left", "lower right", "center right",
           "center left", "upper center", "lower center")


def _try_corners(fig, ax, legend, renderer, tol) -> bool:
    for loc in _INSIDE:
        legend.set_loc(loc)
        fig.canvas.draw()
        if not _legend_collides(fig, ax, renderer, tol):
            return True
    return False


def _try_headroom(fig, ax, legend, renderer, tol, tries: int = 2) -> bool:
    """Raise the top of the y axis (on its own scale) until the data lie below the legend, in
    an upper corner; gives up (limits as they were) after ``tries``."""
    limits = ax.get_ylim()
    scale = ax.yaxis.get_transform()
    for loc in ("upper right", "upper left"):
        legend.set_loc(loc)
        ax.set_ylim(limits)
        for _ in range(tries):
            fig.canvas.draw()
            if not _legend_collides(fig, ax, renderer, tol):
                return True
            box = legend.get_window_extent(renderer).transformed(ax.transAxes.inverted())
            below = box.y0 - 0.02
            if below <= 0.2:
                break
            lo, hi = scale.transform(np.array(ax.get_ylim(), dtype=float))
            top = scale.inverted().transform(np.array([lo + (hi - lo) / below]))[0]
            ax.set_ylim(ax.get_ylim()[0], top)
    ax.set_ylim(limits)
    return False


def tidy(fig, tol_pt: float = TOLERANCE_PT):
    """The layout pass of every figure (:func:`attnquery.figures.render`): tick labels that
    overprint each other are thinned (minor labels first, then every other major label), and a
    legend that covers its axes' data or another text is moved to the first corner of its axes
where it covers neither (:data:`_INSIDE`), else into the room made above the data by raising
the top of the y axis, else out of its axes, to their right.
    Returns ``fig``."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    tol = tol_pt * fig.dpi / 72.0
    for ax in fig.axes:
        if ax.get_visible():
            for axis in (ax.xaxis, ax.yaxis):
                if axis.get_visible():
                    _thin_ticks(axis, renderer, tol)
    moved = False
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None or not legend.get_visible() or legend._bbox_to_anchor is not None:
            continue  # a legend placed outside its axes on purpose stays
        if not _legend_collides(fig, ax, renderer, tol):
            continue
        if not (_try_corners(fig, ax, legend, renderer, tol)
                or _try_headroom(fig, ax, legend, renderer, tol)):
            legend.set_loc("upper left")
            legend.set_bbox_to_anchor((1.02, 1.0), transform=ax.transAxes)
            legend._borderaxespad = 0.0
            moved = True
    if moved:
        _relayout(fig)
    return fig
