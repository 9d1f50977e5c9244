"""Every head's (W, c) refined on the served answers themselves: Gauss-Newton over the
layer's outputs (the shared-token route's last step for float32, float16 and bfloat16 answers;
:func:`~._heads.fit_shared`, after :mod:`._refine`).

The log-weight refinement reads each head's attention weights from the answers first,
``A = (O - beta) (X V)^+`` row by row, and weighs each weight's logarithm by ``a^2``: as if the
weights' errors were independent and alike. They are not. The answers' rounding is about the
same in every output coordinate (float32, d = 96: 78 % of its energy lies in the 72 of 96
dimensions the rows of the stacked ``X V_h`` span), and the pseudo-inverse spreads it over the
weights along the directions of that stack's small singular values (its condition number has
median 51 there). Weighed as independent, those few directions set W's error.

This step fits the answers instead: with the value maps V_h and the offset beta fixed,

    minimise   sum over queries and rows n of  || o_n - beta - sum_h a_hn(W_h, c_h)^T X V_h ||^2,

``a_hn = softmax_k(x_k^T (W_h x_n + c_h))``: the least squares of the answers' own errors. Each
Gauss-Newton step linearises the softmax at the current (W, c) (``da = a * (dl - a^T dl)``) and
solves the normal equations of every head at once (the heads share the answers) by conjugate
gradients, never formed. W keeps the rank r the route measured: its change lies in the tangent
space of the rank-r matrices, ``dW = dB R^T + L dM^T`` (R, L its leading right and left singular
vectors), and the moved W is truncated back to rank r. From exact answers and a start 1e-4 off,
the steps give 2.7e-6, then 7.6e-12 (tests/test_vector_answers.py). Each head's value map enters
through its factors ``V_h = P_h Q_h`` (rank ``d / H`` for a layer's head), so the products are
``(B, N, N) x (B, N, rank)`` per head and one ``(B N, sum of ranks)`` product with the Gram matrix
``Q Q^T`` of the stacked ``Q_h``.

Float32, 6 heads of 16 at d = 96 (the route's 5,074 attention queries, answers from
onnxruntime, the value maps the learner reads): the worst head's W 8.1e-7 after the log-weight
refinement, 2.7e-7 after one step of this one, the same after two.
"""

from __future__ import annotations

import numpy as np

from ...models import softmax_last
from ._refine import _cg

__all__ = ["refine_on_answers", "ANSWER_STEPS", "ANSWER_MAXITER", "ANSWER_RTOL"]

#: Gauss-Newton steps. Float32, d = 96, worst head's W: 8.1e-7 before, 2.7e-7 after one step and
#: after two (the log-weight refinement's start is within the step's reach)
ANSWER_STEPS = 1
#: conjugate-gradient iterations per step at most, and their relative tolerance. Float32,
#: d = 96, worst head's W after one step: 3.3e-7 at 5, 2.8e-7 at 10, 2.75e-7 at 15, 2.73e-7 at 20
#: and at convergence to ANSWER_RTOL (31 iterations)
ANSWER_MAXITER = 20
ANSWER_RTOL = 1e-6
#: a value map's singular values below this share of its largest count as zero (its rank)
VALUE_RANK_RTOL = 1e-6


def _value_factors(V: np.ndarray):
    """Each head's factors ``V_h = P_h Q_h`` (P_h (d, r_h), Q_h (r_h, d_out) with orthonormal
    rows): the P_h, the stacked Q_h (sum of r_h, d_out) and head h's rows of the stack,
    ``cuts[h]:cuts[h + 1]``."""
    P, Q = [], []
    for Vh in V:
        U, s, Vt = np.linalg.svd(Vh, full_matrices=False)
        r = max(1, int(np.count_nonzero(s > VALUE_RANK_RTOL * s[0])))
        P.append(U[:, :r] * s[:r])
        Q.append(Vt[:r])
    return P, np.concatenate(Q), np.cumsum([0] + [q.shape[0] for q in Q])


