"""The passes over every entry of ``T = U W`` that both routes of the low-precision learner
share: the search for the logit scales, the first pass, the passes the budget pays for and the
solve of W and v from the weighted means. Each step returns what it measured; the estimator's
``fit`` assigns its fitted attributes from the frozen results."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...errors import AssumptionViolation
from ._constants import (
    _JITTER_NOISE,
    _KAPPA_DITHER,
    _LAST_TOKEN_JITTER,
    _SCOUT_COLUMNS,
    _SCOUT_ROWS,
)
from ._entries import Entries
from ._noise import check_noise, spread_root, tail
from ._pairs import Probes


class FullRun(NamedTuple):
    """What the passes over every entry measured (:func:`full_passes`)."""

    #: the entries' running means
    acc: Entries
    #: the design the passes ended with (the jitter set by the scale search)
    probes: Probes
    #: each column's logit scale after the first pass (before dithering)
    logit_scale: np.ndarray
    #: complete passes, and directions of the final partial pass
    n_passes: int
    n_partial_rows: int


class Solution(NamedTuple):
    """W and v from the weighted means, with their error estimates (:func:`solve`)."""

    W: np.ndarray
    v: np.ndarray
    noise_level: float
    residual_ratio: float
    singular_values: np.ndarray
    rank: int
    W_error_estimate: float
    v_error_estimate: float
    #: the relative error of W that the answers' noise alone explains (the check's share)
    W_err_noise: float
    #: ``(L, R)`` with ``W = L R^T`` when the rank is below d, else None
    W_factors: tuple | None
    #: the dense W when ``W_factors`` is None, else None
    W_dense: np.ndarray | None
    #: each column's error norm, and W's left singular vectors (the key bias's projection)
    col_err: np.ndarray
    Uw: np.ndarray

    def fitted(self) -> dict:
        """The estimator's fitted attributes this solution gives (name -> value)."""
        return {"W_factors_": self.W_factors, "_W": self.W_dense, "v_": self.v,
                "rank_": self.rank, "singular_values_": self.singular_values,
                "noise_level_": self.noise_level, "residual_ratio_": self.residual_ratio,
                "W_error_estimate_": self.W_error_estimate,
                "v_error_estimate_": self.v_error_estimate}


def scale_search(est, probes: Probes, acc: Entries):
    """The model's logit scale from a few scout columns, then every column's from its pilot
    rows. Returns the design (with ``fit_bias``, its last tokens jittered where the answers'
    noise asks for it), the columns' scales and which columns are zero to the answers'
    precision."""
    d = probes.U.shape[0]
    p = min(int(est.pilot_rows), d)
    scouts = np.unique(np.linspace(0, d - 1, min(_SCOUT_COLUMNS, d)).astype(int))
    kap_s, _ = probes.search(np.arange(min(_SCOUT_ROWS, d)), scouts,
                             np.full(scouts.size, float(est.initial_logit_scale)), acc)
    kappa_p, tp = probes.search(np.arange(p), np.arange(d),
                                np.full(d, np.median(kap_s) / 2.0), acc)
    if probes.fit_bias and (acc.noise() > _JITTER_NOISE or probes.cancelled):
        probes = probes.but(jitter_size=_LAST_TOKEN_JITTER)  # the passes' last tokens jittered
    return probes, kappa_p, np.sqrt(np.mean(tp**2, axis=0)) < float(est.target_logit) / 10


def pass_logit(est, probes: Probes, d: int) -> float:
    """The passes' root-mean-square logit: ``target_logit``, lowered where the largest of a
    column's d logits, dithered, would pass the logit limit."""
    return min(float(est.target_logit), probes.mlog / (np.exp(_KAPPA_DITHER) * tail(d)))


def first_pass(est, probes: Probes, acc: Entries, kappa_p, zero, stop=None) -> np.ndarray:
    """The first pass over the rows after the pilot's (up to ``stop``, all by default), in
    stages growing fourfold, each column's scale re-estimated from the rows measured so far.
    Returns the scales."""
    d = probes.U.shape[0]
    stop = d if stop is None else int(stop)
    cols = np.arange(d)
    # columns zero to the answers' precision keep the pilot's scale. The others aim at a
    # root-mean-square logit lowered where the largest of a column's d logits (about
    # sqrt(2 ln 2d) times it) would pass max_logit, with a margin for the spread of the
    # scale estimated from the rows measured so far
    tl = tail(d)
    T = pass_logit(est, probes, d)
    n = min(int(est.pilot_rows), d)
    while True:
        z = acc.means(slice(None, n))  # u^T w of the rows measured
        rms = np.sqrt(np.mean(z**2, axis=0))
        spread = 1.0 / spread_root(n) if n < d else 1.0
        kappa = np.where(zero | (rms == 0), kappa_p,
                         min(T, probes.mlog / (spread * tl)) / np.where(rms > 0, rms, 1))
        if n >= stop:
            break
        rows = np.arange(n, min(4 * n, stop))
        acc.add(rows, cols, *probes.sweep(rows, kappa, np.ones(d)))  # (P, kappa)
        n = rows[-1] + 1
    check_noise(acc)  # before the rest of the budget is spent
    return kappa


