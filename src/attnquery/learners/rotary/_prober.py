"""The rotary learner's measurements: scaled two- and three-row probes with a learnt logit
scale, probes over zero tokens, rows at their own scales and the first tokens of a column space
(:mod:`attnquery.learners.rotary`, "Measurement"). Shared by every route and by
:mod:`attnquery.learners.multihead_generic.rotary_layer`.
"""

from __future__ import annotations

import numpy as np

from ...errors import AssumptionViolation
from .._probes import balanced_orthonormal
from ._common import _NO_HEAD, _NO_POSITIVE_WEIGHT

__all__ = ["_RotaryProber", "_first_tokens", "_balanced_rows"]


def _first_tokens(U: np.ndarray, v: np.ndarray, rng):
    """First tokens ``a_m = h_m^T U^T + sigma_m v_perp / ||v_perp||`` (rows of F) spanning the
    column space U (d, r) with ``|a^T v|`` never small (H a balanced rotation, v_perp the part
    of v outside U, invisible to any M whose column space is U's, sigma_m the sign of
    ``h_m^T U^T v``), and H: ``F M = H U^T M`` for such M. Returns ``(F, H)``."""
    r = U.shape[1]
    vr = U.T @ v
    H = balanced_orthonormal(vr, rng) if np.any(vr) else np.eye(r)
    F = H @ U.T
    vperp = v - U @ vr
    npp = np.linalg.norm(vperp)
    if npp > 1e-12 * np.linalg.norm(v):
        sgn = np.where(H @ vr < 0, -1.0, 1.0)
        F = F + sgn[:, None] * (vperp / npp)[None, :]
    return F, H


def _balanced_rows(k: int, v: np.ndarray, rng) -> np.ndarray:
    """k orthonormal rows (k <= d) with ``|a^T v|`` bounded below: the first k rows of a
    balanced orthonormal basis."""
    return balanced_orthonormal(v, rng)[:k]