def _attention(X: np.ndarray, W: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The head's attention matrices (B, N rows, N keys): ``softmax_k(x_k^T (W x_n + c))``."""
    return softmax_last(np.matmul(X @ W.T, X.transpose(0, 2, 1)) + (X @ c)[:, None, :])


def _through_softmax(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The softmax's Jacobian (symmetric) applied row by row: ``a * (v - a^T v)``."""
    return a * (v - (a * v).sum(axis=2, keepdims=True))


class _Step:
    """One linearised least squares at the current attention matrices A: every head's change
    of W in the tangent space of the matrices of its rank r, ``dW = dB R^T + L dM^T`` (R and L
    W's leading right and left singular vectors), and of c. The unknowns of head h are
    ``T = [dB, dc]`` (d, r [+ 1]) and ``U = dM^T`` (r, d), flat."""

    def __init__(self, X, A, W, ranks, fit_bias: bool):
        self.X, self.A = X, A
        self.L, self.R, self.rows, self.cols, sizes = [], [], [], [], []
        B, N, d = X.shape
        for Wh, r in zip(W, ranks, strict=True):
            U, _, Vt = np.linalg.svd(Wh)
            self.L.append(U[:, :int(r)])
            self.R.append(Vt[:int(r)].T)
            F = X @ self.R[-1]  # the rows' features for T: [R^T x_n; 1]
            if fit_bias:
                F = np.concatenate([F, np.ones((B, N, 1))], axis=2)
            self.rows.append(F)
            self.cols.append(X @ self.L[-1])  # the keys' features for U: L^T x_k
            sizes += [d * F.shape[2], d * int(r)]
        self.offsets = np.cumsum([0] + sizes)

    def split(self, t: np.ndarray):
        """The flat unknowns as each head's pair (T (d, e), U (r, d))."""
        d = self.X.shape[2]
        parts = [t[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:], strict=True)]
        return [(T.reshape(d, -1), U.reshape(-1, d)) for T, U in zip(parts[::2], parts[1::2],
                                                                     strict=True)]

    def logits(self, h: int, T: np.ndarray, U: np.ndarray) -> np.ndarray:
        """Head h's logit change (B, rows, keys): ``x_k^T T F_n + (U x_n)^T (L^T x_k)``."""
        return (np.matmul(self.rows[h], (self.X @ T).transpose(0, 2, 1))
                + np.matmul(self.X @ U.T, self.cols[h].transpose(0, 2, 1)))

    def gradient(self, h: int, gA: np.ndarray) -> list:
        """The transpose of :meth:`logits` through the softmax, applied to the answers'
        gradient with respect to head h's weights gA (B, rows, keys): flat T and U parts."""
        gl = _through_softmax(self.A[h], gA)
        d = self.X.shape[2]
        Xf = self.X.reshape(-1, d)
        GT = np.matmul(gl.transpose(0, 2, 1), self.rows[h])  # per key: sum_n gl F_n
        GU = np.matmul(gl, self.cols[h])  # per row: sum_k gl L^T x_k
        return [(Xf.T @ GT.reshape(-1, GT.shape[2])).ravel(),
                (GU.reshape(-1, GU.shape[2]).T @ Xf).ravel()]

    def precondition(self, norms):
        """Per head and part the Kronecker product of the tokens' scatter and the features'
        scatter, over the square of the head's value scale (``norms``): an approximate
        inverse (the parts' overlap, ``L K R^T``, left to the iterations)."""
        d = self.X.shape[2]
        Xf = self.X.reshape(-1, d)
        Sx = np.linalg.inv(Xf.T @ Xf)

        def inv(F, n):
            F = F.reshape(-1, F.shape[2])
            return np.linalg.inv(F.T @ F) / n

        pre = [(inv(F, n), inv(K, n)) for F, K, n in zip(self.rows, self.cols, norms,
                                                          strict=True)]
        return lambda t: np.concatenate(
            [np.concatenate([(Sx @ T @ ST).ravel(), (SU @ U @ Sx).ravel()])
             for (T, U), (ST, SU) in zip(self.split(t), pre, strict=True)])

    def update(self, W, c, t, fit_bias: bool):
        """W and c moved by the step t, each W back to its rank (truncated SVD)."""
        for h, (T, U) in enumerate(self.split(t)):
            r = self.R[h].shape[1]
            Wh = W[h] + T[:, :r] @ self.R[h].T + self.L[h] @ U
            u, s, vt = np.linalg.svd(Wh)
            W[h] = (u[:, :r] * s[:r]) @ vt[:r]
            if fit_bias:
                c[h] = c[h] + T[:, r]


def refine_on_answers(X: np.ndarray, O: np.ndarray, V: np.ndarray, beta: np.ndarray,
                      W: np.ndarray, c: np.ndarray, ranks, fit_bias: bool = True,
                      steps: int = ANSWER_STEPS, maxiter: int = ANSWER_MAXITER,
                      rtol: float = ANSWER_RTOL):
    """Every head's (W, c) refined on the answers (module docstring).

    Parameters
    ----------
    X : ndarray (B, N, d)
        The queries.
    O : ndarray (B, N, d_out)
        Their answers (every token's outputs, no mask).
    V : ndarray (H, d, d_out)
        The heads' value maps; ``beta`` (d_out,) the output offset.
    W, c : ndarray (H, d, d), (H, d)
        The starting estimate (:mod:`._refine`'s).
    ranks : sequence of int
        Each W_h's rank.
    fit_bias : bool
        Refine c too (else it stays as given).
    steps, maxiter, rtol
        Gauss-Newton steps, and each step's conjugate-gradient iterations at most and relative
        tolerance (:data:`ANSWER_STEPS`, :data:`ANSWER_MAXITER`, :data:`ANSWER_RTOL`).

    Returns
    -------
    W, c : ndarray
    iterations : int
        Conjugate-gradient iterations in all.
    """
    if O.shape[:2] != X.shape[:2]:
        raise ValueError(f"answers of shape {O.shape} do not answer queries of shape {X.shape}")
    if not len(W) == len(c) == len(V) == len(ranks):
        raise ValueError(f"{len(V)} value maps, {len(W)} W, {len(c)} c and {len(ranks)} ranks: "
                         "one each per head")
    P, Qs, cuts = _value_factors(V)
    Q = [Qs[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    G = Qs @ Qs.T  # the answers' metric in the stacked Q coordinates
    XP = [X @ p for p in P]
    norms = [float(np.sum(p ** 2)) for p in P]
    W, c = np.array(W, dtype=float), np.array(c, dtype=float)
    iterations = 0
    for _ in range(steps):
        A = [_attention(X, W[h], c[h]) for h in range(len(W))]
        E = O - beta - sum(np.matmul(a, xp) @ q for a, xp, q in zip(A, XP, Q, strict=True))
        step = _Step(X, A, W, ranks, fit_bias)
        dt, k = _solve(step, E, XP, Qs, G, cuts, norms, maxiter, rtol)
        step.update(W, c, dt, fit_bias)
        iterations += k
    return W, c, iterations


def _solve(step: _Step, E, XP, Qs, G, cuts, norms, maxiter: int, rtol: float):
    """The Gauss-Newton step of every head at once for the answers' residuals E, by
    preconditioned conjugate gradients on the normal equations (never formed); the step and
    its iterations."""
    H = len(XP)

    def back(EQ):  # the answers' gradient (in the stacked Q coordinates) to the unknowns
        return np.concatenate([part for h in range(H) for part in step.gradient(
            h, np.matmul(EQ[..., cuts[h]:cuts[h + 1]], XP[h].transpose(0, 2, 1)))])

    def apply(t):
        C = np.concatenate([np.matmul(_through_softmax(step.A[h], step.logits(h, T, U)), XP[h])
                            for h, (T, U) in enumerate(step.split(t))], axis=2)
        return back(C @ G)

    rhs = back(E @ Qs.T)
    return _cg(apply, rhs, np.zeros_like(rhs), step.precondition(norms), maxiter, rtol)
