"""W from both sides of its rank-r sketch (the bias route, once the query bias is cancelled):
the columns ``Z = U W R`` along W's row space and the rows ``Y = B W`` along its column space
and v, each entry asked at its own scale, the rest of the budget shared by the entries'
measured noise, and ``W = Z' (B Z')^+ Y``."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...errors import AssumptionViolation
from .._probes import balanced_orthonormal
from ._bias import BiasRun, combine_key_bias
from ._constants import _KAPPA_DITHER, _LAST_TOKEN_JITTER, _SKETCH_UNIFORM, _T
from ._entries import Entries
from ._noise import noise_model, spread_root, tail
from ._pairs import Probes
from ._passes import Solution


class Side:
    """One side of the rank-r sketch: its running means, its directions ``U`` (rows), last
    tokens ``V`` (rows; None: ``e_j``), each entry's measurements so far, its first last-token
    sign, and each entry's measurements in the uniform passes (``last``). Changed only
    through its methods: :meth:`measured` (by :func:`side_pass`) and :meth:`remember`."""

    def __init__(self, acc, U, V, rng):
        self.acc, self.U, self.V = acc, U, V
        self.count = np.zeros(acc.s0.shape, dtype=np.int64)
        self.base = rng.choice([-1.0, 1.0], size=acc.s0.shape)
        self.last = []  # each entry's measurements in the uniform passes

    def mean(self) -> np.ndarray:
        """The entries' weighted means (0 where none was measured yet)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.nan_to_num(self.acc.means())

    def measured(self, rows, P, kap, sub) -> None:
        """Take a pass's measurements ``P`` at scales ``kap`` of the directions ``rows``
        (the entries of ``sub`` only, where given) into the running means and counts."""
        self.acc.add(rows, np.arange(self.count.shape[1]), P, kap)
        self.count[rows] += 1 if sub is None else sub

    def remember(self, x) -> None:
        """Keep a uniform pass's measurement of every entry ``x`` (for :func:`noise_model`)."""
        self.last.append(x)


class SketchRun(NamedTuple):
    """What the sketch's passes measured (:func:`sketch_passes`)."""

    accZ: Entries
    accY: Entries
    #: the basis of W's column space and v that the rows ``Y = B W`` are measured along
    B: np.ndarray
    #: passes over both sides (the fewest measurements of an entry)
    n_passes: int
    #: each column's logit scale, from the sketch's estimate of W
    logit_scale: np.ndarray


def sketch_ok(rank, run: BiasRun, ledger) -> bool:
    """Whether W is measured from its rank-r sketch (:func:`sketch_passes`): once the query
    bias is cancelled (the cancellation found W's row space and rank r), no other ``rank``
    given, and the budget paying for two passes over both sides."""
    if not (run.cancelled and run.rowspace is not None):
        return False
    d, r = run.rowspace.shape
    if rank is not None and int(rank) != r:
        return False
    return ledger.left() >= 2 * 2 * (2 * r + 1) * d


def side_scales(est, probes: Probes, pred, n_rows: int) -> np.ndarray:
    """Each column's logit scale from ``pred``, an estimate of some of its ``n_rows``
    entries: the root-mean-square logit at ``target_logit``, and the largest (with the
    dither and the last-token jitter) within the logit limit: measured where ``pred`` has
    every row, else about ``sqrt(2 ln 2 n_rows)`` times the root-mean-square, with a margin
    for the spread of an estimate from few rows."""
    rms = np.sqrt(np.mean(pred**2, axis=0))
    if pred.shape[0] < n_rows:
        big = rms * tail(n_rows) / spread_root(pred.shape[0])
    else:
        big = np.max(np.abs(pred), axis=0)
    lim = probes.mlog / (np.exp(_KAPPA_DITHER) * (1.0 + _LAST_TOKEN_JITTER))
    with np.errstate(divide="ignore"):
        kap = np.minimum(float(est.target_logit) / rms, lim / big)
    return np.where(np.isfinite(kap) & (kap > 0), kap, est.initial_logit_scale)


def use_side(probes: Probes, U, V, kb, answer_size: float) -> Probes:
    """The design for probe directions ``U`` (rows) against last tokens ``V`` (rows; None:
    ``e_j``): the key bias's logits ``b = U kb`` and every direction's scale c at the chosen
    answer size ``|c u^T v|``."""
    uv = np.abs(U @ probes.v0)
    return probes.but(U=U, V=V, b=U @ kb,
                      c_bias=answer_size / np.where(uv > 0, uv, probes.uv))


