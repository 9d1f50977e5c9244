"""One-layer transformers from value queries (paper Sec. 4.1), with a bias-free ReLU FFN learner.

The transformer ``TF(X) = w_o^T ReLU(A^T X^T alpha(X, W))`` is learned in two independent parts:

* attention: antisymmetric queries ``VQ(X) - VQ(-X) = alpha(X, W)^T X v`` with ``v = A w_o``
  (:class:`~attnquery.oracles.AntisymmetricOracle`) turn the transformer into a single attention
  head, which :class:`~attnquery.learners.ExactValueQueryLearner` recovers exactly;
* FFN: one-row queries ``VQ([x]) = w_o^T ReLU(A^T x)`` expose the FFN, which
  :class:`ReLUNetworkLearner` recovers as a network computing the same function.

The FFN learner (beyond the paper, which assumes one exists) uses that a bias-free two-layer ReLU
network is piecewise linear with kinks on the hyperplanes ``a_i^T x = 0``:

1. Along random lines ``p + t q`` (and ``q + t p``, so that every hyperplane through the origin
   crosses one of the pair within ``|t| <= 1.25``), a grid of values is refined by bisection:
   an interval whose midpoint lies on the chord is linear; a kink interval between two linear
   neighbours is located exactly as the intersection of the neighbours' lines, and accepted when
   the values at the kink and just beside it lie on those lines and both halves pass the chord
   test (otherwise it is split).
2. At each kink, the gradients on both sides (forward finite differences, exact for a piecewise
   linear function up to rounding) differ by ``+-w_i a_i``: a first estimate of the normal.
3. Kinks on the same hyperplane (from different lines) are merged. Each normal is then refined
   from ``d - 1`` points located exactly on its hyperplane (kinks along short lines across it,
   inside a ball that meets no other hyperplane), which removes the finite-difference error.
4. With the normals ``n_i`` fixed, ``f(x) = sum_i c_i ReLU(n_i^T x) + b^T x`` is linear in
   ``(c, b)``: a least-squares fit on random points gives both (hyperplanes with ``c = 0``, i.e.
   spurious kinks, are dropped). ``b`` collects the neurons whose orientation came out flipped
   (``c ReLU(-n^T x) = c ReLU(n^T x) - c n^T x``); when ``b`` is a combination of the ``n_i``
   with coefficients in ``{0, -c_i}`` (always so when the neurons are linearly independent, e.g.
   ``m <= d``), those neurons are flipped and the width is the true width; otherwise ``b^T x``
   is kept as two neurons ``|b| (ReLU(u^T x) - ReLU(-u^T x))``, ``u = b / |b|``.

The output computes the same function as the target (to rounding); its neurons are the target's
up to permutation and positive scale whenever the width is recovered and the target's
hyperplanes are distinct.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, NotIdentifiableError
from ..oracles import AntisymmetricOracle
from ._base import BaseLearner, check_budget, check_oracle
from .exact import ExactValueQueryLearner

__all__ = ["ReLUNetworkLearner", "TransformerLearner", "FFN_LEARNERS"]

#: FFN learners TransformerLearner knows
FFN_LEARNERS = ("kinks",)

# interval states during the line search
_UNKNOWN, _LINEAR, _NONLINEAR = 0, 1, 2


def _fd_gradients(f, Y: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Forward-difference gradients of ``f`` at the rows of Y (n, d) with steps h (n,).

    One batch of n (d + 1) queries.
    """
    n, d = Y.shape
    pts = np.repeat(Y[:, None, :], d + 1, axis=1)
    idx = np.arange(d)
    pts[:, idx + 1, idx] += h[:, None]
    vals = f(pts.reshape(n * (d + 1), d)).reshape(n, d + 1)
    return (vals[:, 1:] - vals[:, :1]) / h[:, None]


class _Line:
    """The state of the kink search along one line ``base + t * dirn``."""

    def __init__(self, base, dirn, ts, fs, tol):
        self.base = base
        self.dirn = dirn
        # intervals: [l, r, fl, fr, state, fmid]
        self.iv = [[ts[k], ts[k + 1], fs[k], fs[k + 1], _UNKNOWN, np.nan]
                   for k in range(ts.size - 1)]
        self.kinks = []  # (t*, slope_left, slope_right, delta)
        self.tol = tol
        self.lost = 0
        self.given_up = []  # ends of the intervals given up
        self.pending = []  # candidate kinks whose halves are being tested


