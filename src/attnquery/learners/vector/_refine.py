"""One head's (W, c) refined by weighted least squares over every row of the attention
matrices read from served answers (the shared-token route's last step for float32, float16 and
bfloat16 answers; :func:`~._heads.fit_shared`).

The shared-token route reads ``m_h(z) = W_h z + c_h`` from the shared tokens' rows and the row
space of ``W_h`` from the fresh tokens' rows over the shared keys: two least squares that leave
out the fresh rows' logits over the fresh keys and weigh every logit alike. Under rounding that
costs accuracy: W's error is about 5 times that of one weighted least squares over all the
logits (float32, d = 96, 6 heads of 16: 4.0e-6 to 8.5e-6 from the route, 1.0e-6 to 1.3e-6
refined, from the same answers).

Each row n of a query (the token x_n's attention over the keys x_k) gives, with weights
``omega_k = a_k^2`` (the logarithm of a weight read with absolute error e has error e / a_k),

    minimise   sum_k omega_k (log a_k - l_k - m)^2,    l_k = x_k^T (W x_n + c),

over the row's free constant m; eliminating m centres ``log a`` and the keys at their
``omega``-weighted means. The unknowns are W of rank r (``W = B R^T``), solved in alternating
sweeps by conjugate gradients on the normal equations (never formed: d (r + 1) unknowns,
147,840 at d = 384 for a full W): with the row space R fixed, (B, c); then with the column space
L fixed, ``W = L M^T`` for M. Kronecker-factored preconditioners (the keys' weighted scatter
times the query features' scatter) keep each solve to about 15 iterations.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse.linalg as spla

__all__ = ["refine_head", "REFINE_SWEEPS", "REFINE_MAXITER", "REFINE_RTOL"]

#: alternating sweeps (row space fixed, then column space fixed). Float32, d = 96, worst head's
#: W: 8.5e-6 from the shared-token route, 1.6e-6 after one sweep, 1.3e-6 after two
REFINE_SWEEPS = 2
#: conjugate-gradient iterations per solve at most, and their relative tolerance
REFINE_MAXITER = 40
REFINE_RTOL = 1e-8


def _rows(X: np.ndarray, A: np.ndarray, min_weight: float):
    """Per row: the weights ``omega`` (n, N, N) (zero below ``min_weight``), the centred log
    weights y and the keys' weighted means (n, N, d)."""
    keep = A > min_weight
    om = np.where(keep, A, 0.0) ** 2
    s = np.maximum(om.sum(axis=2, keepdims=True), np.finfo(float).tiny)
    logA = np.log(np.where(keep, A, 1.0))
    y = np.where(keep, logA - (om * logA).sum(axis=2, keepdims=True) / s, 0.0)
    return om, y, (om @ X) / s


def _logits(Q, K, Kbar):
    """The centred logits ``q_n^T (k_k - kbar_n)`` (n, N rows, N keys) of the rows' features Q
    against the keys' K and their weighted means Kbar (n, N, e) each."""
    return np.matmul(Q, K.transpose(0, 2, 1)) - np.einsum("qne,qne->qn", Q, Kbar)[..., None]


def _back(om, v, K, Kbar):
    """The transpose of :func:`_logits` in Q, applied to ``omega v``: per row ``sum_k omega_k
    v_k (k_k - kbar_n)`` (n, N, e)."""
    wv = om * v
    return wv @ K - wv.sum(axis=2, keepdims=True) * Kbar


def _cg(apply, b, x0, precondition, maxiter: int, rtol: float):
    """Conjugate gradients on ``apply(x) = b`` (flattened), preconditioned; the solution and
    its iterations."""
    n = b.size
    count = [0]
    x, _ = spla.cg(spla.LinearOperator((n, n), matvec=apply), b, x0=x0,
                   M=spla.LinearOperator((n, n), matvec=precondition), maxiter=maxiter,
                   rtol=rtol, callback=lambda _: count.__setitem__(0, count[0] + 1))
    return x, count[0]


