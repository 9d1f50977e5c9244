"""The bias route's measurements (``fit_bias=True``): v and the offset from one-row answers,
the key bias in the probe basis, the shift that cancels the offset and, where W's rank allows,
the query bias, and the search for the probes' answer size. Each stage returns a frozen result
(:class:`KeyBias`, :class:`BiasRun`); the estimator's ``fit`` assigns from them."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...errors import AssumptionViolation, ModelMismatchError
from ._constants import (
    _BIAS_LOGIT,
    _CANCEL_BIAS_ROUNDS,
    _CANCEL_GAP,
    _CANCEL_ROWS,
    _CANCEL_SIZES,
    _CANCEL_STEPS,
    _CANCEL_SV,
    _DESIGN_ENTRIES,
    _DESIGN_REPS,
    _M,
    _MAX_ANSWER,
    _MAX_ROUNDS,
    _MIN_BIAS_ROUNDS,
    _OFFSET_QUERIES,
    _SKETCH_LOGITS,
    _SKETCH_NOISE,
    _T,
)
from ._entries import Entries
from ._pairs import Channel, Probes, fill_pairs, pair_logits
from ._passes import first_pass, pass_logit, scale_search


class KeyBias(NamedTuple):
    """One key-bias stage's measurement (:func:`key_bias_stage`)."""

    #: ``b_l = u_l^T (W z + c_b)`` for every direction, and the variance of each mean
    b: np.ndarray
    b_var: np.ndarray
    #: each direction's cap on the probes' scale c
    c_bias: np.ndarray
    #: v refined from the pairs' differences (the earlier v where that failed), and ``z^T v``
    v0: np.ndarray
    zv: float
    #: rounds of key-bias pairs
    rounds: int

    def apply(self, probes: Probes) -> Probes:
        """``probes`` with this key bias, its caps and the refined v."""
        return probes.but(b=self.b, c_bias=self.c_bias, v0=self.v0, zv=self.zv)


class BiasRun(NamedTuple):
    """The bias route's ``v`` stage (:func:`shift_and_key_bias`): the probes' design for the
    passes and what the stage measured and chose."""

    probes: Probes
    key_bias: KeyBias
    #: the query bias cancelled by a move of the shift z
    cancelled: bool
    #: the design search's answer size and entry logit (None where not chosen)
    answer_size: float | None
    entry_logit: float | None
    #: W's row space and the rows of T measured first, where the sketch may take over
    rowspace: np.ndarray | None
    T0: np.ndarray | None
    #: (b, its variance, z) at the shift before the move
    first: tuple | None


def read_v_offset(channel: Channel, d: int, rng):
    """v and the offset beta from one-row queries: ``[0]`` and ``[e_j]`` (v roughly), then
    ``[rho e_j]`` with answers ``rho v_j`` of order 1 (v to the answers' precision), then
    the offset as the mean of ``y - x^T v`` over 64 small random tokens (each answer is
    rounded afresh, so their errors average). Returns ``(v, offset)``."""
    channel.need(2 * d + 1 + _OFFSET_QUERIES)
    X = np.zeros((d + 1, 1, d))
    X[np.arange(1, d + 1), 0, np.arange(d)] = 1.0
    y = channel(X)
    if not np.all(np.isfinite(y)):
        raise ModelMismatchError("the box gives no finite answer to one-token queries of "
                                 "unit size")
    off0 = float(y[0])
    va = y[1:] - off0
    amax = float(np.max(np.abs(va)))
    rho = float(np.clip(1.0 / amax, 1.0, 1e3)) if amax > 0 else 1.0
    y2 = channel(rho * X[1:])
    g = rng.standard_normal((_OFFSET_QUERIES, d))
    vb = (y2 - off0) / rho
    if not np.all(np.isfinite(vb)):
        vb = va
    vn = float(np.linalg.norm(vb))
    spread = 0.2 * abs(off0) + 1e-3 * rho * amax  # size of x^T v: many grid steps
    x = g * (spread / (vn * np.sqrt(d))) * np.sqrt(d) / np.linalg.norm(g, axis=1,
                                                                        keepdims=True)
    if vn == 0:
        x = np.zeros_like(g)
    y3 = channel(x[:, None, :])
    ok = np.isfinite(y3)
    off = float(np.mean((y3 - x @ vb)[ok])) if ok.any() else off0
    return ((y2 - off) / rho if np.all(np.isfinite(y2)) else va), off


