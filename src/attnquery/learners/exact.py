"""Exact recovery of a single attention head from value queries (paper Theorem 4.1).

Phase 1 reads v from the d one-row queries ``[e_i]``. Phase 2 reads column ``w_j = W e_j`` from
d two-row probes. The paper's probe is ``[(u + e_j); e_j]``; here it is scaled,
``[(c u + s e_j); s e_j]``, which gives the same linear equation with a controlled logit:

    alpha = sigma(c s u^T w_j),     y = s v_j + alpha c (u^T v),

so ``u^T w_j = logit(alpha) / (c s)``. The product ``kappa = c s`` sets the logit scale and is
chosen from the answers themselves (the learner does not know the model's scale): columns are
queried in blocks, each block's kappa comes from the logits measured in the blocks before it, and
only a probe whose logit is saturated (|logit| > ``max_logit``, where float64 would lose digits)
is asked again at a smaller scale. The ratio ``c / s`` keeps ``s v_j`` from swamping
``c u^T v`` (cancellation). On ordinary heads no probe is asked twice and the count is exactly
``d^2 + d``; the learner reports every extra query in ``n_requeried_``.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ..errors import AssumptionViolation, ConfigError, NotIdentifiableError
from ._base import BaseLearner, check_budget, check_oracle

__all__ = ["ExactValueQueryLearner", "read_v", "probe_logits", "check_v", "unit_directions",
           "SparseRows", "coordinate_rows", "rows_dot", "PROBE_DESIGNS"]

PROBE_DESIGNS = ("gaussian", "basis", "orthogonal")


def read_v(oracle, d: int) -> np.ndarray:
    """Read v from the d one-row queries ``[e_i]`` (Theorem 4.1, phase 1)."""
    return oracle(np.eye(d)[:, None, :].copy())


def check_v(v: np.ndarray) -> float:
    """Return ``max |v_i|``; raise :class:`NotIdentifiableError` when v = 0."""
    vmax = float(np.max(np.abs(v)))
    if vmax == 0.0:
        raise NotIdentifiableError(
            "v = 0: every answer is 0, so W is not identifiable from value queries"
        )
    return vmax


def unit_directions(n: int, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``n`` random unit vectors ``a`` with ``|a^T v|`` not far below its typical size.

    ``|a^T v|`` for a random unit ``a`` is about ``||v|| / sqrt(d)``; a direction with a tiny
    ``a^T v`` divides the answer by a tiny number, so such draws are redrawn (this costs no
    query).
    """
    d = v.size
    A = rng.standard_normal((n, d))
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    vn = v / np.linalg.norm(v)
    floor = 0.05 / np.sqrt(d)
    for _ in range(100):
        bad = np.abs(A @ vn) < floor
        if not bad.any():
            break
        G = rng.standard_normal((int(bad.sum()), d))
        A[bad] = G / np.linalg.norm(G, axis=1, keepdims=True)
    return A


class SparseRows:
    """``n`` rows of length ``d`` with a few nonzeros each, as (row, column, value) triplets.

    The probes' coordinate directions and tokens (``e_j``, ``e_j + e_p``) in this form cost
    O(nonzeros) to build, to multiply by a vector and to add into a batch of queries.
    Triplets are sorted by row.
    """

    __slots__ = ("shape", "row", "col", "val")

    def __init__(self, shape, row, col, val):
        self.shape = (int(shape[0]), int(shape[1]))
        order = np.argsort(row, kind="stable")
        self.row = np.asarray(row, dtype=np.intp)[order]
        self.col = np.asarray(col, dtype=np.intp)[order]
        self.val = np.asarray(val, dtype=float)[order]

    def __matmul__(self, v: np.ndarray) -> np.ndarray:
        return np.bincount(self.row, weights=self.val * v[self.col], minlength=self.shape[0])

    def __getitem__(self, mask) -> SparseRows:
        """The rows selected by a boolean mask, in order."""
        mask = np.asarray(mask, dtype=bool)
        new_index = np.cumsum(mask) - 1
        keep = mask[self.row]
        return SparseRows((int(mask.sum()), self.shape[1]), new_index[self.row[keep]],
                          self.col[keep], self.val[keep])

    def add_to(self, out: np.ndarray, coef: np.ndarray) -> None:
        """``out += coef[:, None] * self`` on a dense (n, d) array (touches the nonzeros)."""
        np.add.at(out, (self.row, self.col), coef[self.row] * self.val)

    def toarray(self) -> np.ndarray:
        """The rows as a dense (n, d) array."""
        out = np.zeros(self.shape)
        self.add_to(out, np.ones(self.shape[0]))
        return out


