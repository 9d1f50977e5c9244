"""Ground-truth models: single-head attention, multi-head attention, one-layer transformers.

All models map a batch of inputs ``X`` of shape ``(B, N, d)`` (float64, the last row of each input
is the query token) to outputs of shape ``(B,)``. They are plain callables, so any of them can be
wrapped by an oracle from :mod:`attnquery.oracles`; a learner never sees the model object itself.

Every generator is a pure function of its parameters and a seed (an int, a sequence of ints, or a
``numpy.random.Generator``).

Notation follows the paper (Section 3): scores ``s_i = x_i^T W x_N``, attention weights
``alpha = softmax(s)``, output ``f(X) = alpha^T (X v)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse

from .errors import ModelError
from .precision import check_precision
from .rng import as_rng, haar_orthogonal
from .theory import NON_IDENTIFIABLE_CONSTRUCTIONS

__all__ = [
    "AttentionHead",
    "MultiHeadAttention",
    "OneLayerTransformer",
    "softmax_last",
    "run_starts",
    "check_input",
    "random_head",
    "random_v",
    "theorem_head",
    "assumptions_met",
    "membership_head",
    "as_rng",
    "random_transformer",
    "random_multihead",
    "random_orthogonal_split",
    "orthogonal_subspace_multihead",
    "non_identifiable_pair",
    "NON_IDENTIFIABLE_CONSTRUCTIONS",
]


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
        from .precision import Arithmetic

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


class MultiHeadAttention:
    """Sum of single-head attentions, ``f(X) = sum_h alpha_h^T (X v_h) + beta`` (paper Sec. 7).

    Parameters
    ----------
    heads : sequence of AttentionHead
        The heads (each may carry its own key bias and offset).
    offset : float
        A constant added to every answer on top of the heads' own offsets (a layer's output
        bias read out, ``r^T b_O``). Default 0.
    precision : {"float64", "float32", "float16", "bfloat16"}
        Compute precision of ``__call__`` (:mod:`attnquery.precision`): every head is
        evaluated in it (as :class:`AttentionHead` with that precision), the heads' answers are
        added in order and the offset last, each addition rounded. Default ``"float64"``: the
        exact model of the heads' float64 parameters.
    """

    def __init__(self, heads: Sequence[AttentionHead], offset: float = 0.0,
                 precision: str = "float64"):
        heads = tuple(heads)
        if not heads:
            raise ModelError("a multi-head model needs at least one head")
        d = heads[0].d
        if any(not isinstance(h, AttentionHead) or h.d != d for h in heads):
            raise ModelError("every head must be an AttentionHead of the same dimension d")
        if not np.isfinite(offset):
            raise ModelError(f"offset must be finite; got {offset}")
        self.heads = heads
        self.offset = float(offset)
        self.precision = check_precision(precision)
        if self.precision != "float64":
            self._served_heads = tuple(
                AttentionHead(h.v, W=h.W_dense, K=h.K, Q=h.Q, key_bias=h.key_bias,
                              offset=h.offset, precision=self.precision) for h in heads)

    @property
    def d(self) -> int:
        return self.heads[0].d

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    @property
    def total_offset(self) -> float:
        """The constant of the whole function: ``offset`` plus every head's offset."""
        return self.offset + sum(h.offset for h in self.heads)

    def __call__(self, X) -> np.ndarray:
        """``f(X)`` for a batch (B, N, d): every head at once.

        The query vectors ``W_h x_N + c_h`` are computed once per run of identical last tokens
        (as :class:`AttentionHead` does), for all heads together, in blocks of
        ``_BLOCK`` inputs.
        """
        X = check_input(X, self.d)
        if self.precision != "float64":
            return self._served(X)
        out = np.empty(X.shape[0])
        V = np.stack([h.v for h in self.heads])  # (H, d)
        for a in range(0, X.shape[0], _BLOCK):
            out[a:a + _BLOCK] = self._block(X[a:a + _BLOCK], V)
        return out + self.total_offset

    def _served(self, X: np.ndarray) -> np.ndarray:
        """The layer in ``self.precision``: the heads' answers added in order, then the
        offset, every sum rounded."""
        from .precision import Arithmetic

        A = Arithmetic(self.precision)
        out = None
        for h in self._served_heads:
            y = A.store(h(X))  # already the format's values
            out = y if out is None else A.add(out, y)
        if self.offset:
            out = A.add(out, A.store(self.offset))
        return A.answers(out)

    def _block(self, X: np.ndarray, V: np.ndarray) -> np.ndarray:
        B = X.shape[0]
        last = X[:, -1, :]
        starts = run_starts(last)
        bounds = np.append(starts, B)
        # (U, H, d): every head's W_h x_N + c_h for each distinct run's last token
        A = np.stack([h.W_times(last[starts]) + h.key_bias for h in self.heads], axis=1)
        if 4 * starts.size <= B:
            scores = np.empty((B, len(self.heads), X.shape[1]))
            for u in range(starts.size):
                lo, hi = bounds[u], bounds[u + 1]
                scores[lo:hi] = np.einsum("bnd,hd->bhn", X[lo:hi], A[u])
        else:
            A = np.repeat(A, np.diff(bounds), axis=0)
            scores = np.einsum("bnd,bhd->bhn", X, A)
        values = np.einsum("bnd,hd->bhn", X, V)
        return np.einsum("bhn,bhn->b", softmax_last(scores), values)


#: inputs evaluated at once by :class:`MultiHeadAttention`
_BLOCK = 4096


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


# ----------------------------------------------------------------------------------------------
# Seeded generators
# ----------------------------------------------------------------------------------------------


