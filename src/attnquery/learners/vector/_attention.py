"""The attention matrices and the logits of the vector learners' heads, read from vector
answers (:class:`~attnquery.learners.VectorLayerLearner`): the heads' attention weights behind
the answers, their logit spreads, and one head's (W, c) by weighted least squares."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ...errors import ModelMismatchError, NotIdentifiableError

__all__ = ["attention_matrices", "spreads", "solve_logits", "ATTENTION_TOL", "MIN_WEIGHT"]

#: largest disagreement of the answers with attention matrices (relative to the answers) and
#: largest negative attention weight that float64 rounding explains (measured: at most 6e-14,
#: single heads at d = 64 and layers of 2 to 8 heads at d = 16 and 32)
ATTENTION_TOL = 1e-9
#: weights below this are left out of the logit equations (their logarithm is rounding noise)
MIN_WEIGHT = 1e-12

def spreads(A, outputs, causal: bool) -> np.ndarray:
    """Per row of the attention matrices A (H, n, M, N): ``log(max a / min a)`` over the keys
    it sees (weights below :data:`MIN_WEIGHT` count as that)."""
    A = A.reshape((-1,) + A.shape[2:])
    N = A.shape[2]
    rows = np.arange(N) if outputs == "all" else np.array([N - 1])
    seen = np.arange(N)[None, :] <= rows[:, None] if causal else np.ones(A.shape[1:],
                                                                               dtype=bool)
    a = np.maximum(A, MIN_WEIGHT)
    hi = np.where(seen, a, 0.0).max(axis=2)
    lo = np.where(seen, a, np.inf).min(axis=2)
    return np.log(hi / lo)[:, seen.sum(axis=1) > 1].ravel()


def attention_matrices(X, O, V, beta, outputs, causal: bool,
                       tol: float = ATTENTION_TOL) -> tuple[np.ndarray, float]:
    """The heads' attention matrices (H, n, M, N) behind the answers O to the queries X
    (M = N rows for every token's outputs, 1 for the last token's), from the heads' value
    maps V (H, d, d_out): each row solves ``o - beta = sum_h a_h^T X V_h`` with every
    head's weights summing to one; returns them with the largest residual of that solve,
    relative to the answers.

    Raises ModelMismatchError where the answers are not attention-weighted sums of the
    values ``X V_h``: a negative weight, a row that is no weighted sum, weights on later
    tokens of a causal head, or none on them where no mask was declared, each beyond ``tol``
    (default :data:`ATTENTION_TOL`, float64's rounding; served answers pass their format's).
    """
    O = O[:, None, :] if outputs == "last" else O
    H, n, N = V.shape[0], X.shape[0], X.shape[1]
    P = np.concatenate([X @ V[h] for h in range(H)], axis=1)  # (n, H N, d_out)
    unit = max(float(np.max(np.abs(P))), 1.0)  # the sum-to-one columns, at the values' scale
    ones = np.kron(np.eye(H), np.full((N, 1), unit))  # (H N, H): head h's rows sum to one
    Pa = np.concatenate([P, np.broadcast_to(ones, (n, H * N, H))], axis=2)
    Ra = np.concatenate([O - beta, np.full(O.shape[:2] + (H,), unit)], axis=2)
    A = Ra @ np.linalg.pinv(Pa)
    scale = float(np.max(np.abs(Ra)))
    residual = float(np.max(np.abs(A @ Pa - Ra))) / scale
    hint = "the box may have several heads, biases fit_bias=False leaves out, or noise"
    if residual > tol:
        raise ModelMismatchError(
            f"the answers differ by {residual:.3g} (relative) from every "
            f"attention-weighted sum of the {H} value map(s), where the answers' rounding "
            f"explains {tol:.3g}: the box is not a single attention head"
            f"{'' if H == 1 else ' per declared head'}; {hint}",
            error=residual, allowed=tol)
    A = A.reshape(n, A.shape[1], H, N).transpose(2, 0, 1, 3)
    rows = np.arange(N) if outputs == "all" else np.array([N - 1])
    later = np.arange(N)[None, :] > rows[:, None]  # (M, N): keys after the row's token
    ahead = np.abs(A[:, :, later])
    if causal and np.any(ahead > tol):
        raise ModelMismatchError(
            f"tokens attend to later tokens (weight up to {np.max(ahead):.3g}): the box is "
            "not causal; fit it with causal=False",
            error=float(np.max(ahead)), allowed=tol)
    if not causal and later.any() and np.all(ahead <= tol):
        raise ModelMismatchError(
            "no token attends to a later token: the box has a causal mask; fit it with "
            "causal=True", error=1.0, allowed=tol)
    if np.min(A) < -tol:
        raise ModelMismatchError(
            f"an attention weight read from the answers is {np.min(A):.3g} < 0: the box is "
            f"not a single attention head; {hint}", error=float(-np.min(A)),
            allowed=tol)
    return A, residual


def solve_logits(X, A, outputs, causal: bool, fit_bias: bool,
                 min_weight: float = MIN_WEIGHT) -> tuple[np.ndarray, np.ndarray, float]:
    """One head's (W, c) from the logit differences of its attention matrices A (n, M, N)
    by weighted least squares (normal equations, one step of refinement), and the largest
    weighted residual relative to the largest weighted right-hand side. Weights below
    ``min_weight`` are left out (their logarithm is the answers' rounding)."""
    n, N, d = X.shape
    M = A.shape[1]
    rows = np.arange(N) if outputs == "all" else np.array([N - 1])
    allowed = np.ones((M, N), dtype=bool)
    if causal:
        allowed = np.arange(N)[None, :] <= rows[:, None]
    Am = np.where(allowed, A, 0.0).reshape(n * M, N)
    ref = np.argmax(Am, axis=1)  # each row's largest weight: its best-known logit
    a_ref = Am[np.arange(n * M), ref]
    use = np.tile(allowed, (n, 1)) & (Am > min_weight)
    use[np.arange(n * M), ref] = False
    safe = np.where(use, Am, 1.0)
    y = np.where(use, np.log(safe) - np.log(a_ref)[:, None], 0.0)  # (R, N)
    w2 = np.where(use, 1.0 / (1.0 / safe**2 + 1.0 / a_ref[:, None] ** 2), 0.0)
    Xr = np.repeat(X, M, axis=0)  # (R, N, d): the keys of each row
    U = Xr - Xr[np.arange(n * M), ref][:, None, :]
    Z = X[:, rows].reshape(n * M, d)
    if fit_bias:
        Z = np.concatenate([Z, np.ones((n * M, 1))], axis=1)
    e = Z.shape[1]
    S = (U * w2[:, :, None]).swapaxes(1, 2) @ U
    ZZ = np.einsum("rc,re->rce", Z, Z)
    G = (S.reshape(n * M, d * d).T @ ZZ.reshape(n * M, e * e)).reshape(d, d, e, e)
    G = G.transpose(0, 2, 1, 3).reshape(d * e, d * e)
    try:
        factor = scipy.linalg.cho_factor(G)
    except np.linalg.LinAlgError:
        raise NotIdentifiableError(
            "the logit equations do not determine (W, c): too few usable attention weights "
            "(the head's attention may be too peaked for tokens of norm 1)") from None

    def rhs(res):  # sum over the equations of w^2 res (u outer z)
        return ((w2 * res)[:, None, :] @ U)[:, 0].T @ Z

    def residual(Wt):  # y - u^T Wt z per equation
        return np.where(use, y - ((U @ Wt) @ Z[:, :, None])[..., 0], 0.0)

    Wt = scipy.linalg.cho_solve(factor, rhs(y).ravel()).reshape(d, e)
    Wt += scipy.linalg.cho_solve(factor, rhs(residual(Wt)).ravel()).reshape(d, e)
    r = residual(Wt) * np.sqrt(w2)
    res = float(np.max(np.abs(r)) / max(np.max(np.abs(y * np.sqrt(w2))), np.finfo(float).tiny))
    c = Wt[:, d] if fit_bias else np.zeros(d)
    return Wt[:, :d], c, res
