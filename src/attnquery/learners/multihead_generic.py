"""Generic multi-head attention from value queries, up to a permutation of the heads.

Beyond the paper: Prop. 7.1 shows that multi-head attention is not identifiable *in general*
(heads sharing one W), but heads in general position are. :class:`MultiHeadLearner` recovers
``f(X) = sum_h alpha_h(X, W_h)^T (X v_h)`` with no structural assumption between the heads.

Method (SPEC section 3, "Generic multi-head"):

1. **v-sum.** The d one-row queries ``[e_i]`` give ``s = sum_h v_h``.
2. **Lines.** For an anchor y and a direction u, the two-row queries ``[y + t u; y]`` give
   ``g(t) = f - y^T s = sum_h t b_h sigma(t a_h)`` with ``a_h = u^T W_h y`` and
   ``b_h = u^T v_h``. Its even part divided by t is
   ``e(t) = sum_h c_h tanh(|a_h| t / 2)``, ``c_h = sign(a_h) b_h / 2``: a sum of tanh terms,
   fitted by variable projection (c linear; the rates by a grid, greedily one term at a time,
   then Levenberg-Marquardt). The number of terms is the smallest that fits to ``fit_tol``.
   A line is rejected when the fit's Jacobian predicts a parameter error above ``line_tol``
   (close rates, a tiny term), and more lines are drawn until enough are accepted.
3. **First anchor.** Lines ``u_0`` and ``u_0 +- u_i`` (i = 1..d): heads are matched across
   lines by additivity (``a(u_0 + u_i) + a(u_0 - u_i) = 2 a(u_0)``, the same for b), which also
   fixes each term's sign relative to the reference line; least squares then gives ``W_h y`` and
   ``v_h`` (each term up to a common sign, the *gauge*).
4. **Other anchors.** With the v's known, each line's terms are matched to heads by
   ``|c| = |u^T v_h| / 2`` and their signs follow; least squares gives ``W_h y_j``, and
   ``W_h = [W_h y_j]_j Y^{-1}``.
5. **Signs and hidden heads.** Two-row queries only see each term up to the gauge
   ``(W, v) ~ (-W, -v) + (0, 2 v)`` (because ``sigma(-x) = 1 - sigma(x)``): the sign pattern is
   the one whose heads' v's sum to ``s``. When none does, part of ``s`` is carried by a head
   that two-row queries cannot see: a head with ``W = 0``, or a pair with ``W_2 = -W_1``. The
   candidates (every sign pattern, with a ``W = 0`` head or any visible term split into such a
   pair) are told apart by three-row queries, which have no such symmetry.
6. **Refit.** Gauss-Newton (Levenberg-Marquardt steps) on all parameters against raw random
   two- and three-row queries, with the analytic Jacobian.
7. **Check.** The functional error on held-out random queries of several lengths is measured
   before returning; a result that does not reproduce the oracle is never returned.

Degenerate cases: heads that share W (Prop. 7.1) make the function that of fewer heads, which
raises :class:`~attnquery.errors.NotIdentifiableError` naming the merged heads (the identifiable
part, carried by the exception's ``W`` and ``v`` attributes); nearly coincident heads are
returned with a :class:`UserWarning` and the separation diagnostic ``head_separation_``.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import scipy.optimize

from ..errors import AssumptionViolation, ConfigError, NotIdentifiableError
from ..models import softmax_last
from ._base import BaseLearner, check_oracle
from .exact import read_v

__all__ = ["MultiHeadLearner", "multihead_eval", "multihead_jacobian", "head_separation"]


# ----------------------------------------------------------------------------------------------
# The multi-head function and its Jacobian (batched)
# ----------------------------------------------------------------------------------------------


def multihead_eval(W, v, X) -> np.ndarray:
    """``sum_h softmax(X W_h x_N)^T (X v_h)`` for stacked ``W`` (H, d, d), ``v`` (H, d)."""
    q = X[:, -1, :]
    S = np.einsum("bnd,hde,be->hbn", X, W, q)  # s_i = x_i^T W x_N
    A = softmax_last(S)
    O = np.einsum("bnd,hd->hbn", X, v)
    return np.einsum("hbn,hbn->b", A, O)


def multihead_jacobian(W, v, X):
    """Values and Jacobian of :func:`multihead_eval` with respect to ``(W_1, v_1, ..., W_H, v_H)``.

    Returns
    -------
    y : ndarray (B,)
    J : ndarray (B, H (d^2 + d)); per head, the d^2 entries of ``W_h`` (row-major), then ``v_h``.
    """
    H, d, _ = W.shape
    B = X.shape[0]
    q = X[:, -1, :]
    S = np.einsum("bnd,hde,be->hbn", X, W, q)
    A = softmax_last(S)
    O = np.einsum("bnd,hd->hbn", X, v)
    fh = np.einsum("hbn,hbn->hb", A, O)
    J = np.empty((B, H, d * d + d))
    # df/ds_i = alpha_i (o_i - f_h); ds_i/dW = x_i x_N^T
    P = np.einsum("hbn,bnd->hbd", A * (O - fh[..., None]), X)
    J[:, :, : d * d] = np.einsum("hbd,be->bhde", P, q).reshape(B, H, d * d)
    J[:, :, d * d:] = np.einsum("hbn,bnd->bhd", A, X)
    return fh.sum(axis=0), J.reshape(B, H * (d * d + d))


def head_separation(W) -> float:
    """Smallest relative distance ``||W_k - W_l||_F / max(||W_k||_F, ||W_l||_F)`` over pairs."""
    W = np.asarray(W, dtype=float)
    best = np.inf
    for k, l in itertools.combinations(range(W.shape[0]), 2):
        den = max(np.linalg.norm(W[k]), np.linalg.norm(W[l]))
        dist = np.linalg.norm(W[k] - W[l])
        best = min(best, dist / den if den > 0 else dist)
    return float(best)


# ----------------------------------------------------------------------------------------------
# Fitting a sum of tanh terms along a line (variable projection)
# ----------------------------------------------------------------------------------------------


def _basis(t, rates):
    x = 0.5 * np.outer(t, rates)
    th = np.tanh(x)
    return th, x * (1.0 - th) * (1.0 + th)  # Phi and d Phi / d log(rate)


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


def _basis_batch(t, rates):
    x = 0.5 * t[None, :, None] * rates[:, None, :]
    th = np.tanh(x)
    return th, x * (1.0 - th) * (1.0 + th)


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


#: factors by which a rate is split into two when a term is added
SPLITS = (0.8, 0.95)


def fit_tanh_sum(t, E, kmax: int, fit_tol: float, grid=None, n_starts: int = 1):
    """Fit ``e(t) = sum_k c_k tanh(r_k t / 2)`` to each row of E with the fewest terms.

    Terms are added greedily: the new rate is chosen on a logarithmic ``grid`` by projected
    residual (the best ``n_starts`` each refined with all rates by Levenberg-Marquardt, all
    lines at once); a line stops at the first number of terms whose relative residual is at
    most ``fit_tol``.

    Returns
    -------
    list of (k, rates, c, rel_res) per row of E; ``k = 0`` when no fit with at most ``kmax``
    terms reached the tolerance (rates, c and rel_res are then those of the last fit).
    """
    E = np.atleast_2d(np.asarray(E, dtype=float))
    L = E.shape[0]
    norms = np.linalg.norm(E, axis=1)
    if grid is None:
        grid = np.geomspace(0.05 / t.max(), 20.0 / t.min(), 80)
    Cg, _ = _basis(t, grid)  # (n, G)
    out = [None] * L
    for i in np.flatnonzero(norms == 0):
        out[i] = (0, np.empty(0), np.empty(0), 0.0)
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
            out[idx[j]] = (k if done[j] else 0, rates_k[j], c_k[j], float(rel[j]))
        keep = ~done
        idx, rates = idx[keep], rates_k[keep]
    return out


def _predicted_error(t, e, rates, c, rel_res):
    """Relative parameter error the fit's Jacobian predicts at the data's noise level."""
    Phi, dPhi = _basis(t, rates)
    J = np.hstack([dPhi * c, Phi])
    noise = max(rel_res, 1e-14) * np.linalg.norm(e) / np.sqrt(t.size)
    try:
        s = np.linalg.svd(J, compute_uv=False)
        if s[-1] <= 1e-300:
            return np.inf
        cov = np.linalg.pinv(J.T @ J)
    except np.linalg.LinAlgError:  # pragma: no cover
        return np.inf
    sd = np.sqrt(np.abs(np.diag(cov))) * noise
    k = rates.size
    rel = np.concatenate([sd[:k], sd[k:] / np.maximum(np.abs(c), 1e-300)])
    return float(rel.max())


# ----------------------------------------------------------------------------------------------
# The learner
# ----------------------------------------------------------------------------------------------


class MultiHeadLearner(BaseLearner):
    """Recover generic multi-head attention from value queries, up to a permutation of heads.

    Parameters
    ----------
    n_heads : int or None
        Number of heads H. ``None``: chosen from the data (see Notes).
    random_state : int, sequence of ints, Generator or None
        Seed of the random anchors, directions and refit queries.
    three_row_queries : bool
        Use three-row queries, which see heads that two-row queries cannot separate (a head with
        ``W = 0``, a pair with ``W_2 = -W_1``). With ``False`` the learner asks only one- and
        two-row queries and raises :class:`NotIdentifiableError` on such models.
    max_heads : int
        Largest number of terms tried on a line when ``n_heads`` is None.
    n_t : int or None
        Positive line parameters t per line (each asked at +t and -t). Default ``3 k + 12``
        with k the largest number of terms fitted.
    fit_tol : float
        Relative residual at which a line's fit is accepted (and its number of terms chosen).
    line_tol : float
        Largest relative parameter error (predicted from the fit's Jacobian) of an accepted line.
    match_tol : float
        Largest relative mismatch when heads are matched across lines.
    func_tol : float
        Largest relative functional error on held-out queries of a returned result.
    separation_warn : float
        A :class:`UserWarning` is issued when ``head_separation_`` is below this.
    refit_factor : float
        Refit queries per parameter in the final Gauss-Newton stage.
    max_line_rounds : int
        Rounds of new lines drawn per anchor when lines are rejected.

    Attributes
    ----------
    W_ : list of ndarray (d, d)
        Recovered score matrices, one per head (any order).
    v_ : list of ndarray (d,)
        Recovered value vectors.
    n_heads_ : int
    n_queries_ : int
        Queries counted by the oracle during ``fit``.
    head_separation_ : float
        Smallest relative distance between recovered W's (:func:`head_separation`).
    func_err_ : float
        Relative functional error on held-out random queries.
    lines_used_, lines_rejected_ : int
        Lines accepted and rejected.
    hidden_ : str
        How the sign/hidden-head step resolved: ``"none"``, ``"zero_head"`` or ``"pair"``.
    n_queries_by_stage_ : dict
        Queries per stage (``v_sum``, ``lines``, ``hidden``, ``refit``, ``check``).
    refit_rel_residual_ : float
        Relative residual of the final refit on its own queries.

    Notes
    -----
    With ``n_heads=None`` the number of heads is chosen by model selection on the line fits:
    on each candidate reference line of the first anchor (four random directions), the number
    of tanh terms is the smallest that fits the noise-free answers to relative residual
    ``fit_tol`` (each extra term lowers the residual by orders of magnitude until the count is
    right, then nothing is left to fit); the count K is the most common one over those lines
    (at most ``max_heads``). One head is added when the one-row answers carry a component that
    no sign pattern of the K visible heads explains (a head invisible to two-row queries), and
    three-row queries choose which kind it is. With ``n_heads`` given, a smaller K that explains
    every answer means merged heads (:class:`NotIdentifiableError`).

    Limits (measured; see the multihead_generic experiment): the line fits are sums of tanh
    terms, as ill-conditioned as sums of exponentials. Lines on which two rates nearly coincide
    are rejected and more lines are drawn, so the number of lines (and queries) grows quickly
    with H; two heads closer than about ``eps = 1e-3`` (relative) are merged by the line fits,
    and the learner then refuses rather than return wrong heads. Queries grow as about
    ``2 n_t (d^2 + 3 d)`` lines' worth plus ``refit_factor H (d^2 + d)`` refit queries; the
    refit's Jacobian has ``H (d^2 + d)`` columns, which bounds the sizes it can reach.
    """

    def __init__(
        self,
        n_heads: int | None = None,
        random_state=None,
        three_row_queries: bool = True,
        max_heads: int = 8,
        n_t: int | None = None,
        fit_tol: float = 1e-8,
        line_tol: float = 1e-4,
        match_tol: float = 1e-4,
        func_tol: float = 1e-6,
        separation_warn: float = 1e-2,
        refit_factor: float = 1.5,
        max_line_rounds: int = 4,
    ):
        self.n_heads = n_heads
        self.random_state = random_state
        self.three_row_queries = three_row_queries
        self.max_heads = max_heads
        self.n_t = n_t
        self.fit_tol = fit_tol
        self.line_tol = line_tol
        self.match_tol = match_tol
        self.func_tol = func_tol
        self.separation_warn = separation_warn
        self.refit_factor = refit_factor
        self.max_line_rounds = max_line_rounds

    # ------------------------------------------------------------------------------------------
    def _validate_params(self):
        H = self.n_heads
        if H is not None and (isinstance(H, bool) or not isinstance(H, int | np.integer)
                              or H < 1):
            raise ConfigError(f"n_heads must be a positive integer or None; got {H!r}")
        if not isinstance(self.max_heads, int | np.integer) or self.max_heads < 1:
            raise ConfigError(f"max_heads must be a positive integer; got {self.max_heads!r}")
        if self.n_t is not None and (not isinstance(self.n_t, int | np.integer) or self.n_t < 4):
            raise ConfigError(f"n_t must be an integer >= 4 or None; got {self.n_t!r}")
        for name in ("fit_tol", "line_tol", "match_tol", "func_tol", "separation_warn"):
            val = getattr(self, name)
            if not (np.isfinite(val) and 0 < val < 1):
                raise ConfigError(f"{name} must be in (0, 1); got {val!r}")
        if not (np.isfinite(self.refit_factor) and self.refit_factor >= 1):
            raise ConfigError(f"refit_factor must be >= 1; got {self.refit_factor!r}")
        if not isinstance(self.max_line_rounds, int | np.integer) or self.max_line_rounds < 1:
            raise ConfigError(f"max_line_rounds must be >= 1; got {self.max_line_rounds!r}")

    # -- queries ---------------------------------------------------------------------------------
    def _ask_lines(self, oracle, y, U, t):
        """Even part over t of ``g(t u) = f([y + t u; y]) - y^T s`` for each row u of U.

        Returns e (n_lines, n_t) = even part / t.
        """
        n, d = U.shape
        ts = np.concatenate([t, -t])
        X = np.empty((n, ts.size, 2, d))
        X[:, :, 0, :] = y + ts[None, :, None] * U[:, None, :]
        X[:, :, 1, :] = y
        ans = oracle(X.reshape(-1, 2, d)).reshape(n, ts.size)
        self._stage["lines"] += n * ts.size
        return (ans[:, : t.size] + ans[:, t.size:] - 2.0 * float(y @ self._vsum)) / (2.0 * t)

    def _fit_lines(self, E, t, kmax):
        out = []
        for k, rates, c, rel in fit_tanh_sum(t, E, kmax, self.fit_tol):
            err = _predicted_error(t, E[len(out)], rates, c, rel) if k else np.inf
            out.append((k, rates, c, err))
        return out

    # -- fit -------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover the heads behind ``oracle``; returns self.

        Raises
        ------
        NotIdentifiableError
            If the answers are those of fewer heads than ``n_heads`` (heads sharing W, a head
            with v = 0), or if only two-row queries are allowed and a head is invisible to them.
            The exception's ``W`` and ``v`` attributes hold the identifiable (merged) heads.
        AssumptionViolation
            If the answers need more heads than ``n_heads``, if too few lines can be fitted, or
            if the result does not reproduce the oracle on held-out queries.
        """
        self._validate_params()
        d = check_oracle(oracle)
        rng = self._rng()
        n0 = oracle.n_queries
        self._stage = {"v_sum": 0, "lines": 0, "hidden": 0, "refit": 0, "check": 0}
        H = None if self.n_heads is None else int(self.n_heads)
        kmax = H if H is not None else int(self.max_heads)
        n_t = self.n_t or 3 * kmax + 12

        # 1. v-sum
        self._vsum = read_v(oracle, d)
        self._stage["v_sum"] += d
        r_anchor, r_dir, r_refit, r_check = rng.spawn(4)

        # 2-3. first anchor: pilot reference line on a wide t range, then u0 +- u_i
        Y = r_anchor.standard_normal((d, d))
        Y /= np.linalg.norm(Y, axis=0)
        y = Y[:, 0]
        t = None
        for _ in range(8):  # pilot: a wide range of t sets the scale of the line parameter
            u0 = _unit(r_dir.standard_normal(d))
            tp = np.geomspace(1e-3, 1e3, 4 * n_t)
            e0 = self._ask_lines(oracle, y, u0[None], tp)[0]
            k0, rates0, c0, _ = fit_tanh_sum(tp, e0, kmax, self.fit_tol)[0]
            if k0:
                t = np.geomspace(0.02, 50.0, n_t) / float(np.median(rates0))
                break
        if t is None:
            raise AssumptionViolation(
                "no line could be fitted by a sum of at most "
                f"{kmax} attention terms: the oracle does not behave like multi-head attention "
                "with this many heads, or its heads are too close to be resolved"
            )
        n_acc = n_rej = 0
        first = None
        for _ in range(self.max_line_rounds):
            first = self._first_anchor(oracle, y, t, kmax, r_dir)
            n_rej += first[-1]
            if first[0] is not None:
                break
        rows_u, rows_a, rows_b, K, n_acc, _ = first
        if rows_u is None:
            raise AssumptionViolation(
                f"too few of the lines needed at the first anchor could be fitted and matched "
                f"({n_rej} rejected): the heads are too close to be resolved"
            )
        Umat = np.array(rows_u)
        wy = np.linalg.lstsq(Umat, np.array(rows_a), rcond=None)[0]  # (d, K): W_k y
        V = np.linalg.lstsq(Umat, np.array(rows_b), rcond=None)[0].T  # (K, d)
        cols = [wy.T]

        # 4. other anchors: match terms by |u^T v_k|
        for j in range(1, d):
            yj = Y[:, j]
            rows_u, rows_a = [], []
            for _ in range(2 * self.max_line_rounds):
                if len(rows_u) >= d + 1:
                    break
                # ask more lines than missing: the rejection rate grows with the heads
                need = max(d + 1 - len(rows_u), 1) + (0 if not rows_u else 2)
                need += n_rej * need // max(n_acc, 1)
                Uj = r_dir.standard_normal((need, d))
                Uj /= np.linalg.norm(Uj, axis=1, keepdims=True)
                fits = self._fit_lines(self._ask_lines(oracle, yj, Uj, t), t, K)
                for i in range(need):
                    a = self._match_by_v(Uj[i] @ V.T, fits[i], K)
                    if a is None:
                        n_rej += 1
                        continue
                    rows_u.append(Uj[i])
                    rows_a.append(a)
                    n_acc += 1
            if len(rows_u) < d:
                raise AssumptionViolation(
                    f"only {len(rows_u)} of the {d} lines needed at anchor {j + 1} could be "
                    "fitted and matched: the heads are too close to be resolved"
                )
            cols.append(np.linalg.lstsq(np.array(rows_u), np.array(rows_a), rcond=None)[0].T)
        WY = np.stack(cols, axis=2)  # (K, d, d): column j = W_k y_j
        Wk = WY @ np.linalg.inv(Y)
        self.lines_used_ = int(n_acc + 1)
        self.lines_rejected_ = int(n_rej)

        # 5. signs and hidden heads
        Ws, vs, hidden = self._resolve(oracle, Wk, V, H, r_check)

        # 6. refit on raw queries
        Ws, vs = self._refit(oracle, Ws, vs, r_refit)

        # 7. check on held-out queries
        ferr = self._check(oracle, Ws, vs, r_check)
        if ferr > self.func_tol:
            why = ""
            if H is not None and K < H:
                why = (f"; the line fits resolve only {K} of the {H} heads, so some heads are "
                       "too close to be told apart along lines")
            raise AssumptionViolation(
                f"the recovered {Ws.shape[0]} heads do not reproduce the oracle: relative "
                f"functional error {ferr:.2e} on held-out queries (tolerance {self.func_tol:g})"
                + why
            )
        if H is not None and Ws.shape[0] < H:
            err = NotIdentifiableError(
                f"the answers are exactly those of {Ws.shape[0]} heads, not {H} (functional "
                f"error {ferr:.1e} with {Ws.shape[0]}): heads share W (Prop. 7.1) or have "
                "v = 0. Identifiable: the merged heads (each shared W with the sum of its "
                "heads' v's), available as this exception's W and v attributes; the split of "
                "a merged head's v among its heads is not"
            )
            err.W = [w.copy() for w in Ws]
            err.v = [x.copy() for x in vs]
            raise err
        self.W_ = [w.copy() for w in Ws]
        self.v_ = [x.copy() for x in vs]
        self.n_heads_ = int(Ws.shape[0])
        self.hidden_ = hidden
        self.func_err_ = float(ferr)
        self.head_separation_ = head_separation(Ws) if Ws.shape[0] > 1 else float("inf")
        self.n_queries_ = int(oracle.n_queries - n0)
        self.n_queries_by_stage_ = dict(self._stage)
        if self.head_separation_ < self.separation_warn:
            warnings.warn(
                f"recovered heads nearly coincide (relative separation "
                f"{self.head_separation_:.1e} < {self.separation_warn:g}): the individual "
                "heads are ill-conditioned even though the function is reproduced "
                f"(functional error {ferr:.1e})",
                UserWarning,
                stacklevel=2,
            )
        return self

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered multi-head model on inputs X (B, N, d)."""
        X = np.asarray(X, dtype=np.float64)
        return multihead_eval(np.array(self.W_), np.array(self.v_), X)

    def _first_anchor(self, oracle, y, t, kmax, r_dir):
        """Terms at the first anchor: a reference line u0 and lines u0 +- u_i (additivity).

        Returns (rows_u, rows_a, rows_b, K, n_accepted, n_rejected); rows_u is None when too
        few lines were accepted with this reference line.
        """
        d = y.size
        # reference: among a few candidate lines, the most common number of terms K, then the
        # best conditioned line with K terms
        U0 = r_dir.standard_normal((4, d))
        U0 /= np.linalg.norm(U0, axis=1, keepdims=True)
        fits = self._fit_lines(self._ask_lines(oracle, y, U0, t), t, kmax)
        ks = np.array([f[0] for f in fits])
        if not np.any(ks):
            return None, None, None, 0, 0, len(fits)
        vals, counts = np.unique(ks[ks > 0], return_counts=True)
        K = int(vals[np.argmax(counts)])
        errs = np.array([f[3] if f[0] == K else np.inf for f in fits])
        i0 = int(np.argmin(errs))
        if errs[i0] > 0.1 * self.line_tol:
            return None, None, None, K, 0, len(fits)
        u0, (_, rates0, c0, _) = U0[i0], fits[i0]
        p0 = np.stack([rates0, 2.0 * c0], axis=1)  # gauge: a(u0) > 0 for every term
        rows_a, rows_b, rows_u = [p0[:, 0]], [p0[:, 1]], [u0]
        n_acc = n_rej = 0
        for _ in range(self.max_line_rounds):
            need = d + 2 - n_acc
            if need <= 0:
                break
            if n_acc:  # ask for as many lines as the acceptance rate so far needs
                need = min(int(np.ceil(need * (n_acc + n_rej) / n_acc)) + 2, 8 * d)
            Ui = r_dir.standard_normal((need, d))
            Ui /= 2.0 * np.linalg.norm(Ui, axis=1, keepdims=True)
            fits = self._fit_lines(
                self._ask_lines(oracle, y, np.concatenate([u0 + Ui, u0 - Ui]), t), t, K)
            for i in range(need):
                res = self._match_additive(p0, fits[i], fits[need + i])
                if res is None:
                    n_rej += 1
                    continue
                rows_u.append(Ui[i])
                rows_a.append(res[0])
                rows_b.append(res[1])
                n_acc += 1
            if n_acc == 0:
                break  # no line matches this reference line: it is wrong, try another one
        if n_acc < d:
            return None, None, None, K, n_acc, n_rej
        return rows_u, rows_a, rows_b, K, n_acc, n_rej

    # -- matching ------------------------------------------------------------------------------
    def _match_additive(self, p0, fit_p, fit_m):
        """Match the terms of lines u0 + u_i and u0 - u_i to the reference terms p0 (K, 2)."""
        K = p0.shape[0]
        if fit_p[0] != K or fit_m[0] != K or max(fit_p[3], fit_m[3]) > self.line_tol:
            return None
        Pp = np.stack([fit_p[1], 2.0 * fit_p[2]], axis=1)
        Pm = np.stack([fit_m[1], 2.0 * fit_m[2]], axis=1)
        scale = np.sqrt(np.mean(p0**2, axis=0))
        signs = np.array([1.0, -1.0])
        # comb[m, m', s, s'] = s Pp[m] + s' Pm[m']; R[k, ...] = |comb - 2 p0[k]| / scale
        comb = (Pp[:, None, None, None, :] * signs[None, None, :, None, None]
                + Pm[None, :, None, None, :] * signs[None, None, None, :, None])
        R = np.linalg.norm((comb[None] - 2.0 * p0[:, None, None, None, None, :]) / scale,
                           axis=-1)
        flat = R.reshape(K, -1)
        best = flat.argmin(axis=1)
        m, mm, s, ss = np.unravel_index(best, (K, K, 2, 2))
        if len(set(m)) != K or len(set(mm)) != K:
            return None
        bestval = flat[np.arange(K), best]
        if bestval.max() > self.match_tol:
            return None
        second = np.partition(flat, 1, axis=1)[:, 1]
        if np.any(second < 10.0 * bestval) or np.any(second < 10 * self.match_tol):
            return None
        a_plus = signs[s][:, None] * Pp[m]
        a_minus = signs[ss][:, None] * Pm[mm]
        diff = 0.5 * (a_plus - a_minus)  # values along u_i (half-length direction)
        return diff[:, 0], diff[:, 1]

    def _match_by_v(self, b, fit, K):
        """Signed rates a_k of a line whose terms are matched to heads by |c| = |b_k| / 2."""
        k, rates, c, err = fit
        if k != K or err > self.line_tol:
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
        cost = np.abs(2.0 * np.abs(c)[:, None] - ab[None, :]) / scale
        rr, cc = scipy.optimize.linear_sum_assignment(cost)
        if cost[rr, cc].max() > self.match_tol:
            return None
        a = np.empty(K)
        a[cc] = np.sign(c[rr]) * np.sign(b[cc]) * rates[rr]
        return a

    # -- signs and hidden heads ----------------------------------------------------------------
    def _resolve(self, oracle, Wk, V, H, rng):
        """Choose each term's sign, and find heads invisible to two-row queries."""
        K, d = V.shape
        S = np.array(list(itertools.product([1.0, -1.0], repeat=K)))  # (2^K, K)
        L = self._vsum[None, :] - S @ V  # linear residual of each pattern
        scale = max(float(np.abs(V).max()), float(np.abs(self._vsum).max()), 1e-300)
        resid = np.linalg.norm(L, axis=1) / scale
        order = np.argsort(resid)
        best = order[0]
        tol = 1e-3
        target = K if H is None else H
        if resid[best] <= tol and (H is None or K >= H):
            if H is not None and K > H:
                raise AssumptionViolation(
                    f"the answers need at least {K} heads but n_heads={H}")
            s = S[best]
            return s[:, None, None] * Wk, s[:, None] * V, "none"
        if resid[best] <= tol:
            # fewer visible heads than asked for and nothing hidden: merged heads
            s = S[best]
            return s[:, None, None] * Wk, s[:, None] * V, "merged"
        if H is not None and K >= H:
            raise AssumptionViolation(
                f"the one-row answers carry a component that the {K} heads seen by two-row "
                "queries do not explain, and n_heads allows no further head"
            )
        # One hidden head: a head with W = 0, or one term split into a pair (W, -W).
        if not self.three_row_queries:
            raise NotIdentifiableError(
                "a head is invisible to two-row queries: the one-row answers carry a component "
                "the visible heads do not explain, which is either a head with W = 0 or a pair "
                "of heads with W_2 = -W_1 (sigma(-x) = 1 - sigma(x) makes them alike on two "
                "rows); three-row queries are needed to tell them apart "
                "(three_row_queries=True)"
            )
        if target - K > 1:
            raise AssumptionViolation(
                f"{target - K} heads are invisible to two-row queries; recovering more than one "
                "hidden head is not supported"
            )
        cands = []
        for si in range(S.shape[0]):
            s, Ls = S[si], L[si]
            Wb, vb = s[:, None, None] * Wk, s[:, None] * V
            cands.append((np.concatenate([Wb, np.zeros((1, d, d))]),
                          np.concatenate([vb, Ls[None]]), "zero_head"))
            for k in range(K):
                # (W, v1), (-W, v2) look like (W, v1 - v2) plus a W = 0 head with 2 v2
                v2 = vb.copy()
                v2[k] = vb[k] + 0.5 * Ls
                cands.append((np.concatenate([Wb, -Wb[k][None]]),
                              np.concatenate([v2, 0.5 * Ls[None]]), "pair"))
        X = self._random_queries(rng, d, 4 * d + 16, (3,), Wk)[0]
        yq = oracle(X)
        self._stage["hidden"] += X.shape[0]
        errs = np.array([np.linalg.norm(multihead_eval(Wc, vc, X) - yq) for Wc, vc, _ in cands])
        errs /= max(float(np.linalg.norm(yq)), 1e-300)
        i = int(np.argmin(errs))
        self.hidden_errors_ = errs
        return cands[i]

    # -- refit and check -----------------------------------------------------------------------
    def _random_queries(self, rng, d, n, lengths, Wk):
        """Random queries of each length in ``lengths`` (n in all), scaled to O(1) logits."""
        wn = max(float(np.max(np.linalg.norm(Wk, axis=(1, 2)))), 1e-12)
        sig = 1.0 / np.sqrt(wn)
        per = -(-n // len(lengths))
        return [sig * rng.standard_normal((per, N, d)) for N in lengths]

    def _lengths(self):
        return (2, 3) if self.three_row_queries else (2,)

    def _refit(self, oracle, W, v, rng):
        Hh, d, _ = W.shape
        n_par = Hh * (d * d + d)
        n = int(np.ceil(self.refit_factor * n_par)) + 16
        Xs = self._random_queries(rng, d, n, self._lengths(), W)
        ys = [oracle(X) for X in Xs]
        self._stage["refit"] += sum(X.shape[0] for X in Xs)
        yall = np.concatenate(ys)
        ynorm = max(float(np.linalg.norm(yall)), 1e-300)
        theta = np.concatenate([W.reshape(Hh, -1), v], axis=1).ravel()

        def unpack(th):
            P = th.reshape(Hh, d * d + d)
            return P[:, : d * d].reshape(Hh, d, d), P[:, d * d:]

        def resid_jac(th):
            Wt, vt = unpack(th)
            rs, Js = [], []
            for X, yq in zip(Xs, ys, strict=True):
                f, J = multihead_jacobian(Wt, vt, X)
                rs.append(f - yq)
                Js.append(J)
            return np.concatenate(rs), np.concatenate(Js)

        r, J = resid_jac(theta)
        cost = float(r @ r)
        lam = 1e-6
        for _ in range(60):
            if np.sqrt(cost) <= 1e-15 * ynorm:
                break
            JtJ = J.T @ J
            g = J.T @ r
            D = np.diag(JtJ).copy() + 1e-300
            improved = False
            for _ in range(12):
                try:
                    step = np.linalg.solve(JtJ + lam * np.diag(D), -g)
                except np.linalg.LinAlgError:
                    lam *= 10
                    continue
                th_new = theta + step
                r_new, J_new = resid_jac(th_new)
                c_new = float(r_new @ r_new)
                if c_new < cost:
                    small = (cost - c_new) <= 1e-6 * cost
                    theta, r, J, cost = th_new, r_new, J_new, c_new
                    lam = max(lam / 10, 1e-15)
                    improved = True
                    break
                lam *= 10
            if not improved or small:
                break
        self.refit_rel_residual_ = float(np.sqrt(cost) / ynorm)
        return unpack(theta)

    def _check(self, oracle, W, v, rng):
        d = W.shape[1]
        lengths = (1, 2, 3, 5) if self.three_row_queries else (1, 2)
        Xs = self._random_queries(rng, d, 32 * len(lengths), lengths, W)
        num = den = 0.0
        for X in Xs:
            yq = oracle(X)
            self._stage["check"] += X.shape[0]
            num += float(np.sum((multihead_eval(W, v, X) - yq) ** 2))
            den += float(np.sum(yq**2))
        return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


def _unit(x):
    return x / np.linalg.norm(x)