def random_v(
    d: int,
    rng,
    *,
    mu: float | None = None,
    zero_frac: float = 0.0,
    v_norm: float | None = None,
) -> np.ndarray:
    """Draw a value vector.

    Parameters
    ----------
    d : int
        Dimension.
    rng : seed or Generator
    mu : float in (0, 1], optional
        Margin: the nonzero entries have ``|v_i|`` in ``[mu, 1]`` and the smallest equals ``mu``
        exactly. Without it, entries are standard Gaussian.
    zero_frac : float in [0, 1]
        Fraction of entries set to exactly 0 (rounded down; ``zero_frac=1`` gives ``v = 0``).
    v_norm : float, optional
        Rescale v to this Euclidean norm (applied before ``mu`` is enforced only when ``mu`` is
        None).
    """
    rng = as_rng(rng)
    if d < 1:
        raise ModelError(f"d must be >= 1; got {d}")
    if not 0.0 <= zero_frac <= 1.0:
        raise ModelError(f"zero_frac must be in [0, 1]; got {zero_frac}")
    n_zero = d if zero_frac >= 1.0 else int(np.floor(zero_frac * d))
    if mu is None:
        v = rng.standard_normal(d)
        if v_norm is not None:
            v *= v_norm / np.linalg.norm(v)
    else:
        if not 0.0 < mu <= 1.0:
            raise ModelError(f"mu must be in (0, 1]; got {mu}")
        signs = rng.choice([-1.0, 1.0], size=d)
        v = signs * (mu + (1.0 - mu) * rng.random(d))
    zeros = rng.permutation(d)[:n_zero]
    v[zeros] = 0.0
    if mu is not None and n_zero < d:
        nonzero = np.flatnonzero(v)
        k = nonzero[rng.integers(nonzero.size)]
        v[k] = np.sign(v[k]) * mu
    return v


def random_head(
    d: int,
    seed=None,
    *,
    rank: int | None = None,
    W_fro: float | None = None,
    W_spectral: float | None = None,
    logit_scale: float | None = None,
    mu: float | None = None,
    zero_frac: float = 0.0,
    factored: bool | None = None,
    key_bias: float = 0.0,
    offset: float = 0.0,
) -> AttentionHead:
    """Draw a random single-head attention model.

    W has i.i.d. Gaussian entries (or ``K, Q`` with i.i.d. Gaussian entries when ``rank`` is
    given) and is then rescaled by at most one of the scale knobs.

    Parameters
    ----------
    d : int
        Token dimension.
    seed : int, sequence of ints or Generator
    rank : int, optional
        Rank r of W (the head dimension). ``None`` means full rank and a dense W.
    W_fro : float, optional
        Frobenius norm of W. This is also the standard deviation of a score ``x^T W y`` for
        independent standard Gaussian tokens x, y.
    W_spectral : float, optional
        Spectral norm of W.
    logit_scale : float, optional
        Standard deviation of a score for tokens drawn from N(0, I/d) (roughly unit norm), that
        is ``||W||_F / d``. Default (no knob): W entries N(0, 1/d), logit scale 1/sqrt(d).
    mu, zero_frac : see :func:`random_v`.
    factored : bool, optional
        Store W as factors. Defaults to True exactly when ``rank`` is given.
    key_bias : float
        Norm of the key bias c, drawn in a uniformly random direction of the column space of W
        (where a real module's ``c = W_K^T b_Q / sqrt(d_h)`` lies); 0 (default) draws nothing,
        so the head of a given seed is the same as without this knob.
    offset : float
        The constant beta added to every answer.
    """
    rng = as_rng(seed)
    if not (np.isfinite(key_bias) and key_bias >= 0):
        raise ModelError(f"key_bias must be a non-negative norm; got {key_bias}")
    if d < 1:
        raise ModelError(f"d must be >= 1; got {d}")
    knobs = [k for k in (W_fro, W_spectral, logit_scale) if k is not None]
    if len(knobs) > 1:
        raise ModelError("give at most one of W_fro, W_spectral, logit_scale")
    if any(k < 0 for k in knobs):
        raise ModelError("scale knobs must be non-negative")
    if rank is not None and not 0 <= rank <= d:
        raise ModelError(f"rank must be in [0, d={d}]; got {rank}")
    factored = (rank is not None) if factored is None else factored
    r = d if rank is None else rank
    K = rng.standard_normal((r, d)) / np.sqrt(d)
    Q = rng.standard_normal((r, d)) / np.sqrt(max(r, 1))
    if rank is None and not factored:
        W = rng.standard_normal((d, d)) / np.sqrt(d)
    else:
        W = K.T @ Q
    fro = np.linalg.norm(W)
    if W_fro is not None:
        target = W_fro
    elif logit_scale is not None:
        target = logit_scale * d
    elif W_spectral is not None:
        spec = np.linalg.norm(W, 2)
        target = W_spectral * fro / spec if spec > 0 else 0.0
    else:
        target = None
    scale = 1.0 if target is None or fro == 0 else target / fro
    v = random_v(d, rng, mu=mu, zero_frac=zero_frac)
    c = None
    if key_bias > 0:
        if rank is None and not factored:
            c = W @ rng.standard_normal(d)
        else:
            c = K.T @ rng.standard_normal(r)
        nc = np.linalg.norm(c)
        c = c * (key_bias / nc) if nc > 0 else c
    if factored:
        s = np.sqrt(scale)
        return AttentionHead(v, K=K * s, Q=Q * s, key_bias=c, offset=offset)
    return AttentionHead(v, W=W * scale, key_bias=c, offset=offset)


# ---------------------------------------------------------------------------------------------
# heads meeting a theorem's assumptions (the ground truth of the noise, rounding and membership
# experiments)
# ---------------------------------------------------------------------------------------------
def theorem_head(d: int, rng, W_bound: float, mu: float, zero_frac: float = 0.0,
                 W_frac: float = 1.0, rank: int | None = None) -> AttentionHead:
    """A head meeting Theorem 6.1's assumptions (when ``mu <= 1 / sqrt(d)``).

    W is Gaussian (or ``K^T Q`` of rank ``rank``) rescaled to ``||W||_F = W_frac * W_bound``;
    the nonzero ``|v_i|`` are uniform in ``[mu, max(mu, 1/sqrt(d))]`` with one equal to ``mu``
    (so ``||v|| <= 1``), and ``floor(zero_frac * d)`` entries (never all) are exactly 0.
    """
    rng = np.random.default_rng(rng)
    if not 0 < mu <= 1:
        raise ModelError(f"mu must be in (0, 1]; got {mu}")
    if rank is None:
        W = rng.standard_normal((d, d))
    else:
        W = rng.standard_normal((rank, d)).T @ rng.standard_normal((rank, d))
    nrm = np.linalg.norm(W)
    W = W * (W_frac * W_bound / nrm) if nrm > 0 else W
    hi = max(mu, 1.0 / np.sqrt(d))
    v = rng.choice([-1.0, 1.0], size=d) * rng.uniform(mu, hi, size=d)
    n_zero = min(int(np.floor(zero_frac * d)), d - 1)
    v[rng.permutation(d)[:n_zero]] = 0.0
    k = int(rng.choice(np.flatnonzero(v)))
    v[k] = np.sign(v[k]) * mu
    return AttentionHead(v, W=W)


