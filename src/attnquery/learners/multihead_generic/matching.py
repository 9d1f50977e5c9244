"""Matching the terms of fitted lines to heads.

A line's terms come in no particular order and each only up to a sign. Two ways tell which term
is which head: additivity across the lines ``u0 + u_i`` and ``u0 - u_i`` (the rates and
amplitudes are linear in the direction, so the terms of the two lines add up to twice those of
the reference line ``u0``), and, once the value vectors are known, the amplitudes
``|c| = |u^T v_h| / 2``.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize

from .lines import LineFit

__all__ = ["match_additive", "match_by_v"]


def match_additive(p0: np.ndarray, fit_p: LineFit, fit_m: LineFit, *, line_tol: float,
                   match_tol: float):
    """Match the terms of lines ``u0 + u_i`` and ``u0 - u_i`` to the reference terms p0.

    ``p0`` (K, 2) holds the reference line's (rate, 2 coef) per head, in the gauge where every
    rate is positive. Returns the values ``(a, b)`` of the terms along the half-length
    direction ``u_i`` (arrays of K), or None when the lines do not match unambiguously.
    """
    K = p0.shape[0]
    if fit_p.n_terms != K or fit_m.n_terms != K or max(fit_p.err, fit_m.err) > line_tol:
        return None
    Pp = np.stack([fit_p.rates, 2.0 * fit_p.coef], axis=1)
    Pm = np.stack([fit_m.rates, 2.0 * fit_m.coef], axis=1)
    scale = np.sqrt(np.mean(p0**2, axis=0))
    signs = np.array([1.0, -1.0])
    # comb[m, m', s, s'] = s Pp[m] + s' Pm[m']; R[k, ...] = |comb - 2 p0[k]| / scale
    comb = (Pp[:, None, None, None, :] * signs[None, None, :, None, None]
            + Pm[None, :, None, None, :] * signs[None, None, None, :, None])
    R = np.linalg.norm((comb[None] - 2.0 * p0[:, None, None, None, None, :]) / scale, axis=-1)
    flat = R.reshape(K, -1)
    best = flat.argmin(axis=1)
    m, mm, s, ss = np.unravel_index(best, (K, K, 2, 2))
    if len(set(m)) != K or len(set(mm)) != K:
        return None
    bestval = flat[np.arange(K), best]
    if bestval.max() > match_tol:
        return None
    second = np.partition(flat, 1, axis=1)[:, 1]
    if np.any(second < 10.0 * bestval) or np.any(second < 10 * match_tol):
        return None
    a_plus = signs[s][:, None] * Pp[m]
    a_minus = signs[ss][:, None] * Pm[mm]
    diff = 0.5 * (a_plus - a_minus)  # values along u_i (half-length direction)
    return diff[:, 0], diff[:, 1]


def match_by_v(b: np.ndarray, fit: LineFit, K: int, *, line_tol: float, match_tol: float):
    """Signed rates ``a_k`` of a line whose terms are matched to heads by ``|c| = |b_k| / 2``.

    ``b`` holds ``u^T v_k`` for the K heads. Returns None when the line's fit is rejected or
    two heads' amplitudes are too close to tell apart.
    """
    if fit.n_terms != K or fit.err > line_tol:
        return None
    ab = np.abs(b)
    scale = ab.max()
    if scale == 0 or ab.min() < 0.02 * scale:
        return None
    if K > 1:
        gaps = np.abs(ab[:, None] - ab[None, :])
        np.fill_diagonal(gaps, np.inf)
        if gaps.min() < 0.02 * scale:
            return None
    cost = np.abs(2.0 * np.abs(fit.coef)[:, None] - ab[None, :]) / scale
    rr, cc = scipy.optimize.linear_sum_assignment(cost)
    if cost[rr, cc].max() > match_tol:
        return None
    a = np.empty(K)
    a[cc] = np.sign(fit.coef[rr]) * np.sign(b[cc]) * fit.rates[rr]
    return a
