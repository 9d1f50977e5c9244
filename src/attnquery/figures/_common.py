"""Code shared by several figure modules (not a figure module: figure modules import this one,
never each other)."""

from __future__ import annotations

import numpy as np

from ..metrics import PowerLawFit, fit_power_law_within
from ..theory import LOWPRECISION_TARGET as TARGET_REL_ERR

__all__ = ["fit_within", "group_keys", "inf_to", "slope_fits", "queries_needed", "label_points",
           "SLOPE_FROM_PASSES"]

#: the exponents of the low-precision learner are fitted on runs with at least this many
#: complete passes over W: with fewer, the first pass (asked at a lower logit scale while the
#: columns' scales are still being learnt) and the fixed costs (v, the scale search, the check)
#: weigh more than averaging does
SLOPE_FROM_PASSES = 4


def group_keys(rows, by) -> list[str]:
    """One string per row naming its group: the values of the columns ``by``, joined."""
    return ["|".join(map(str, vals)) for vals in zip(*(rows[k] for k in by), strict=True)]


def fit_within(rows, x: str, y: str, by) -> PowerLawFit:
    """The power law ``y = C_g x^slope`` of the columns ``x`` and ``y`` of ``rows``, with a
    constant per group of the columns ``by``
    (:func:`attnquery.metrics.fit_power_law_within`: ``n - G - 1`` degrees of freedom)."""
    return fit_power_law_within(rows[x], rows[y], group_keys(rows, by))


def inf_to(y, top):
    """``y`` with its infinite entries (failed runs) drawn at ``top``."""
    y = np.asarray(y, dtype=float)
    return np.where(np.isfinite(y), y, top)


def slope_fits(rows, min_passes: int = SLOPE_FROM_PASSES) -> dict:
    """Exponent of the error of W against the queries spent, on runs with at least
    ``min_passes`` complete passes over W: per (family, precision) and pooled over every
    precision but float64 (per family and all; family None), with a constant per head and
    precision."""
    out = {}
    sub = rows[(rows["rounding"] != "float64") & (rows["passes"] >= min_passes)]
    for fam in [*sorted(sub["family"].unique()), None]:
        g = sub if fam is None else sub[sub["family"] == fam]
        keys = [None, *sorted(g["rounding"].unique())]
        for spec in keys:
            h = g if spec is None else g[g["rounding"] == spec]
            try:
                out[(fam, spec)] = fit_within(h, "spent", "rel_err_W", by=("unit", "rounding"))
            except Exception:  # too few points for a fit
                continue
    return out


def queries_needed(rows, target: float = TARGET_REL_ERR, stat: str = "median",
                   fits: dict | None = None) -> dict:
    """Per (family, precision): queries per unknown for a relative error of W of ``target``.

    The ``stat`` ("median" or "max") over heads of the error at each budget of the grid is
    interpolated on log-log axes against the queries spent. Returns ``(queries, kind)``:
    ``"at most"`` when the smallest budget already reaches the target, ``"measured"`` when two
    budgets of the grid bracket it, ``"extrapolated"`` (with the precision's fitted exponent from
    ``fits``, else -1/2) when no budget of the grid reaches it.
    """
    fits = slope_fits(rows) if fits is None else fits
    out = {}
    for (fam, spec), g in rows.groupby(["family", "rounding"], sort=True):
        per = g.groupby("queries_per_unknown").agg(err=("rel_err_W", stat),
                                                   spent=("spent", "median")).sort_index()
        lx, ly = np.log(per["spent"].to_numpy()), np.log(per["err"].to_numpy())
        lt = np.log(target)
        hit = np.flatnonzero(ly <= lt)
        if hit.size and hit[0] == 0:
            out[(fam, spec)] = (float(np.exp(lx[0])), "at most")
        elif hit.size:
            i = hit[0]
            x = lx[i - 1] + (lt - ly[i - 1]) * (lx[i] - lx[i - 1]) / (ly[i] - ly[i - 1])
            out[(fam, spec)] = (float(np.exp(x)), "measured")
        else:
            f = fits.get((fam, spec))
            b = f.slope if f is not None and f.slope < 0 else -0.5
            out[(fam, spec)] = (float(np.exp(lx[-1] + (lt - ly[-1]) / b)), "extrapolated")
    return out


#: where :func:`label_points` tries a label, in points from its marker (right, then around)
LABEL_OFFSETS = ((5, 0, "left"), (5, 7, "left"), (5, -7, "left"), (-5, 0, "right"),
                 (-5, 7, "right"), (-5, -7, "right"), (0, 9, "center"), (0, -9, "center"),
                 (5, 14, "left"), (5, -14, "left"))


def label_points(ax, xs, ys, names, fontsize: float = 6, **text) -> None:
    """Name each point ``(x, y)`` of ``ax`` beside its marker: each label at the first offset
    of :data:`LABEL_OFFSETS` where it overlaps no label placed before it and no marker (the
    figure is drawn to measure the labels; its layout engine runs first). ``text``: further
    keywords of the labels (``color``)."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    pts = ax.transData.transform(np.column_stack([xs, ys]).astype(float))
    pad = 3.0 * fig.dpi / 72.0
    placed = []
    for x, y, name in zip(xs, ys, names, strict=True):
        for dx, dy, ha in LABEL_OFFSETS:
            t = ax.annotate(str(name), (x, y), xytext=(dx, dy), textcoords="offset points",
                            fontsize=fontsize, ha=ha, va="center", **text)
            box = t.get_window_extent(renderer)
            near = (box.x0 - pad < pts[:, 0]) & (pts[:, 0] < box.x1 + pad) & \
                (box.y0 - pad < pts[:, 1]) & (pts[:, 1] < box.y1 + pad)
            if not near.any() and not any(box.expanded(1.0, 1.0).overlaps(b) for b in placed):
                break
            t.remove()
        else:  # every place taken: the first one
            dx, dy, ha = LABEL_OFFSETS[0]
            t = ax.annotate(str(name), (x, y), xytext=(dx, dy), textcoords="offset points",
                            fontsize=fontsize, ha=ha, va="center", **text)
            box = t.get_window_extent(renderer)
        placed.append(box)