def bias_pairs(probes: Probes, rows, c, w=None) -> np.ndarray:
    """Pairs ``[+-c u_l + z; z]`` with the shift z (0 at first): the logit is
    ``c u_l^T (W z + c_b)`` and the difference ``c u_l^T v``; returns their
    :func:`pair_logits` (5, n)."""
    n, d = rows.size, probes.U.shape[1]
    probes.channel.need(2 * n)
    X = np.zeros((n, 2, 2, d))
    X[:, 0, 0, :] = c[:, None] * probes.U[rows]
    X[:, 1, 0, :] = -X[:, 0, 0, :]
    if probes.z is not None:
        X += probes.z
    wv = 0.0
    if w is not None:
        X += w
        wv = float(w @ probes.v0)
    y = probes.channel(X.reshape(2 * n, 2, d)).reshape(n, 2)
    return pair_logits(y[:, 0], y[:, 1], probes.off + probes.zv + wv, c)


def bias_scales(probes: Probes, rows, c0, cmax, T):
    """Each direction's scale for the key-bias pairs: a search until its logit is usable,
    then the scale that puts it at ``T`` (at most ``cmax``)."""
    P = bias_pairs(probes, rows, c0)
    for _ in range(_MAX_ROUNDS):
        t = P[_T]
        big = ~(np.abs(t) <= probes.mlog)
        small = ~big & (np.abs(t) < T / 10) & (c0 < cmax)
        redo = big | small
        if not redo.any():
            break
        c0[big] /= 10.0
        c0[small] = np.minimum(cmax, c0[small] * np.minimum(
            1e4, T / np.maximum(np.abs(t[small]), 1e-300)))
        idx = np.flatnonzero(redo)
        P[:, idx] = bias_pairs(probes, idx, c0[idx])
        probes.channel.requeried(idx.size)
    else:
        raise ModelMismatchError(
            "the answers are not those of a single attention head with biases: probes "
            f"with a zero last token give no usable logit at any of {_MAX_ROUNDS} scales")
    b0 = P[_T] / c0
    return np.where(b0 != 0, np.minimum(cmax, T / np.maximum(np.abs(b0), 1e-300)), cmax)