def assumptions_met(head: AttentionHead, tau: float, W_bound: float, mu: float) -> bool:
    """Whether (head, tau) meet Theorem 6.1's assumptions for (W_bound, mu).

    The tolerance must be strictly below ``mu / 2``: at ``tau = mu / 2`` an entry
    ``|v_i| = mu`` can be answered as ``mu / 2``, which the proof's zero test
    (``|v_hat_i| <= mu / 2``) takes for a zero, and the adversarial oracle does exactly that.
    """
    v = head.v
    nz = np.abs(v[v != 0])
    return bool(
        W_bound >= 2
        and np.linalg.norm(head.W) <= W_bound * (1 + 1e-12)
        and np.linalg.norm(v) <= 1 + 1e-12
        and nz.size > 0
        and nz.min() >= mu * (1 - 1e-12)
        and tau < mu / 2
    )


def membership_head(d: int, rng, W_bound: float, mu: float, W_frac: float = 1.0
                    ) -> AttentionHead:
    """A head meeting Appendix B's assumptions: ``||v|| = 1``, ``min |v_i| = mu``,
    ``||W||_F = W_frac * W_bound``.

    One entry of v is ``+-mu``; the others are ``+-U[1, 2]`` rescaled to complete the unit norm
    (which needs ``mu`` small enough that they stay ``>= mu``; else :class:`ModelError`).
    """
    rng = np.random.default_rng(rng)
    W = rng.standard_normal((d, d))
    W *= W_frac * W_bound / np.linalg.norm(W)
    sgn = rng.choice([-1.0, 1.0], size=d)
    if d == 1:
        return AttentionHead(sgn.copy(), W=W)
    k = int(rng.integers(d))
    mag = rng.uniform(1.0, 2.0, size=d)
    mag[k] = 0.0
    mag *= math.sqrt(1.0 - mu**2) / np.linalg.norm(mag)
    mag[k] = mu
    if np.min(mag) < mu * (1 - 1e-12):
        raise ModelError(f"mu = {mu} is too large for a unit v with margin mu at d = {d}")
    return AttentionHead(sgn * mag, W=W)