def more_passes(probes: Probes, acc: Entries, kappa, rng) -> tuple[int, int]:
    """Full passes while the budget pays for them, then a partial one over random
    directions, each at a dithered scale and answer size. Returns the complete passes (the
    first included) and the directions of the partial one."""
    d = kappa.size
    cols = np.arange(d)
    n_passes, partial = 1, 0
    while True:
        left = probes.channel.ledger.left() - 2 * d  # one direction's worth for re-asked pairs
        rows = np.arange(d) if left >= 2 * d * d else np.sort(
            rng.choice(d, size=max(0, min(d, left // (2 * d))), replace=False))
        if rows.size == 0:
            break
        kap_b = kappa * np.exp(rng.uniform(-_KAPPA_DITHER, _KAPPA_DITHER, size=d))
        acc.add(rows, cols, *probes.sweep(rows, kap_b, 10.0 ** rng.uniform(0.0, 1.0, size=d)))
        if rows.size < d:
            partial = rows.size
            break
        n_passes += 1
    return n_passes, partial


def full_passes(est, probes: Probes, ledger, rng) -> FullRun:
    """Every entry of ``T = U W``: the scale search, then passes over the d x d entries
    while the budget pays for them, and a partial one."""
    acc = Entries(probes.U.shape[0], inverse_variance=probes.fit_bias)
    probes = probes.but(acc=acc if probes.fit_bias else None)
    with ledger.stage("scale_search"):  # the model's scale, then each column's
        probes, kappa_p, zero = scale_search(est, probes, acc)
    with ledger.stage("passes"):  # passes over every entry, then a partial one
        kappa = first_pass(est, probes, acc, kappa_p, zero)
        n_passes, partial = more_passes(probes, acc, kappa, rng)
    return FullRun(acc, probes, kappa, n_passes, partial)


def solve(acc: Entries, U: np.ndarray, rank=None, min_cut: float | None = None) -> Solution:
    """W and v from the weighted means; noise, error estimates and rank (``rank`` where
    given, else the singular values above ``2 / sqrt(3)`` times the noise's spectral edge, and
    above ``min_cut`` where given: the bias route's floor for the key bias's rank-one
    error)."""
    d = U.shape[0]
    if not (np.all(acc.s0 > 0) and np.all(acc.om > 0)):  # every pass re-asks until usable
        raise AssumptionViolation("some entries of W were never measured by a usable pair")
    T = acc.means()
    W = U.T @ T
    v = U.T @ acc.v_means()
    rss = float(np.sum(acc.s2 - acc.s1**2 / acc.s0))
    dof_t = int(np.sum(acc.n - 1))
    resid2 = max(rss, 0.0) / dof_t if dof_t > 0 else np.nan  # kappa^2-weighted logit scatter
    rel = acc.noise()
    if not np.isfinite(rel):  # d = 1: no column shares a direction; use the residuals
        rel = float(np.sqrt(resid2 / 2.0)) if np.isfinite(resid2) else 0.0
    # variance of each T_lj: the answers' noise through the weighted mean, and the scatter
    # of repeated measurements where that is larger (per column)
    col_model = rel**2 * np.sum(acc.h / acc.s0**2, axis=0)
    col_resid = resid2 * np.sum(1.0 / acc.s0, axis=0) if dof_t > 0 else np.zeros(d)
    residual_ratio = (float(np.sum(col_resid) / np.sum(col_model))
                      if dof_t > 0 and np.sum(col_model) > 0 else float("nan"))
    col_err = np.sqrt(np.maximum(col_model, col_resid))  # error norm of each column
    E = float(np.sqrt(np.sum(col_err**2)))
    Wn, vn = float(np.linalg.norm(W)), float(np.linalg.norm(v))
    Uw, sv, Vt = np.linalg.svd(W)
    if rank is not None:
        r = int(rank)
    else:  # 2/sqrt(3) times the noise's spectral edge (rows' and columns' error norms)
        edge = E / np.sqrt(d) + float(np.max(col_err))
        cut = (2.0 / np.sqrt(3.0)) * edge
        if min_cut is not None:
            cut = max(cut, min_cut)
        r = int(np.count_nonzero(sv > cut))
    shrink = np.sqrt(r * (2 * d - r)) / d if r < d else 1.0
    W_error_estimate = E * shrink / Wn if Wn > 0 else float("inf")
    v_error_estimate = (rel * float(np.sqrt(np.sum(1.0 / acc.om))) / vn if vn > 0
                        else float("inf"))
    # the check's tolerance uses the answers' noise alone, which a box that is not a single
    # head does not inflate (unlike the scatter of the logits)
    W_err_noise = (float(np.sqrt(np.sum(col_model))) * shrink / Wn if Wn > 0 else 0.0)
    factors = (Uw[:, :r] * sv[:r], Vt[:r].T.copy()) if r < d else None
    return Solution(W, v, rel, residual_ratio, sv, r, W_error_estimate, v_error_estimate,
                    W_err_noise, factors, None if r < d else W, col_err, Uw)
