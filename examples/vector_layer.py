"""A black box that answers vectors: one attention layer written in plain numpy.

The layer is what a served model computes: 2 heads of 8 dimensions on tokens of d = 16, query,
key, value and output projections with biases, scaled dot-product softmax over every token (no
mask). It is written here from the formulas, with nothing of attnquery, as a box of yours would
be. ``attnquery extract --answers all|last`` learns it (docs/cli.md, "A box that answers
vectors")::

    attnquery extract --oracle examples/vector_layer.py:layer --d 16 --answers all --n-heads 2
    attnquery extract --oracle examples/vector_layer.py:last --d 16 --answers last --n-heads 2

``layer`` answers every token's output vector, an array ``(B, N, 16)``; ``last`` only the last
token's, ``(B, 16)``; ``flat`` is a box of the wrong shape for ``--answers all`` (the last
token's output where every token's is declared), refused with one line.
"""

import numpy as np

D, HEADS = 16, 2
DH = D // HEADS

_rng = np.random.default_rng(2026)
W_Q, W_K = _rng.standard_normal((2, D, D)) / np.sqrt(D) * 2.0
W_V = _rng.standard_normal((D, D)) / np.sqrt(D)
W_O = _rng.standard_normal((D, D)) / np.sqrt(D)
b_Q, b_K, b_V, b_O = 0.3 * _rng.standard_normal((4, D))


def layer(X):
    """Every token's output: ``(B, N, d)`` tokens -> ``(B, N, d)`` outputs."""
    X = np.asarray(X, dtype=np.float64)
    B, N, _ = X.shape
    q = (X @ W_Q + b_Q).reshape(B, N, HEADS, DH)
    k = (X @ W_K + b_K).reshape(B, N, HEADS, DH)
    v = (X @ W_V + b_V).reshape(B, N, HEADS, DH)
    s = np.einsum("bnhe,bmhe->bhnm", q, k) / np.sqrt(DH)
    a = np.exp(s - s.max(axis=-1, keepdims=True))
    a /= a.sum(axis=-1, keepdims=True)
    heads = np.einsum("bhnm,bmhe->bnhe", a, v).reshape(B, N, D)
    return heads @ W_O + b_O


def last(X):
    """The last token's output: ``(B, N, d)`` tokens -> ``(B, d)``."""
    return layer(X)[:, -1, :]


def flat(X):
    """A box of the wrong shape for ``--answers all``: the last token's output only."""
    return last(X)
