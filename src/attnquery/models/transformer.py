"""The one-layer transformer of Sec. 4.1, :class:`OneLayerTransformer`: one attention head
followed by a ReLU feed-forward network, without biases."""

from __future__ import annotations

import numpy as np

from ..errors import ModelError
from .heads import check_input, softmax_last

__all__ = ["OneLayerTransformer"]


class OneLayerTransformer:
    """One-layer transformer ``TF(X) = w_o^T ReLU(A^T X^T alpha)`` without biases (Sec. 4.1).

    Parameters
    ----------
    W : array_like, shape (d, d)
        Score matrix of the single attention head.
    A : array_like, shape (d, m)
        Value projection merged with the FFN's first layer.
    w_o : array_like, shape (m,)
        FFN output weights.
    """

    def __init__(self, W, A, w_o):
        W = np.asarray(W, dtype=np.float64)
        A = np.atleast_2d(np.asarray(A, dtype=np.float64))
        w_o = np.atleast_1d(np.asarray(w_o, dtype=np.float64))
        d = W.shape[0]
        if W.shape != (d, d):
            raise ModelError(f"W must be square; got {W.shape}")
        if A.shape[0] != d or A.shape[1] != w_o.size:
            raise ModelError(
                f"A must have shape ({d}, m) and w_o shape (m,); got {A.shape} and {w_o.shape}"
            )
        if not all(np.all(np.isfinite(a)) for a in (W, A, w_o)):
            raise ModelError("model parameters must be finite")
        self.W = W
        self.A = A
        self.w_o = w_o

    @property
    def d(self) -> int:
        return self.W.shape[0]

    @property
    def width(self) -> int:
        return self.w_o.size

    @property
    def v(self) -> np.ndarray:
        """The attention-equivalent value vector ``A w_o``."""
        return self.A @ self.w_o

    def ffn(self, z) -> np.ndarray:
        """The FFN alone on vectors ``z`` (B, d): ``w_o^T ReLU(A^T z)``."""
        return np.maximum(np.asarray(z, dtype=np.float64) @ self.A, 0.0) @ self.w_o

    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
        alpha = softmax_last(np.einsum("bnd,bd->bn", X, X[:, -1, :] @ self.W.T))
        z = np.einsum("bn,bnd->bd", alpha, X)
        return self.ffn(z)
