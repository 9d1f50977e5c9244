"""Single-head attention, :class:`AttentionHead`, and the batch conventions every model shares.

A batch of inputs ``X`` has shape ``(B, N, d)`` (float64; the last row of each input is the query
token) and a model maps it to answers of shape ``(B,)``: :func:`check_input` validates it,
:func:`softmax_last` is the softmax over the tokens, and :func:`run_starts` finds the runs of
inputs that share their query token (evaluated once per run).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse

from ..errors import ModelError
from ..precision import check_precision

__all__ = ["AttentionHead", "check_input", "softmax_last", "run_starts"]


def check_input(X, d: int) -> np.ndarray:
    """Validate a batch of model inputs and return it as a float64 array of shape (B, N, d)."""
    X = np.asarray(X)
    if X.ndim == 2:
        X = X[None]
    if X.ndim != 3 or X.shape[-1] != d:
        raise ModelError(f"input must have shape (B, N, {d}); got {X.shape}")
    if X.shape[1] < 1:
        raise ModelError("input sequences must have at least one row (N >= 1)")
    return np.asarray(X, dtype=np.float64)


def sparse_aware_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b``, computed through a sparse ``a`` when at most 5% of its entries are nonzero."""
    if a.shape[0] * a.shape[1] >= 4096:
        nnz = np.count_nonzero(a)
        if nnz <= 0.05 * a.size:
            return np.asarray(scipy.sparse.csr_matrix(a) @ b)
    return a @ b