class _RotaryProber:
    """Scaled two- and three-row probes with a learnt logit scale (module docstring)."""

    def __init__(self, oracle, v, beta, learner, d):
        self.oracle = oracle
        self.v = v
        self.beta = beta
        self.kappa = None
        self.initial = float(learner.initial_logit_scale)
        self.max_logit = float(learner.max_logit)
        self.min_logit = float(learner.min_logit)
        self.target = 1.0
        self.block_bytes = int(learner.block_bytes)
        self.n_requeried = 0
        self.d = d

    # -- one batch --------------------------------------------------------------------------------
    def _ask(self, first, last, c, s, n_last):
        """Logits of the first row of ``[c a; s b (n_last times)]`` (NaN where alpha is not
        strictly inside (0, 1)); rows of ``first`` and ``last`` are the a's and b's."""
        n, d = first.shape
        X = np.empty((n, 1 + n_last, d))
        np.multiply(c[:, None], first, out=X[:, 0, :])
        X[:, 1:, :] = (s[:, None] * last)[:, None, :]
        y = self.oracle(X) - self.beta
        av = c * (first @ self.v)
        bv = s * (last @ self.v)
        num1 = y - bv  # alpha (c a^T v - s b^T v)
        num0 = av - y  # (1 - alpha) (c a^T v - s b^T v)
        den = av - bv
        r1, r0 = num1 / den, num0 / den
        ok = (r1 > 0) & (r0 > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(ok, np.log(np.where(ok, r1, 1.0)) - np.log(np.where(ok, r0, 1.0)),
                            np.nan)

    def _scales(self, A, B, kap):
        """(c, s) for last tokens B (m, d) at logit scales kap (m,): c / s keeps
        ``|c a^T v| >= 2 |s b^T v|`` for every first token a of A."""
        floor = max(float(np.min(np.abs(A @ self.v))), 1e-300)
        rho = np.maximum(1.0, 2.0 * np.abs(B @ self.v) / floor)
        c = np.sqrt(kap * rho)
        return c, kap / c, rho

    def _chunk(self, n_probe_rows: int, n_per: int) -> int:
        return max(1, self.block_bytes // (8 * n_probe_rows * self.d * n_per))

    # -- two-row probes: A M_{-1} b and b^T M_0 b ------------------------------------------------
    def _pairs_block(self, A, B, kap, n_last=1):
        """Per last token b (rows of B), the n + 1 probes ``[c u_l; s b (n_last times)]`` and
        ``[-c u_1; s b ...]``; returns logits (m, n + 1), c, s, rho."""
        m, n = B.shape[0], A.shape[0]
        c, s, rho = self._scales(A, B, kap)
        F = np.concatenate([A, -A[:1]], axis=0)  # (n + 1, d)
        first = np.tile(F, (m, 1))
        last = np.repeat(B, n + 1, axis=0)
        logit = self._ask(first, last, np.repeat(c, n + 1), np.repeat(s, n + 1), n_last)
        return logit.reshape(m, n + 1), c, s, rho

    def _pairs_checked(self, A, B, kap, n_last=1, gf=None):
        logit, c, s, rho = self._pairs_block(A, B, kap, n_last)
        for _ in range(8):
            bad = ~np.all(np.abs(logit) <= self.max_logit, axis=1)
            if not bad.any():
                break
            kap[bad] *= 1e-2
            logit[bad], c[bad], s[bad], rho[bad] = self._pairs_block(A, B[bad], kap[bad],
                                                                     n_last)
            self.n_requeried += int(bad.sum()) * (A.shape[0] + 1)
        if not np.all(np.isfinite(logit)):
            raise AssumptionViolation(_NO_HEAD)
        # logit_l = kap t_l + c u_l^T g - C' and logit_0 = -kap t_1 - c u_1^T g - C'
        Cp = -(logit[:, 0] + logit[:, -1]) / 2.0  # s^2 b^T M_0 b without biases
        lin = logit[:, :-1] + Cp[:, None]
        if gf is not None:
            lin = lin - c[:, None] * gf[None, :]
        return lin / kap[:, None], Cp, s, rho

    def _update(self, t, m0, rho):
        big = float(max(np.max(np.abs(t)), np.max(np.abs(m0) / rho)))
        if big > 0:
            kap = self.target / big
            self.kappa = kap if self.kappa is None else min(self.kappa, kap)

    def pairs(self, A, B, n_last=1, gf=None, raw=False):
        """``t[k] = A M_{-n_last} b_k`` (m, n) and ``m0[k] = b_k^T M_0 b_k`` for the rows b_k of
        B: ``m (n + 1)`` queries. ``gf = A g`` removes the key-bias share ``c u^T g`` of the
        logits (biased heads); with ``raw``, returns ``(t, C', s)`` (the per-column constant
        and token scale) instead of ``(t, m0)``."""
        m, n = B.shape[0], A.shape[0]
        t = np.empty((m, n))
        Cp = np.empty(m)
        sc = np.empty(m)
        start = 0
        if self.kappa is None:  # pilot: the first last token at the initial scale
            kap = np.array([self.initial])
            tt, cc, ss, rho = self._pairs_checked(A, B[:1], kap, n_last, gf)
            peak = float(kap[0] * max(np.max(np.abs(tt)), abs(cc[0]) / ss[0] ** 2 / rho[0]))
            if 0 < peak < self.min_logit:  # too few digits: once more, larger
                kap = kap / peak
                tt, cc, ss, rho = self._pairs_checked(A, B[:1], kap, n_last, gf)
                self.n_requeried += n + 1
            t[0], Cp[0], sc[0] = tt[0], cc[0], ss[0]
            self._update(tt, cc / ss**2, rho)
            if self.kappa is None:
                self.kappa = self.initial
            start = 1
        step = self._chunk(n + 1, 1 + n_last)
        for a in range(start, m, step):
            sl = slice(a, min(a + step, m))
            kap = np.full(sl.stop - sl.start, self.kappa)
            t[sl], Cp[sl], sc[sl], rho = self._pairs_checked(A, B[sl], kap, n_last, gf)
            self._update(t[sl], Cp[sl] / sc[sl] ** 2, rho)
        if raw:
            return t, Cp, sc
        return t, Cp / sc**2

    def zero_probes(self, A, n_zero):
        """``A g_{-n_zero}`` (n,) and the constant of the probes ``[c u; 0 (n_zero times)]``
        (and ``[-c u_1; 0 ...]``), whose logit is ``c u^T g + const`` for a head with biases
        (g = K^T Rot^(n_zero) b_Q: the query bias seen through the keys at that offset):
        ``n + 1`` queries."""
        n, d = A.shape
        F = np.concatenate([A, -A[:1]], axis=0)
        c = 1.0
        for attempt in range(10):
            logit = self._ask(F, np.zeros((n + 1, d)), np.full(n + 1, c), np.zeros(n + 1),
                              n_zero)
            ok = np.all(np.abs(logit) <= self.max_logit)
            if ok:
                const = (logit[0] + logit[-1]) / 2.0
                lin = logit[:-1] - const
                peak = float(np.max(np.abs(lin)))
                if attempt == 0 and 1e-12 < peak < 1e-2:  # too few digits: once more, larger
                    c = c / peak
                    self.n_requeried += n + 1
                    continue
                return lin / c, const
            c *= 1e-2
            self.n_requeried += n + 1
        raise AssumptionViolation(_NO_HEAD)

    def constants(self, a, B, known):
        """``b_k^T M_0 b_k`` for the rows of B from one probe ``[c a; s b_k]`` each, given
        ``known[k] = a^T M_{-1} b_k``: m queries."""
        A = a[None, :]

        def measure(todo, kap):
            c, s, _ = self._scales(A, B[todo], kap)
            logit = self._ask(np.repeat(A, todo.size, axis=0), B[todo], c, s, 1)
            return logit, (kap * known[todo] - logit) / s**2

        return self._in_range(B.shape[0], measure, _NO_HEAD)

    def _in_range(self, n: int, measure, message: str):
        """Measure n probes at the scale ``kappa``, asking again at a scale 100 times smaller
        those whose logit falls outside ``max_logit`` (at most 9 scales): ``measure(todo, kap)``
        returns the logits and the values of the probes ``todo`` at scales ``kap``.

        Raises
        ------
        AssumptionViolation
            With ``message``, when some probe has no usable logit at any scale.
        """
        kap = np.full(n, self.kappa)
        vals, todo = np.empty(n), np.arange(n)
        for _ in range(9):
            logit, value = measure(todo, kap[todo])
            ok = np.abs(logit) <= self.max_logit
            vals[todo[ok]] = value[ok]
            todo = todo[~ok]
            if not todo.size:
                return vals
            kap[todo] *= 1e-2
            self.n_requeried += int(todo.size)
        raise AssumptionViolation(message)

    def _ask_long(self, first, last, c, s, L, m0):
        """Logits of the first row of ``[c a; 0 (L - 1 times); s b]`` given
        ``m0 = b^T M_0 b``: a zero token scores 0 and has value 0, so
        ``y (e^s1 + e^sN + L - 1) = e^s1 c a^T v + e^sN s b^T v`` (NaN where no positive
        ``e^s1`` solves it)."""
        n, d = first.shape
        X = np.zeros((n, L + 1, d))
        X[:, 0, :] = c[:, None] * first
        X[:, -1, :] = s[:, None] * last
        y = self.oracle(X) - self.beta
        av, bv = c * (first @ self.v), s * (last @ self.v)
        eN = np.exp(s**2 * m0)
        with np.errstate(divide="ignore", invalid="ignore"):
            e1 = (eN * (bv - y) - (L - 1) * y) / (y - av)
            return np.where(e1 > 0, np.log(np.where(e1 > 0, e1, 1.0)), np.nan)

    def long_pairs(self, F, B, L: int, m0):
        """``t[k, l] = F[l] M_{-L} B[k]`` (m, n) from ``m n`` probes of ``L + 1`` tokens."""
        m, n = B.shape[0], F.shape[0]
        out = np.empty((m, n))
        step = max(1, self.block_bytes // (8 * (L + 1) * self.d * n))
        for a0 in range(0, m, step):
            ks = np.arange(a0, min(a0 + step, m))
            kk, ll = np.repeat(ks, n), np.tile(np.arange(n), ks.size)

            def measure(todo, kap, kk=kk, ll=ll):
                c, s, rho = self._scales(F, B[kk[todo]], kap)
                # c / s also keeps s^2 |b^T M_0 b| <= 1e-2 (the estimate of M_0 barely counts)
                rho2 = np.maximum(rho, 100.0 * kap * np.abs(m0[kk[todo]]))
                c, s = c * np.sqrt(rho2 / rho), s * np.sqrt(rho / rho2)
                logit = self._ask_long(F[ll[todo]], B[kk[todo]], c, s, L, m0[kk[todo]])
                return logit, logit / kap

            vals = self._in_range(kk.size, measure, _NO_POSITIVE_WEIGHT)
            out[ks] = vals.reshape(ks.size, n)
        return out

    # -- rows at their own scales: F M_{-n} b --------------------------------------------------
    def rows(self, F, old, n_last, m1, m0):
        """``F M_{-n_last} b_k`` (k, d) for the coordinate last tokens b_k, each row f of F at
        the logit scale that brings its largest entry in ``old`` (an earlier measurement) to
        the target, from probes ``[c f; s b_k (n_last times)]`` given ``m0[k] = b_k^T M_0
        b_k`` (and ``m1[k] = b_k^T M_{-1} b_k`` when n_last = 2): ``k d`` queries. Entries
        whose logit falls outside ``max_logit`` keep ``old``."""
        k, d = F.shape
        B = np.eye(d)
        boost = self.target / (self.kappa * np.maximum(np.max(np.abs(old), axis=1), 1e-300))
        c0, s0, _ = self._scales(F, B, np.full(d, self.kappa))
        c = np.outer(boost, c0).ravel()  # (row i, column j) at i * d + j
        s = np.tile(s0, k)
        logit = self._ask(np.repeat(F, d, axis=0), np.tile(B, (k, 1)), c, s, n_last)
        const = s0**2 * m0 if n_last == 1 else np.logaddexp(s0**2 * m1, s0**2 * m0)
        val = (logit.reshape(k, d) + const[None, :]) / (c * s).reshape(k, d)
        ok = np.isfinite(val) & (np.abs(logit.reshape(k, d)) <= self.max_logit)
        return np.where(ok, val, old)

    # -- three-row probes: A M_{-2} b ----------------------------------------------------------
    def triples(self, A, B, m1, m0):
        """``t2[k] = A M_{-2} b_k`` (m, n) from the probes ``[c u_l; s b_k; s b_k]``, given
        ``m1[k] = b_k^T M_{-1} b_k`` and ``m0[k] = b_k^T M_0 b_k``: ``m n`` queries."""
        m, n = B.shape[0], A.shape[0]
        out = np.empty((m, n))
        step = self._chunk(n, 3)
        for a0 in range(0, m, step):
            ks = np.arange(a0, min(a0 + step, m))
            kk = np.repeat(ks, n)
            ll = np.tile(np.arange(n), ks.size)

            def measure(todo, kap, kk=kk, ll=ll):
                c, s, _ = self._scales(A, B[kk[todo]], kap)
                logit = self._ask(A[ll[todo]], B[kk[todo]], c, s, 2)
                s2 = s**2
                lse = np.logaddexp(s2 * m1[kk[todo]], s2 * m0[kk[todo]])
                return logit, (logit + lse) / kap

            vals = self._in_range(kk.size, measure, _NO_HEAD)
            out[ks] = vals.reshape(ks.size, n)
        return out
