"""The weighted least squares that refines a head's (W, c) over every row of its attention
matrices (learners/vector/_refine.py): exact weights give the true head back from a perturbed
start, noisy weights give a better head than the start, and rank and bias are kept."""

import numpy as np
import pytest

from attnquery.learners.vector._refine import refine_head


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def head(d, r, seed, n=300, N=8):
    """A head of rank r with a key bias, n queries of N tokens and its attention matrices."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d, r)) @ rng.standard_normal((r, d)) / d
    c = rng.standard_normal(d) / np.sqrt(d)
    X = rng.standard_normal((n, N, d)) / np.sqrt(d) * 2
    logits = np.einsum("qkd,de,qne->qnk", X, W, X) + (X @ c)[:, None, :]
    A = np.exp(logits - logits.max(axis=2, keepdims=True))
    return W, c, X, A / A.sum(axis=2, keepdims=True), rng


def tilted(W, r, eps, rng):
    """W of rank r with its column and row spaces tilted and its singular values scaled by
    about ``eps``."""
    U, s, Vt = np.linalg.svd(W)

    def tilt(B):
        Q, R = np.linalg.qr(B + eps * rng.standard_normal(B.shape))
        return Q * np.sign(np.diag(R))

    return tilt(U[:, :r]) @ np.diag(s[:r] * (1 + eps)) @ tilt(Vt[:r].T).T


@pytest.mark.parametrize("fit_bias", [True, False])
def test_exact_weights_give_the_true_head_from_a_perturbed_start(fit_bias):
    d, r = 24, 6
    W, c, X, A, rng = head(d, r, 0)
    if not fit_bias:
        c = np.zeros(d)
        logits = np.einsum("qkd,de,qne->qnk", X, W, X)
        A = np.exp(logits - logits.max(axis=2, keepdims=True))
        A /= A.sum(axis=2, keepdims=True)
    W0, c0 = tilted(W, r, 1e-4, rng), c + (1e-4 * rng.standard_normal(d) if fit_bias else 0.0)
    W1, c1, iterations = refine_head(X, A, W0, c0, r, 1e-14, fit_bias=fit_bias, sweeps=3)
    assert rel(W0, W) > 1e-4
    assert rel(W1, W) < 1e-6
    assert np.linalg.matrix_rank(W1, tol=1e-8 * np.abs(W1).max()) == r
    assert (rel(c1, c) < 1e-6) if fit_bias else np.array_equal(c1, c0)
    assert iterations > 0


def test_noisy_weights_give_a_better_head_than_the_start():
    """Weights read with an absolute error of 1e-6 (as from rounded answers): from a start off
    by about 1e-4 (as the shared-token route's), the default sweeps land on the least squares'
    own error (that of the refinement started at the truth), far below the start."""
    d, r = 24, 6
    W, c, X, A, rng = head(d, r, 1, n=600)
    An = A + 1e-6 * rng.standard_normal(A.shape)
    W0 = tilted(W, r, 1e-4, rng)
    W1, c1, _ = refine_head(X, An, W0, c, r, 3e-6)
    Wf, cf, _ = refine_head(X, An, W, c, r, 3e-6)
    assert rel(W1, W) < 0.05 * rel(W0, W)
    assert rel(W1, W) < 1.5 * rel(Wf, W) and rel(c1, c) < 1.5 * rel(cf, c)