def sketch_passes(est, run: BiasRun, ledger, rng) -> SketchRun:
    """W from both sides of its rank-r sketch, once the query bias is cancelled.

    The columns ``Z = U W R`` (every direction of U against r last tokens along W's row
    space R, from the cancellation's rows) are asked first, each column at its own scale; the
    rows ``Y = B W`` (r + 1 directions, a balanced orthonormal basis B of W's column space,
    from Z, and of v, so that ``|u^T v|`` is large on each, against every coordinate last
    token) then, each entry at its own scale (its estimate from Z). Two more passes over both
    sides show how each side's noise grows with the size of an entry; the rest of the budget
    is then shared among the entries of both sides in proportion to the error each
    measurement of an entry leaves in W (:func:`entry_quotas`), every pair at the scale that
    puts its entry's logit at ``entry_logit`` and each entry's last-token sign alternating
    from one measurement to the next. Then ``W = Z' (B Z')^+ Y`` with ``Z' = U^T Z``
    (:func:`solve_sketch`): exact for a rank-r W whatever R and B, with the noise of
    ``r (2d - r) + d`` entries instead of ``d^2``."""
    probes = run.probes
    R, U0, kb = run.rowspace, probes.U, probes.U.T @ probes.b  # kb: W z + c_b
    d, r = R.shape
    accZ = Entries(d, inverse_variance=True, n_cols=r)
    probes = probes.but(acc=accZ, jitter_size=_LAST_TOKEN_JITTER)
    with ledger.stage("passes"):
        Z = Side(accZ, U0, R.T, rng)
        side_pass(est, run, probes, Z, kb, rng,
                  kappa=side_scales(est, probes, run.T0 @ R, d))
        Zw = U0.T @ Z.mean()  # W R
        Cb = np.linalg.qr(np.column_stack([Zw, probes.v0]))[0]
        B = balanced_orthonormal(Cb.T @ probes.v0, rng) @ Cb.T
        Y = Side(Entries(r + 1, inverse_variance=True, n_cols=d), B, None, rng)
        side_pass(est, run, probes, Y, kb, rng, pred=B @ Zw @ R.T)
        for _ in range(_SKETCH_UNIFORM):  # passes that show how the noise grows with T
            for side in (Z, Y):
                if ledger.left() >= 2.5 * side.count.size:
                    side.remember(side_pass(est, run, probes, side, kb, rng))
        quotas = entry_quotas(ledger, d, (Z, Y), 1.0 - r / d, rng)
        for k in range(max(int(q.max()) for q in quotas)):
            for side, q in zip((Z, Y), quotas, strict=True):
                if (q > k).any():
                    side_pass(est, run, probes, side, kb, rng, mask=q > k)
    return SketchRun(Z.acc, Y.acc, B, int(min(np.min(Z.count), np.min(Y.count))),
                     side_scales(est, probes, B @ Zw @ R.T, r + 1))


def side_pass(est, run: BiasRun, probes: Probes, side: Side, kb, rng, kappa=None, pred=None,
              mask=None) -> np.ndarray:
    """One pass over a side of the sketch (the entries of ``mask`` only, where given): at
    the columns' scales ``kappa``, or at each entry's own (the logit ``entry_logit`` from
    ``pred``, the side's estimate by default, and at most ten times its column's), dithered
    per column; each entry's last-token sign alternates with its measurements. Returns the
    pass's measurement of every entry (NaN where none)."""
    probes = use_side(probes, side.U, side.V, kb, run.answer_size)
    m, n = side.count.shape
    if kappa is None:
        pred = side.mean() if pred is None else pred
        with np.errstate(divide="ignore"):  # each entry's logit at entry_logit
            kappa = np.minimum(run.entry_logit / np.abs(pred),
                               10.0 * side_scales(est, probes, pred, m))
    kappa = kappa * np.exp(rng.uniform(-_KAPPA_DITHER, _KAPPA_DITHER, size=n))
    probes = probes.but(sign_base=side.base * (-1.0) ** side.count)
    rows = np.arange(m) if mask is None else np.flatnonzero(mask.any(axis=1))
    sub = None if mask is None else mask[rows]
    kap = np.broadcast_to(kappa, (m, n))[rows]
    P, kap = probes.sweep(rows, kap, 10.0 ** rng.uniform(0.0, 1.0, size=n), sub)
    side.measured(rows, P, kap, sub)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(P[_T]) <= probes.mlog, P[_T] / kap, np.nan)


