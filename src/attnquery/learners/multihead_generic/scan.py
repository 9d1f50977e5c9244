"""The circle scan of the layer learners: every value vector ``v_h`` from the arcs of a circle of
saturated two-row queries (the "Saturation" step of :mod:`.layer`'s method).

:class:`CircleScan` is a mixin of the route estimators (:mod:`.exact_layer`,
:mod:`.served_layer`, :mod:`..rotary_layer`): it reads their ``n_grid`` and ``max_planes`` and
asks through the run's ledger (:class:`._state._Layer`); its tolerances follow the answers'
measured noise where the run has one (served answers, :mod:`.served`).
"""

from __future__ import annotations

import numpy as np

from ...errors import AnswerError, SearchLimitError
from . import served
from ._state import Scan, _Layer

__all__ = ["CircleScan", "CLEAN_TOL", "GRADIENT_SCALE"]

#: answers whose recurrence residual is below this, relative to the answers, are saturated
CLEAN_TOL = 1e-13
#: the gradients of the arcs are taken on a circle this many times larger than the one that
#: separated them: the same sign patterns, with every logit that much further from 0
GRADIENT_SCALE = 16.0


class CircleScan:
    """Every ``v_h`` from a circle of saturated queries (:meth:`_scan`); a mixin of the layer
    learners' route estimators, which define ``n_grid`` and ``max_planes``."""

    def _phi(self, run: _Layer, x0, p, q, T, theta) -> tuple[np.ndarray, np.ndarray]:
        """``f([x0 + T (cos p + sin q); x0]) - beta - x0^T V`` and the raw answers."""
        theta = np.atleast_1d(theta)
        X = np.empty((theta.size, 2, run.d))
        X[:, 1] = x0
        X[:, 0] = x0 + T * (np.cos(theta)[:, None] * p + np.sin(theta)[:, None] * q)
        f = run.ledger.ask(X, "circle")
        return f - run.beta - float(x0 @ run.V), f

    @staticmethod
    def _clean(ph, f, step, scale=None, tol=CLEAN_TOL) -> np.ndarray:
        """Saturated interior points of equally spaced answers (end points False).

        The sinusoid recurrence ``phi(t + h) + phi(t - h) = 2 cos(h) phi(t)`` holds to
        rounding, ``CLEAN_TOL`` times the largest answer of the scan (``scale``; the heads'
        terms may cancel in one answer, not in its rounding), at a point and at both its
        neighbours: the residual alone also vanishes at the inflection point in the middle of
        a crossing.
        """
        res = ph[2:] + ph[:-2] - 2.0 * np.cos(step) * ph[1:-1]
        scale = 4.0 * (np.abs(f).max() if scale is None else scale)
        ok = np.zeros(ph.size, dtype=bool)
        ok[1:-1] = np.abs(res) <= tol * scale
        out = np.zeros(ph.size, dtype=bool)
        out[2:-2] = ok[1:-3] & ok[2:-2] & ok[3:-1]
        return out

    def _arcs(self, run: _Layer, x0, p, q, T, n_heads):
        """The saturated arcs of a half-turn from a saturated angle: one per head, plus one.

        A coarse grid of the whole circle gives a saturated starting angle; on the half-turn
        from it every head's logit changes sign once. The unsaturated stretches between
        saturated runs are refined (32 more angles each, up to 4 times), which separates
        crossings closer than the grid. Returns the arcs as (start, end) angles of saturated
        runs, in order, or None when this circle does not show ``n_heads + 1`` of them.
        """
        n = int(self.n_grid)
        step = 2 * np.pi / n
        th = step * np.arange(-1, n + 1)
        ph, f = self._phi(run, x0, p, q, T, th)
        fmax = float(np.abs(f).max())
        tol = served.clean_tol(run.noise or 0.0, CLEAN_TOL)
        clean = self._clean(ph, f, step, fmax, tol)[1:-1]
        th = th[1:-1]
        if not clean.any():
            return None
        i0 = int(np.argmax(clean))
        half = slice(i0, i0 + n // 2 + 1)  # [start, start + pi], the grid has n even points
        ang = list(th[half] if i0 + n // 2 < n else np.concatenate(
            [th[i0:], th[: i0 + n // 2 + 1 - n] + 2 * np.pi]))
        phis = list(np.concatenate([ph[1:-1], ph[1:-1]])[i0: i0 + n // 2 + 1])
        fs = list(np.concatenate([f[1:-1], f[1:-1]])[i0: i0 + n // 2 + 1])
        cl = list(np.concatenate([clean, clean])[i0: i0 + n // 2 + 1])
        cl[-1] = cl[0] = True  # the antipode of a saturated angle is saturated
        for _ in range(5):
            runs = self._runs(ang, cl)
            if len(runs) >= n_heads + 1:
                break
            new_a, new_p, new_f, new_c = [], [], [], []
            keep = np.ones(len(ang), dtype=bool)
            for (_, a_idx), (b_idx, _) in zip(runs[:-1], runs[1:], strict=True):
                # the gap's angles are replaced by 32 angles strictly inside it, with two more
                # on each side inside the saturated runs, so that every new angle has its
                # neighbours to be tested
                keep[a_idx + 1: b_idx] = False
                h = (ang[b_idx] - ang[a_idx]) / 33
                fine = ang[a_idx] + h * np.arange(-2, 36)
                fp, ff = self._phi(run, x0, p, q, T, fine)
                fc = self._clean(fp, ff, h, fmax, tol)
                new_a += list(fine[3:-3])
                new_p += list(fp[3:-3])
                new_f += list(ff[3:-3])
                new_c += list(fc[3:-3])
            merged = [np.concatenate([np.asarray(old)[keep], new]) for old, new in
                      ((ang, new_a), (phis, new_p), (fs, new_f), (cl, new_c))]
            order = np.argsort(merged[0], kind="stable")
            ang, phis, fs, cl = (list(m[order]) for m in merged)
        runs = self._runs(ang, cl)
        if len(runs) != n_heads + 1:
            return None
        return [(ang[i], ang[j]) for i, j in runs]

    @staticmethod
    def _runs(ang, clean) -> list[tuple[int, int]]:
        """(first, last) indices of the maximal runs of saturated angles."""
        runs, start = [], None
        for i, c in enumerate(clean):
            if c and start is None:
                start = i
            elif not c and start is not None:
                runs.append((start, i - 1))
                start = None
        if start is not None:
            runs.append((start, len(clean) - 1))
        return runs

    def _saturated(self, run: _Layer, x0, p, q, T, mids, widths) -> bool:
        """Whether every arc's centre is saturated: five angles around it, a tenth of the arc
        apart, pass the sinusoid test."""
        offs = np.arange(-2, 3)
        theta = (mids[:, None] + 0.1 * widths[:, None] * offs).ravel()
        ph, f = self._phi(run, x0, p, q, T, theta)
        scale = float(np.abs(f).max())
        tol = served.clean_tol(run.noise or 0.0, CLEAN_TOL)
        return all(self._clean(ph[5 * k: 5 * k + 5], f[5 * k: 5 * k + 5], 0.1 * w, scale,
                               tol)[2] for k, w in enumerate(widths))

    def _gradient(self, run: _Layer, delta, x0, h, pairs: int = 0):
        """Gradient of f at ``[x0 + delta; x0]`` along the coordinates, where f is linear, and
        an estimate of its error's norm (0 in exact mode).

        Each coordinate is stepped by h and by h / 2; where the two differences disagree
        beyond rounding (a step crossed a head's sign change), the step is quartered and asked
        again. In served mode (``pairs`` > 0): a least-squares slope over ``pairs`` distinct
        steps on each side (:func:`.served.noisy_gradient`).
        """
        d = run.d
        if pairs:
            def ask_steps(rows, steps):
                X = np.empty((rows.size, 2, d))
                X[:, 1] = x0
                X[:, 0] = x0 + delta
                X[np.arange(rows.size), 0, rows] += steps
                return run.ledger.ask(X, "circle")
            return served.noisy_gradient(ask_steps, d, h, pairs, run.noise)
        idx = np.arange(d)
        hs = np.full(d, float(h))

        def ask(rows, steps):
            X = np.empty((2 * rows.size, 2, d))
            X[:, 1] = x0
            X[:, 0] = x0 + delta
            X[np.arange(rows.size), 0, rows] += steps
            X[rows.size + np.arange(rows.size), 0, rows] += 0.5 * steps
            y = run.ledger.ask(X, "circle")
            return y[: rows.size], y[rows.size:]

        X0 = np.empty((1, 2, d))
        X0[0, 1] = x0
        X0[0, 0] = x0 + delta
        y0 = float(run.ledger.ask(X0, "circle")[0])
        y1, y2 = np.full(d, np.nan), np.full(d, np.nan)
        todo = idx
        for _ in range(12):
            y1[todo], y2[todo] = ask(todo, hs[todo])
            # rounding is relative to the largest answer (one answer's terms may cancel)
            scale = max(float(np.abs(y1[np.isfinite(y1)]).max(initial=0.0)), abs(y0))
            bad = np.abs((y1 - y0) - 2.0 * (y2 - y0)) > 64 * np.finfo(float).eps * scale
            todo = idx[bad]
            if todo.size == 0:
                return (y1 - y0) / hs, 0.0
            hs[todo] *= 0.25
        raise SearchLimitError("the answers are not linear around a saturated query: a head's "
                               "logit changes sign within every step tried")

    def _scan(self, run: _Layer, H: int, rng) -> Scan:
        """Every ``v_h``, from the arcs of a circle of saturated queries, and the circle that
        separated them (``info``: its scale ``T``, the planes tried, the narrowest arc, the
        circles rejected by the isolation test and the kept one's deviation in it)."""
        d = run.d
        x0 = rng.standard_normal(d) / np.sqrt(d)
        tried = rejected = overflowed = 0
        for _ in range(int(self.max_planes)):
            P, _ = np.linalg.qr(rng.standard_normal((d, 2)))
            p, q = P[:, 0], P[:, 1]
            tried += 1
            try:
                out = self._circle(run, H, x0, p, q, rng)
            except AnswerError:  # narrow formats: the box's format overflowed on this circle
                if not served.narrow(run.noise):
                    raise
                overflowed += 1
                continue
            if isinstance(out, str):
                rejected += out == "leaky"
                continue
            vs, T, widths, leak = out
            return Scan(vs, {"T": float(T), "planes": tried, "min_arc": float(widths.min()),
                             "rejected": rejected, "isolation": leak})
        why = (f"; {rejected} of them gave value vectors that passed the arcs' checks but did "
               "not isolate the heads (served mode: the other heads leaked into queries "
               "orthogonal to their v's)" if rejected else "")
        why += (f"; on {overflowed} the box's format overflowed (answers not finite) before "
                "the heads were separated" if overflowed else "")
        raise SearchLimitError(
            f"no circle of {int(self.max_planes)} tried separated the {H} heads: along each, "
            f"fewer than {H} sign changes of the heads' logits could be told apart, or the "
            "arcs' gradients did not decompose into value vectors summing to V (heads with "
            "nearly equal query vectors, a head that never changes sign, another number of "
            "heads than n_heads, or biases the learner was told are absent: fit_bias=False)"
            + why)

    def _circle(self, run: _Layer, H: int, x0, p, q, rng):
        """The v's from one circle of the plane (p, q): ``(vs, T, widths, isolation)``, or
        why not (``"arcs"``, ``"checks"``, ``"leaky"``). The scan's constants are
        :func:`.served.scan_settings`'s (narrow formats: their own)."""
        cfg = served.scan_settings(run.noise, GRADIENT_SCALE)
        arcs = None
        T = 64.0 * self._start_scale(run, x0, p, q)
        for _ in range(8):  # a larger circle sharpens every crossing
            arcs = self._arcs(run, x0, p, q, T, H)
            if arcs is not None:
                break
            T *= 4.0
        if arcs is None:
            return "arcs"
        # each unsaturated stretch brackets one crossing; an arc's centre is halfway
        # between its two crossings (the first arc's left one is the last one's antipode)
        cross = np.array([0.5 * (b + a) for (_, b), (a, _) in zip(arcs[:-1], arcs[1:],
                                                                   strict=True)])
        bounds = np.concatenate([[cross[-1] - np.pi], cross, [cross[0] + np.pi]])
        # the gradients on a larger circle: the same arcs (a sign pattern does not depend
        # on T), logits GRADIENT_SCALE times further from 0
        mids = 0.5 * (bounds[:-1] + bounds[1:])
        widths = np.diff(bounds)
        Tg = cfg.gradient_scale * T
        while True:
            try:
                out = self._arc_values(run, H, x0, p, q, Tg, mids, widths, cfg, rng)
            except AnswerError:  # narrow formats: a smaller circle, down to NARROW_LEAST_SCALE
                if not served.narrow(run.noise) or Tg <= served.NARROW_LEAST_SCALE * T:
                    raise
                Tg = max(Tg / 4.0, served.NARROW_LEAST_SCALE * T)
                continue
            return out if isinstance(out, str) else (out[0], T, widths, out[1])

    def _arc_values(self, run: _Layer, H: int, x0, p, q, Tg, mids, widths, cfg, rng):
        """The v's from the arcs' gradients on the circle of scale ``Tg``, checked:
        ``(vs, isolation)``, or why not (``"arcs"``, ``"checks"``, ``"leaky"``)."""
        if not self._saturated(run, x0, p, q, Tg, mids, widths):
            return "arcs"
        if served.narrow(run.noise):  # an overflow of the isolation test's scale, found first
            self._phi(run, x0, p, q, 2.0 * cfg.isolation_scale * Tg, mids)
        pairs = self._gradient_pairs(run, H, cfg.max_pairs)
        try:
            # a coordinate step moves the logits less than the half-arc does (served mode:
            # longer steps, checked for kinks, whose rounding weighs less)
            grads = [self._gradient(run, Tg * (np.cos(mid) * p + np.sin(mid) * q), x0,
                                    cfg.step * Tg * width, pairs)
                     for mid, width in zip(mids, widths, strict=True)]
        except SearchLimitError:
            return "arcs"  # some arc too narrow for a linear step: another circle
        G = np.array([g for g, _ in grads])
        D = np.diff(G, axis=0)  # (H, d): +-v_h, one head per crossing
        tol_v, tol_c = self._scan_tols(run, np.array([e for _, e in grads]), D)
        # the two ends of the half-turn are antipodal: their active heads complement
        if np.linalg.norm(G[0] + G[-1] - run.V) > tol_v * np.linalg.norm(run.V):
            return "checks"
        coef, *_ = np.linalg.lstsq(D.T, run.V, rcond=None)
        if np.max(np.abs(np.abs(coef) - 1.0)) > tol_c:
            return "checks"
        vs = np.sign(coef)[:, None] * D
        leak = self._isolation(run, vs, x0, Tg, rng, cfg.isolation_scale)
        if leak is not None and not leak <= cfg.isolation_tol:
            return "leaky"  # served mode: v's that leak
        return vs, leak

    @staticmethod
    def _isolation(run: _Layer, vs, x0, scale: float, rng,
                   factor: float = served.ISOLATION_SCALE) -> float | None:
        """How far the scan's v's are from isolating every head: None, nothing asked (on exact
        answers the arcs' checks are exact; the served route measures it,
        :meth:`.served_layer.ServedLayerLearner._isolation`)."""
        return None

    def _gradient_pairs(self, run: _Layer, H: int, most: int) -> int:
        """Distinct step pairs per coordinate of the arcs' gradients: 0, the exact finite
        differences of :meth:`_gradient` (the served route's least-squares slopes,
        :meth:`.served_layer.ServedLayerLearner._gradient_pairs`)."""
        return 0

    @staticmethod
    def _scan_tols(run: _Layer, errs, D) -> tuple[float, float]:
        """Tolerances of the scan's two checks (``G_0 + G_H = V``, relative to |V|, and the
        coefficients of V in the v's within this of 1): ``1e-8`` and ``1e-6`` on exact answers
        (the served route widens them, :meth:`.served_layer.ServedLayerLearner._scan_tols`)."""
        return 1e-8, 1e-6

    def _start_scale(self, run: _Layer, x0, p, q) -> float:
        """The circle scale at which the logits are of order 1.

        On a small circle (``T0``) the answers are ``phi = T0 delta^T V / 2 + T0^2 delta^T S
        delta + O(T0^3)`` with S the Hessian (``(1/4) sum_h (a_h v_h^T + v_h a_h^T)``): the even
        part over the odd part is ``T0`` times the logits' scale per unit of T. Narrow formats
        (:func:`.served.narrow`): T0 grows until the even part stands out of the answers'
        rounding (:func:`.served.resolved`; at ``T0 = 1e-3`` it is below it, and the scale read
        there was up to 2.6e4 times too small, so that the scan's 8 scales never reached a
        circle whose crossings could be told apart).
        """
        T0 = 1e-3
        th = np.linspace(0.0, np.pi, 16, endpoint=False)
        for _ in range(served.START_STEPS if served.narrow(run.noise) else 1):
            ph, f = self._phi(run, x0, p, q, T0, np.concatenate([th, th + np.pi]))
            even = 0.5 * (ph[:16] + ph[16:])
            odd = 0.5 * (ph[:16] - ph[16:])
            # narrow formats: the even part must stand out of the answers' rounding
            # (the noise is relative to the one-row answers, of size about |(beta, V)|)
            ref = max(float(np.abs(f).max()), float(np.hypot(run.beta, np.linalg.norm(run.V))))
            if served.resolved(np.abs(even).max(), ref, run.noise):
                break
            T0 *= served.START_GROWTH
        lam = 2.0 * np.abs(even).max() / max(np.abs(odd).max(), 1e-300) / T0
        if not np.isfinite(lam) or lam <= 0:
            raise SearchLimitError("the answers along the scan's circle do not depend on the "
                                   "attention weights: no head's logit grows with the query")
        return 1.0 / lam

