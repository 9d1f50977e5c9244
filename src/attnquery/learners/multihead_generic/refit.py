"""The multi-head function, its Jacobian, and the final refit on raw queries.

:func:`refit_heads` refines every head's ``(W_h, v_h)`` at once by nonlinear least squares
(:func:`scipy.optimize.least_squares`, Levenberg-Marquardt, with the analytic Jacobian of
:func:`multihead_jacobian`) against the answers to fresh random queries.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np
import scipy.optimize

from ...models import softmax_last

__all__ = ["multihead_eval", "multihead_jacobian", "head_separation", "query_scale",
           "random_queries", "refit_heads", "Refit", "relative_rms_error"]


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


def query_scale(W) -> float:
    """Token scale of the random queries, ``1 / sqrt(max_h ||W_h||_F)``: logits of order 1."""
    return 1.0 / np.sqrt(max(float(np.max(np.linalg.norm(W, axis=(1, 2)))), 1e-12))


def random_queries(rng, d: int, n: int, lengths, W) -> list[np.ndarray]:
    """Random queries of each length in ``lengths`` (n in all), scaled to O(1) logits."""
    sig = query_scale(W)
    per = -(-n // len(lengths))
    return [sig * rng.standard_normal((per, N, d)) for N in lengths]


def relative_rms_error(f, Xs, ys) -> float:
    """``||f(X) - y|| / ||y||`` over the batches ``Xs`` with answers ``ys``."""
    num = sum(float(np.sum((f(X) - y) ** 2)) for X, y in zip(Xs, ys, strict=True))
    den = sum(float(np.sum(y**2)) for y in ys)
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


class Refit(NamedTuple):
    """Result of :func:`refit_heads`."""

    W: np.ndarray
    v: np.ndarray
    rel_residual: float
    n_queries: int


def refit_heads(oracle, W, v, rng, *, factor: float, lengths) -> Refit:
    """Refine every head at once against ``factor`` times as many random queries as parameters.

    Levenberg-Marquardt (:func:`scipy.optimize.least_squares`, ``method="lm"``) with the
    analytic Jacobian, from the heads ``W`` (H, d, d), ``v`` (H, d).
    """
    Hh, d, _ = W.shape
    n_par = Hh * (d * d + d)
    n = int(np.ceil(factor * n_par)) + 16
    Xs = random_queries(rng, d, n, lengths, W)
    ys = [oracle(X) for X in Xs]
    yall = np.concatenate(ys)
    ynorm = max(float(np.linalg.norm(yall)), 1e-300)
    theta0 = np.concatenate([W.reshape(Hh, -1), v], axis=1).ravel()

    def unpack(th):
        P = th.reshape(Hh, d * d + d)
        return P[:, : d * d].reshape(Hh, d, d), P[:, d * d:]

    cache = {}

    def evaluate(th):
        key = th.tobytes()
        if key not in cache:
            cache.clear()
            Wt, vt = unpack(th)
            parts = [multihead_jacobian(Wt, vt, X) for X in Xs]
            cache[key] = (np.concatenate([f for f, _ in parts]) - yall,
                          np.concatenate([J for _, J in parts]))
        return cache[key]

    r0 = evaluate(theta0)[0]
    theta = theta0
    if np.linalg.norm(r0) > 1e-15 * ynorm:
        sol = scipy.optimize.least_squares(
            lambda th: evaluate(th)[0], theta0, jac=lambda th: evaluate(th)[1], method="lm",
            x_scale="jac", ftol=1e-14, xtol=1e-15, gtol=1e-15, max_nfev=200)
        if np.linalg.norm(sol.fun) <= np.linalg.norm(r0):
            theta = sol.x
    Wn, vn = unpack(theta)
    rel = float(np.linalg.norm(evaluate(theta)[0]) / ynorm)
    return Refit(Wn, vn, rel, int(sum(X.shape[0] for X in Xs)))
