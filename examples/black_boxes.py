"""Example black boxes for ``attnquery extract --oracle examples.black_boxes:FUNCTION``.

A black box is any Python callable that takes a float64 array of shape (B, N, d) (B sequences of
N tokens; the last token of each is the query token) and returns an array of shape (B,). The
extraction learns (W, v) from its answers alone. Run from the repository root::

    attnquery extract --oracle examples.black_boxes:some_head --d 16 --method exact
    attnquery extract --oracle examples.black_boxes:low_rank_head --d 64 --method sketch --rank 4
    attnquery extract --oracle examples.black_boxes:two_heads --d 16     # refused: exit 1

The heads below are fixed, seeded attention heads written out in plain numpy, as a stand-in for a
model behind an API.
"""

import numpy as np

_rng = np.random.default_rng(2026)

# A dense head, d = 16: scores s_i = x_i^T W x_N, output softmax(s)^T (X v).
_W16 = _rng.standard_normal((16, 16)) / 4.0
_V16 = _rng.standard_normal(16)

# A low-rank head, d = 64, rank 4, stored as W = K^T Q like a transformer's query/key maps.
_K64 = _rng.standard_normal((4, 64)) / 8.0
_Q64 = _rng.standard_normal((4, 64)) / 8.0
_V64 = _rng.standard_normal(64)


def _attend(X, scores, v):
    s = scores - scores.max(axis=1, keepdims=True)
    a = np.exp(s)
    a /= a.sum(axis=1, keepdims=True)
    return np.einsum("bn,bn->b", a, X @ v)


def some_head(X):
    """A single attention head on d = 16 tokens (dense W)."""
    X = np.asarray(X, dtype=np.float64)
    q = X[:, -1, :] @ _W16.T  # W x_N for each sequence
    return _attend(X, np.einsum("bnd,bd->bn", X, q), _V16)


def low_rank_head(X):
    """A single attention head on d = 64 tokens whose W = K^T Q has rank 4."""
    X = np.asarray(X, dtype=np.float64)
    keys = X @ _K64.T  # (B, N, 4)
    query = X[:, -1, :] @ _Q64.T  # (B, 4)
    return _attend(X, np.einsum("bnr,br->bn", keys, query), _V64)


# Two heads on d = 16 tokens, summed: not a single head, so every single-head learner refuses it
# (attnquery extract exits 1 with a ModelMismatchError) instead of returning a wrong head.
_W16b = _rng.standard_normal((16, 16)) / 4.0
_V16b = _rng.standard_normal(16)


def two_heads(X):
    """The sum of two attention heads on d = 16 tokens (not a single head)."""
    X = np.asarray(X, dtype=np.float64)
    out = some_head(X)
    q = X[:, -1, :] @ _W16b.T
    return out + _attend(X, np.einsum("bnd,bd->bn", X, q), _V16b)