def entry_quotas(ledger, d: int, sides, keep: float, rng):
    """Measurements of every entry of both sides after those made so far: the pairs the
    budget has left (less a reserve for pairs asked again) shared in proportion to the
    error one measurement of the entry leaves in W, its noise times ``sqrt(keep)`` on Z
    (the share of its error off W's column space): the allocation that minimizes the
    summed variances for the budget. An entry's noise is ``sqrt(a + b T_e^2)``, fitted on
    each side to the differences of its last two passes (:func:`noise_model`; uniform
    without them); fractions are rounded at random."""
    cost = []
    for k, side in enumerate(sides):
        sd = noise_model(side) if len(side.last) >= 2 else np.ones(side.count.shape)
        cost.append(sd * (np.sqrt(keep) if k == 0 else 1.0))
    total = sum(float(c.sum()) for c in cost)
    n = max(0, int(0.997 * ledger.left()) - 4 * d) // 2
    out = []
    for c in cost:
        q = n * c / total
        out.append(np.floor(q) + (rng.random(q.shape) < q - np.floor(q)))
    return out


def solve_sketch(run: BiasRun, sk: SketchRun) -> tuple[Solution, np.ndarray]:
    """W, v, the key bias and the error estimates from the two sides of the sketch
    (:func:`sketch_passes`); the rank is the cancellation's. To first order the error of W is
    ``(I - P_C) dZ' R^T + H dY`` (H the map from B's coordinates onto W's column space),
    from which the error estimates follow. Returns the solution and the key bias."""
    R, U0, probes = run.rowspace, run.probes.U, run.probes
    d, r = R.shape
    accZ, accY, B = sk.accZ, sk.accY, sk.B
    accs = (accZ, accY)
    if not all(np.all(a.s0 > 0) and np.all(a.om > 0) for a in accs):
        raise AssumptionViolation("some entries of W's sketch were never measured by a "
                                  "usable pair")
    Zw = U0.T @ accZ.means()  # W R
    Y = accY.means()  # B W
    core = 0.5 * (B @ Zw + Y @ R)  # B W R, measured by both sides
    Uh, sh, Vht = np.linalg.svd(Zw @ np.linalg.pinv(core), full_matrices=False)
    a, sv, bt = np.linalg.svd((sh[:r, None] * Vht[:r]) @ Y, full_matrices=False)
    L, Rf = Uh[:, :r] @ a[:, :r], bt[:r].T  # W = L diag(sv) Rf^T, L orthonormal
    sv = sv[:r]
    W = (L * sv) @ Rf.T
    v = U0.T @ accZ.v_means()
    dof = accZ.dof + accY.dof
    rel = float(np.sqrt((accZ.ss + accY.ss) / dof)) if dof else 0.0
    rss = sum(float(np.sum(a.s2 - a.s1**2 / a.s0)) for a in accs)
    dof_t = sum(int(np.sum(a.n - 1)) for a in accs)
    resid2 = max(rss, 0.0) / dof_t if dof_t > 0 else 0.0
    var_m = [rel**2 * a.h / a.s0**2 for a in accs]  # each entry's, from the noise
    var = [np.maximum(vm, resid2 / a.s0) for vm, a in zip(var_m, accs, strict=True)]
    keep = 1.0 - r / d  # the part of dZ' off W's column space
    residual_ratio = (float(sum(np.sum(resid2 / a.s0) for a in accs)
                            / sum(np.sum(vm) for vm in var_m))
                      if dof_t > 0 else float("nan"))
    col_err = np.sqrt(var[1].sum(axis=0) + keep * (R**2) @ var[0].sum(axis=0))
    Wn, vn = float(np.linalg.norm(sv)), float(np.linalg.norm(v))
    W_error_estimate = (float(np.sqrt(np.sum(var[1]) + keep * np.sum(var[0]))) / Wn
                        if Wn > 0 else float("inf"))
    v_error_estimate = (rel * float(np.sqrt(np.sum(1.0 / accZ.om))) / vn if vn > 0
                        else float("inf"))
    W_err_noise = (float(np.sqrt(np.sum(var_m[1]) + keep * np.sum(var_m[0]))) / Wn if Wn > 0
                   else 0.0)
    z = probes.z if probes.z is not None else np.zeros(d)
    b = U0 @ (U0.T @ probes.b)  # the key bias's logits in the basis U, through W z + c_b
    cb = combine_key_bias(U0.T @ b - W @ z, W, U0, run.first, probes.z,
                          run.key_bias.b_var, col_err)
    sol = Solution(W, v, rel, residual_ratio, np.concatenate([sv, np.zeros(d - r)]), r,
                   W_error_estimate, v_error_estimate, W_err_noise, (L * sv, Rf), None,
                   col_err, L)
    return sol, L @ (L.T @ cb)  # in W's column space, as a module's is