def key_bias_stage(est, probes: Probes, d: int, rng, null=None, c_fixed=None) -> KeyBias:
    """Measure ``b_l = u_l^T c_b`` for every direction (the key bias c_b in the basis U):
    a search for each direction's scale (or ``c_fixed`` for every direction), then rounds
    of pairs with a zero last token at that scale (dithered), averaged with weights
    ``c^2``. The number of rounds grows with the budget (four per pass over W expected, 16
    to 256), so that the key bias's error, which reaches every entry of its row of W, stays
    below the entries' own. With ``null`` (a basis of W's row space and v), the last tokens
    are ``z +- w`` with w off it. Returns the key bias, the cap on the W probes' scale c
    (``c_fixed`` where given) and v refined from the pairs' differences."""
    T, uv = float(est.target_logit), probes.uv
    cmax = min(float(est.answer_scale), _MAX_ANSWER) / uv  # the W probes' largest c
    rows = np.arange(d)
    if c_fixed is None:
        c0 = bias_scales(probes, rows, np.full(d, cmax), cmax, T)
    else:
        c0 = np.full(d, float(c_fixed))
    per_pass = 2 * d * d
    rpp = 4 if c_fixed is None else _CANCEL_BIAS_ROUNDS
    left = probes.channel.ledger.left()
    rounds = 2 * (int(np.clip(rpp * (left // per_pass), _MIN_BIAS_ROUNDS, 256)) // 2)
    null_size = float(np.linalg.norm(probes.z)) if probes.z is not None else 1.0
    sw = np.zeros(d)
    s1 = np.zeros(d)
    s2 = np.zeros(d)
    sm = np.zeros(d)
    swm = np.zeros(d)
    shift = None
    for k in range(rounds):
        if null is None or k % 2 == 0:  # +-w at the same scale: weights alike, W w cancels
            c = c0 * rng.uniform(0.8, 1.0, size=d)
        if null is not None:  # last tokens z +- w, w off W's row space: W w cancels in
            # the mean, the box's rounding of the query at z does not repeat
            if k % 2 == 0:
                g = rng.standard_normal(d)
                g -= null @ (null.T @ g)
                shift = g * (null_size / np.linalg.norm(g))
            else:
                shift = -shift
        P = bias_pairs(probes, rows, c, shift)
        ok = np.abs(P[_T]) <= probes.max
        z = np.where(ok, P[_T] / c, 0.0)
        w = np.where(ok, c * c, 0.0)
        sw += w
        s1 += w * z
        s2 += w * z * z
        good = np.isfinite(P[_M])
        sm += np.where(good, c * c * P[_M], 0.0)
        swm += np.where(good, c * c, 0.0)
    if not (np.all(sw > 0) and np.all(swm > 0)):
        raise AssumptionViolation("some directions' key bias was never measured by a "
                                  "usable pair")
    b = s1 / sw
    # variance of each b_l's weighted mean, from the scatter of its rounds
    b_var = np.maximum(s2 / sw - b * b, 0.0) / np.maximum(rounds - 1, 1)
    # the probes' scale c: the key bias's part of each logit within _BIAS_LOGIT, and for
    # every direction at most _BIAS_LOGIT / rms(b), where the key bias's part of the query
    # vector, c c_b, is as large as its measured part kappa W e_j: a larger c (a smaller
    # last token) leaves the scores dominated by the bias, whose rounding in a served box
    # (errors of order eps |k| |q|) then swamps the logit
    rms_b = float(np.sqrt(np.mean(b * b)))
    if c_fixed is not None:
        c_bias = np.full(d, float(c_fixed))
    else:
        with np.errstate(divide="ignore"):
            c_bias = np.minimum(_BIAS_LOGIT / np.abs(b),
                                _BIAS_LOGIT / rms_b if rms_b > 0 else np.inf)
    v = probes.U.T @ (sm / swm)  # u_l^T v at the answers' precision
    v0, zv = probes.v0, probes.zv
    if np.all(np.isfinite(v)) and np.linalg.norm(v) > 0:
        v0 = v
        if probes.z is not None:
            zv = float(probes.z @ v)
    return KeyBias(b, b_var, c_bias, v0, zv, rounds)


def move_shift(probes: Probes, Q, P, S) -> Probes:
    """Move the shift z within W's row space (``Q``, from the SVD ``P S Q^T`` of the rows of
    T measured) so that the measured key-bias logits of those rows vanish, then along the part
    of v off that space so that ``z^T v = -beta`` (the offset stays cancelled)."""
    v0 = probes.v0
    p = v0 - Q @ (Q.T @ v0)
    z0 = probes.z if probes.z is not None else np.zeros(v0.size)
    z = z0 - Q @ ((P.T @ probes.b[:P.shape[0]]) / S)
    z = z - ((z @ v0) + probes.off) / (p @ v0) * p
    return probes.but(z=z, zv=float(z @ v0))


def combine_key_bias(cb, W, U, first, z, b_var, col_err):
    """The key bias from both shifts: ``U^T b - W z`` carries W's error times z, and the moved
    shift ``z`` (larger where the offset needs a long step off W's row space) can carry more
    of it than the ``first``, ``(b, its variance, z)`` before the move. Returns the mix
    ``lambda c_first + (1 - lambda) cb`` (lambda in 0, 0.1, ..., 1) whose predicted variance,
    ``sum_j col_err_j^2 z_lambda,j^2`` (independent column errors) plus the key-bias rounds'
    own (``b_var`` at z), is least."""
    b0, bv0, z0 = first
    c0 = U.T @ b0 - W @ z0
    lam = np.linspace(0.0, 1.0, 11)[:, None]
    zl = lam * z0 + (1.0 - lam) * z
    var = ((zl * col_err) ** 2).sum(axis=1) + (lam[:, 0] ** 2 * bv0.sum()
                                               + (1.0 - lam[:, 0]) ** 2 * b_var.sum())
    k = float(lam[int(np.argmin(var)), 0])
    return k * c0 + (1.0 - k) * cb


def shift_and_key_bias(est, probes: Probes, d: int, rng) -> BiasRun:
    """Every later probe shifted by ``z = -beta v / |v|^2`` (the answers then no longer carry
    the offset, ``z^T v = -beta``, whose rounding would swamp the smaller answer of a pair),
    the key bias measured at last token z, then the query bias cancelled by a move of z where
    W's rank allows (:func:`cancel_query_bias`). The design returned jitters the passes'
    last tokens with a generator of its own."""
    v0 = probes.v0
    z = -probes.off * v0 / float(v0 @ v0)
    if probes.off != 0 and np.all(np.isfinite(z)):
        probes = probes.but(z=z, zv=float(z @ v0))
    kb = key_bias_stage(est, probes, d, rng)
    run = BiasRun(kb.apply(probes), kb, False, None, None, None, None, None)
    # the cancellation's queries: its rows (with their scale search), the design search
    # and two key-bias stages; it runs where a full pass over W is still paid for after it
    cost = (3 * d * _CANCEL_ROWS + 4 * _DESIGN_ENTRIES * _DESIGN_REPS
            * (len(_CANCEL_SIZES) + 2 + len(_SKETCH_LOGITS))
            + 4 * 2 * d * _MIN_BIAS_ROUNDS)
    # after it, a full pass over W: whether the sketch takes over is known only once its
    # rows show the answers' noise, and in narrow formats the full passes follow
    if d > _CANCEL_ROWS and probes.channel.ledger.left() - cost >= 2.1 * d * d:
        run = cancel_query_bias(est, run, d, rng)
    return run._replace(probes=run.probes.but(rng=rng.spawn(1)[0]))


def cancel_query_bias(est, run: BiasRun, d: int, rng) -> BiasRun:
    """Where W's rank is below ``_CANCEL_ROWS``: cancel the query bias.

    The first ``_CANCEL_ROWS`` rows of ``T = U^T W`` are measured once at the shift z (a
    throwaway first pass); their top right singular vectors span W's row space. z is moved
    within that space so that their key-bias logits vanish, ``u_l^T (W z + c_b) = 0``
    (then ``W z + c_b = 0``: c_b lies in W's column space), and along the rest of v so that
    ``z^T v = -beta`` still. With the key bias's part of every logit gone, the probes' scale
    c is no longer capped by it: it is chosen by :func:`design_search`, the key bias is
    measured again at that scale and z moved once more with it. Kept where the key bias
    fell (``cancelled``); else the earlier shift, caps and key bias stay."""
    m = _CANCEL_ROWS
    acc0 = Entries(d, inverse_variance=True)
    probes, kappa_p, zero = scale_search(est, run.probes.but(acc=acc0), acc0)
    first_pass(est, probes, acc0, kappa_p, zero, stop=m)
    probes = probes.but(acc=None)
    T0 = acc0.means(slice(None, m))  # the m rows of T measured
    P, S, Qt = np.linalg.svd(T0, full_matrices=False)
    # W's rank: the last gap of _CANCEL_GAP between consecutive singular values within the
    # first three quarters (the rest is the noise, of a rank below them), above 1e-3 of
    # the largest; none: no clear rank below the rows, no row space to move z in
    gaps = np.flatnonzero((S[:-1] >= _CANCEL_GAP * S[1:])
                          & (S[:-1] > _CANCEL_SV * S[0]))
    gaps = gaps[gaps < m - m // 4]
    if gaps.size == 0:
        return run._replace(probes=probes)
    keep = np.arange(m) <= gaps[-1]
    # the sketch where the answers are float32's or finer (measured: in bfloat16 it took
    # W over its floor from 1.19 to 1.81 on L2H0, 1.25 to 2.26 on L2H9,
    # docs/notes/2026-11-27-served.md)
    rowspace = Qt[keep].T.copy() if acc0.noise() <= _SKETCH_NOISE else None
    old = probes  # the shift, caps, key bias and v kept where the cancellation fails
    first = (probes.b.copy(), run.key_bias.b_var.copy(),
             probes.z.copy() if probes.z is not None else np.zeros(d))
    rms0 = float(np.sqrt(np.mean(probes.b**2)))
    Q = Qt[keep].T
    # the key-bias rounds shift z by +-w off W's row space and v
    null = np.linalg.qr(np.column_stack([Q, probes.v0]))[0]
    step = (Q, P[:, keep], S[keep])
    probes = move_shift(probes, *step)
    grid, errs = design_search(est, probes, T0, rng, _CANCEL_SIZES)
    best = int(np.nanargmin(errs))
    answer_size, entry_logit = float(grid[best, 0]), None
    if rowspace is not None:  # for the sketch: the sizes a factor sqrt(3) either
        a = answer_size  # side, then the entries' logit at the best size
        g2, e2 = design_search(est, probes, T0, rng, (a / np.sqrt(3.0), a * np.sqrt(3.0)))
        g2, e2 = np.vstack([g2, grid[[best]]]), np.append(e2, errs[best])
        answer_size = float(g2[int(np.nanargmin(e2)), 0])
        grid, errs = design_search(est, probes, T0, rng, (answer_size,), _SKETCH_LOGITS)
        entry_logit = float(grid[int(np.nanargmin(errs)), 1])
    kb = run.key_bias
    for k in range(_CANCEL_STEPS):
        kb = key_bias_stage(est, probes, d, rng, null=null, c_fixed=answer_size / probes.uv)
        probes = kb.apply(probes)
        if k < _CANCEL_STEPS - 1:
            probes = move_shift(probes, *step)
    if not float(np.sqrt(np.mean(probes.b**2))) < rms0:
        return BiasRun(old, run.key_bias, False, None, entry_logit, None, T0, first)
    return BiasRun(probes.but(cancelled=True), kb, True, answer_size, entry_logit, rowspace,
                   T0, first)


def design_search(est, probes: Probes, Tm, rng, sizes, logits=None):
    """The relative scatter of repeated logits of ``_DESIGN_ENTRIES`` large entries of
    ``Tm`` (rows of T) at each answer size of ``sizes`` and, where given, each entry logit
    of ``logits`` (else the passes' root-mean-square logit), ``_DESIGN_REPS`` times each
    at dithered scales. Each repetition asks the entry with its last token at +s and at -s
    and the same c, so the key bias's part of the logit cancels. Returns the sizes (or the
    logits, where given) and their scatters (NaN where no entry was measured twice)."""
    m, d = Tm.shape
    rms = float(np.sqrt(np.mean(Tm**2)))
    cand = np.argwhere(np.abs(Tm) > rms)
    pick = rng.choice(len(cand), size=min(_DESIGN_ENTRIES, len(cand)), replace=False)
    rows, cols = cand[pick].T
    Tlj = Tm[rows, cols]
    n = rows.size
    rows2, cols2 = np.concatenate([rows, rows]), np.concatenate([cols, cols])
    if logits is None:
        logits = (pass_logit(est, probes, d),)
    grid = [(a, T) for a in sizes for T in logits]
    errs = []
    for a, T in grid:
        est_ = np.empty((_DESIGN_REPS, n))
        for k in range(_DESIGN_REPS):
            c = a / probes.uv * rng.uniform(0.8, 1.0, size=n)
            s = T / (c * Tlj)
            c, s = np.concatenate([c, c]), np.concatenate([s, -s])
            X = np.zeros((2 * n, 2, 2, d))
            fill_pairs(X, c, probes.U[rows2], s, cols2)
            X += probes.z
            probes.channel.need(4 * n)
            y = probes.channel(X.reshape(4 * n, 2, d)).reshape(2 * n, 2)
            t = pair_logits(y[:, 0], y[:, 1], s * probes.v0[cols2] + probes.off + probes.zv,
                            c)[_T]
            est_[k] = (t[:n] - t[n:]) / (2 * c[:n] * s[:n])
        ok = np.isfinite(est_)
        cnt = ok.sum(axis=0)
        e = np.where(ok, est_, 0.0)
        mean = e.sum(axis=0) / np.maximum(cnt, 1)
        var = np.where(ok, (e - mean) ** 2, 0.0).sum(axis=0) / np.maximum(cnt - 1, 1)
        two = cnt >= 2
        errs.append(float(np.sqrt(np.mean(var[two] / Tlj[two] ** 2))) if two.any()
                    else np.nan)
    if np.all(np.isnan(errs)):
        raise ModelMismatchError("the answers are not those of a single attention head with "
                                 "biases: no repeated probe gave a usable logit at any "
                                 "answer size")
    return np.asarray(grid, dtype=float), np.asarray(errs)