def coordinate_rows(cols, d: int) -> SparseRows:
    """The coordinate rows ``e_{cols[k]}`` (n, d)."""
    cols = np.asarray(cols, dtype=np.intp)
    return SparseRows((cols.size, d), np.arange(cols.size), cols, np.ones(cols.size))


def rows_dot(M, v: np.ndarray) -> np.ndarray:
    """``M @ v`` for rows given densely, as one broadcast row (stride 0) or sparse."""
    if isinstance(M, np.ndarray) and M.shape[0] > 1 and M.strides[0] == 0:
        return np.full(M.shape[0], M[0] @ v)
    return M @ v


def probe_logits(oracle, U, cols, c, s, v, last=None, uv=None, lastv=None):
    """Ask the two-row probes ``[(c_k U[k] + s_k e_j); s_k e_j]`` and return their logits.

    Parameters
    ----------
    oracle : value oracle
    U : ndarray or SparseRows (n, d)
        The probe directions, one per query (dense, a broadcast row or sparse).
    cols : ndarray (n,) of int
        The column j of each probe.
    c, s : ndarray (n,)
        Scale of the probe direction and of the last token.
    v : ndarray (d,)
        The value vector (already read).
    last : ndarray or SparseRows (n, d), optional
        General last tokens ``b_k`` in place of ``e_j``: the probes are then
        ``[(c_k U[k] + s_k b_k); s_k b_k]`` with logit ``c s u^T W b`` (``cols`` is ignored).
    uv, lastv : ndarray (n,), optional
        ``U @ v`` and ``last @ v``, when the caller has them already.

    Returns
    -------
    logit : ndarray (n,)
        ``c s u^T w_j`` measured (NaN where alpha was not strictly inside (0, 1)).
    alpha : ndarray (n,)
        The attention weight on the first row.
    """
    n, d = U.shape
    if last is None:
        last = coordinate_rows(cols, d)
    if uv is None:
        uv = rows_dot(U, v)
    if lastv is None:
        lastv = rows_dot(last, v)
    X = np.empty((n, 2, d))
    if isinstance(last, SparseRows):
        X[:, 1, :] = 0.0
        if isinstance(U, SparseRows):
            X[:, 0, :] = 0.0
            U.add_to(X[:, 0, :], c)
        else:
            np.multiply(c[:, None], U, out=X[:, 0, :])
        last.add_to(X[:, 0, :], s)
        last.add_to(X[:, 1, :], s)
    elif isinstance(U, SparseRows):
        np.multiply(s[:, None, None], last[:, None, :], out=X)
        U.add_to(X[:, 0, :], c)
    else:
        np.multiply(s[:, None], last, out=X[:, 1, :])
        np.multiply(c[:, None], U, out=X[:, 0, :])
        X[:, 0, :] += X[:, 1, :]
    y = oracle(X)
    base = s * lastv
    uvc = c * uv
    num1 = y - base  # = alpha * c u^T v
    num0 = uvc - num1  # = (1 - alpha) * c u^T v
    r1 = num1 / uvc
    r0 = num0 / uvc
    ok = (r1 > 0) & (r0 > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        logit = np.where(ok, np.log(np.where(ok, r1, 1.0)) - np.log(np.where(ok, r0, 1.0)), np.nan)
    return logit, r1


class ExactValueQueryLearner(BaseLearner):
    """Exact recovery of (W, v) from d^2 + d value queries (Theorem 4.1).

    Parameters
    ----------
    probes : {"gaussian", "basis", "orthogonal"}
        Probe directions u_1..u_d. "gaussian" (paper): i.i.d. standard Gaussian directions
        (normalised; a direction with ``|u^T v|`` far below its typical size is redrawn, which
        costs no query). "basis" (paper): the deterministic set ``u_l = e_l``, or
        ``e_l + e_p`` where ``v_l = 0`` (also where ``|v_l|`` is below ``zero_tol * max|v|``,
        since a tiny ``u^T v`` costs precision), with ``p = argmax |v_i|``. "orthogonal"
        (beyond the paper): a random orthonormal basis (QR of a Gaussian matrix) reflected so
        that every ``|u_l^T v| = ||v|| / sqrt(d)``; its probe matrix has condition number 1,
        where a d x d Gaussian matrix has one of order d, which the error of W inherits.
    random_state : int, sequence of ints, Generator or None
        Seed of the Gaussian probes.
    max_logit : float
        Largest |logit| accepted before a probe is asked again at a smaller scale.
    zero_tol : float
        Relative threshold below which ``v_l`` is treated as zero by the basis design.
    initial_logit_scale : float
        Scale ``c s`` of the first column's probes, before any answer has shown the model's
        scale. The first column is accepted without re-asking when its largest
        ``|u^T w_1|`` lies in ``[min_logit, max_logit] / initial_logit_scale``, i.e. in
        [1e-3, 1e3] with the defaults.
    min_logit : float
        A column whose largest |logit| is below this is asked again at a larger scale (its
        logits would carry too few significant digits).
    block_bytes : int
        Memory bound on one batch of queries (the learner works in column blocks).

    Attributes
    ----------
    W_ : ndarray (d, d)
    v_ : ndarray (d,)
    n_queries_ : int
        Queries counted by the oracle during ``fit``.
    n_requeried_ : int
        Probes asked again because their first answer was saturated (0 on ordinary heads).
    probe_matrix_ : ndarray (d, d)
        The probe directions, one per row.
    logit_scale_ : ndarray (d,)
        The scale ``c s`` used for each column's probes.
    """

    def __init__(
        self,
        probes: str = "gaussian",
        random_state=None,
        max_logit: float = 10.0,
        zero_tol: float = 1e-3,
        min_logit: float = 1e-5,
        initial_logit_scale: float = 1e-2,
        block_bytes: int = 64 * 2**20,
    ):
        self.probes = probes
        self.random_state = random_state
        self.max_logit = max_logit
        self.zero_tol = zero_tol
        self.min_logit = min_logit
        self.initial_logit_scale = initial_logit_scale
        self.block_bytes = block_bytes

    # ------------------------------------------------------------------------------------------
    def _probe_matrix(self, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        d = v.size
        vmax = np.max(np.abs(v))
        if self.probes == "orthogonal":
            G = rng.standard_normal((d, d))
            Qm, Rm = np.linalg.qr(G)
            R = (Qm * np.sign(np.diag(Rm))).T  # Haar-distributed orthogonal rows
            vn = v / np.linalg.norm(v)
            w = rng.choice([-1.0, 1.0], size=d) / np.sqrt(d)
            h = R @ vn - w  # Householder reflection taking R v to w
            nh = np.linalg.norm(h)
            if nh > 0:
                h /= nh
                R = R - 2.0 * np.outer(h, h @ R)
            return R
        if self.probes == "basis":
            U = np.eye(d)
            p = int(np.argmax(np.abs(v)))
            small = np.abs(v) < self.zero_tol * vmax
            U[small, p] += 1.0
            return U
        return unit_directions(d, v, rng)

    def _validate_params(self):
        if self.probes not in PROBE_DESIGNS:
            raise ConfigError(f"probes must be one of {PROBE_DESIGNS}; got {self.probes!r}")
        if not (np.isfinite(self.max_logit) and 1.0 <= self.max_logit <= 30.0):
            raise ConfigError(f"max_logit must be in [1, 30]; got {self.max_logit}")
        if not (0.0 < self.min_logit < self.max_logit):
            raise ConfigError(f"min_logit must be in (0, max_logit); got {self.min_logit}")
        if not (np.isfinite(self.initial_logit_scale) and self.initial_logit_scale > 0):
            raise ConfigError(
                f"initial_logit_scale must be positive; got {self.initial_logit_scale}"
            )
        if not 0.0 <= self.zero_tol < 1.0:
            raise ConfigError(f"zero_tol must be in [0, 1); got {self.zero_tol}")

    def fit(self, oracle):
        """Recover (W, v) from ``oracle``; returns self.

        Raises
        ------
        NotIdentifiableError
            If every answer to the one-row queries is 0 (v = 0): W is then not identifiable.
        AssumptionViolation
            If the answers cannot come from a single attention head (an attention weight outside
            (0, 1) that no rescaling resolves).
        """
        self._validate_params()
        d = check_oracle(oracle)
        rng = self._rng()
        n0 = oracle.n_queries
        check_budget(oracle, d * d + d, "exact recovery (d^2 + d queries)")

        v = read_v(oracle, d)
        check_v(v)
        U = self._probe_matrix(v, rng)
        uv = U @ v
        uv_min = float(np.min(np.abs(uv)))

        T = np.empty((d, d))  # T[l, j] = u_l^T w_j
        kappa_col = np.empty(d)
        n_requeried = 0
        max_cols = max(1, int(self.block_bytes // (16 * d * d)))
        scale_ref = None  # largest rms of u^T w_j seen so far
        j0, block = 0, 1
        while j0 < d:
            cols = np.arange(j0, min(j0 + block, d))
            if scale_ref is None:
                kappa = self.initial_logit_scale
            elif scale_ref == 0.0:  # columns so far are zero: keep the last scale
                kappa = kappa_col[j0 - 1]
            else:
                kappa = 0.1 / scale_ref  # a column 100x larger still fits
            Tb, kap, nre = self._measure_block(
                oracle, U, uv_min, v, cols, kappa, scale_known=bool(scale_ref)
            )
            n_requeried += nre
            T[:, cols] = Tb
            kappa_col[cols] = kap
            rms = float(np.sqrt(np.mean(Tb**2, axis=0)).max())
            scale_ref = rms if scale_ref is None else max(scale_ref, rms)
            j0 += cols.size
            block = min(2 * block, max_cols)

        lu = scipy.linalg.lu_factor(U)
        self.W_ = scipy.linalg.lu_solve(lu, T)
        self.v_ = v
        self.probe_matrix_ = U
        self.logit_scale_ = kappa_col
        self.n_requeried_ = int(n_requeried)
        self.n_queries_ = int(oracle.n_queries - n0)
        return self

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered head on inputs X (B, N, d)."""
        from ..models import AttentionHead

        return AttentionHead(self.v_, W=self.W_)(X)

    def _measure_block(self, oracle, U, uv_min, v, cols, kappa, scale_known):
        """Measure ``u_l^T w_j`` for every l and every j in ``cols`` at logit scale ``kappa``.

        Saturated probes are asked again with kappa divided by 1e2 (at most 8 times). While the
        model's scale is unknown (no nonzero column measured yet), a column whose logits are all
        tiny (|logit| < min_logit, so that float64 rounding would dominate) is asked again once
        at the scale its answers suggest. Once the scale is known, kappa is set from the largest
        column so far, so a small column's absolute error is already below rounding level of W.
        """
        d = U.shape[0]
        k = cols.size
        jj = np.repeat(cols, d)
        ll = np.tile(np.arange(d), k)
        kap = np.full(d * k, float(kappa))
        # c / s = rho keeps the s v_j term from swamping c u^T v.
        rho = np.maximum(1.0, np.abs(v[jj]) / uv_min)
        def ask(sub):
            """Logits of the probes ``sub`` at their current scales ``kap[sub]``."""
            return probe_logits(oracle, U[ll[sub]], jj[sub], np.sqrt(kap[sub] * rho[sub]),
                                np.sqrt(kap[sub] / rho[sub]), v)[0]

        logit = ask(np.arange(d * k))
        n_re = 0
        for _ in range(8):
            bad = ~(np.abs(logit) <= self.max_logit)
            if not bad.any():
                break
            kap[bad] *= 1e-2
            sub = np.flatnonzero(bad)
            logit[sub] = ask(sub)
            n_re += sub.size
        if not np.all(np.isfinite(logit)):
            raise AssumptionViolation(
                "the answers are not those of a single attention head: some attention weights "
                "fall outside (0, 1) at every probe scale"
            )
        # Too small a scale: the logits carry few significant digits. Ask once more, larger.
        peak = np.max(np.abs(logit.reshape(k, d)), axis=1)
        tiny = (peak < self.min_logit) & (peak > 0) & (not scale_known)
        if tiny.any():
            sub = np.flatnonzero(np.repeat(tiny, d))
            boost = np.repeat(1.0 / peak[tiny], d)
            kap[sub] *= boost
            new = ask(sub)
            n_re += sub.size
            if np.all(np.abs(new) <= self.max_logit):
                logit[sub] = new
            else:  # keep the first, unsaturated answers
                kap[sub] /= boost
        T = (logit / kap).reshape(k, d).T
        kap_col = kap.reshape(k, d).min(axis=1)
        return T, kap_col, n_re
