"""The layer learner on answers that are not exact: a layer as it is served (beyond the paper).

:class:`~attnquery.learners.AttentionLayerLearner` with ``route="served"`` reads a layer whose
answers carry rounding (a module computed in float32, float16 or bfloat16, docs/served.md). Its
exact-mode tolerances (the circle scan's saturation test at ``1e-13`` of the answers, the finite
differences' ``64 eps``, the check's ``rtol``) become multiples of the answers' relative noise,
measured first from antipodal one-row queries (``f([x]) + f([-x]) = 2 beta`` exactly, so their
scatter is the rounding alone); each arc's gradient is a least-squares slope over many distinct
steps (their roundings average); every probe of the isolated heads and of the missing
directions is asked ``reps`` times at dithered logit scales and averaged with weights
``kappa^2`` (its inverse variance, as :class:`~attnquery.learners.LowPrecisionValueQueryLearner`
weighs its passes), with logits kept within that learner's ``_BIAS_MAX_LOGIT``.

This module holds the pieces that only the served mode uses; :mod:`.served_layer` (the served
route, :class:`~.served_layer.ServedLayerLearner`) and the shared measurement modules
(:mod:`.scan`, :mod:`.heads`) call them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...errors import AssumptionViolation, BudgetExceededError, SearchLimitError
from ...precision import AnswerFormat
from .._base import ForwardingOracle
from ..lowprecision import _BIAS_MAX_LOGIT, _KAPPA_DITHER, MAX_NOISE_LEVEL

__all__ = ["FormatReader", "repeated", "measure_noise", "clean_tol", "fd_tol", "noisy_gradient",
           "gradient_pairs", "plan_repeats", "dithers", "NOISE_QUERIES", "NOISY_TARGET",
           "ENTRY_TARGET", "ENTRY_CAP", "BIAS_LOGIT", "full_sketch", "share_passes", "merged",
           "NOISY_MAX_LOGIT", "VERIFY_NOISE", "value_queries", "saturated_values",
           "VALUE_SAMPLES", "VALUE_LOGIT", "silence",
           "missing_factor", "isolation_test", "isolation_queries", "ISOLATION_SAMPLES",
           "ISOLATION_TOL", "ISOLATION_SCALE", "NARROW_NOISE", "narrow", "resolved",
           "START_STEPS", "START_GROWTH", "START_RESOLVE", "ScanSettings", "scan_settings",
           "NARROW_LEAST_SCALE", "verify_units",
           "constants", "constant_queries", "CONST_SAMPLES",
           "LAYER_MAX_NOISE", "cap_missing"]

#: antipodal pairs of one-row queries that measure the answers' relative noise
NOISE_QUERIES = 64
#: the isolated probes' logit target (the exact mode uses 0.1: with rounded answers a logit's
#: error is a few units of the answers' noise whatever its size, so larger logits read more).
#: One pass of MiniLM layer 0's isolated head 2 (true v's and row spaces): B^T W to 5.8e-5 at
#: 1, 2.4e-5 at 2, 1.8e-5 at 3, 4.3e-5 at 4 (head 0: 1.5e-5, 7.3e-6, 5.5e-6, 7.8e-6);
#: docs/notes/2026-11-27-served.md "Sharper probes"
NOISY_TARGET = 3.0
#: a probe whose logit exceeds this many times the target (a value larger than any the scale
#: had seen, on MiniLM the coordinate last tokens of outlier dimensions) is asked again at the
#: target: MiniLM L0H9's isolated B^T W 8.7e-5 without, 1.5e-5 with (3.5 % more probes)
RELIMIT = 1.2
#: the missing-direction probes' logit scale ``t |nu_j| |a_g(x)|`` after the rough pass (1
#: in exact mode, in the rough pass and in narrow formats, where 12 had a float16 synthetic
#: fit refused by name at 50 ``layer_dof``; the cosines of nu_j with a_g(x) are 0.03 (median) to
#: 0.26 on MiniLM, so a scale of 1 read logits of 0.03). One pass of MiniLM layer 0's heads
#: 2, 0: relative rows nu_j^T W_g to 2.6e-4, 4.4e-5 at 1; 3.9e-5, 6.9e-6 at 6; 1.8e-5,
#: 1.7e-6 at 12 (with MISSING_ANSWER 10); 24 helped head 2 and hurt heads 0 and 7
MISSING_LOGIT = 12.0
#: ... but their logits, as the rough heads predict them, at most this: on the synthetic
#: layers (d = 32) a cosine near 1 made a scale of 12 read logits of 12 (worst W of learner
#: seed 1 1.5e-5 uncapped, 2.5e-6 capped); on MiniLM the cap seldom binds
MISSING_MAX_LOGIT = 3.0
#: the missing-direction probes' answer scale ``s |nu_g| |a_j(x)|`` after the rough pass (1 in
#: exact mode and in the rough pass): heads 2, 0, 7 of MiniLM layer 0 at logit scale 6: rows
#: to 3.9e-5, 6.9e-6, 1.5e-5 at 1; 2.7e-5, 2.9e-6, 3.5e-6 at 10; 5.9e-5, 3.6e-6, 3.9e-6 at 30
MISSING_ANSWER = 10.0
#: (answers no noisier than float32's, after the rough pass) an isolated probe whose value the
#: rough heads predict small is asked at a larger scale, up to ENTRY_CAP times the shared one,
#: that puts it at logit ENTRY_TARGET (:class:`~attnquery.learners._probes.Prober`). MiniLM
#: layer 0, learner seed 0, worst / median head W: 1.03e-5 / 3.4e-6 at 1.5 with the left
#: sketch read in full (:func:`full_sketch`), 1.21e-5 / 4.9e-6 without per-entry scales; with
#: the rotated left sketch 9.1e-6 at targets 1 and 1.5, 8.8e-6 at 2, 9.4e-6 with a cap of 30
#: (docs/notes/2026-11-27-served.md, "The left sketch in full")
ENTRY_TARGET = 1.5
ENTRY_CAP = 10.0
#: the key bias's share ``c u^T c_g`` of an isolated probe's logit, at most (1 in exact mode
#: and in narrow formats): it bounds the first row's scale c, and past it a larger logit scale
#: only enlarges the last token's. MiniLM layer 0 (learner seed 0), worst head W (head 2) and
#: head 5: 2.46e-5, 2.52e-5 at 0.5; 9.1e-6, 8.5e-6 at 1; 8.3e-6, 5.0e-6 at 2; 8.0e-6, 4.5e-6
#: at 3; 7.8e-6, 8.7e-6 at 5
BIAS_LOGIT = 3.0
#: largest logit of a probe (the low-precision learner's, measured on served MiniLM heads)
NOISY_MAX_LOGIT = _BIAS_MAX_LOGIT
#: the check's relative tolerance, in units of the answers' relative noise (about 3e-4 in
#: float32). Measured disagreements of the fits: 9 to 42 units (synthetic layers 1.8e-6 to
#: 4.0e-6, MiniLM layers 2.6e-6 to 1.3e-5); 1e4 units before the v's were measured from
#: saturated queries, when fits that passed were off by up to 1.5e-4
VERIFY_NOISE = 1e3
#: distinct steps (pairs +-h) of each coordinate's finite difference, at most
MAX_GRADIENT_PAIRS = 4
#: a coordinate step of an arc's gradient, in units of the arc's width times the circle's
#: scale (the exact mode's 0.05). Longer steps weigh the rounding less (0.4 to 0.6 took the
#: synthetic layer's worst v from 2e-5 to 7e-6) but on MiniLM layer 0 a step of 0.5 crossed
#: sign changes on every circle tried (SearchLimitError after the whole budget)
STEP_FRACTION = 0.05
#: share of the budget left after the scan that the arcs' gradients may spend
GRADIENT_SHARE = 0.25
#: queries kept back for probes asked again at a smaller scale
MARGIN = 0.02
#: the missing-direction probes' share of a pass, against the isolated probes'
#: (:func:`missing_factor`)
MISSING_SHARE = 0.25
#: the rough pass's missing-direction weights are clipped to [ROUGH_CLIP, 1 - ROUGH_CLIP]: with
#: the scan's v's (1e-5 to 1e-3 off) other heads leak into these probes, and on MiniLM layer 2
#: one answered outside (0, 1) (AssumptionViolation before any precise pass). The rough heads
#: only have to predict which heads a query saturates; a wrong one fails the saturated fit's
#: residual test or the final check, by name
ROUGH_CLIP = 1e-3
#: the silencing logit's margin beyond ``log(1 / noise)`` (:func:`silence`)
SILENCE_MARGIN = 4.0
#: saturated queries per unknown of each value vector (``d + 1``: v_g and a constant)
VALUE_SAMPLES = 16
#: the smallest logit of a saturated query's heads (their weights are then within
#: ``e^-40 = 4e-18`` of 0 or 1, below float64's rounding; 30 left a residual of 5e-14 on
#: exact answers)
VALUE_LOGIT = 40.0
#: a saturated fit's residual beyond this many units of the answers' noise: the heads were
#: not saturated as the rough estimates predicted
VALUE_RESIDUAL = 100.0

#: answers noisier than this (relative) are a narrow format's: float16 (5.8e-4 on the synthetic
#: layer), bfloat16 (4.1e-3); float32's are 1.1e-7 to 3.8e-7. Only there do the scan's
#: narrow-format steps apply (:func:`narrow`), so float32 fits are unchanged bit for bit
NARROW_NOISE = 1e-5
#: narrow formats: the start scale's small circle grows by this factor ...
START_GROWTH = 4.0
#: ... at most this many times less one, until the answers' even part is this many units of
#: the noise (of the largest answer) (:func:`resolved`)
START_STEPS = 12
START_RESOLVE = 32.0


#: narrow formats: where the box's format overflows (answers not finite: float16 at 16 times the
#: separating circle on the synthetic layer), the arcs' gradients are taken on a circle 4
#: times smaller, down to this many times the separating circle (saturation needs logits of
#: ``log(1 / noise)`` only there, 7.5 in float16)
NARROW_LEAST_SCALE = 2.0
#: narrow formats: a coordinate step of an arc's gradient, in units of the arc's width times
#: the circle's scale (0.05 otherwise; kinks are still detected and the step quartered there)
NARROW_STEP_FRACTION = 0.2
#: narrow formats: distinct step pairs per coordinate, at most (4 otherwise)
NARROW_MAX_PAIRS = 16
#: narrow formats: the isolation test's deltas in units of the gradients' circle (4 otherwise:
#: 8 times a circle overflows float16)
NARROW_ISOLATION_SCALE = 1.0
#: narrow formats: the isolation test's tolerance. The scan's v's are only a start there (the
#: arcs' gradients carry 1e-2 to 1e-1 of rounding: the saturated queries measure them again to
#: the format's floor); measured on the synthetic layer (float16, bfloat16): circles whose v's
#: were 2.5 % to 13 % off at 0.011 to 0.11 (seed 3's first circle, 7 % and 0.05, gave a fit like
#: the others'), wrong ones (v's off by 0.8 to 3.4) at 0.31 to 0.56
NARROW_ISOLATION_TOL = 0.2


@dataclasses.dataclass(frozen=True)
class ScanSettings:
    """The circle scan's constants: the gradients' circle (in units of the separating one),
    the coordinate step (in units of an arc's width times that circle), the gradients' step
    pairs at most (0: exact mode's two steps), the isolation test's scale and tolerance."""

    gradient_scale: float
    step: float
    max_pairs: int
    isolation_scale: float
    isolation_tol: float


def scan_settings(noise, gradient_scale: float) -> ScanSettings:
    """The scan's constants for answers of relative noise ``noise`` (None: exact mode, whose
    gradients' circle is ``gradient_scale`` times the separating one): exact and float32
    answers keep theirs, narrow formats (:func:`narrow`) get the ``NARROW_*`` ones."""
    if not narrow(noise):
        return ScanSettings(float(gradient_scale), 0.05 if noise is None else STEP_FRACTION,
                            0 if noise is None else MAX_GRADIENT_PAIRS, ISOLATION_SCALE,
                            ISOLATION_TOL)
    return ScanSettings(float(gradient_scale), NARROW_STEP_FRACTION, NARROW_MAX_PAIRS,
                        NARROW_ISOLATION_SCALE, NARROW_ISOLATION_TOL)


#: narrow formats: the check's relative tolerance in units of the answers' noise (``VERIFY_NOISE``
#: = 1e3 units would be 0.58 in float16 and 4.1 in bfloat16, a check that cannot fail).
#: Measured disagreements of float16 fits that passed (synthetic layer, 10 to 100 ``layer_dof``,
#: ours and onnxruntime's): 1.7 to 58 units, the largest at 10 ``layer_dof``
NARROW_VERIFY_NOISE = 64.0


def verify_units(noise) -> float:
    """The check's tolerance in units of the answers' noise: ``VERIFY_NOISE``, or
    ``NARROW_VERIFY_NOISE`` for narrow formats (:func:`narrow`)."""
    return NARROW_VERIFY_NOISE if narrow(noise) else VERIFY_NOISE


#: the layer learner's largest relative noise (the low-precision learner's ``MAX_NOISE_LEVEL``,
#: 0.03, is a single head's). Measured on the synthetic layer: float16 (noise 3.4e-4 to 5.8e-4)
#: is extracted at 10 to 100 ``layer_dof`` with heads' W errors of 13 to 230 units of the noise;
#: bfloat16 (3.1e-3 to 4.1e-3) was refused by every fit tried (20, 50, 100 ``layer_dof``,
#: learner seeds 0 to 3: no separating circle, or rough heads too rough for the saturated or
#: missing-direction queries) after spending 9.8 to 44.8 ``layer_dof``: refused at once instead
LAYER_MAX_NOISE = 2e-3


def full_sketch(noise) -> bool:
    """Whether the isolated heads' left sketch reads all d columns of ``A^T W``, along the
    right sketch's directions and their orthogonal complement (served mode in formats no
    noisier than float32; exact mode and narrow formats read ``d - r`` coordinate columns and
    solve the other r from the core, through ``Bs[PB]^-1``, which amplified the right sketch's
    noise: MiniLM layer 0's worst head W 2.18e-5 with it, 1.21e-5 read in full)."""
    return noise is not None and not narrow(noise)


def share_passes(spreads, base: int, more: int) -> np.ndarray:
    """Passes over each head's isolated probes: ``base`` each, and ``more`` given one at a time
    to the head whose error, as its spread after ``base`` passes predicts it
    (``spread^2 base / n``), is then the largest (Neyman's allocation, as far as whole passes
    go). ``spreads``: the two sketches' disagreement on each head's core (MiniLM layer 0,
    learner seed 1, 2 passes: 4.4e-6 on head 2, whose W was then the worst, 1.1e-6 to 2.9e-6
    on the others)."""
    s2 = np.asarray(spreads, dtype=float) ** 2 * int(base)
    n = np.full(s2.size, int(base), dtype=int)
    for _ in range(max(0, int(more))):
        n[int(np.argmax(s2 / n))] += 1
    return n


def merged(first, more, n_first: int, n_more: int):
    """One head from two estimates over ``n_first`` and ``n_more`` passes, weighted by them:
    ``B^T W = L R^T`` averaged and cut back to its rank by an SVD, ``B^T c`` averaged (both
    estimates share the basis B of the head's probes)."""
    w = n_first / (n_first + n_more)
    M = w * (first.L @ first.R.T) + (1.0 - w) * (more.L @ more.R.T)
    k = first.L.shape[1]
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    return dataclasses.replace(first, L=U[:, :k] * s[:k], R=Vt[:k].T,
                               t_c=w * first.t_c + (1.0 - w) * more.t_c,
                               spread=float(np.hypot(w * first.spread, (1 - w) * more.spread)))


def narrow(noise) -> bool:
    """Whether answers of relative noise ``noise`` (None: exact mode) are a narrow format's
    (float16, bfloat16: beyond ``NARROW_NOISE``)."""
    return noise is not None and float(noise) > NARROW_NOISE


def resolved(part: float, fmax: float, noise) -> bool:
    """Whether a part of the answers of size ``part`` stands ``START_RESOLVE`` units of the
    noise above the rounding of answers of size ``fmax`` (always, outside narrow formats)."""
    return not narrow(noise) or part >= START_RESOLVE * float(noise) * fmax


#: random deltas per head of the scan's isolation test (:func:`isolation_test`)
ISOLATION_SAMPLES = 8
#: the isolation test's deltas, in units of the scale of the circle the arcs' gradients were
#: taken on (logits that much further from 0: a head is unsaturated at a random delta rarely)
ISOLATION_SCALE = 4.0
#: a saturated answer of the isolation test must be within this fraction of
#: ``delta^T v_g`` of 0 or of ``delta^T v_g``. Measured in float32: the circles kept on the six
#: MiniLM layers 4.9e-5 to 4.1e-4 (v's off by up to 3.2e-3), on the synthetic layers 1.4e-6 to
#: 4.5e-5; MiniLM layer 2's leaky circle 0.49, v's made leaky in the tests 0.46 to 0.56
ISOLATION_TOL = 1e-2


def isolation_queries(n_heads: int) -> int:
    """Queries of :func:`isolation_test`: every delta at two scales."""
    return int(2 * ISOLATION_SAMPLES * n_heads)


def isolation_test(run, vs, x0, scale: float, rng) -> tuple[float, int]:
    """Whether the scan's value vectors isolate each head (isolation by the value).

    The scan's two checks (``G_0 + G_H = V``, the coefficients of V in the v's of size 1)
    pass when one arc's gradient is off by e between two crossings of the same sign: the two
    v's it gives are off by ``+e`` and ``-e`` and their sum is right (MiniLM layer 2 served in
    float32: three v's off by 1.6 to 3.7 relative passed both,
    docs/notes/2026-11-27-served.md). This test
    sees it. For head g, ``ISOLATION_SAMPLES`` deltas of norm ``scale`` orthogonal to every
    other head's estimated ``v_h`` (each the direction ``w`` of ``v_g`` there plus a random
    direction orthogonal to it, so that ``delta^T v_g`` is the same for all) are asked at
    ``[x0 + delta; x0]`` and at twice ``delta``. With the right v's only head g speaks,
    ``f - beta - x0^T V = sigma(delta^T a_g(x0)) delta^T v_g``, which for a saturated logit
    is 0 or ``delta^T v_g``; with wrong v's the other heads leak into the answer and it is
    neither (for the +-e pair above, whenever the pair's two heads have opposite signs at
    delta). A delta whose two answers are not in ratio 2 (a head not saturated there) tells
    nothing and is left out.

    Returns
    -------
    worst : float
        The largest distance of a saturated answer from 0 or ``delta^T v_g``, in units of
        ``delta^T v_g`` (``inf`` when a head had no saturated delta).
    n_saturated : int
        Deltas whose answers were saturated.
    """
    H, d = vs.shape
    k = ISOLATION_SAMPLES
    dirs, sig = np.empty((H, k, d)), np.empty(H)
    for g in range(H):
        others = np.linalg.qr(np.delete(vs, g, axis=0).T)[0]  # (d, H - 1)
        w = vs[g] - others @ (others.T @ vs[g])
        w /= max(float(np.linalg.norm(w)), 1e-300)
        z = rng.standard_normal((k, d))
        z -= (z @ others) @ others.T + np.outer(z @ w, w)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        dirs[g] = (w + z) / np.sqrt(2.0)
        sig[g] = float(scale * (w @ vs[g]) / np.sqrt(2.0))  # delta^T v_g
    delta = scale * dirs.reshape(H * k, d)
    X = np.empty((2 * H * k, 2, d))
    X[:, 1] = x0
    X[:, 0] = x0 + np.concatenate([delta, 2.0 * delta])
    f = run.ledger.ask(X, "circle")
    y = (f - run.beta - float(x0 @ run.V)).reshape(2, H, k)
    lin = np.abs(y[1] - 2.0 * y[0]) <= fd_tol(run.noise) * float(np.abs(f).max())
    frac = 0.5 * (y[0] + 0.5 * y[1]) / sig[:, None]  # 0 or 1 when saturated and isolated
    dev = np.minimum(np.abs(frac), np.abs(frac - 1.0))
    if not lin.any(axis=1).all():
        return float("inf"), int(lin.sum())
    return float(np.max(dev[lin])), int(lin.sum())


def missing_factor(isolated: int, missing: int, budget_left: int, reps: int) -> int:
    """How many times more often the missing-direction probes are asked than the isolated
    ones: until they cost ``MISSING_SHARE`` of the isolated probes, within what ``reps``
    passes leave of ``budget_left`` (at least once as often). Their error dominated the heads'
    on the synthetic layers (4e-6 against 3e-6 for the isolated part at 20 ``layer_dof``)
    while they cost a tenth of a pass there and a thirtieth at MiniLM's size."""
    m = max(int(missing), 1)
    want = round(MISSING_SHARE * isolated / m)
    fits = ((1.0 - MARGIN) * budget_left / max(int(reps), 1) - isolated) // m
    return int(max(1, min(want, fits)))


def cap_missing(t, dither: float, rough, nu_j, g: int, X):
    """The missing-direction probes' scales t, capped so that their logits
    ``t nu_j^T a_g(x)``, predicted by the rough heads, stay within ``MISSING_MAX_LOGIT``
    (times the pass's ``dither``)."""
    K, Q, c = rough[0][g], rough[1][g], rough[2][g]
    est = np.abs((X @ Q.T) @ (K @ nu_j) + c @ nu_j)
    cap = MISSING_MAX_LOGIT * dither / np.maximum(est, 1e-300)
    return np.minimum(t, cap)


def silence(noise: float, exact: float) -> float:
    """The logit that silences a head in the missing-direction probes: the exact mode's
    ``exact`` (60), or ``log(1 / noise) + SILENCE_MARGIN`` if smaller (20 in float32: a weight
    of ``e^-20 = 2e-9``, below the answers' rounding). The probe's silencing direction P is
    proportional to it and the answers' rounding to P's size (P moves no value but every head's
    values inside the box), so a smaller one reads the missing directions with less noise."""
    return float(min(float(exact), np.log(1.0 / float(noise)) + SILENCE_MARGIN))


def value_queries(d: int) -> int:
    """Saturated queries per head of :func:`saturated_values`."""
    return int(VALUE_SAMPLES * (d + 1))


def saturated_values(run, Ks, Qs, cs, rng) -> np.ndarray:
    """Every head's value vector, measured again from saturated queries.

    With rough heads ``W_h = K_h^T Q_h``, ``c_h`` the query vectors ``a_h(x)`` at an anchor
    token x are known to a few per cent; a first row ``x + delta`` whose logit
    ``delta^T a_h(x)`` is at least ``VALUE_LOGIT`` for head g and at most ``-VALUE_LOGIT`` for
    every other head (the minimum-norm delta for random logits of that size, plus as large a
    random part orthogonal to every ``a_h(x)``) is answered with
    ``beta + x^T V + delta^T v_g`` to the answers' rounding, whatever the small errors of the
    rough heads: ``v_g`` (and the constant) by least squares over :func:`value_queries`
    such queries. The deltas are as large as the logits allow, so the answers' rounding
    weighs ``1 / |delta|`` in v, where the arcs' finite differences of the scan weigh it
    ``1 / h`` with a step h a small fraction of the arc.

    Raises
    ------
    AssumptionViolation
        When a fit's residual exceeds ``VALUE_RESIDUAL`` units of the answers' noise (the
        heads were not saturated as the rough heads predicted).
    """
    d, H = run.d, len(Ks)
    x = rng.standard_normal(d) / np.sqrt(d)
    A = np.stack([K.T @ (Q @ x) + c for K, Q, c in zip(Ks, Qs, cs, strict=True)], axis=1)
    dual = np.linalg.pinv(A).T  # (d, H): A^T dual = I
    null = np.linalg.svd(A.T)[2][H:].T  # (d, d - H): orthogonal to every a_h(x)
    n = value_queries(d)
    out = np.empty((H, d))
    for g in range(H):
        logit = -VALUE_LOGIT * (1.0 + rng.random((n, H)))
        logit[:, g] *= -1.0
        span = logit @ dual.T
        z = rng.standard_normal((n, d - H)) @ null.T
        z *= np.linalg.norm(span, axis=1, keepdims=True) / np.linalg.norm(z, axis=1,
                                                                        keepdims=True)
        X = np.empty((n, 2, d))
        X[:, 1] = x
        X[:, 0] = x + span + z
        y = run.ledger.ask(X)
        M = np.concatenate([np.ones((n, 1)), span + z], axis=1)
        sol, *_ = np.linalg.lstsq(M, y, rcond=None)
        res = float(np.sqrt(np.mean((M @ sol - y) ** 2)))
        rms = float(np.sqrt(np.mean(y * y)))
        if not res <= VALUE_RESIDUAL * run.noise * rms:
            raise AssumptionViolation(
                f"head {g}'s saturated queries are not linear in their first row (residual "
                f"{res / max(rms, 1e-300):.2g} of the answers, noise {run.noise:.2g}): the "
                "rough heads did not predict which heads the queries saturate")
        out[g] = sol[1:]
    return out


#: served mode: one-row queries per unknown of V and beta measured again (:func:`constants`;
#: in float32 since it was found that V's rounding, read once, held MiniLM layer 0's head 2 at
#: 1.1e-5: 4.2e-6 with V read again, 3.4e-6 with the true V, docs/notes/2026-11-27-served.md)
CONST_SAMPLES = 32


def constant_queries(d: int) -> int:
    """One-row queries of :func:`constants`."""
    return int(CONST_SAMPLES * (d + 1))


def constants(ledger, d: int, rng) -> tuple[np.ndarray, float]:
    """V and beta by least squares over :func:`constant_queries` one-row queries (antipodal
    pairs of random unit rows; ``f([x]) = beta + x^T V`` exactly), in served mode.

    The ``d + 1`` one-row queries that read them first carry one answer's rounding each, and
    every probe reads its logit through V and beta, the same error in every pass: on the
    synthetic layer with answers of relative noise 5e-5, the true V took the worst head's W
    from 1.2e-3 to 3.8e-4 and V and beta together to 2.3e-4 (50 ``layer_dof``); on MiniLM
    layer 0 in float32 (learner seed 1) head 2's W went from 1.12e-5 to 4.2e-6 with V and beta
    read again (3.4e-6 with the true V and beta put in), and the function from 5.0e-7 to
    1.3e-7.
    """
    n = constant_queries(d) // 2
    z = rng.standard_normal((n, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    y = ledger.ask(np.concatenate([z, -z])[:, None, :])
    V, *_ = np.linalg.lstsq(z, 0.5 * (y[:n] - y[n:]), rcond=None)
    return V, float(np.mean(0.5 * (y[:n] + y[n:])))


def measure_noise(ledger, d: int, rng, scale: float) -> float:
    """Relative noise of the answers, from ``NOISE_QUERIES`` antipodal one-row pairs.

    A one-row answer is ``beta + x^T V`` exactly, so ``f([x]) + f([-x])`` is ``2 beta`` for
    every x: the scatter of these sums is the answers' rounding, ``sqrt(2)`` times one answer's.
    Returned relative to the root-mean-square answer (at least float64's epsilon).

    Raises
    ------
    AssumptionViolation
        Beyond ``MAX_NOISE_LEVEL`` (a pair's log-ratio is then biased by about the noise
        squared, which averaging does not remove), beyond ``LAYER_MAX_NOISE`` (bfloat16's
        noise: measured, no fit succeeded), or when an answer is not finite.
    """
    n = NOISE_QUERIES
    X = scale * rng.standard_normal((n, 1, d)) / np.sqrt(d)
    y = ledger.ask(np.concatenate([X, -X]))
    if not np.all(np.isfinite(y)):
        raise AssumptionViolation("one-row answers that are not finite: the box overflows at "
                                  "inputs of the size the layer learner needs")
    s = y[:n] + y[n:]
    rms = float(np.sqrt(np.mean(y * y)))
    noise = float(np.std(s) / np.sqrt(2.0) / max(rms, 1e-300))
    noise = max(noise, float(np.finfo(float).eps))
    if noise > MAX_NOISE_LEVEL:
        raise AssumptionViolation(
            f"the answers carry a relative noise of {noise:.3g}, above the {MAX_NOISE_LEVEL:g} "
            "the layer learner allows")
    if noise > LAYER_MAX_NOISE:
        raise AssumptionViolation(
            f"the answers carry a relative noise of {noise:.3g} (bfloat16's is about 4e-3), above "
            f"the {LAYER_MAX_NOISE:g} the layer learner reads: its heads would be off by tens of "
            "units of it, too rough for the saturated and missing-direction probes (measured "
            "on synthetic layers in bfloat16 at up to 100 layer_dof, docs/served.md)")
    return noise


def clean_tol(noise: float, exact: float) -> float:
    """Saturation test's tolerance (relative to four times the scan's largest answer): the
    exact mode's ``exact``, or four units of the noise (the recurrence's residual combines
    three answers, ``sqrt(6)`` units: the test then sits beyond six of its deviations)."""
    return max(float(exact), 4.0 * noise)


def fd_tol(noise: float) -> float:
    """Finite differences' linearity tolerance, relative to the largest answer: ``64 eps`` or
    sixteen units of the noise."""
    return max(64.0 * float(np.finfo(float).eps), 16.0 * noise)


def noisy_gradient(ask, d: int, h: float, pairs: int, noise: float):
    """Gradient of f at a saturated query by least squares over ``pairs`` distinct steps
    ``+-f_i h`` per coordinate (``f_i`` from 1 down to 1/2: distinct queries, distinct
    roundings). Where the slopes of the two sides disagree beyond the noise (a head's sign
    change inside the step), the coordinate's step is quartered and asked again.

    ``ask(rows, steps)`` answers ``[x0 + delta + step e_row; x0]`` for each (row, step).
    Returns the gradient and an estimate of its error's norm.

    Raises
    ------
    SearchLimitError
        When some coordinate is not linear at any of 12 step sizes.
    """
    fr = 1.0 - 0.5 * np.arange(pairs) / pairs
    sgn = np.concatenate([fr, -fr])  # (2k,)
    idx = np.arange(d)
    hs = np.full(d, float(h))
    G = np.full(d, np.nan)
    half = np.full(d, np.nan)
    todo = idx
    for _ in range(12):
        steps = hs[todo, None] * sgn[None, :]  # (t, 2k)
        y = ask(np.repeat(todo, sgn.size), steps.ravel()).reshape(todo.size, sgn.size)
        scale = float(np.abs(y).max())
        k = pairs
        sp = np.sum(steps[:, :k] * (y[:, :k] - y[:, k:]), axis=1) / np.sum(
            2.0 * steps[:, :k] ** 2, axis=1)
        # one-sided slopes about the mean answer: a kink shows as their difference
        ym = np.mean(y, axis=1, keepdims=True)
        s_plus = np.mean((y[:, :k] - ym) / steps[:, :k], axis=1)
        s_minus = np.mean((y[:, k:] - ym) / steps[:, k:], axis=1)
        bad = np.abs(s_plus - s_minus) * hs[todo] > fd_tol(noise) * scale
        G[todo[~bad]] = sp[~bad]
        # the slope's error: each side's mean carries noise / sqrt(k) of the answers
        half[todo[~bad]] = noise * scale / (hs[todo[~bad]] * np.sqrt(2.0 * k))
        todo = todo[bad]
        if todo.size == 0:
            return G, float(np.linalg.norm(half))
        hs[todo] *= 0.25
    raise SearchLimitError("the answers are not linear around a saturated query: a head's "
                           "logit changes sign within every step tried")


def gradient_pairs(budget_left: int, d: int, n_arcs: int,
                   most: int = MAX_GRADIENT_PAIRS) -> int:
    """Distinct step pairs per coordinate for the arcs' gradients: ``GRADIENT_SHARE`` of what
    is left (at least one pair, at most ``most``)."""
    k = int(GRADIENT_SHARE * budget_left // (2 * d * n_arcs))
    return int(min(max(k, 1), int(most)))


def plan_repeats(budget_left: int, per_pass: int, what: str) -> int:
    """How many times every isolated and missing-direction probe is asked: the whole passes
    the budget left pays for, less ``MARGIN`` for probes asked again.

    Raises
    ------
    BudgetExceededError
        When not even one pass fits.
    """
    reps = int((1.0 - MARGIN) * budget_left // max(per_pass, 1))
    if reps < 1:
        raise BudgetExceededError(
            f"{what}: {budget_left} queries are left after the circle scan, fewer than the "
            f"{per_pass} one pass over the isolated heads and the missing directions needs "
            "(raise n_queries)")
    return reps


def dithers(reps: int) -> np.ndarray:
    """Logit-scale factors of the ``reps`` passes, within ``exp(+-_KAPPA_DITHER)``, the first
    1: the passes' answers sit at unrelated places of the rounding grid."""
    return np.exp(_KAPPA_DITHER * np.sin(2.4 * np.arange(int(reps))))


def repeated(prober, make, n: int, floor, reps: int) -> np.ndarray:
    """``prober.measure(make, n, floor)`` over ``reps`` passes, the logit scale and target of
    each pass after the first dithered (:func:`dithers`), averaged with weights ``kappa^2``
    (each measurement's inverse variance: a logit's error does not depend on its scale)."""
    num, den = np.zeros(n), np.zeros(n)
    target, kappa = prober.target, None
    for f in dithers(reps):
        if kappa is not None:
            prober.kappa, prober.target = kappa * f, target * f
        vals, sc = prober.measure(make, n, floor, return_scale=True)
        if kappa is None:
            kappa = prober.kappa
        w = sc * sc
        num += w * vals
        den += w
    prober.kappa, prober.target = kappa, target
    return num / den


class FormatReader(ForwardingOracle):
    """The oracle, with the format of every answer it gives read on the way
    (``formats``, an :class:`~attnquery.precision.AnswerFormat`): the served route judges the
    answers' noise against it. It forwards the oracle's interface
    (:class:`~attnquery.oracles.ForwardingOracle`) and counts nothing of its own; the
    fit's budget is its ledger's (:class:`~attnquery.learners._base.QueryLedger` with
    ``cap=n_queries``)."""

    def __init__(self, oracle):
        self._inner = oracle
        self.formats = AnswerFormat()

    @property
    def oracle(self):
        """The wrapped oracle."""
        return self._inner

    def __call__(self, X):
        y = self._inner(X)
        self.formats.update(y)
        return y
