"""Code shared by several figure modules (not a figure module: figure modules import this one,
never each other)."""

from __future__ import annotations

import numpy as np

from ..metrics import PowerLawFit, fit_power_law_within
from ..theory import LOWPRECISION_TARGET as TARGET_REL_ERR

__all__ = ["fit_within", "group_keys", "inf_to", "slope_fits", "queries_needed",
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
