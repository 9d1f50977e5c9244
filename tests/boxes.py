"""Black boxes that are not what a single-head learner assumes, for the verification tests.

Each builder returns a plain callable ``(B, N, d) -> (B,)`` (and, for the wrappers, takes one):
several heads, a head with biases, answers with relative noise, answers in float32 or float16,
and the position-dependent heads of real architectures (a sliding window, ALiBi, rotary
positions) and a head with an attention sink. All are plain numpy and take any length N.
"""

import numpy as np

from attnquery.models import AttentionHead, random_head, random_multihead, softmax_last
from attnquery.oracles import query_hash
from attnquery.precision import Arithmetic
from attnquery.realheads import build_layer, cached_checkpoint, readout_vector


def checkpoint_layer(path):
    """The ground truth behind a module box of a checkpoint's layer 0: the layer with its
    biases, read out along :func:`~attnquery.realheads.readout_vector`."""
    c = cached_checkpoint(path)
    return build_layer(c, 0, readout_vector(c.d), biases=True)


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


def _scores(head: AttentionHead, X: np.ndarray) -> np.ndarray:
    """The head's scores ``x_i^T W x_N`` (B, N)."""
    return np.einsum("bnd,bd->bn", X, X[:, -1, :] @ head.W.T)


def _attend(s: np.ndarray, X: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.einsum("bn,bn->b", softmax_last(s), X @ v)


def sliding_window(d: int, seed=0, window: int = 4, head: AttentionHead | None = None):
    """A head that attends only to the last ``window`` tokens (``x_N`` included), as the
    sliding-window layers of Mistral and Gemma do: on ``N <= window`` tokens it is exactly
    ``head`` (default ``random_head(d, seed)``)."""
    head = random_head(d, seed=seed) if head is None else head

    def box(X):
        X = np.asarray(X, dtype=np.float64)
        n = X.shape[1]
        s = _scores(head, X)
        s[:, : max(n - int(window), 0)] = -np.inf
        return _attend(s, X, head.v)

    return box


def last_tokens(fn, window: int):
    """``fn`` on the last ``window`` tokens of each input: the sliding window of any
    position-free box (a served layer, a module), which :func:`sliding_window` is for one head
    (there by masking the scores); on ``N <= window`` tokens it is ``fn`` itself."""

    def box(X):
        return fn(np.asarray(X)[:, -int(window):])

    return box


def logit_scaled(head: AttentionHead, start: int = 128):
    """``head`` with its scores multiplied by ``log(N) / log(start)`` on ``N > start`` tokens
    (a length-dependent logit scaling, as long-context models use); on ``N <= start`` tokens it
    is ``head`` itself."""

    def box(X):
        X = np.asarray(X, dtype=np.float64)
        n = X.shape[1]
        scale = np.log(n) / np.log(start) if n > start else 1.0
        return _attend(scale * _scores(head, X), X, head.v)

    return box


def alibi(d: int, seed=0, slope: float = 0.25):
    """ALiBi (Press et al. 2022): the score of token i is ``x_i^T W x_N - slope (N - i)``."""
    head = random_head(d, seed=seed)

    def box(X):
        X = np.asarray(X, dtype=np.float64)
        n = X.shape[1]
        s = _scores(head, X) - float(slope) * (n - 1 - np.arange(n))
        return _attend(s, X, head.v)

    return box


def rotate_half(z: np.ndarray) -> np.ndarray:
    """``[-z_2, z_1]`` for ``z = [z_1, z_2]`` split in halves along the last axis."""
    h = z.shape[-1] // 2
    return np.concatenate([-z[..., h:], z[..., :h]], axis=-1)


def rope(z: np.ndarray, pos: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Rotary position embedding of ``z`` (..., N, r), r even, at positions ``pos`` (N,), in
    the rotate-half convention (GPT-NeoX, Llama): ``z cos(p theta) + rotate_half(z) sin(p
    theta)``, ``theta_j = base^(-2j / r)`` repeated over both halves."""
    r = z.shape[-1]
    theta = base ** (-np.arange(0, r, 2) / r)
    ang = np.asarray(pos, dtype=float)[:, None] * np.concatenate([theta, theta])[None, :]
    return z * np.cos(ang) + rotate_half(z) * np.sin(ang)


def rotary(d: int, seed=0, base: float = 10000.0):
    """A head with rotary positions: keys ``K x_i`` and query ``Q x_N`` rotated by their
    positions, scores ``rope(K x_i, i)^T rope(Q x_N, N)`` (a function of ``N - i`` only), with
    ``K = I`` and ``Q = W`` (padded to an even dimension), so that ``W = K^T Q``."""
    head = random_head(d, seed=seed)
    r = d + d % 2
    K, Q = np.eye(r, d), np.zeros((r, d))
    Q[:d] = head.W

    def box(X):
        X = np.asarray(X, dtype=np.float64)
        pos = np.arange(X.shape[1])
        k = rope(X @ K.T, pos, base)
        q = rope(X[:, -1:, :] @ Q.T, pos[-1:], base)
        s = np.einsum("bnr,br->bn", k, q[:, 0, :])
        return _attend(s, X, head.v)

    return box


def attention_sink(d: int, seed=0, sink_logit: float = 0.0):
    """A head with a learned attention sink (as in gpt-oss and StreamingLLM's sink token): a
    constant score ``sink_logit`` with value 0 joins the softmax,
    ``f = sum_i e^{s_i} x_i^T v / (e^{sink} + sum_i e^{s_i})``. Position-free, but not a head."""
    head = random_head(d, seed=seed)

    def box(X):
        X = np.asarray(X, dtype=np.float64)
        s = _scores(head, X)
        s = np.concatenate([s, np.full((s.shape[0], 1), float(sink_logit))], axis=1)
        w = softmax_last(s)[:, :-1]
        return np.einsum("bn,bn->b", w, X @ head.v)

    return box


def soft_capped(model, cap: float = 5.0, precision: str = "float32"):
    """``model`` (an :class:`AttentionHead` or a :class:`MultiHeadAttention`) with its scores
    soft-capped, ``cap tanh(s / cap)`` (Gemma 2's logit soft-capping), computed in
    ``precision`` as a served model is (every operation rounded to the format,
    :mod:`attnquery.precision`; the heads' answers added in order, each with its offset, then the
    layer's offset): answers in the format that are not those of attention heads."""
    A = Arithmetic(precision)
    heads = [model] if isinstance(model, AttentionHead) else list(model.heads)
    params = [(A.store(h.W), A.store(h.key_bias), A.store(h.v), h.offset) for h in heads]
    offset = 0.0 if isinstance(model, AttentionHead) else float(model.offset)
    capped = A.store(cap)

    def box(X):
        Xs = A.store(np.asarray(X, dtype=np.float64))
        out = None
        for W, c, v, beta in params:
            a = A.add(A.matmul(Xs[:, -1, :], W.T), c)
            s = A.matmul(Xs, a[:, :, None])[..., 0]
            s = A.mul(A.rnd(np.tanh(A.div(s, capped))), capped)
            y = A.matmul(A.softmax(s)[:, None, :], A.matmul(Xs, v)[:, :, None])[:, 0, 0]
            if beta:
                y = A.add(y, A.store(beta))
            out = y if out is None else A.add(out, y)
        if offset:
            out = A.add(out, A.store(offset))
        return A.answers(out)

    return box


def three_heads(d: int, seed=0):
    """The sum of three random heads."""
    return random_multihead(d, 3, seed)


#: the boxes of real architectures: name -> builder (d, seed) -> box
ARCHITECTURE_BOXES = {
    "window_4": lambda d, seed: sliding_window(d, seed, 4),
    "window_5": lambda d, seed: sliding_window(d, seed, 5),
    "window_8": lambda d, seed: sliding_window(d, seed, 8),
    "alibi": alibi,
    "rotary": rotary,
    "sink": attention_sink,
}


def wrong_boxes(d: int, seed=0) -> dict:
    """Every wrong-model box of this module around a random head of dimension ``d``."""
    head = random_head(d, seed=seed)
    return {
        "two_heads": two_heads(d, seed),
        "biased": biased_head(d, seed),
        "noise_1e-4": relative_noise(head, 1e-4, seed),
        "float32": in_dtype(head, np.float32),
        "float16": in_dtype(head, np.float16),
        **{name: make(d, seed) for name, make in ARCHITECTURE_BOXES.items()},
    }


__all__ = ["two_heads", "three_heads", "biased_head", "relative_noise", "in_dtype",
           "soft_capped", "sliding_window", "last_tokens", "logit_scaled", "alibi", "rotary",
           "rope", "rotate_half", "attention_sink", "ARCHITECTURE_BOXES", "wrong_boxes",
           "AttentionHead"]
