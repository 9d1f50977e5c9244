"""Black boxes that are not what a single-head learner assumes, for the verification tests.

Each builder returns a plain callable ``(B, N, d) -> (B,)`` (and, for the wrappers, takes one):
several heads, a head with biases, answers with relative noise, answers in float32 or float16.
"""

import numpy as np

from attnquery.models import AttentionHead, random_head, random_multihead, softmax_last
from attnquery.oracles import query_hash


def two_heads(d: int, seed=0):
    """The sum of two random heads."""
    return random_multihead(d, 2, seed)


def biased_head(d: int, seed=0, scale: float = 0.5):
    """A head with a key bias and a value bias: scores ``x_i^T W x_N + b^T x_i``, output
    ``alpha^T (X v + c)``."""
    rng = np.random.default_rng(seed)
    head = random_head(d, seed=rng)
    b = scale * rng.standard_normal(d)
    c = scale * float(rng.standard_normal())

    def box(X):
        X = np.asarray(X, dtype=np.float64)
        s = np.einsum("bnd,bd->bn", X, X[:, -1, :] @ head.W.T) + X @ b
        return np.einsum("bn,bn->b", softmax_last(s), X @ head.v + c)

    return box


def relative_noise(fn, rel: float, seed: int = 0):
    """``fn``'s answers times ``1 + rel u`` with ``u`` uniform in [-1, 1), fixed per query."""

    def box(X):
        y = np.asarray(fn(X), dtype=np.float64)
        u = (query_hash(np.asarray(X, dtype=np.float64), seed) >> np.uint64(11)).astype(float)
        return y * (1.0 + rel * (2.0 * u * 2.0**-53 - 1.0))

    return box


def in_dtype(fn, dtype):
    """``fn``'s answers rounded to ``dtype`` (float32, float16) and returned as float64."""

    def box(X):
        return np.asarray(fn(X), dtype=np.float64).astype(dtype).astype(np.float64)

    return box


def wrong_boxes(d: int, seed=0) -> dict:
    """Every wrong-model box of this module around a random head of dimension ``d``."""
    head = random_head(d, seed=seed)
    return {
        "two_heads": two_heads(d, seed),
        "biased": biased_head(d, seed),
        "noise_1e-4": relative_noise(head, 1e-4, seed),
        "float32": in_dtype(head, np.float32),
        "float16": in_dtype(head, np.float16),
    }


__all__ = ["two_heads", "biased_head", "relative_noise", "in_dtype", "wrong_boxes",
           "AttentionHead"]