def refine_head(X: np.ndarray, A: np.ndarray, W: np.ndarray, c: np.ndarray, rank: int,
                min_weight: float, fit_bias: bool = True, sweeps: int = REFINE_SWEEPS,
                maxiter: int = REFINE_MAXITER, rtol: float = REFINE_RTOL):
    """One head's (W, c) refined over every row of its attention matrices (module docstring).

    Parameters
    ----------
    X : ndarray (n, N, d)
        The queries.
    A : ndarray (n, N, N)
        The head's attention matrices read from their answers (every token's outputs, no mask).
    W, c : ndarray (d, d), (d,)
        The starting estimate (the shared-token route's).
    rank : int
        W's rank r.
    min_weight : float
        Weights at or below it are left out (their logarithm is the answers' rounding).
    fit_bias : bool
        Refine c too (else it stays as given).
    sweeps, maxiter, rtol
        :data:`REFINE_SWEEPS`, :data:`REFINE_MAXITER`, :data:`REFINE_RTOL`.

    Returns
    -------
    W, c : ndarray
    iterations : int
        Conjugate-gradient iterations in all.
    """
    n, N, d = X.shape
    om, y, xbar = _rows(X, A, min_weight)
    Xf, xf = X.reshape(-1, d), xbar.reshape(-1, d)
    wk, wn = om.sum(axis=1).reshape(-1), om.sum(axis=2).reshape(-1)
    S = (Xf * wk[:, None]).T @ Xf - (xf * wn[:, None]).T @ xf
    W, c = np.array(W, dtype=float), np.array(c, dtype=float)
    iterations = 0
    for _ in range(sweeps):
        W, c, k = _row_space_fixed(X, xbar, om, y, S, W, c, rank, fit_bias, maxiter, rtol)
        W, k2 = _column_space_fixed(X, xbar, om, y, S, W, c, rank, maxiter, rtol)
        iterations += k + k2
    return W, c, iterations


def _minus_bias(X, xbar, y, c):
    """The centred log weights less the logits of the key bias c, ``c^T (x_k - xbar_n)``."""
    return y - ((X @ c)[:, None, :] - (xbar @ c)[..., None])


def _row_space_fixed(X, xbar, om, y, S, W, c, r, fit_bias, maxiter, rtol):
    """W = B R^T with R, W's leading r right singular vectors, fixed: (B [, c]) by the
    weighted least squares. The rows' features are ``F_n = [R^T x_n; 1]``, the logits
    ``F_n^T T^T (x_k - xbar_n)`` for the unknown T = [B, c] (d, e)."""
    n, N, d = X.shape
    R = np.linalg.svd(W)[2][:r].T
    F = X @ R
    if fit_bias:
        F = np.concatenate([F, np.ones((n, N, 1))], axis=2)
    e = F.shape[2]
    Ff, Xf, xf = F.reshape(-1, e), X.reshape(-1, d), xbar.reshape(-1, d)
    Sinv, Cinv = np.linalg.inv(S), np.linalg.inv(Ff.T @ Ff)
    rhs = y if fit_bias else _minus_bias(X, xbar, y, c)

    def transpose(v):  # sum over rows and keys of omega v (x_k - xbar_n) F_n^T
        wv = om * v
        G = np.matmul(wv.transpose(0, 2, 1), F).reshape(-1, e)
        return Xf.T @ G - xf.T @ (Ff * wv.sum(axis=2).reshape(-1, 1))

    def apply(t):
        t = t.reshape(d, e)
        return transpose(_logits(F, X @ t, xbar @ t)).ravel()

    t0 = W @ R
    if fit_bias:
        t0 = np.concatenate([t0, c[:, None]], axis=1)
    t, k = _cg(apply, transpose(rhs).ravel(), t0.ravel(),
               lambda t: (Sinv @ t.reshape(d, e) @ Cinv).ravel(), maxiter, rtol)
    t = t.reshape(d, e)
    return t[:, :r] @ R.T, (t[:, r] if fit_bias else c), k


def _column_space_fixed(X, xbar, om, y, S, W, c, r, maxiter, rtol):
    """W = L M^T with L, W's leading r left singular vectors, fixed: M by the weighted least
    squares (c as given). The logits are ``(M^T x_n)^T L^T (x_k - xbar_n)``."""
    n, N, d = X.shape
    L = np.linalg.svd(W)[0][:, :r]
    K, Kbar, Xf = X @ L, xbar @ L, X.reshape(-1, d)
    SLinv, Cinv = np.linalg.inv(L.T @ S @ L), np.linalg.inv(Xf.T @ Xf)
    rhs = _minus_bias(X, xbar, y, c)

    def apply(t):  # t = M^T (r, d)
        Q = X @ t.reshape(r, d).T
        return (Xf.T @ _back(om, _logits(Q, K, Kbar), K, Kbar).reshape(-1, r)).T.ravel()

    b = (Xf.T @ _back(om, rhs, K, Kbar).reshape(-1, r)).T.ravel()
    t, k = _cg(apply, b, (L.T @ W).ravel(),
               lambda t: (SLinv @ t.reshape(r, d) @ Cinv).ravel(), maxiter, rtol)
    return L @ t.reshape(r, d), k