def random_transformer(
    d: int,
    m: int,
    seed=None,
    *,
    logit_scale: float | None = None,
    W_fro: float | None = None,
    even: bool = False,
) -> OneLayerTransformer:
    """Draw a random one-layer transformer ``TF(X) = w_o^T ReLU(A^T X^T alpha)`` (no biases).

    W is drawn as by :func:`random_head` (dense, full rank), ``A`` has i.i.d. ``N(0, 1/d)``
    entries (unit-norm columns on average) and ``w_o`` i.i.d. ``N(0, 1)`` entries.

    Parameters
    ----------
    d : int
        Token dimension.
    m : int
        Hidden width of the FFN (m >= 1).
    seed : int, sequence of ints or Generator
    logit_scale, W_fro : float, optional
        Scale of W, as in :func:`random_head` (at most one).
    even : bool
        Build an even FFN whose attention-equivalent vector ``v = A w_o`` is exactly 0: the
        neurons come in pairs ``(a, w), (-a, w)``, so the FFN is ``sum w |a^T z|``. W is then not
        identifiable from antisymmetric queries (the paper's ``v = 0`` case). ``m`` must be even.
    """
    rng = as_rng(seed)
    if m < 1:
        raise ModelError(f"the FFN width m must be >= 1; got {m}")
    if even and m % 2:
        raise ModelError(f"an even FFN needs an even width m; got {m}")
    r_head, r_ffn = rng.spawn(2)
    W = random_head(d, r_head, logit_scale=logit_scale, W_fro=W_fro).W
    if even:
        half = r_ffn.standard_normal((d, m // 2)) / np.sqrt(d)
        w_half = r_ffn.standard_normal(m // 2)
        A = np.concatenate([half, -half], axis=1)
        w_o = np.concatenate([w_half, w_half])
    else:
        A = r_ffn.standard_normal((d, m)) / np.sqrt(d)
        w_o = r_ffn.standard_normal(m)
    return OneLayerTransformer(W, A, w_o)


def random_multihead(
    d: int,
    H: int,
    seed=None,
    *,
    rank: int | None = None,
    logit_scale: float | None = None,
    W_fro: float | None = None,
    mu: float | None = None,
    shared_W: bool = False,
) -> MultiHeadAttention:
    """Draw a generic multi-head attention model (no structural assumption between heads).

    Each head is an independent :func:`random_head` (its own seed stream spawned from ``seed``),
    so the model is a pure function of ``(d, H, seed, knobs)``.

    Parameters
    ----------
    d : int
        Token dimension.
    H : int
        Number of heads (H >= 1).
    seed : int, sequence of ints or Generator
    rank, logit_scale, W_fro, mu : optional
        Passed to :func:`random_head` for every head (dense W is stored either way).
    shared_W : bool
        Give every head the W of the first head (Prop. 7.1's setting: the heads' value vectors
        are then not identifiable, only their sum is).

    Returns
    -------
    MultiHeadAttention
    """
    rng = as_rng(seed)
    if H < 1:
        raise ModelError(f"a multi-head model needs H >= 1 heads; got {H}")
    heads = []
    for r in rng.spawn(H):
        h = random_head(d, r, rank=rank, logit_scale=logit_scale, W_fro=W_fro, mu=mu,
                        factored=False)
        heads.append(h)
    if shared_W:
        heads = [AttentionHead(h.v, W=heads[0].W.copy()) for h in heads]
    return MultiHeadAttention(heads)


def random_orthogonal_split(d: int, H: int, seed=None, dims=None) -> list[np.ndarray]:
    """A random orthogonal split of R^d into H subspaces (Assumption C.1).

    Parameters
    ----------
    d, H : int
    seed : int, sequence of ints or Generator
    dims : sequence of H positive ints summing to d, optional
        Subspace dimensions d_h. Default: as equal as possible (the first ``d % H`` get one more).

    Returns
    -------
    list of ndarray
        ``E_h`` of shape (d, d_h) with orthonormal columns; ``[E_1 ... E_H]`` is a Haar-random
        orthogonal matrix.
    """
    rng = as_rng(seed)
    if H < 1 or H > d:
        raise ModelError(f"the number of heads must be in [1, d={d}]; got H={H}")
    if dims is None:
        dims = [d // H + (1 if h < d % H else 0) for h in range(H)]
    dims = [int(x) for x in dims]
    if len(dims) != H or any(x < 1 for x in dims) or sum(dims) != d:
        raise ModelError(f"dims must be H={H} positive ints summing to d={d}; got {dims}")
    Qm = haar_orthogonal(d, rng)
    bounds = np.cumsum([0, *dims])
    return [Qm[:, bounds[h]: bounds[h + 1]].copy() for h in range(H)]


def orthogonal_subspace_multihead(
    d: int,
    H: int,
    seed=None,
    dims=None,
    *,
    logit_scale: float = 1.0,
    mu: float | None = None,
    return_bases: bool = False,
):
    """Draw a multi-head model satisfying the orthogonal-subspace Assumption C.1.

    R^d is split at random into orthogonal subspaces ``U_h = range(E_h)``
    (:func:`random_orthogonal_split`); head h has ``W_h = E_h B_h E_h^T`` and ``v_h = E_h c_h``
    with ``B_h`` i.i.d. Gaussian, scaled so that a score between independent standard Gaussian
    tokens has standard deviation ``logit_scale``, and ``c_h`` from :func:`random_v`.

    Parameters
    ----------
    d, H : int
        Token dimension and number of heads.
    seed : int, sequence of ints or Generator
    dims : sequence of ints, optional
        Subspace dimensions (default: as equal as possible).
    logit_scale : float
        ``||W_h||_F`` (the standard deviation of ``x^T W_h y`` for x, y ~ N(0, I)).
    mu : float, optional
        Margin of each reduced value vector ``c_h`` (see :func:`random_v`).
    return_bases : bool
        Also return the bases ``[E_1, ..., E_H]``.

    Returns
    -------
    MultiHeadAttention, or (MultiHeadAttention, list of ndarray) with ``return_bases``.
    """
    rng = as_rng(seed)
    r_split, r_heads = rng.spawn(2)
    bases = random_orthogonal_split(d, H, r_split, dims)
    heads = []
    for E, r in zip(bases, r_heads.spawn(H), strict=True):
        dh = E.shape[1]
        B = r.standard_normal((dh, dh))
        B *= logit_scale / np.linalg.norm(B)
        c = random_v(dh, r, mu=mu)
        heads.append(AttentionHead(E @ c, W=E @ B @ E.T))
    model = MultiHeadAttention(heads)
    return (model, bases) if return_bases else model


def non_identifiable_pair(name: str, d: int, H: int, seed=None):
    """Two multi-head models with different parameters that compute the same function.

    Parameters
    ----------
    name : {"prop71", "shared_w", "dead_head"}
        ``"prop71"`` (the paper's Prop. 7.1): every head shares ``W = A`` and has
        ``v_h = lambda_h b``; set a puts all the weight on one head, set b spreads it evenly.
        ``"shared_w"``: heads grouped in pairs sharing a W (a generic W per group); set b adds to
        the v's of each group arbitrary vectors summing to zero (not multiples of one
        direction). ``"dead_head"``: one head has ``v = 0``; its W differs arbitrarily between
        the sets.
    d, H : int
        Token dimension and number of heads.
    seed : int, sequence of ints or Generator

    Returns
    -------
    (MultiHeadAttention, MultiHeadAttention)
    """
    rng = as_rng(seed)
    if name == "prop71":
        # Prop. 7.1: every head has W = A, v_h = lambda_h b with sum lambda = 1. Two weightings
        # far apart even after permuting heads: all mass on one head vs spread evenly.
        A = rng.standard_normal((d, d)) / np.sqrt(d)
        b = rng.standard_normal(d)
        lam_a = np.zeros(H)
        lam_a[0] = 1.0
        lam_b = np.full(H, 1.0 / H)
        ma = MultiHeadAttention([AttentionHead(lam * b, W=A) for lam in lam_a])
        mb = MultiHeadAttention([AttentionHead(lam * b, W=A) for lam in lam_b])
        return ma, mb
    if name == "shared_w":
        # Heads fall into groups that share a W; within a group only the sum of the v's
        # matters, so any zero-sum perturbation of the group's v's (not along a common
        # direction, unlike Prop. 7.1) leaves the function unchanged.
        n_groups = max(1, H // 2)
        base = random_multihead(d, n_groups, rng)
        group = np.arange(H) % n_groups
        heads_a, heads_b = [], []
        V = rng.standard_normal((H, d))
        C = rng.standard_normal((H, d))
        for g in range(n_groups):
            idx = np.flatnonzero(group == g)
            if idx.size > 1:
                C[idx] -= C[idx].mean(axis=0)  # zero-sum within the group
            else:
                C[idx] = 0.0
        for h in range(H):
            W = base.heads[group[h]].W
            heads_a.append(AttentionHead(V[h], W=W))
            heads_b.append(AttentionHead(V[h] + C[h], W=W))
        return MultiHeadAttention(heads_a), MultiHeadAttention(heads_b)
    if name == "dead_head":
        # A head whose v is 0 contributes nothing, whatever its W: the W of that head can be
        # anything (here two independent draws).
        base = random_multihead(d, H, rng)
        heads = list(base.heads)
        Wa = rng.standard_normal((d, d)) / np.sqrt(d)
        Wb = rng.standard_normal((d, d)) / np.sqrt(d)
        ma = MultiHeadAttention(heads[:-1] + [AttentionHead(np.zeros(d), W=Wa)])
        mb = MultiHeadAttention(heads[:-1] + [AttentionHead(np.zeros(d), W=Wb)])
        return ma, mb
    raise ModelError(f"unknown construction {name!r}; choose from "
                     f"{NON_IDENTIFIABLE_CONSTRUCTIONS}")


# ==============================================================================================
# Rotary positions (RoPE) and grouped-query attention (beyond the paper)
# ==============================================================================================
#
# The paper's head ignores token positions. The heads of Llama, Qwen and Mistral rotate queries
# and keys by their positions ("rotate half" convention of the GPT-NeoX and Llama code) and share
# keys and values between groups of query heads (grouped-query attention). This section is
# separate from the models above and changes none of them.

__all__ += ["RotaryAttentionHead", "RotaryAttentionLayer", "rope_frequencies", "rotate_half",
            "random_rotary_head", "random_rotary_layer"]


def rope_frequencies(rotary_dim: int, rope_base: float) -> np.ndarray:
    """The rotary frequencies ``theta_j = rope_base^(-2 j / R)``, ``j < R / 2`` (R = rotary_dim).

    Parameters
    ----------
    rotary_dim : int
        The number R of rotated dimensions of a head vector (even, >= 2).
    rope_base : float
        The base (10,000 in Llama 2, 500,000 in Llama 3, 1,000,000 in Qwen2); > 1.
    """
    if isinstance(rotary_dim, bool) or int(rotary_dim) != rotary_dim or rotary_dim < 2 \
            or rotary_dim % 2:
        raise ModelError(f"rotary_dim must be an even integer >= 2; got {rotary_dim!r}")
    if not (np.isfinite(rope_base) and rope_base > 1.0):
        raise ModelError(f"rope_base must be a finite number > 1; got {rope_base!r}")
    R = int(rotary_dim)
    return float(rope_base) ** (-np.arange(0, R, 2, dtype=np.float64) / R)


def rotate_half(Z: np.ndarray, positions: np.ndarray, frequencies: np.ndarray) -> np.ndarray:
    """Rotate head vectors by their positions, "rotate half" convention (GPT-NeoX, Llama).

    With ``R = 2 len(frequencies)``, the dimensions ``(j, j + R/2)`` of every vector are rotated
    by the angle ``p theta_j`` at position ``p``::

        z'_j = z_j cos(p theta_j) - z_{j+R/2} sin(p theta_j)
        z'_{j+R/2} = z_{j+R/2} cos(p theta_j) + z_j sin(p theta_j)

    and the dimensions from R on are left as they are (partial rotary).

    Parameters
    ----------
    Z : ndarray (..., n, dh)
        Head vectors; the axis before last is the one the positions run along.
    positions : ndarray (n,)
        The position of each vector along that axis.
    frequencies : ndarray (R/2,)

    Returns
    -------
    ndarray, same shape as Z
    """
    half = frequencies.size
    if half == 0:
        return Z
    ang = np.asarray(positions, dtype=np.float64)[:, None] * frequencies[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    a, b = Z[..., :half], Z[..., half:2 * half]
    out = np.empty(Z.shape)
    out[..., :half] = a * cos - b * sin
    out[..., half:2 * half] = b * cos + a * sin
    out[..., 2 * half:] = Z[..., 2 * half:]
    return out


def _rotary_frequencies_arg(frequencies, rope_base, rotary_dim, head_dim: int) -> np.ndarray:
    """The frequencies of a rotary model from either ``frequencies`` or ``rope_base``."""
    if frequencies is not None:
        if rope_base is not None:
            raise ModelError("give either frequencies or rope_base, not both")
        th = np.atleast_1d(np.asarray(frequencies, dtype=np.float64))
        if th.ndim != 1 or not np.all(np.isfinite(th)):
            raise ModelError("frequencies must be a finite vector")
        if rotary_dim is not None and 2 * th.size != rotary_dim:
            raise ModelError(f"rotary_dim={rotary_dim} needs {rotary_dim // 2} frequencies; "
                             f"got {th.size}")
    else:
        if rope_base is None:
            raise ModelError("a rotary model needs rope_base or frequencies")
        th = rope_frequencies(head_dim if rotary_dim is None else rotary_dim, rope_base)
    if 2 * th.size > head_dim:
        raise ModelError(f"rotary_dim = {2 * th.size} exceeds the head dimension {head_dim}")
    return th


def _vec_or_zeros(b, n: int, name: str) -> np.ndarray:
    if b is None:
        return np.zeros(n)
    b = np.asarray(b, dtype=np.float64)
    if b.shape != (n,) or not np.all(np.isfinite(b)):
        raise ModelError(f"{name} must be a finite vector of shape ({n},); got {b.shape}")
    return b


#: entries of the (batch x tokens x head_dim) key arrays of one block of a rotary evaluation
_ROTARY_BLOCK_ENTRIES = 2**22


class RotaryAttentionHead:
    """One attention head with rotary positions (RoPE, "rotate half") and Qwen-style biases.

    Positions are ``0..N-1`` and the query token is the last, ``x_N`` at position ``N - 1``::

        q = W_Q x_N + b_Q,   k_i = W_K x_i + b_K,
        s_i = scale (Rot_{N-1} q)^T (Rot_{i-1} k_i),
        f(X) = sum_i softmax(s)_i v^T x_i + offset,

    (tokens numbered from 1, positions from 0), where ``Rot_p`` rotates the dimension pairs
    ``(j, j + R/2)`` by ``p theta_j`` (:func:`rotate_half`) and ``scale = 1 / sqrt(head_dim)``.
    A head read out along a vector u with value weights ``W_V`` and bias ``b_V`` is the case
    ``v = W_V^T u`` and ``offset = u^T b_V``. Since ``Rot_a^T Rot_b = Rot_{b-a}``, the score
    depends on the positions only through the offset ``delta = i - N`` (<= 0):
    ``s_i = x_i^T M_delta x_N`` + bias terms, with one bilinear form per offset,
    ``M_delta = scale W_K^T Rot_{-delta} W_Q`` (:meth:`M`).

    The head is stored as its factors ``W_Q, W_K`` (head_dim x d) and evaluated from them in
    O(N d head_dim) per sequence; no d x d matrix is formed unless :meth:`M` is asked for.

    Parameters
    ----------
    W_Q, W_K : array_like (head_dim, d)
        Query and key weights.
    v : array_like (d,)
        Value vector (value weights read out).
    frequencies : array_like (R/2,), optional
        The rotary frequencies ``theta_j`` of the dimension pairs ``(j, j + R/2)``.
    rope_base : float, optional
        Instead of ``frequencies``: ``theta_j = rope_base^(-2j/R)`` (:func:`rope_frequencies`).
    rotary_dim : int, optional
        R, the rotated dimensions (the first R of each head vector); default head_dim.
    b_Q, b_K : array_like (head_dim,), optional
        Query and key biases (Qwen2); default 0.
    offset : float
        Constant added to every answer (the value bias read out); default 0.
    scale : float, optional
        Score scale; default ``1 / sqrt(head_dim)``.
    precision : {"float64", "float32", "float16", "bfloat16"}
        Compute precision of ``__call__`` (served arithmetic, :mod:`attnquery.precision`), as
        :class:`AttentionHead`'s: the weights, biases, v, the scale and the cos/sin tables
        (``cos(p theta_j)``, computed in float64, as an engine's precomputed cache) are stored
        in the format, and every operation (projections, bias adds, the rotation's products
        and sums, the scores, their scaling, the softmax, the values, their weighted sum, the
        offset) is rounded to it. ``"float64"`` (default) is the exact model, bit-identical to
        one built without ``precision``; :meth:`scores`, :meth:`attention` and :meth:`M` are
        always the float64 model's.
    """

    def __init__(self, W_Q, W_K, v, *, frequencies=None, rope_base=None, rotary_dim=None,
                 b_Q=None, b_K=None, offset=0.0, scale=None, precision: str = "float64"):
        W_Q = np.atleast_2d(np.asarray(W_Q, dtype=np.float64))
        W_K = np.atleast_2d(np.asarray(W_K, dtype=np.float64))
        v = np.asarray(v, dtype=np.float64)
        if v.ndim != 1 or v.size < 1:
            raise ModelError(f"v must be a non-empty vector; got shape {v.shape}")
        d = v.size
        if W_Q.shape != W_K.shape or W_Q.shape[1] != d or W_Q.ndim != 2:
            raise ModelError(f"W_Q and W_K must both have shape (head_dim, {d}); got "
                             f"{W_Q.shape} and {W_K.shape}")
        dh = W_Q.shape[0]
        if not all(np.all(np.isfinite(a)) for a in (W_Q, W_K, v)):
            raise ModelError("model parameters must be finite")
        self.frequencies = _rotary_frequencies_arg(frequencies, rope_base, rotary_dim, dh)
        self.W_Q, self.W_K, self.v = W_Q, W_K, v
        self.b_Q = _vec_or_zeros(b_Q, dh, "b_Q")
        self.b_K = _vec_or_zeros(b_K, dh, "b_K")
        if not np.isfinite(offset):
            raise ModelError(f"offset must be finite; got {offset}")
        self.offset = float(offset)
        self.scale = 1.0 / np.sqrt(dh) if scale is None else float(scale)
        if not np.isfinite(self.scale):
            raise ModelError(f"scale must be finite; got {scale}")
        self.precision = check_precision(precision)

    @property
    def d(self) -> int:
        """Token dimension."""
        return self.v.size

    @property
    def head_dim(self) -> int:
        return self.W_Q.shape[0]

    @property
    def rotary_dim(self) -> int:
        """R, the number of rotated dimensions."""
        return 2 * self.frequencies.size

    @property
    def has_bias(self) -> bool:
        return bool(self.offset != 0.0 or np.any(self.b_Q) or np.any(self.b_K))

    def M(self, delta: int) -> np.ndarray:
        """The bilinear form ``M_delta`` (d x d) of the relative offset ``delta = i - N <= 0``:
        the score of token i is ``x_i^T M_delta x_N`` plus the bias terms."""
        RQ = rotate_half(self.W_Q.T, np.full(self.d, -float(delta)), self.frequencies)
        return self.scale * (self.W_K.T @ RQ.T)

    def scores(self, X) -> np.ndarray:
        """Attention scores ``s_i``, shape (B, N)."""
        X = check_input(X, self.d)
        return np.concatenate([_rotary_scores(X[sl], self.W_Q, self.b_Q, self.W_K, self.b_K,
                                              self.frequencies, self.scale)[:, 0]
                               for sl in _rotary_blocks(X.shape, self.head_dim)], axis=0)

    def attention(self, X) -> np.ndarray:
        """Attention weights ``softmax(s)``, shape (B, N)."""
        return softmax_last(self.scores(X))

    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
        out = np.empty(X.shape[0])
        served = self.precision != "float64"
        for sl in _rotary_blocks(X.shape, self.head_dim):
            if served:
                out[sl] = self._served(X[sl])
                continue
            s = _rotary_scores(X[sl], self.W_Q, self.b_Q, self.W_K, self.b_K,
                               self.frequencies, self.scale)[:, 0]
            out[sl] = np.einsum("bn,bn->b", softmax_last(s), X[sl] @ self.v)
        return out if served else out + self.offset

    def _served(self, X: np.ndarray) -> np.ndarray:
        """The forward pass of a block in ``self.precision`` (:mod:`attnquery.precision`)."""
        from .precision import Arithmetic

        A = Arithmetic(self.precision)
        P = getattr(self, "_served_cache", None)
        if P is None:
            P = {k: A.store(getattr(self, k)) for k in ("W_Q", "W_K", "v", "b_Q", "b_K")}
            P["scale"], P["offset"] = A.store(self.scale), A.store(self.offset)
            self._served_cache = P
        B, N, _ = X.shape
        ang = np.arange(N, dtype=np.float64)[:, None] * self.frequencies[None, :]
        cos, sin = A.store(np.cos(ang)), A.store(np.sin(ang))  # (N, R/2)
        Xs = A.store(X)

        def rot(Z, c, s):  # rotate_half, every product and sum rounded
            half = c.shape[-1]
            a, b = Z[..., :half], Z[..., half:2 * half]
            out = Z.copy()
            out[..., :half] = A.add(A.mul(a, c), -A.mul(b, s))
            out[..., half:2 * half] = A.add(A.mul(b, c), A.mul(a, s))
            return out

        q = A.matmul(Xs[:, -1, :], P["W_Q"].T)  # (B, dh)
        k = A.matmul(Xs, P["W_K"].T)  # (B, N, dh)
        if np.any(self.b_Q):
            q = A.add(q, P["b_Q"])
        if np.any(self.b_K):
            k = A.add(k, P["b_K"])
        q, k = rot(q, cos[-1], sin[-1]), rot(k, cos, sin)
        s = A.mul(A.matmul(k, q[:, :, None])[..., 0], P["scale"])
        alpha = A.softmax(s)
        out = A.matmul(alpha[:, None, :], A.matmul(Xs, P["v"])[:, :, None])[:, 0, 0]
        if self.offset:
            out = A.add(out, P["offset"])
        return A.answers(out)


def _rotary_blocks(shape, width: int):
    """Slices of a batch (B, N, d) small enough for the key arrays of one evaluation block."""
    B, N = shape[0], shape[1]
    step = max(1, _ROTARY_BLOCK_ENTRIES // max(1, N * width))
    return [slice(a, min(a + step, B)) for a in range(0, B, step)]


def _rotary_scores(X, W_Q, b_Q, W_K, b_K, frequencies, scale, groups=None) -> np.ndarray:
    """Scores of rotary heads on a validated batch X (B, N, d): shape (B, H, N).

    ``W_Q`` (H, dh, d) or (dh, d), ``W_K`` (G, dh, d) or (dh, d); query head h reads key head
    ``groups[h]`` (default: h, with G = H).
    """
    W_Q = W_Q[None] if W_Q.ndim == 2 else W_Q
    W_K = W_K[None] if W_K.ndim == 2 else W_K
    b_Q = b_Q[None] if b_Q.ndim == 1 else b_Q
    b_K = b_K[None] if b_K.ndim == 1 else b_K
    B, N, _ = X.shape
    pos = np.arange(N, dtype=np.float64)
    H, dh, d = W_Q.shape
    G = W_K.shape[0]
    # projections as BLAS products: (B, d) x (d, H dh) and (B N, d) x (d, G dh)
    q = (X[:, -1, :] @ W_Q.reshape(H * dh, d).T).reshape(B, H, dh) + b_Q  # (B, H, dh)
    q = rotate_half(q, np.full(H, N - 1.0), frequencies)
    k = (X.reshape(B * N, d) @ W_K.reshape(G * dh, d).T).reshape(B, N, G, dh)
    k = rotate_half(k.transpose(0, 2, 1, 3) + b_K[:, None, :], pos, frequencies)  # (B,G,N,dh)
    if groups is None:
        groups = np.arange(W_Q.shape[0])
    return scale * np.einsum("bhne,bhe->bhn", k[:, groups], q)


class RotaryAttentionLayer:
    """A self-attention layer with rotary positions and grouped-query attention, read out.

    H query heads and G key/value heads (G divides H; G = H is multi-head attention, G = 1
    multi-query attention); query head h reads key/value head ``h // (H / G)``::

        s_{h,i} = scale (Rot_{N-1} (W_Q[h] x_N + b_Q[h]))^T (Rot_{i-1} (W_K[g] x_i + b_K[g])),
        o_h = sum_i softmax(s_h)_i (W_V[g] x_i + b_V[g]),
        f(X) = r^T (W_O [o_1; ...; o_H] + b_O),

    so ``f`` is a sum of :class:`RotaryAttentionHead` s (:meth:`heads`) with value vectors
    ``v_h = W_V[g]^T W_O[:, h]^T r`` (``W_O[:, h]`` the columns of head h) and one offset.
    Evaluated from the factors: O(N d dh (H + G)) per sequence.

    Parameters
    ----------
    W_Q : array_like (H, dh, d)
    W_K, W_V : array_like (G, dh, d)
    W_O : array_like (d, H dh)
    readout : array_like (d,)
        The vector r that reads the layer's output out as one number.
    frequencies, rope_base, rotary_dim, scale
        As in :class:`RotaryAttentionHead` (shared by every head).
    b_Q : array_like (H, dh), optional
    b_K, b_V : array_like (G, dh), optional
    b_O : array_like (d,), optional
        Biases (default 0).
    """

    def __init__(self, W_Q, W_K, W_V, W_O, readout, *, frequencies=None, rope_base=None,
                 rotary_dim=None, b_Q=None, b_K=None, b_V=None, b_O=None, scale=None):
        W_Q = np.asarray(W_Q, dtype=np.float64)
        W_K = np.asarray(W_K, dtype=np.float64)
        W_V = np.asarray(W_V, dtype=np.float64)
        W_O = np.asarray(W_O, dtype=np.float64)
        r = np.asarray(readout, dtype=np.float64)
        if W_Q.ndim != 3 or W_K.ndim != 3 or W_K.shape != W_V.shape:
            raise ModelError("W_Q must have shape (H, dh, d) and W_K, W_V the shape (G, dh, d)")
        H, dh, d = W_Q.shape
        G = W_K.shape[0]
        if W_K.shape[1:] != (dh, d) or G < 1 or H % G:
            raise ModelError(f"W_K must have shape (G, {dh}, {d}) with G dividing H = {H}; "
                             f"got {W_K.shape}")
        if W_O.shape != (d, H * dh) or r.shape != (d,):
            raise ModelError(f"W_O must have shape ({d}, {H * dh}) and readout ({d},); got "
                             f"{W_O.shape} and {r.shape}")
        if not all(np.all(np.isfinite(a)) for a in (W_Q, W_K, W_V, W_O, r)):
            raise ModelError("model parameters must be finite")

        def bias(b, shape, name):
            if b is None:
                return np.zeros(shape)
            b = np.asarray(b, dtype=np.float64)
            if b.shape != shape or not np.all(np.isfinite(b)):
                raise ModelError(f"{name} must be finite with shape {shape}; got {b.shape}")
            return b

        self.frequencies = _rotary_frequencies_arg(frequencies, rope_base, rotary_dim, dh)
        self.W_Q, self.W_K, self.W_V, self.W_O, self.readout = W_Q, W_K, W_V, W_O, r
        self.b_Q = bias(b_Q, (H, dh), "b_Q")
        self.b_K = bias(b_K, (G, dh), "b_K")
        self.b_V = bias(b_V, (G, dh), "b_V")
        self.b_O = bias(b_O, (d,), "b_O")
        self.scale = 1.0 / np.sqrt(dh) if scale is None else float(scale)
        self.groups = np.arange(H) // (H // G)
        # value vectors and offset read out along r
        Or = (W_O.T @ r).reshape(H, dh)  # (H, dh): W_O[:, h]^T r
        self.values = np.einsum("he,hed->hd", Or, W_V[self.groups])
        self.offset = float(np.einsum("he,he->", Or, self.b_V[self.groups]) + r @ self.b_O)

    @property
    def d(self) -> int:
        return self.W_Q.shape[2]

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.W_K.shape[0]

    @property
    def head_dim(self) -> int:
        return self.W_Q.shape[1]

    @property
    def rotary_dim(self) -> int:
        return 2 * self.frequencies.size

    def heads(self) -> list[RotaryAttentionHead]:
        """The layer as H single rotary heads (the offset carried by the first)."""
        return [RotaryAttentionHead(self.W_Q[h], self.W_K[g], self.values[h],
                                    frequencies=self.frequencies, b_Q=self.b_Q[h],
                                    b_K=self.b_K[g], offset=self.offset if h == 0 else 0.0,
                                    scale=self.scale)
                for h, g in enumerate(self.groups)]

    def __call__(self, X) -> np.ndarray:
        X = check_input(X, self.d)
        out = np.empty(X.shape[0])
        for sl in _rotary_blocks(X.shape, self.head_dim * (self.n_heads + self.n_kv_heads)):
            s = _rotary_scores(X[sl], self.W_Q, self.b_Q, self.W_K, self.b_K, self.frequencies,
                               self.scale, self.groups)  # (B, H, N)
            vals = np.einsum("bnd,hd->bhn", X[sl], self.values)
            out[sl] = np.einsum("bhn,bhn->b", softmax_last(s), vals)
        return out + self.offset


def random_rotary_head(
    d: int,
    seed=None,
    *,
    head_dim: int | None = None,
    rotary_dim: int | None = None,
    rope_base: float = 1e4,
    logit_scale: float = 1.0,
    bias: float = 0.0,
    offset: float = 0.0,
    mu: float | None = None,
) -> RotaryAttentionHead:
    """Draw a random rotary head (Llama-style shapes: head_dim 64 or 128, base 1e4 to 1e6).

    ``W_Q`` and ``W_K`` have i.i.d. ``N(0, logit_scale)`` entries, so a score between two
    unit tokens has standard deviation about ``logit_scale`` (after the ``1/sqrt(head_dim)``
    scale); v is drawn by :func:`random_v`.

    Parameters
    ----------
    d : int
        Token dimension.
    seed : int, sequence of ints or Generator
    head_dim : int, optional
        Default ``min(d, 64)`` rounded down to an even number.
    rotary_dim : int, optional
        Rotated dimensions R (even, <= head_dim); default head_dim.
    rope_base : float
        Base of the frequencies ``theta_j = rope_base^(-2j/R)``.
    logit_scale : float
    bias : float
        Standard deviation of the entries of the query and key biases (Qwen2); 0 (default)
        draws none.
    offset : float
        The constant added to every answer (the value bias read out).
    mu : float, optional
        Margin of v (see :func:`random_v`).
    """
    rng = as_rng(seed)
    if d < 2:
        raise ModelError(f"a rotary head needs d >= 2; got {d}")
    dh = (min(d, 64) // 2) * 2 if head_dim is None else int(head_dim)
    if dh < 2:
        raise ModelError(f"head_dim must be >= 2; got {head_dim}")
    R = dh if rotary_dim is None else int(rotary_dim)
    if not (np.isfinite(logit_scale) and logit_scale > 0):
        raise ModelError(f"logit_scale must be positive; got {logit_scale}")
    if not (np.isfinite(bias) and bias >= 0):
        raise ModelError(f"bias must be a non-negative standard deviation; got {bias}")
    sd = np.sqrt(logit_scale)
    W_Q = rng.standard_normal((dh, d)) * sd
    W_K = rng.standard_normal((dh, d)) * sd
    v = random_v(d, rng, mu=mu)
    b_Q = b_K = None
    if bias > 0:
        b_Q = rng.standard_normal(dh) * bias
        b_K = rng.standard_normal(dh) * bias
    return RotaryAttentionHead(W_Q, W_K, v, rope_base=rope_base, rotary_dim=R, b_Q=b_Q,
                               b_K=b_K, offset=offset)


def random_rotary_layer(
    d: int,
    n_heads: int,
    n_kv_heads: int | None = None,
    seed=None,
    *,
    head_dim: int | None = None,
    rotary_dim: int | None = None,
    rope_base: float = 1e4,
    logit_scale: float = 1.0,
    bias: float = 0.0,
) -> RotaryAttentionLayer:
    """Draw a random rotary layer with grouped-query attention, read out along a unit vector.

    Parameters
    ----------
    d, n_heads : int
        Token dimension and number H of query heads.
    n_kv_heads : int, optional
        Number G of key/value heads (dividing H); default H.
    seed : int, sequence of ints or Generator
    head_dim : int, optional
        Default ``d // n_heads``.
    rotary_dim, rope_base, logit_scale : as in :func:`random_rotary_head`.
    bias : float
        Standard deviation of every bias entry (q, k, v and output; Qwen2 has q, k, v); 0 (the
        default) draws none.
    """
    rng = as_rng(seed)
    H = int(n_heads)
    G = H if n_kv_heads is None else int(n_kv_heads)
    if H < 1 or G < 1 or H % G:
        raise ModelError(f"n_kv_heads must divide n_heads; got H={n_heads}, G={n_kv_heads}")
    dh = d // H if head_dim is None else int(head_dim)
    if dh < 2:
        raise ModelError(f"head_dim must be >= 2; got {dh}")
    sd = np.sqrt(logit_scale)
    W_Q = rng.standard_normal((H, dh, d)) * sd
    W_K = rng.standard_normal((G, dh, d)) * sd
    W_V = rng.standard_normal((G, dh, d)) / np.sqrt(d)
    W_O = rng.standard_normal((d, H * dh)) / np.sqrt(H * dh)
    r = rng.standard_normal(d)
    r /= np.linalg.norm(r)
    b = {}
    if bias > 0:
        b = dict(b_Q=rng.standard_normal((H, dh)) * bias,
                 b_K=rng.standard_normal((G, dh)) * bias,
                 b_V=rng.standard_normal((G, dh)) * bias, b_O=rng.standard_normal(d) * bias)
    return RotaryAttentionLayer(W_Q, W_K, W_V, W_O, r, rope_base=rope_base,
                                rotary_dim=dh if rotary_dim is None else rotary_dim, **b)