class ReLUNetworkLearner(BaseLearner):
    """Learn a bias-free two-layer ReLU network ``x -> w_o^T ReLU(A^T x)`` from value queries.

    The oracle is queried with one-row inputs ``[x]`` only (a transformer oracle restricted to
    length 1 is exactly its FFN). The learner returns a network that computes the same function;
    see the module docstring for the method.

    Parameters
    ----------
    n_line_pairs : int
        Number of random line pairs searched for kinks. One pair crosses every hyperplane;
        more pairs make a kink missed on one line (two kinks closer than rounding) found on
        another.
    n_grid : int
        Initial grid intervals per line on ``t in [-1.25, 1.25]``.
    rtol : float
        Relative tolerance (to the largest ``|f|`` on the line) of the chord test and of a kink's
        acceptance. Neurons whose kink moves f by less are not seen.
    max_rounds : int
        Maximum bisection rounds.
    fd_rel_step : float
        Finite-difference step, relative to the distance from a kink to its neighbouring
        kinks along the line.
    merge_tol : float
        Kinks whose normals have ``|cos| > 1 - merge_tol`` are one hyperplane.
    n_fit_factor : float
        The output weights and the linear remainder are refitted by least squares on
        ``n_fit_factor * (k + d) + 8`` random points (k hyperplanes found).
    linear_tol : float
        A linear remainder smaller than this (relative) is dropped.
    n_verify : int
        Random points on which the returned network is compared with the oracle
        (``verify_error_``; these queries are counted). 0 skips the check.
    refine : bool
        Refine each hyperplane's normal from ``d - 1`` points located on it exactly (4 queries
        each); without it the normals carry the finite-difference error (about 1e-8).
    random_state : int, sequence of ints, Generator or None

    Attributes
    ----------
    A_ : ndarray (d, m_hat)
    w_o_ : ndarray (m_hat,)
        A network computing the oracle's function (``w_o_`` is +-1 on the neurons, whose
        scale ``A_`` carries; the two linear units, when present, come last).
    n_neurons_ : int
        Number of hyperplanes found (``m_hat`` minus the 2 linear neurons when they were added).
    width_recovered_ : bool
        Whether no linear neurons were needed (the neurons are then the true ones up to
        permutation and positive scale when the true hyperplanes are distinct).
    n_kinks_ : int
        Kinks accepted along all lines (before merging).
    n_lost_ : int
        Intervals given up (kinks too close to resolve, or at the end of a line).
    verify_error_ : float
        Largest ``|f_hat - f|`` over the largest ``|f|`` on the verification points (NaN if none).
    n_queries_ : int
        Queries counted by the oracle during ``fit``.
    """

    def __init__(
        self,
        n_line_pairs: int = 2,
        n_grid: int = 32,
        rtol: float = 1e-10,
        max_rounds: int = 80,
        fd_rel_step: float = 1e-3,
        merge_tol: float = 1e-6,
        n_fit_factor: float = 2.0,
        linear_tol: float = 1e-9,
        n_verify: int = 64,
        refine: bool = True,
        random_state=None,
    ):
        self.n_line_pairs = n_line_pairs
        self.n_grid = n_grid
        self.rtol = rtol
        self.max_rounds = max_rounds
        self.fd_rel_step = fd_rel_step
        self.merge_tol = merge_tol
        self.n_fit_factor = n_fit_factor
        self.linear_tol = linear_tol
        self.n_verify = n_verify
        self.refine = refine
        self.random_state = random_state

    def _validate_params(self):
        if int(self.n_line_pairs) < 1:
            raise ConfigError(f"n_line_pairs must be >= 1; got {self.n_line_pairs}")
        if int(self.n_grid) < 4:
            raise ConfigError(f"n_grid must be >= 4; got {self.n_grid}")
        if not 0 < self.rtol < 1e-2:
            raise ConfigError(f"rtol must be in (0, 1e-2); got {self.rtol}")
        if not 0 < self.fd_rel_step < 0.5:
            raise ConfigError(f"fd_rel_step must be in (0, 0.5); got {self.fd_rel_step}")
        if not 0 < self.merge_tol < 0.1:
            raise ConfigError(f"merge_tol must be in (0, 0.1); got {self.merge_tol}")
        if not self.n_fit_factor >= 1.0:
            raise ConfigError(f"n_fit_factor must be >= 1; got {self.n_fit_factor}")
        if not 0 < self.linear_tol < 1e-2:
            raise ConfigError(f"linear_tol must be in (0, 1e-2); got {self.linear_tol}")
        if int(self.n_verify) < 0 or int(self.max_rounds) < 1:
            raise ConfigError("n_verify must be >= 0 and max_rounds >= 1")

    # ------------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover an equivalent FFN from one-row value queries; returns self."""
        self._validate_params()
        d = check_oracle(oracle)
        rng = self._rng()
        n0 = oracle.n_queries

        def f(Z):
            return oracle(np.ascontiguousarray(Z, dtype=np.float64)[:, None, :])

        lines = self._search_lines(f, d, rng)
        U, _, n_kinks, Xk = self._jumps(f, lines, d)
        N, groups = self._merge(U, Xk)
        if self.refine:
            N = self._refine_normals(f, N, groups, Xk, d, rng)
        A, w_o, recovered = self._linear_part(f, N, d, rng)
        self.A_ = A
        self.w_o_ = w_o
        self.n_neurons_ = int(A.shape[1] - (0 if recovered else 2))
        self.width_recovered_ = bool(recovered)
        self.n_kinks_ = int(n_kinks)
        self.n_lost_ = int(sum(ln.lost for ln in lines))
        self.verify_error_ = np.nan
        if self.n_verify:
            Z = rng.standard_normal((int(self.n_verify), d))
            y = f(Z)
            err = np.max(np.abs(self.predict(Z) - y))
            scale = np.max(np.abs(y))
            self.verify_error_ = float(err / scale) if scale > 0 else float(err)
        self.n_queries_ = int(oracle.n_queries - n0)
        return self

    def predict(self, Z) -> np.ndarray:
        """Evaluate the recovered network on vectors Z (B, d)."""
        return np.maximum(np.asarray(Z, dtype=np.float64) @ self.A_, 0.0) @ self.w_o_

    # ------------------------------------------------------------------------------------------
    def _search_lines(self, f, d, rng) -> list[_Line]:
        L = 2 * int(self.n_line_pairs)
        G = rng.standard_normal((L, d))
        G /= np.linalg.norm(G, axis=1, keepdims=True)
        base = np.empty((L, d))
        dirn = np.empty((L, d))
        base[0::2], dirn[0::2] = G[0::2], G[1::2]
        base[1::2], dirn[1::2] = G[1::2], G[0::2]
        ts = np.linspace(-1.25, 1.25, int(self.n_grid) + 1)
        pts = base[:, None, :] + ts[None, :, None] * dirn[:, None, :]
        vals = f(pts.reshape(-1, d)).reshape(L, ts.size)
        lines = []
        for k in range(L):
            scale = float(np.max(np.abs(vals[k])))
            tol = self.rtol * scale if scale > 0 else 1e-300
            lines.append(_Line(base[k], dirn[k], ts, vals[k], tol))
        w_min = 2.5 * 1e-12
        for _ in range(int(self.max_rounds)):
            asks = []  # (line, interval index, kind, t)
            for li, ln in enumerate(lines):
                iv = ln.iv
                for k, it in enumerate(iv):
                    if it[4] == _UNKNOWN:
                        asks.append((li, k, "mid", 0.5 * (it[0] + it[1])))
                    elif it[4] == _NONLINEAR:
                        left = iv[k - 1] if k > 0 else None
                        right = iv[k + 1] if k + 1 < len(iv) else None
                        if left is not None and right is not None and \
                                left[4] == _LINEAR and right[4] == _LINEAR:
                            sl = (left[3] - left[2]) / (left[1] - left[0])
                            sr = (right[3] - right[2]) / (right[1] - right[0])
                            t_star = np.nan
                            if sl != sr:
                                t_star = (it[3] - it[2] + sl * it[0] - sr * it[1]) / (sl - sr)
                            if np.isfinite(t_star) and it[0] < t_star < it[1]:
                                asks.append((li, k, "kink", t_star))
                                continue
                            it[4] = -1  # split below
                        elif (left is not None and left[4] == _UNKNOWN) or \
                                (right is not None and right[4] == _UNKNOWN):
                            continue  # wait for the neighbour's test
                        else:
                            it[4] = -1
            # split every interval marked -1 (no query: the midpoint value is known)
            changed = False
            for ln in lines:
                new = []
                for it in ln.iv:
                    if it[4] == -1:
                        changed = True
                        l, r, fl, fr, _, fm = it
                        if r - l < w_min:
                            ln.lost += 1
                            ln.given_up += [l, r]
                            new.append([l, r, fl, fr, _LINEAR, np.nan])  # give up on it
                            continue
                        m = 0.5 * (l + r)
                        new.append([l, m, fl, fm, _UNKNOWN, np.nan])
                        new.append([m, r, fm, fr, _UNKNOWN, np.nan])
                    else:
                        new.append(it)
                ln.iv = new
            if not asks:
                if changed:
                    continue
                break
            if changed:  # interval indices moved: recompute the asks on the new partition
                continue
            # a kink candidate t* is also checked at t* -+ eta, just inside both pieces: two
            # kinks on the same side of t* would put one of these off its line
            ts_q = []
            for a in asks:
                if a[2] == "mid":
                    ts_q.append([a[3]])
                else:
                    it = lines[a[0]].iv[a[1]]
                    eta = 1e-6 * (it[1] - it[0])
                    ts_q.append([a[3], a[3] - eta, a[3] + eta])
            sizes = np.array([len(x) for x in ts_q])
            P = np.concatenate([
                lines[a[0]].base[None, :] + np.array(tq)[:, None] * lines[a[0]].dirn[None, :]
                for a, tq in zip(asks, ts_q, strict=True)
            ])
            vals_all = np.split(f(P), np.cumsum(sizes)[:-1])
            for (li, k, kind, t), vq, tq in zip(asks, vals_all, ts_q, strict=True):
                ln = lines[li]
                it = ln.iv[k]
                l, r, fl, fr = it[0], it[1], it[2], it[3]
                if kind == "mid":
                    val = vq[0]
                    chord = 0.5 * (fl + fr)
                    it[5] = val
                    it[4] = _LINEAR if abs(val - chord) <= ln.tol else _NONLINEAR
                else:
                    left, right = ln.iv[k - 1], ln.iv[k + 1]
                    sl = (left[3] - left[2]) / (left[1] - left[0])
                    sr = (right[3] - right[2]) / (right[1] - right[0])
                    tt = np.array([tq[0], tq[1], tq[2], 0.5 * (l + r)])
                    got = np.array([vq[0], vq[1], vq[2], it[5]])
                    pred = np.where(tt <= t, fl + sl * (tt - l), fr + sr * (tt - r))
                    pred[0] = fl + sl * (t - l)
                    if np.all(np.abs(got - pred) <= ln.tol):
                        it[4] = ("kink", t, vq[0], sl, sr)
                    else:
                        it[4] = -1
            # a kink whose halves both pass the chord test is confirmed; if one fails, there
            # was more than one kink in the interval and the candidate is dropped
            for ln in lines:
                state = {it[0]: it[4] for it in ln.iv}
                state_r = {it[1]: it[4] for it in ln.iv}
                keep = []
                for cand in ln.pending:
                    a, b = state_r.get(cand[0]), state.get(cand[0])
                    if a == _LINEAR and b == _LINEAR:
                        ln.kinks.append(cand)
                    elif _UNKNOWN in (a, b):
                        keep.append(cand)
                ln.pending = keep
            # split candidate kink intervals into two halves to be tested
            for ln in lines:
                new = []
                for it in ln.iv:
                    if isinstance(it[4], tuple):
                        _, t, val, sl, sr = it[4]
                        ln.pending.append([t, sl, sr])
                        new.append([it[0], t, it[2], val, _UNKNOWN, np.nan])
                        new.append([t, it[1], val, it[3], _UNKNOWN, np.nan])
                    else:
                        new.append(it)
                ln.iv = new
        # a kink's neighbourhood: 0.4 times the distance to the nearest other kink, unresolved
        # interval or end of the line (f is linear on either side within it)
        for ln in lines:
            ln.lost += sum(1 for it in ln.iv if it[4] in (_UNKNOWN, _NONLINEAR))
            obst = [it[0] for it in ln.iv if it[4] != _LINEAR] + \
                [it[1] for it in ln.iv if it[4] != _LINEAR] + ln.given_up + [-1.25, 1.25]
            obst = np.array(obst)
            kt = np.array([kk[0] for kk in ln.kinks])
            for i, kk in enumerate(ln.kinks):
                t = kk[0]
                others = np.concatenate([np.delete(kt, i), obst])
                kk.append(min(0.4 * float(np.min(np.abs(others - t))), 0.1))
        return lines

    def _jumps(self, f, lines, d):
        """Gradient jumps at every accepted kink.

        Returns u (d, k), s (k,), the number of kinks and the kink points (k, d).
        """
        rows = [(ln, kk) for ln in lines for kk in ln.kinks]
        if not rows:
            return np.zeros((d, 0)), np.zeros(0), 0, np.zeros((0, d))
        Y = []
        h = []
        for ln, (t, _sl, _sr, delta) in rows:
            Y.append(ln.base + (t - delta) * ln.dirn)
            Y.append(ln.base + (t + delta) * ln.dirn)
            h += [self.fd_rel_step * delta] * 2
        g = _fd_gradients(f, np.array(Y), np.array(h))
        J = g[1::2] - g[0::2]
        dirs = np.array([ln.dirn for ln, _ in rows])
        jump_line = np.array([kk[2] - kk[1] for _, kk in rows])
        along = np.einsum("kd,kd->k", J, dirs)
        # a finite difference that crossed another hyperplane shows as a mismatch here
        ok = np.abs(along - jump_line) <= 1e-6 * np.maximum(np.abs(jump_line), 1e-300) + \
            1e-8 * np.linalg.norm(J, axis=1)
        ok &= np.linalg.norm(J, axis=1) > 0
        s = np.sign(along[ok])
        U = (J[ok] * s[:, None]).T
        Xk = np.array([ln.base + kk[0] * ln.dirn for ln, kk in rows])[ok]
        return U, s, len(rows), Xk

    def _merge(self, U, Xk):
        """Group the kinks that lie on one hyperplane; returns unit normals and the groups."""
        k = U.shape[1]
        if k == 0:
            return U, []
        N = U / np.linalg.norm(U, axis=0, keepdims=True)
        C = np.abs(N.T @ N)
        label = -np.ones(k, dtype=int)
        groups = []
        for i in range(k):
            if label[i] >= 0:
                continue
            members = np.flatnonzero((C[i] > 1 - self.merge_tol) & (label < 0))
            label[members] = len(groups)
            groups.append(members)
        out = []
        for members in groups:
            orient = np.sign(N[:, members].T @ N[:, members[0]])
            n = (N[:, members] * orient).mean(axis=1)
            out.append(n / np.linalg.norm(n))
        return np.array(out).T, groups

    def _refine_normals(self, f, N, groups, Xk, d, rng):
        """Refine each hyperplane's normal from d - 1 extra points located on it exactly.

        Around a kink point x* (the one of the group farthest from every other hyperplane, at
        distance D), the ball of radius D meets only its own hyperplane. Along the short lines
        ``x* + r_j + t n`` (r_j random, orthogonal to the current normal n, ``|r_j| = D / 2``)
        f has one kink, located as the intersection of the two lines through two points on
        either side (4 queries). The hyperplane passes through the origin, x* and these
        points: its normal is their common null vector. The finite-difference normal is
        accurate to about ``1e-16 / h`` (h the step); these points to rounding.
        """
        k = N.shape[1]
        if k == 0 or d < 2:
            return N
        anchors = np.empty((k, d))
        radius = np.empty(k)
        for g, members in enumerate(groups):
            P = Xk[members]
            dist = np.abs(P @ N) / np.linalg.norm(P, axis=1, keepdims=True)
            dist[:, g] = np.inf
            far = np.min(dist * np.linalg.norm(P, axis=1, keepdims=True), axis=1) if k > 1 \
                else np.linalg.norm(P, axis=1)
            j = int(np.argmax(far))
            anchors[g] = P[j]
            radius[g] = far[j]
        # offsets orthogonal to each normal
        R = rng.standard_normal((k, d - 1, d))
        R -= np.einsum("kjd,dk->kj", R, N)[:, :, None] * N.T[:, None, :]
        R /= np.linalg.norm(R, axis=2, keepdims=True)
        R *= 0.5 * radius[:, None, None]
        tau = 0.5 * radius  # the points stay within 0.71 radius of x*
        tq = np.array([-1.0, -0.5, 0.5, 1.0])
        T = tau[:, None] * tq[None, :]  # (k, 4)
        pts = (anchors[:, None, None, :] + R[:, :, None, :]
               + T[:, None, :, None] * N.T[:, None, None, :])
        vals = f(pts.reshape(-1, d)).reshape(k, d - 1, 4)
        sl = (vals[..., 1] - vals[..., 0]) / (T[:, None, 1] - T[:, None, 0])
        sr = (vals[..., 3] - vals[..., 2]) / (T[:, None, 3] - T[:, None, 2])
        fl = vals[..., 1] + sl * (0.0 - T[:, None, 1])  # left line at t = 0
        fr = vals[..., 2] + sr * (0.0 - T[:, None, 2])
        with np.errstate(divide="ignore", invalid="ignore"):
            t_star = (fr - fl) / (sl - sr)
        N_new = N.copy()
        for g in range(k):
            ok = np.isfinite(t_star[g]) & (np.abs(t_star[g]) < 0.5 * tau[g])
            if ok.sum() < d - 1:
                continue  # keep the finite-difference normal
            Pts = anchors[g] + R[g] + t_star[g][:, None] * N[:, g][None, :]
            M = np.concatenate([anchors[g][None, :], Pts])
            M /= np.linalg.norm(M, axis=1, keepdims=True)
            _, _, Vt = np.linalg.svd(M)
            n = Vt[-1]
            N_new[:, g] = n if n @ N[:, g] > 0 else -n
        return N_new

    def _linear_part(self, f, N, d, rng):
        """Refit magnitudes and the linear remainder; flip neurons to absorb it when possible.

        With the hyperplane normals ``n_i`` known, ``f(x) = sum_i c_i ReLU(n_i^T x) + b^T x``
        is linear in ``(c, b)``: a least-squares fit on ``n_fit_factor (k + d)`` random points
        gives them to rounding accuracy (the finite-difference jumps only fix the normals).
        ``b`` is then a combination ``sum_i beta_i n_i`` with ``beta_i in {0, -c_i}`` when the
        neurons are independent; ``c ReLU(n^T x) - c n^T x = c ReLU(-n^T x)`` flips those.
        """
        k = N.shape[1]
        n_fit = int(self.n_fit_factor * (k + d)) + 8
        Z = rng.standard_normal((n_fit, d))
        y = f(Z)
        for _ in range(2):
            F = np.concatenate([np.maximum(Z @ N, 0.0), Z], axis=1)
            coef, *_ = np.linalg.lstsq(F, y, rcond=None)
            c, b = coef[: N.shape[1]], coef[N.shape[1]:]
            scale = max(float(np.max(np.abs(c), initial=0.0)), float(np.linalg.norm(b)), 1e-300)
            # a hyperplane without a jump (a spurious kink) is no neuron: drop it and refit
            keep_nz = np.abs(c) > self.linear_tol * scale
            if keep_nz.all():
                break
            N = N[:, keep_nz]
        self.fit_residual_ = float(np.linalg.norm(F @ coef - y) / max(np.linalg.norm(y), 1e-300))
        if np.linalg.norm(b) > self.linear_tol * scale and c.size:
            beta, *_ = np.linalg.lstsq(N, b, rcond=None)
            resid = np.linalg.norm(N @ beta - b)
            flip = np.abs(beta + c) <= 1e-6 * np.abs(c)
            zero = np.abs(beta) <= 1e-6 * np.abs(c)
            if resid <= 1e-8 * np.linalg.norm(b) and np.all(flip | zero):
                b = b - N[:, flip] @ beta[flip]
                N = N.copy()
                N[:, flip] *= -1.0
        A = N * np.abs(c)[None, :]
        w_o = np.sign(c)
        recovered = True
        if np.linalg.norm(b) > self.linear_tol * scale:
            recovered = False
            nb = np.linalg.norm(b)
            A = np.concatenate([A, (b / nb)[:, None], -(b / nb)[:, None]], axis=1)
            w_o = np.concatenate([w_o, [nb, -nb]])
        return A, np.asarray(w_o, dtype=float), recovered


