"""Fitting a sum of tanh terms along a line, by variable projection.

Along a line through an anchor y, two-row queries ``[y + t u; y]`` of generic multi-head attention
give an even part ``e(t) = sum_h c_h tanh(r_h t / 2)`` (see :mod:`.generic`). A line is fitted
with the fewest terms that reach a relative residual: the coefficients c are eliminated by least
squares (variable projection), the log-rates are found by a grid search per added term and
refined by Levenberg-Marquardt, all lines of a batch at once.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["TanhSumFit", "LineFit", "fit_tanh_sum", "predicted_error", "SPLITS"]

#: factors by which a rate is split into two when a term is added
SPLITS = (0.8, 0.95)


class TanhSumFit(NamedTuple):
    """One line's fit ``e(t) = sum_k coef_k tanh(rates_k t / 2)``.

    ``n_terms`` is 0 when no fit with at most the allowed terms reached the tolerance (``rates``,
    ``coef`` and ``rel_res`` are then those of the last fit tried).
    """

    n_terms: int
    rates: np.ndarray
    coef: np.ndarray
    rel_res: float


class LineFit(NamedTuple):
    """A fitted line as the learner uses it: terms and the predicted relative parameter error."""

    n_terms: int
    rates: np.ndarray
    coef: np.ndarray
    err: float


def _basis(t, rates):
    x = 0.5 * np.outer(t, rates)
    th = np.tanh(x)
    return th, x * (1.0 - th) * (1.0 + th)  # Phi and d Phi / d log(rate)


def _basis_batch(t, rates):
    x = 0.5 * t[None, :, None] * rates[:, None, :]
    th = np.tanh(x)
    return th, x * (1.0 - th) * (1.0 + th)


def _varpro_batch(t, E, TH):
    """Residuals, Kaufman Jacobians (w.r.t. log-rates) and coefficients for a batch of fits.

    ``E`` (B, n) data, ``TH`` (B, k) log-rates; c is eliminated by least squares.
    """
    Phi, dPhi = _basis_batch(t, np.exp(TH))
    Qm, R = np.linalg.qr(Phi)
    Qe = np.einsum("bnk,bn->bk", Qm, E)
    r = E - np.einsum("bnk,bk->bn", Qm, Qe)
    try:
        c = np.linalg.solve(R, Qe[..., None])[..., 0]
        if not np.all(np.isfinite(c)):
            raise np.linalg.LinAlgError
    except np.linalg.LinAlgError:
        c = np.einsum("bkl,bl->bk", np.linalg.pinv(R), Qe)
    G = dPhi * c[:, None, :]
    J = -(G - np.einsum("bnk,bkl->bnl", Qm, np.einsum("bnk,bnl->bkl", Qm, G)))
    return r, J, c


def _lm_batch(t, E, TH, iters: int = 120):
    """Levenberg-Marquardt on log-rates for a batch of variable-projection fits.

    Each fit stops on its own (tiny relative decrease, damping out of range, or a residual at
    rounding level); only the fits still running are computed.
    """
    lo, hi = np.log(1e-6 / t.max()), np.log(1e6 / t.min())
    TH = np.clip(np.array(TH, dtype=float), lo, hi)
    r, J, c = _varpro_batch(t, E, TH)
    cost = np.einsum("bn,bn->b", r, r)
    floor = (1e-15 * np.linalg.norm(E, axis=1)) ** 2
    lam = np.full(TH.shape[0], 1e-3)
    k = TH.shape[1]
    eye = np.eye(k)
    act = np.flatnonzero(cost > floor)
    for _ in range(iters):
        if act.size == 0:
            break
        Ja, ra = J[act], r[act]
        A = np.einsum("bnk,bnl->bkl", Ja, Ja)
        g = np.einsum("bnk,bn->bk", Ja, ra)
        diag = np.einsum("bkk->bk", A)
        M = A + lam[act, None, None] * (diag[:, :, None] * eye + 1e-30 * eye)
        try:
            step = -np.linalg.solve(M, g[..., None])[..., 0]
        except np.linalg.LinAlgError:
            step = -np.einsum("bkl,bl->bk", np.linalg.pinv(M), g)
        TH_new = np.clip(TH[act] + step, lo, hi)
        r_new, J_new, c_new = _varpro_batch(t, E[act], TH_new)
        cost_new = np.einsum("bn,bn->b", r_new, r_new)
        better = cost_new < cost[act]
        gain = np.where(better, (cost[act] - cost_new) / np.maximum(cost[act], 1e-300), 0.0)
        ib = act[better]
        TH[ib], r[ib], J[ib], c[ib], cost[ib] = (TH_new[better], r_new[better], J_new[better],
                                                 c_new[better], cost_new[better])
        lam[act] = np.where(better, np.maximum(lam[act] / 3.0, 1e-12), lam[act] * 4.0)
        stalled = (better & (gain < 1e-13)) | (lam[act] > 1e12) | (cost[act] <= floor[act])
        act = act[~stalled]
    return np.exp(TH), c, np.sqrt(cost)


def fit_tanh_sum(t, E, kmax: int, fit_tol: float, grid=None,
                 n_starts: int = 1) -> list[TanhSumFit]:
    """Fit ``e(t) = sum_k c_k tanh(r_k t / 2)`` to each row of E with the fewest terms.

    Terms are added greedily: the new rate is chosen on a logarithmic ``grid`` by projected
    residual (the best ``n_starts`` each refined with all rates by Levenberg-Marquardt, all
    lines at once); a line stops at the first number of terms whose relative residual is at
    most ``fit_tol``.

    Returns
    -------
    list of TanhSumFit, one per row of E (``n_terms = 0`` when no fit with at most ``kmax``
    terms reached the tolerance).
    """
    E = np.atleast_2d(np.asarray(E, dtype=float))
    L = E.shape[0]
    norms = np.linalg.norm(E, axis=1)
    if grid is None:
        grid = np.geomspace(0.05 / t.max(), 20.0 / t.min(), 80)
    Cg, _ = _basis(t, grid)  # (n, G)
    out: list = [None] * L
    for i in np.flatnonzero(norms == 0):
        out[i] = TanhSumFit(0, np.empty(0), np.empty(0), 0.0)
    idx = np.flatnonzero(norms > 0)
    rates = np.empty((idx.size, 0))
    for k in range(1, kmax + 1):
        if idx.size == 0:
            break
        Ek = E[idx]
        if k > 1:
            Phi, _ = _basis_batch(t, rates)
            Qm, _ = np.linalg.qr(Phi)
            R0 = Ek - np.einsum("bnk,bk->bn", Qm, np.einsum("bnk,bn->bk", Qm, Ek))
            C = Cg[None] - np.einsum("bnk,bkg->bng", Qm, np.einsum("bnk,ng->bkg", Qm, Cg))
        else:
            R0 = Ek
            C = np.broadcast_to(Cg, (idx.size, *Cg.shape))
        nc = np.einsum("bng,bng->bg", C, C)
        gain = np.einsum("bn,bng->bg", R0, C) ** 2 / np.maximum(nc, 1e-300)
        gain[nc < 1e-24 * nc.max(initial=0.0)] = 0.0
        ng = min(n_starts, grid.size)
        top = np.argsort(-gain, axis=1)[:, :ng]  # (A, ng)
        starts = [np.concatenate([np.repeat(rates, ng, axis=0), grid[top].reshape(-1, 1)],
                                 axis=1).reshape(idx.size, ng, k)]
        # a (k-1)-term fit often merges two close rates into one: also split each rate
        for j in range(k - 1):
            for f in SPLITS:
                st = np.concatenate([rates, rates[:, j: j + 1] / f], axis=1)
                st[:, j] *= f
                starts.append(st[:, None, :])
        starts = np.concatenate(starts, axis=1)  # (A, ns, k)
        ns = starts.shape[1]
        starts = starts.reshape(-1, k)
        r_all, c_all, res_all = _lm_batch(t, np.repeat(Ek, ns, axis=0), np.log(starts))
        res_all = res_all.reshape(idx.size, ns)
        pick = np.argmin(res_all, axis=1)
        sel = np.arange(idx.size) * ns + pick
        rates_k, c_k = r_all[sel], c_all[sel]
        order = np.argsort(rates_k, axis=1)
        rates_k = np.take_along_axis(rates_k, order, axis=1)
        c_k = np.take_along_axis(c_k, order, axis=1)
        rel = res_all[np.arange(idx.size), pick] / norms[idx]
        done = rel <= fit_tol
        for j in np.flatnonzero(done | (k == kmax)):
            out[idx[j]] = TanhSumFit(k if done[j] else 0, rates_k[j], c_k[j], float(rel[j]))
        keep = ~done
        idx, rates = idx[keep], rates_k[keep]
    return out


def predicted_error(t, e, fit: TanhSumFit) -> float:
    """Relative parameter error the fit's Jacobian predicts at the data's noise level."""
    Phi, dPhi = _basis(t, fit.rates)
    J = np.hstack([dPhi * fit.coef, Phi])
    noise = max(fit.rel_res, 1e-14) * np.linalg.norm(e) / np.sqrt(t.size)
    try:
        s = np.linalg.svd(J, compute_uv=False)
        if s[-1] <= 1e-300:
            return np.inf
        cov = np.linalg.pinv(J.T @ J)
    except np.linalg.LinAlgError:  # pragma: no cover
        return np.inf
    sd = np.sqrt(np.abs(np.diag(cov))) * noise
    k = fit.rates.size
    rel = np.concatenate([sd[:k], sd[k:] / np.maximum(np.abs(fit.coef), 1e-300)])
    return float(rel.max())
