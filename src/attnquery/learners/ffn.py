"""A bias-free two-layer ReLU network ``x -> w_o^T ReLU(A^T x)`` learnt from value queries.

The paper's transformer learner (Sec. 4.1) assumes an FFN learner; this is ours. A bias-free
two-layer ReLU network is piecewise linear with kinks on the hyperplanes ``a_i^T x = 0``:

1. Along random lines ``p + t q`` (and ``q + t p``, so that every hyperplane through the origin
   crosses one of the pair within ``|t| <= 1.25``), a grid of values is refined by bisection
   (:mod:`attnquery.learners._kinks`): an interval whose midpoint lies on the chord is
   linear; a kink interval between two linear neighbours is located exactly as the intersection
   of the neighbours' lines, and accepted when the values at the kink and just beside it lie on
   those lines and both halves pass the chord test (otherwise it is split).
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

Every loop is bounded: the line search stops after ``max_rounds`` rounds, or as soon as a line
holds more unresolved intervals than ``n_grid + 2 max_kinks`` (answers that are not piecewise
linear at ``rtol``: noise, low precision), and the search never asks more than
:meth:`ReLUNetworkLearner.query_cap` queries (the cap of the fit's query ledger, ``n_queries``
when given); each limit ends in :class:`~attnquery.errors.SearchLimitError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from ..errors import ConfigError, SearchLimitError
from . import _params
from ._base import (
    DEFAULT_VERIFY,
    BaseLearner,
    QueryLedger,
    check_oracle,
    check_verify_param,
    renamed_parameter,
)
from ._kinks import KINK as KINK
from ._kinks import LINEAR as LINEAR
from ._kinks import NONLINEAR as NONLINEAR
from ._kinks import SPLIT as SPLIT
from ._kinks import T_END as T_END
from ._kinks import UNKNOWN as UNKNOWN
from ._kinks import W_MIN as W_MIN
from ._kinks import Interval, Kink, Line, SearchPlan, search_lines
from ._registry import LearnerSpec

__all__ = ["ReLUNetworkLearner", "Interval", "Kink", "Line", "FFN_VERIFY_RTOL"]

#: relative disagreement of the check queries the FFN learner's own error explains (its
#: networks agree with the target to about 1e-10 relative; float32 answers differ by 1e-7)
FFN_VERIFY_RTOL = 1e-8
#: the stages ``n_queries_by_stage_`` counts
STAGES = ("lines", "kinks", "refine", "fit", "verify")



def _cap_refusal(n: int, spent: int, cap: int) -> SearchLimitError:
    """The search's end when a batch would pass the fit's cap (the ledger's ``refusal``)."""
    return SearchLimitError(
        f"the FFN learner would pass its cap of {cap} queries ({spent} spent, {n} more "
        "asked): raise max_kinks or n_queries if the network is that wide; otherwise the "
        "answers are not those of a bias-free ReLU network")


@dataclass(frozen=True)
class _OneRowFunction:
    """``f(Z)`` for vectors Z (n, d): one-row queries asked through the fit's ledger, whose cap
    (:meth:`ReLUNetworkLearner.query_cap`) refuses a batch that would pass it with a
    :class:`~attnquery.errors.SearchLimitError` before it is asked."""

    ledger: QueryLedger

    def __call__(self, Z) -> np.ndarray:
        Z = np.ascontiguousarray(Z, dtype=np.float64)
        n = Z.shape[0]
        # the check's queries are kept back: the cap is the whole fit's (n_queries)
        self.ledger.need(n, f"a batch of {n} queries", refusal=_cap_refusal)
        return self.ledger.ask(Z[:, None, :])


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
        Rounds of the line search; a search still open after them raises
        :class:`~attnquery.errors.SearchLimitError`.
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
    verify : int
        Check queries (one-row, random) spent after fitting (0: no check): the network must
        agree with the oracle to :data:`FFN_VERIFY_RTOL`, else
        :class:`~attnquery.errors.ModelMismatchError`.
    refine : bool
        Refine each hyperplane's normal from ``d - 1`` points located on it exactly (4 queries
        each); without it the normals carry the finite-difference error (about 1e-8).
    max_kinks : int
        Most kinks a line is expected to cross (the network's width bounds it). A line with more
        than ``n_grid + 2 max_kinks`` unresolved intervals at once raises
        :class:`~attnquery.errors.SearchLimitError`.
    n_queries : int, optional
        The fit's query budget, the check's queries included: the cap of its query ledger,
        which the search, the gradient jumps, the refinement and the least-squares fit may not
        pass with the ``verify`` check queries kept back (a batch that would raises
        :class:`~attnquery.errors.SearchLimitError` before it is asked); default
        :meth:`query_cap`. The oracle's own budget applies too
        (:class:`~attnquery.errors.BudgetExceededError`).
    max_queries : int, optional
        Deprecated: the old name of ``n_queries`` (a :class:`FutureWarning`; giving both is a
        :class:`~attnquery.errors.ConfigError`).
    random_state : int, sequence of ints, Generator or None
        Seed of the lines, the refinement points, the fit points and the check queries.

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
        Intervals given up (kinks too close to resolve).
    n_rounds_ : int
        Rounds the line search took.
    fit_residual_ : float
        Relative residual of the least-squares fit of the output weights.
    query_cap_ : int
        The cap the fit ran under (:meth:`query_cap`).
    verify_error_ : float
        Largest ``|f_hat - f|`` over the largest ``|f|`` on the check queries (NaN if none).
    n_verify_queries_ : int
        Check queries.
    n_queries_ : int
        Queries counted by the oracle during ``fit`` (the check queries included).
    n_queries_by_stage_ : dict
        Queries per stage: ``lines`` (the line search), ``kinks`` (the gradient jumps),
        ``refine``, ``fit`` (the output weights and linear part) and ``verify``.
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "n_line_pairs": [_params.Interval(Integral, 1, None, closed="left")],
        "n_grid": [_params.Interval(Integral, 4, None, closed="left")],
        "rtol": [_params.Interval(Real, 0, 1e-2, closed="neither")],
        "max_rounds": [_params.Interval(Integral, 1, None, closed="left")],
        "fd_rel_step": [_params.Interval(Real, 0, 0.5, closed="neither")],
        "merge_tol": [_params.Interval(Real, 0, 0.1, closed="neither")],
        "n_fit_factor": [_params.Interval(Real, 1, None, closed="left")],
        "linear_tol": [_params.Interval(Real, 0, 1e-2, closed="neither")],
        "refine": ["boolean"],
        "max_kinks": [_params.Interval(Integral, 1, None, closed="left")],
        "n_queries": [_params.Interval(Integral, 1, None, closed="left"), None],
        "max_queries": [_params.Interval(Integral, 1, None, closed="left"), None,
                        _params.Hidden(_params.Options({_params.DEPRECATED}))],
    }
    spec = LearnerSpec(
        name="relu", oracle="value", returns="network", stages=STAGES,
        description="a bias-free two-layer ReLU network from its kinks (the transformer "
        "learner's FFN part, beyond the paper)", label="ReLU network")

    def __init__(
        self,
        *,
        n_line_pairs: int = 2,
        n_grid: int = 32,
        rtol: float = 1e-10,
        max_rounds: int = 80,
        fd_rel_step: float = 1e-3,
        merge_tol: float = 1e-6,
        n_fit_factor: float = 2.0,
        linear_tol: float = 1e-9,
        verify: int = DEFAULT_VERIFY,
        refine: bool = True,
        max_kinks: int = 256,
        n_queries: int | None = None,
        max_queries: int | None | str = _params.DEPRECATED,
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
        self.verify = verify
        self.refine = refine
        self.max_kinks = max_kinks
        self.n_queries = n_queries
        self.max_queries = max_queries
        self.random_state = random_state

    def _validate_extra(self) -> None:
        """``max_queries``, the old name of ``n_queries``: a FutureWarning, or a ConfigError
        beside ``n_queries``; a cap below :meth:`least_queries` (ConfigError, before any
        query)."""
        old = renamed_parameter(self, "max_queries", "n_queries")
        cap = self.n_queries if self.n_queries is not None else old
        if cap is not None and int(cap) < self.least_queries():
            L, G = 2 * int(self.n_line_pairs), int(self.n_grid)
            raise ConfigError(
                f"n_queries={cap} is below the {self.least_queries()} queries every fit asks: "
                f"the line search's grid of 2 n_line_pairs (n_grid + 1) = {L * (G + 1)} "
                f"one-row queries and verify = {check_verify_param(self.verify)} check queries")

    def least_queries(self) -> int:
        """The fewest queries any fit asks, whatever the box: the line search's first batch,
        ``2 n_line_pairs (n_grid + 1)`` grid points, and the ``verify`` check queries."""
        return 2 * int(self.n_line_pairs) * (int(self.n_grid) + 1) + \
            check_verify_param(self.verify)

    def query_cap(self, d: int) -> int:
        """The most queries a fit at dimension ``d`` may ask (``n_queries`` when given).

        With L lines, K = ``max_kinks``, G = ``n_grid`` and R = ``max_rounds``: the grid
        ``L (G + 1)``; R rounds of at most 3 queries for each of at most ``G + 2 K`` open
        intervals per line; for each of at most ``L K`` kinks, ``2 (d + 1)`` for its gradient
        jump and ``4 (d - 1)`` for its hyperplane; the least-squares fit; the check.
        """
        given = self.n_queries if self.n_queries is not None else \
            renamed_parameter(self, "max_queries", "n_queries", warn=False)
        if given is not None:
            return int(given)
        L, K, G = 2 * int(self.n_line_pairs), int(self.max_kinks), int(self.n_grid)
        search = L * (G + 1) + int(self.max_rounds) * L * 3 * (G + 2 * K)
        per_kink = 2 * (d + 1) + 4 * max(d - 1, 0)
        fit = int(self.n_fit_factor * (L * K + d)) + 8
        return int(search + L * K * per_kink + fit + check_verify_param(self.verify))

    # ------------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover an equivalent FFN from one-row value queries; returns self.

        Raises
        ------
        SearchLimitError
            The line search did not close within ``max_rounds`` rounds, a line held more open
            intervals than ``n_grid + 2 max_kinks``, or the fit would pass its query cap
            (answers that are not piecewise linear at ``rtol``: noise, lower precision, a
            network wider than ``max_kinks``).
        BudgetExceededError
            A batch would pass the oracle's budget (before it is asked).
        ConfigError
            A bad parameter, or ``n_queries`` and its old name ``max_queries`` both given.
        ModelMismatchError
            The network disagrees with the check queries beyond :data:`FFN_VERIFY_RTOL`.
        """
        self._validate_params()
        d = check_oracle(oracle)
        rng = self._rng()
        n0 = oracle.n_queries
        self.query_cap_ = self.query_cap(d)
        with self._open_ledger(oracle, STAGES, cap=self.query_cap_,
                               reserve=check_verify_param(self.verify)) as ledger:
            f = _OneRowFunction(ledger)
            with ledger.stage("lines"):
                lines, self.n_rounds_ = search_lines(f, d, rng, SearchPlan(
                    self.n_line_pairs, self.n_grid, self.rtol, self.max_rounds, self.max_kinks))
            with ledger.stage("kinks"):
                U, _, n_kinks, Xk = self._jumps(f, lines, d)
            N, groups = self._merge(U, Xk)
            if self.refine:
                with ledger.stage("refine"):
                    N = self._refine_normals(f, N, groups, Xk, d, rng)
            with ledger.stage("fit"):
                A, w_o, recovered, self.fit_residual_ = self._linear_part(f, N, d, rng)
            self.A_ = A
            self.w_o_ = w_o
            self.n_neurons_ = int(A.shape[1] - (0 if recovered else 2))
            self.width_recovered_ = bool(recovered)
            self.n_kinks_ = int(n_kinks)
            self.n_lost_ = int(sum(ln.lost for ln in lines))
            with ledger.stage("verify"):
                self._verify_fit(oracle, lambda X: self.predict(X[:, 0, :]), rng.spawn(1)[0],
                                 rtol=FFN_VERIFY_RTOL, n0=n0, lengths=(1,),
                                 what="the network found",
                                 hint="the box may not be a bias-free two-layer ReLU network, "
                                 "or its answers may carry noise or lower precision than "
                                 "float64")
        return self

    def predict(self, Z) -> np.ndarray:
        """Evaluate the recovered network on vectors Z (B, d)."""
        return np.maximum(np.asarray(Z, dtype=np.float64) @ self.A_, 0.0) @ self.w_o_

    # -- from kinks to a network --------------------------------------------------------------
    def _jumps(self, f, lines, d):
        """Gradient jumps at every accepted kink.

        Returns u (d, k), s (k,), the number of kinks and the kink points (k, d).
        """
        rows = [(ln, kk) for ln in lines for kk in ln.kinks]
        if not rows:
            return np.zeros((d, 0)), np.zeros(0), 0, np.zeros((0, d))
        Y = []
        h = []
        for ln, kk in rows:
            Y.append(ln.point(kk.t - kk.radius))
            Y.append(ln.point(kk.t + kk.radius))
            h += [self.fd_rel_step * kk.radius] * 2
        g = _fd_gradients(f, np.array(Y), np.array(h))
        J = g[1::2] - g[0::2]
        dirs = np.array([ln.dirn for ln, _ in rows])
        jump_line = np.array([kk.slope_right - kk.slope_left for _, kk in rows])
        along = np.einsum("kd,kd->k", J, dirs)
        # a finite difference that crossed another hyperplane shows as a mismatch here
        ok = np.abs(along - jump_line) <= 1e-6 * np.maximum(np.abs(jump_line), 1e-300) + \
            1e-8 * np.linalg.norm(J, axis=1)
        ok &= np.linalg.norm(J, axis=1) > 0
        s = np.sign(along[ok])
        U = (J[ok] * s[:, None]).T
        Xk = np.array([ln.point(kk.t) for ln, kk in rows])[ok]
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
        Returns ``A``, ``w_o``, whether the width was recovered and the fit's relative
        residual.
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
        residual = float(np.linalg.norm(F @ coef - y) / max(np.linalg.norm(y), 1e-300))
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
        return A, np.asarray(w_o, dtype=float), recovered, residual
