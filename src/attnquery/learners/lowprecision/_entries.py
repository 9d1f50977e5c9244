"""The entry estimates: running weighted means of every measured logit entry ``T_lj`` and of
every ``u_l^T v``, with the sums their error estimates need."""

from __future__ import annotations

import numpy as np

from ._constants import _C, _H, _M, _Q, _T


class Entries:
    """Running weighted means of the measurements of every ``T_lj`` and of every ``u_l^T v``,
    and the sums their error estimates need.

    Sums are kept relative to each entry's first measurement, so the scatter is computed without
    cancellation even when it is at float64 rounding level. The answers' noise is modelled as
    relative, ``var(y) = sigma^2 y^2``, with sigma estimated from the scatter of
    ``(y+ - y-) / c = u^T v`` over the columns that share a direction.
    """

    def __init__(self, d: int, inverse_variance: bool = False, n_cols: int | None = None):
        #: weigh each measurement by kappa^2 min(1, 2 / H) (its inverse variance, up to the
        #: noise level) instead of kappa^2: a pair whose smaller answer nears the rest of the
        #: answer (a large H) then counts little (used with fit_bias)
        self.iv = inverse_variance
        shape = (d, d if n_cols is None else int(n_cols))  # directions x last tokens
        self.ref = np.full(shape, np.nan)  # first z of each entry

        self.s0 = np.zeros(shape)  # sum of weights kappa^2
        self.s1 = np.zeros(shape)  # sum of w (z - ref)
        self.s2 = np.zeros(shape)  # sum of w (z - ref)^2
        self.h = np.zeros(shape)  # sum of kappa^2 H: logit variance per sigma^2
        self.n = np.zeros(shape, dtype=np.int64)
        self.mref = np.full(d, np.nan)  # u_l^T v: first per-row mean
        self.om = np.zeros(d)  # sum of weights omega = c^2 / q
        self.m1 = np.zeros(d)
        self.ss = 0.0  # omega-weighted scatter of u^T v over the columns sharing a direction
        self.dof = 0

    def add(self, rows, cols, P, kap, max_logit: float = np.inf):
        """Measurements ``P`` (:func:`pair_logits`, (5, len(rows), len(cols))) of directions
        ``rows`` against columns ``cols`` at logit scales ``kap``. A logit that is not finite
        or beyond ``max_logit`` carries no weight."""
        ix = np.ix_(rows, cols)
        t = P[_T]
        ok = np.abs(t) <= max_logit  # False for NaN
        z = np.where(ok, t / kap, 0.0)
        if self.iv:
            with np.errstate(divide="ignore", invalid="ignore"):
                g = np.where(ok, np.minimum(1.0, 2.0 / P[_H]), 0.0)
            g = np.where(np.isfinite(g), g, 0.0)
            ok = ok & (g > 0)
        else:
            g = 1.0
        w = np.where(ok, kap * kap * g, 0.0)
        ref = self.ref[ix]
        ref = np.where(np.isnan(ref) & ok, z, ref)
        self.ref[ix] = ref
        dz = np.where(ok, z - ref, 0.0)
        self.s0[ix] += w
        self.s1[ix] += w * dz
        self.s2[ix] += w * dz * dz
        self.h[ix] += np.where(ok, w * g * P[_H], 0.0)
        self.n[ix] += ok
        m, c, q = P[_M], P[_C], P[_Q]
        good = np.isfinite(m) & (q > 0) & np.isfinite(q)
        om = np.where(good, c * c / np.where(good, q, 1.0), 0.0)
        m = np.where(good, m, 0.0)
        w_om = om.sum(axis=1)
        seen = w_om > 0
        mhat = np.where(seen, (om * m).sum(axis=1) / np.where(seen, w_om, 1.0), 0.0)
        self.ss += float(np.sum(om * (m - mhat[:, None]) ** 2))
        self.dof += int(np.sum(np.maximum(good.sum(axis=1) - 1, 0)))
        rows = np.asarray(rows)[seen]
        mref = self.mref[rows]
        mref = np.where(np.isnan(mref), mhat[seen], mref)
        self.mref[rows] = mref
        self.om[rows] += w_om[seen]
        self.m1[rows] += w_om[seen] * (mhat[seen] - mref)

    def means(self, rows=slice(None)) -> np.ndarray:
        """The weighted means of the entries of ``rows`` (NaN where none was measured)."""
        return self.ref[rows] + self.s1[rows] / self.s0[rows]

    def v_means(self) -> np.ndarray:
        """The weighted means of every direction's ``u_l^T v``."""
        return self.mref + self.m1 / self.om

    def noise(self) -> float:
        """The answers' relative noise sigma (NaN before two columns shared a direction)."""
        return float(np.sqrt(self.ss / self.dof)) if self.dof else float("nan")