def softmax_last(s: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis (max-shifted, float64)."""
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


#: a batch whose last tokens form at most this many runs of identical rows is evaluated run by
#: run, with W x_N from a cache of the last _CACHE_TOKENS distinct tokens
_FEW_RUNS = 8
_CACHE_TOKENS = 64


def run_starts(rows: np.ndarray) -> np.ndarray:
    """Start index of every run of consecutive identical rows of ``rows`` (B, d)."""
    n = rows.shape[0]
    if n <= 1:
        return np.zeros(min(1, n), dtype=np.intp)
    # a few leading entries rule most distinct neighbours out before the full comparison
    cand = np.flatnonzero((rows[1:, :8] == rows[:-1, :8]).all(axis=1))
    if cand.size == n - 1:
        same = (rows[1:] == rows[:-1]).all(axis=1)
    else:
        same = np.zeros(n - 1, dtype=bool)
        same[cand] = (rows[cand + 1] == rows[cand]).all(axis=1)
    return np.concatenate([[0], np.flatnonzero(~same) + 1])


class AttentionHead:
    """Single-head attention ``f(X) = softmax(X (W x_N + c))^T (X v) + beta``.

    Give either a dense ``W`` (d x d) or the factors ``K`` and ``Q`` (each r x d) with
    ``W = K^T Q``. With factors, evaluation costs O(N d r) per query and W is never formed
    (use :attr:`W` to get it densely on request). The paper's head is the case ``c = 0``,
    ``beta = 0`` (the default).

    A real attention module with its biases is exactly of this form: for one head read out by a
    vector r, ``(W_Q x_N + b_Q)^T (W_K x_i + b_K) / sqrt(d_h)`` differs from
    ``x_i^T (W x_N + c)`` by terms that do not depend on i, which the softmax cancels, with
    ``W = W_K^T W_Q / sqrt(d_h)`` and ``c = W_K^T b_Q / sqrt(d_h)``; the value bias adds
    ``beta = r^T b_V`` to every answer because the attention weights sum to one.

    Parameters
    ----------
    v : array_like, shape (d,)
        Value vector (value projection merged with the output projection).
    W : array_like, shape (d, d), optional
        Dense score matrix.
    K, Q : array_like, shape (r, d), optional
        Factors of a low-rank score matrix ``W = K^T Q``.
    key_bias : array_like, shape (d,), optional
        The vector c added to ``W x_N`` in every score (the query bias seen through the keys).
        Default 0.
    offset : float
        The constant beta added to every answer (the value and output biases read out).
        Default 0.
    precision : {"float64", "float32", "float16", "bfloat16"}
        Compute precision of ``__call__`` (served arithmetic, :mod:`attnquery.precision`): the
        parameters are stored in the format and every operation of the forward pass (the
        query vector ``W x_N`` (``K^T (Q x_N)`` with factors), ``+ c``, the scores, the
        softmax, the values ``X v``, their weighted sum, ``+ beta``) is rounded to it.
        ``"float64"`` (default) is the exact model. :attr:`W`, :meth:`scores` and
        :meth:`attention` are always the float64 model's.
    """

    def __init__(self, v, W=None, K=None, Q=None, key_bias=None, offset=0.0,
                 precision: str = "float64"):
        v = np.asarray(v, dtype=np.float64)
        if v.ndim != 1 or v.size < 1:
            raise ModelError(f"v must be a non-empty vector; got shape {v.shape}")
        d = v.size
        if (W is None) == (K is None and Q is None):
            raise ModelError("give either a dense W or both factors K and Q")
        if W is not None:
            W = np.asarray(W, dtype=np.float64)
            if W.shape != (d, d):
                raise ModelError(f"W must have shape ({d}, {d}) to match v; got {W.shape}")
            arrays = [v, W]
        else:
            if K is None or Q is None:
                raise ModelError("low-rank heads need both K and Q")
            K = np.atleast_2d(np.asarray(K, dtype=np.float64))
            Q = np.atleast_2d(np.asarray(Q, dtype=np.float64))
            if K.shape != Q.shape or K.shape[1] != d:
                raise ModelError(
                    f"K and Q must both have shape (r, {d}); got {K.shape} and {Q.shape}"
                )
            arrays = [v, K, Q]
        c = np.zeros(d) if key_bias is None else np.asarray(key_bias, dtype=np.float64)
        if c.shape != (d,):
            raise ModelError(f"key_bias must have shape ({d},) to match v; got {c.shape}")
        beta = np.asarray(offset, dtype=np.float64)
        if beta.shape != ():
            raise ModelError(f"offset must be a scalar; got shape {beta.shape}")
        if not all(np.all(np.isfinite(a)) for a in [*arrays, c, beta]):
            raise ModelError("model parameters must be finite")
        self.v = v
        self.W_dense = W
        self.K = K
        self.Q = Q
        self.key_bias = c
        self.offset = float(beta)
        # the right operand of W_times, C-contiguous (a sparse product needs that layout)
        self._right = np.ascontiguousarray((Q if W is None else W).T)
        self._cache: dict[bytes, np.ndarray] = {}  # W x of recent last tokens, by their bytes
        self.precision = check_precision(precision)

    @property
    def d(self) -> int:
        """Token dimension."""
        return self.v.size

    @property
    def is_lowrank(self) -> bool:
        """Whether W is stored as factors."""
        return self.W_dense is None

    @property
    def has_bias(self) -> bool:
        """Whether the head has a nonzero key bias c or offset beta."""
        return bool(self.offset != 0.0 or np.any(self.key_bias))

    @property
    def rank(self) -> int:
        """Numerical rank of W (from the factors' inner dimension when factored)."""
        if self.is_lowrank:
            return int(np.linalg.matrix_rank(self.K @ self.Q.T)) if self.K.shape[0] else 0
        return int(np.linalg.matrix_rank(self.W_dense))

    @property
    def W(self) -> np.ndarray:
        """The score matrix, formed densely (d x d) on request."""
        if self.W_dense is not None:
            return self.W_dense
        return self.K.T @ self.Q

    def W_times(self, q: np.ndarray) -> np.ndarray:
        """Return ``q @ W^T`` for a batch of query tokens ``q`` (B, d), i.e. each ``W q_b``.

        Costs O(B d r) with factors. With mostly-zero query tokens (as in coordinate probes), a
        sparse product costs O(nnz(q) d) instead of O(B d^2) (dense W) or O(B d r) (factors,
        first product).
        """
        if self.W_dense is None:
            return sparse_aware_matmul(q, self._right) @ self.K
        return sparse_aware_matmul(q, self._right)

    def scores(self, X) -> np.ndarray:
        """Attention scores ``s_i = x_i^T (W x_N + c)``, shape (B, N)."""
        return self._scores_values(check_input(X, self.d))[0]

    def attention(self, X) -> np.ndarray:
        """Attention weights ``alpha = softmax(s)``, shape (B, N)."""
        return softmax_last(self.scores(X))

    def __call__(self, X) -> np.ndarray:
        if self.precision != "float64":
            return self._served(check_input(X, self.d))
        scores, values = self._scores_values(check_input(X, self.d))
        out = np.einsum("bn,bn->b", softmax_last(scores), values)
        return out + self.offset if self.offset else out

    def _served(self, X: np.ndarray) -> np.ndarray:
        """The forward pass in ``self.precision`` (see :mod:`attnquery.precision`)."""
        A, P = _served_params(self)
        Xs = A.store(X)
        last = Xs[:, -1, :]
        if self.is_lowrank:
            a = A.matmul(A.matmul(last, P["Q"].T), P["K"])
        else:
            a = A.matmul(last, P["W"].T)
        if "c" in P:
            a = A.add(a, P["c"])
        alpha = A.softmax(A.matmul(Xs, a[:, :, None])[..., 0])
        values = A.matmul(Xs, P["v"])
        out = A.matmul(alpha[:, None, :], values[:, :, None])[:, 0, 0]
        if "beta" in P:
            out = A.add(out, P["beta"])
        return A.answers(out)

    def _scores_values(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scores ``X (W x_N + c)`` and values ``X v`` of a validated batch, each (B, N).

        A batch whose last tokens come in a few runs of identical rows (probes that share their
        query token) is evaluated run by run: ``W x_N`` once per run, taken from a small cache of
        recently seen tokens (as a server caches per-token work), and one matrix-vector product
        per run, so such a query costs O(N d) instead of O(N d + d r). Other batches are
        evaluated as a whole.
        """
        B, N, d = X.shape
        last = X[:, -1, :]
        starts = run_starts(last)
        nu = starts.size
        if nu > _FEW_RUNS:
            Wq = self.W_times(last[starts]) + self.key_bias
            if nu < B:
                Wq = np.repeat(Wq, np.diff(np.append(starts, B)), axis=0)
            return np.einsum("bnd,bd->bn", X, Wq), X @ self.v
        bounds = np.append(starts, B)
        scores = np.empty((B, N))
        for u in range(nu):
            a, b = bounds[u], bounds[u + 1]
            scores[a:b] = (X[a:b].reshape(-1, d) @ self._cached_W_times(last[a])).reshape(-1, N)
        return scores, X @ self.v

    def _cached_W_times(self, q: np.ndarray) -> np.ndarray:
        """``W q + c`` for one token, from the cache of the last ``_CACHE_TOKENS`` tokens."""
        key = q.tobytes()
        Wq = self._cache.get(key)
        if Wq is None:
            Wq = self.W_times(q[None, :])[0] + self.key_bias
            if len(self._cache) >= _CACHE_TOKENS:
                del self._cache[next(iter(self._cache))]  # the oldest entry
            self._cache[key] = Wq
        return Wq

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = {}
        state.pop("_served_cache", None)
        return state


def _served_params(head: AttentionHead):
    """The head's arithmetic and its parameters stored in its precision (built once)."""
    cached = getattr(head, "_served_cache", None)
    if cached is None:
        from ..precision import Arithmetic

        A = Arithmetic(head.precision)
        P = {"v": A.store(head.v)}
        if head.is_lowrank:
            P["K"], P["Q"] = A.store(head.K), A.store(head.Q)
        else:
            P["W"] = A.store(head.W_dense)
        if np.any(head.key_bias):
            P["c"] = A.store(head.key_bias)
        if head.offset:
            P["beta"] = A.store(head.offset)
        cached = head._served_cache = (A, P)
    return cached