class TransformerLearner(BaseLearner):
    """Learn a one-layer transformer ``w_o^T ReLU(A^T X^T alpha(X, W))`` from value queries.

    W and ``v = A w_o`` come from antisymmetric queries ``VQ(X) - VQ(-X)`` (two value queries
    each) with the exact single-head learner (Sec. 4.1, Theorem 4.1); the FFN from one-row
    queries with :class:`ReLUNetworkLearner`.

    Parameters
    ----------
    ffn : {"kinks"}
        The FFN learner.
    random_state : int, sequence of ints, Generator or None
    probes : {"basis", "gaussian"}
        Probe design of the exact learner (default: the paper's deterministic set).
    ffn_params : dict, optional
        Extra parameters of :class:`ReLUNetworkLearner`.

    Attributes
    ----------
    W_ : ndarray (d, d)
    v_ : ndarray (d,)
        ``A w_o`` read by the attention part.
    A_, w_o_ : ndarray (d, m_hat), (m_hat,)
        An FFN computing the same function as the true one.
    ffn_ : ReLUNetworkLearner
        The fitted FFN learner (diagnostics: ``width_recovered_``, ``verify_error_``, ...).
    n_queries_attention_ : int
        Value queries used by the attention part (twice the antisymmetric queries).
    n_queries_ffn_ : int
        Value queries used by the FFN part.
    n_queries_ : int
        All value queries counted by the oracle during ``fit``.
    """

    def __init__(self, ffn: str = "kinks", random_state=None, probes: str = "basis",
                 ffn_params: dict | None = None):
        self.ffn = ffn
        self.random_state = random_state
        self.probes = probes
        self.ffn_params = ffn_params

    def fit(self, oracle):
        """Recover (W, v) and an equivalent FFN from ``oracle``; returns self.

        Raises
        ------
        NotIdentifiableError
            If ``A w_o = 0``: every antisymmetric query answers 0 and W is not identifiable.
        """
        if self.ffn not in FFN_LEARNERS:
            raise ConfigError(f"ffn must be one of {FFN_LEARNERS}; got {self.ffn!r}")
        d = check_oracle(oracle)
        rng = self._rng()
        r_att, r_ffn = rng.spawn(2)
        n0 = oracle.n_queries
        check_budget(oracle, 2 * (d * d + d), "the attention part (2 (d^2 + d) queries)")
        anti = AntisymmetricOracle(oracle)
        try:
            att = ExactValueQueryLearner(probes=self.probes, random_state=r_att).fit(anti)
        except NotIdentifiableError:
            raise NotIdentifiableError(
                "A w_o = 0: every antisymmetric query VQ(X) - VQ(-X) answers 0, so W is not "
                "identifiable (paper Sec. 4.1)"
            ) from None
        n1 = oracle.n_queries
        ffn = ReLUNetworkLearner(random_state=r_ffn, **(self.ffn_params or {})).fit(oracle)
        self.W_ = att.W_
        self.v_ = att.v_
        self.A_ = ffn.A_
        self.w_o_ = ffn.w_o_
        self.attention_ = att
        self.ffn_ = ffn
        self.n_queries_attention_ = int(n1 - n0)
        self.n_queries_ffn_ = int(oracle.n_queries - n1)
        self.n_queries_ = int(oracle.n_queries - n0)
        return self

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered transformer on inputs X (B, N, d)."""
        from ..models import OneLayerTransformer

        return OneLayerTransformer(self.W_, self.A_, self.w_o_)(X)
