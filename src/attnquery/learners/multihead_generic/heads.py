"""Each head of a layer isolated by its value vector, and its missing directions (the
"Isolation by the value" and "The H - 1 missing directions" steps of :mod:`.layer`'s method).

:class:`HeadProbes` is a mixin of the route estimators (:mod:`.exact_layer`,
:mod:`.served_layer`; :mod:`..rotary_layer` reads :meth:`HeadProbes._probe_basis` and
:meth:`HeadProbes._missing`): it reads their probe parameters and asks through the run's
ledger (:class:`._state._Layer`), the served pieces from :mod:`.served` where the run has a
measured noise.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ...errors import AssumptionViolation
from .._probes import Prober, coordinate_rows
from . import served
from ._state import _Head, _Layer

__all__ = ["HeadProbes", "SILENCE", "PILOT"]

#: the logit that silences a head in the missing-direction probes: its weight is e^-60
SILENCE = 60.0
#: probes asked at the initial logit scale, before the answers have shown the head's scale
PILOT = 32


class HeadProbes:
    """The isolated heads (:meth:`_isolated`) and their missing directions
    (:meth:`_missing_directions`); a mixin of the layer learners' route estimators, which
    define the probe parameters (``max_logit``, ``min_logit``, ``initial_logit_scale``,
    ``block_bytes``, ``oversample``)."""

    @staticmethod
    def _probe_basis(vs, g) -> np.ndarray:
        """Orthonormal basis of Delta_g (orthogonal to every v_h but v_g) whose first vector is
        the direction w of v_g in it: the probe directions ``b_0 = w`` and ``b_l + w`` all have
        ``u^T v_g = |P v_g|``, the largest signal a unit direction of Delta_g can carry."""
        d = vs.shape[1]
        others = np.delete(vs, g, axis=0)
        P = np.eye(d) - np.linalg.pinv(others) @ others if others.shape[0] else np.eye(d)
        w = P @ vs[g]
        wn = np.linalg.norm(w)
        if wn <= 1e-12 * np.linalg.norm(vs[g]):
            raise AssumptionViolation(f"head {g}'s value vector lies in the span of the others'")
        w /= wn
        rest = np.linalg.svd(np.concatenate([others, w[None]]), full_matrices=True)[2]
        return np.concatenate([w[:, None], rest[others.shape[0] + 1:].T], axis=1)

    def _prober(self, run: _Layer, key_bias=None) -> Prober:
        """The single-head probes of one isolated head, through the run's ledger, with the
        settings of :meth:`_probe_settings`."""
        return Prober(run.ledger, run.V, initial_logit_scale=self.initial_logit_scale,
                      min_logit=self.min_logit,
                      chunk=max(1, int(self.block_bytes // (32 * run.d))),
                      key_bias=key_bias, offset=run.beta, pilot=PILOT,
                      entry_cap=served.ENTRY_CAP, **self._probe_settings(run))

    def _probe_settings(self, run: _Layer) -> dict:
        """The probes' logit window and targets on exact answers (the served route's:
        :meth:`.served_layer.ServedLayerLearner._probe_settings`)."""
        return {"max_logit": self.max_logit, "target": 0.1, "repilot": False, "relimit": None,
                "entry_target": None, "bias_logit": 1.0}

    @staticmethod
    def _measure(run: _Layer, prober, make, n, floor):
        r0 = prober.n_requeried
        run.ledger.need(n * run.reps, "the layer's isolated heads", reserved=True)
        with run.ledger.stage("isolated"):
            out = prober.measure(make, n, floor) if run.reps == 1 else served.repeated(
                prober, make, n, floor, run.reps)
        run.ledger.n_requeried += int(prober.n_requeried - r0)
        return out

    def _isolated(self, run: _Layer, vs, g, r, bias, rng, rows=None) -> _Head:
        """``B_g^T W_g`` (rank r, two-sided sketch) and ``B_g^T c_g`` of head g, isolated;
        ``rows`` (d, r), orthonormal: the right sketch's directions (random when None)."""
        d = run.d
        B = self._probe_basis(vs, g)
        m = B.shape[1]
        # probe directions u_0 = b_0 = w, u_l = b_l + w: u_l^T y = B^T y + (l > 0) w^T y
        U = B.T.copy()
        U[1:] += B[:, 0]
        floor = float(np.min(np.abs(U @ run.V)))

        def coords(t):  # B^T y from the values u_l^T y
            out = t.copy()
            out[1:] -= t[0]
            return out

        # served float32 after the rough pass: the rough head's prediction of every probe
        Wr, cr = (None, None) if not (served.full_sketch(run.noise) and run.rough_heads) else (
            run.rough_heads[0][g].T @ run.rough_heads[1][g], run.rough_heads[2][g])
        t_c = np.zeros(m)
        if bias:  # u^T c_g from probes with a zero last token
            pc = None if cr is None else U @ cr
            t_c = coords(self._measure(run, self._prober(run), lambda idx: (
                U[idx], None, None if pc is None else pc[idx]), m, None))
        prober = self._prober(run, key_bias=B @ t_c if bias else None)
        Bs = rng.standard_normal((d, r))
        Bs /= np.linalg.norm(Bs, axis=0)
        if rows is not None:
            Bs = np.array(rows, dtype=float)

        pr = None if Wr is None else U @ (Wr @ Bs)

        def right(idx):  # probe (l, j) is number j m + l: the m probes of b_j share it
            jj, ll = np.divmod(idx, m)
            return U[ll], Bs[:, jj].T, None if pr is None else pr[ll, jj]

        T = self._measure(run, prober, right, m * r, floor).reshape(r, m).T
        Y = np.apply_along_axis(coords, 0, T)  # B^T W Bs
        kA = r + int(self.oversample)
        # left directions w + (an orthonormal basis of the right sketch's range, then random
        # directions): the same signal |P v_g| for every probe, and a core A^T W Bs as well
        # conditioned as W Bs itself (random left directions make it a random kA x r matrix)
        Qy = np.linalg.qr(Y)[0][:, :r].T if r <= m else np.empty((0, m))
        extra = rng.standard_normal((kA - Qy.shape[0], m))
        extra /= np.linalg.norm(extra, axis=1, keepdims=True)
        Z_coef = np.concatenate([Qy, extra])
        Z_coef[:, 0] += 1.0
        A = Z_coef @ B.T  # (kA, d)
        Z, core, spread = self._left(run, prober, A, Y, Z_coef, Bs, Wr)
        Uc, sc, Vct = np.linalg.svd(core, full_matrices=False)
        rk = int(np.sum(sc > sc[0] * 1e-9)) if sc.size and sc[0] > 0 else 0
        L = (Y @ Vct[:rk].T) / sc[:rk]  # (m, rk)
        R = Z.T @ Uc[:, :rk]  # (d, rk)
        return _Head(B, L, R, t_c, spread)

    def _left(self, run: _Layer, prober, A, Y, Z_coef, Bs, Wr):
        """The left sketch ``Z = A^T W`` (kA, d), the core ``A^T W Bs`` and the two sketches'
        relative disagreement on it (served float32; 0 elsewhere).

        Exact mode and narrow formats: the ``d - r`` coordinate columns outside the pivots PB of
        ``Bs`` are asked and the r others solved from the core ``Z_coef Y`` (right sketch).
        Served float32 (:func:`.served.full_sketch`): all d columns are asked along the
        orthonormal basis ``O = [Bs, Bs_perp]`` (solving through ``Bs[PB]^-1`` amplified the
        right sketch's noise; along O the columns outside W's row space are near zero and,
        with the rough head's predictions ``Wr``, asked at larger scales), and the core is
        averaged from both sketches."""
        d, r, kA = run.d, Bs.shape[1], A.shape[0]
        core = Z_coef @ Y  # A^T W Bs, from the right sketch
        floor = float(np.min(np.abs(A @ run.V)))
        if served.full_sketch(run.noise):
            O = np.linalg.qr(Bs, mode="complete")[0]  # (d, d), its first r columns span Bs
            pl = None if Wr is None else A @ Wr @ O

            def left(idx):  # probe (i, j) is number j kA + i: the kA probes of o_j share it
                jj, ii = np.divmod(idx, kA)
                return A[ii], O[:, jj].T, None if pl is None else pl[ii, jj]

            S = self._measure(run, prober, left, kA * d, floor).reshape(d, kA).T
            Z = S @ O.T
            spread = float(np.linalg.norm(core - Z @ Bs) / np.linalg.norm(core))
            return Z, 0.5 * (core + Z @ Bs), spread
        PB = scipy.linalg.qr(Bs.T, pivoting=True, mode="r")[1][:r]
        CB = np.setdiff1d(np.arange(d), PB)

        def left(idx):  # probe (i, j) is number j kA + i: the kA probes of e_j share it
            jj, ii = np.divmod(idx, kA)
            return A[ii], coordinate_rows(CB[jj], d)

        S = self._measure(run, prober, left, kA * CB.size, floor).reshape(CB.size, kA).T
        Z = np.empty((kA, d))
        Z[:, CB] = S
        Z[:, PB] = scipy.linalg.solve(Bs[PB].T, (core - S @ Bs[CB]).T).T
        return Z, core, 0.0

    def _missing_directions(self, run: _Layer, vs, heads, bias):
        """Every head's factors (K, Q) and key bias, its H - 1 missing directions measured."""
        H = vs.shape[0]
        nu = np.linalg.pinv(vs).T  # (H, d) dual basis: nu_j^T v_h = [j = h]
        perp = np.linalg.svd(vs)[2][H:].T  # (d, d - H): orthogonal to every v
        silent = (perp, [perp.T @ h.B for h in heads])
        Ks, Qs, cs = [], [], []
        for g in range(H):
            K, Q, c = self._assemble(run, nu, heads, silent, g, bias)
            Ks.append(K)
            Qs.append(Q)
            cs.append(c)
        return Ks, Qs, cs


    # -- the missing directions -----------------------------------------------------------------
    def _assemble(self, run: _Layer, nu, heads, silent, g, bias):
        """Head g's factors and key bias, its H - 1 missing directions measured."""
        d, H = run.d, nu.shape[0]
        hg = heads[g]
        Q, _ = np.linalg.qr(hg.R)  # orthonormal basis of W_g's row space
        rows = [(hg.L @ (hg.R.T @ Q), hg.t_c)]  # B^T W_g in the basis Q, and B^T c_g
        for j in range(H):
            if j == g:
                continue
            rho, gam = self._missing_passes(run, nu, heads, silent, g, j, Q, bias)
            rows.append((rho[None, :], np.array([gam])))
        others = [j for j in range(H) if j != g]
        T = np.concatenate([hg.B, nu[others].T], axis=1)  # (d, d): [B_g, nu_j]
        C = np.concatenate([r[0] for r in rows])  # T^T W_g Q
        cvec = np.concatenate([r[1] for r in rows])  # T^T c_g
        Kt = np.linalg.solve(T.T, C)  # W_g Q: W_g = Kt Q^T
        c = np.linalg.solve(T.T, cvec) if bias else np.zeros(d)
        return Kt.T, Q.T, c

    def _missing_passes(self, run: _Layer, nu, heads, silent, g, j, Q, bias):
        """:meth:`_missing` once, at the exact answers' scales (the served route averages
        passes, :meth:`.served_layer.ServedLayerLearner._missing_passes`)."""
        return self._missing(run, nu, heads, silent, g, j, Q, bias)

    @staticmethod
    def _missing(run: _Layer, nu, heads, silent, g, j, Q, bias, factor: float = 1.0,
                 answer: float = 1.0):
        """``nu_j^T W_g`` (as coefficients in the row-space basis Q) and ``nu_j^T c_g``.

        ``silent = (perp, perp_B)``: an orthonormal basis ``perp`` of the directions orthogonal
        to every v (a direction P = perp z moves logits and no value), and ``perp^T B_h`` per
        head.
        """
        perp, perp_B = silent
        d = run.d
        # last tokens along W_g's row space: nu_j^T W_g x = rho^T Q^T x is read exactly,
        # through the identity; with biases, from the base token w and Q + w (differences give
        # rho, and nu_j^T a_g(w) - rho^T Q^T w gives nu_j^T c_g; x = 0 would not do: a head
        # without key bias has a zero query vector there and cannot be silenced)
        w = run.base
        X = np.concatenate([w[None, :], Q.T + w]) if bias else Q.T.copy()
        n = X.shape[0]
        hg, hj = heads[g], heads[j]
        ag = hg.query_vectors(X)  # (n, m): a_g(x) along B_g
        aj = hj.query_vectors(X)
        # the unknown shares s nu_g^T a_j and t nu_j^T a_g stay within about `answer` and
        # `factor` units times the cosine of nu with a (served mode after the rough pass: 10 and
        # 12, the cosines within 0.26 on MiniLM; t capped by the rough heads' prediction)
        s = answer / (np.linalg.norm(nu[g]) * (np.linalg.norm(aj, axis=1) + 1e-300))
        t = factor / (np.linalg.norm(nu[j]) * (np.linalg.norm(ag, axis=1) + 1e-300))
        if run.rough_heads is not None:  # served mode: logits within MISSING_MAX_LOGIT
            base = 1.0 if served.narrow(run.noise) else served.MISSING_LOGIT
            t = served.cap_missing(t, factor / base, run.rough_heads, nu[j], g, X)
            # head j's unknown share s nu_g^T a_j moves its silencing logit: as much at most
            s = served.cap_missing(s, 1.0, run.rough_heads, nu[g], j, X)
        known_g = s * (ag @ (hg.B.T @ nu[g]))  # s nu_g^T a_g(x)
        known_j = t * (aj @ (hj.B.T @ nu[j]))  # t nu_j^T a_j(x)
        # P = perp z, orthogonal to every v: P^T a_g = -known_g (head g's logit is then
        # t nu_j^T a_g alone) and P^T a_j = -SILENCE - known_j (head j silenced): the
        # minimum-norm z of these two equations, for every x at once
        Fg = ag @ perp_B[g].T  # (n, d - H): perp^T a_g(x)
        Fj = aj @ perp_B[j].T
        M = np.stack([Fg, Fj], axis=1)  # (n, 2, d - H)
        quiet = SILENCE if run.noise is None else served.silence(run.noise, SILENCE)
        rhs = np.stack([-known_g, -quiet - known_j], axis=1)
        z = np.einsum("nki,nk->ni", M,
                      np.linalg.solve(M @ M.transpose(0, 2, 1), rhs[..., None])[..., 0])
        delta = z @ perp.T + s[:, None] * nu[g] + t[:, None] * nu[j]
        # each probe twice: with and without t nu_j, so that the logit's known part, read
        # from the isolated estimates through the large P, cancels in the difference
        Xq = np.empty((2 * n, 2, d))
        Xq[:, 1] = np.concatenate([X, X])
        Xq[:n, 0] = X + delta
        Xq[n:, 0] = X + delta - t[:, None] * nu[j]
        y = run.ledger.ask(Xq, "missing") - run.beta - np.concatenate([X, X]) @ run.V
        alpha = y / np.concatenate([s, s])
        if run.rough:  # the rough pass: the scan's v's let other heads leak into the answer
            alpha = np.clip(alpha, served.ROUGH_CLIP, 1.0 - served.ROUGH_CLIP)
        if not np.all((alpha > 0) & (alpha < 1)):
            why = (f"answers of relative noise {run.noise:.2g} (a narrow format's) leave the "
                   "heads measured so far too rough for these probes" if served.narrow(run.noise)
                   else "the heads are not those of an attention layer")
            raise AssumptionViolation(
                f"a probe of head {g} along the value direction of head {j} answered outside "
                f"(0, 1) after silencing head {j}: {why}")
        logit = np.log(alpha) - np.log1p(-alpha)
        val = (logit[:n] - logit[n:]) / t  # nu_j^T a_g(x)
        if bias:
            rho = val[1:] - val[0]
            return rho, float(val[0] - rho @ (Q.T @ w))
        return val, 0.0
