"""Plain-numpy attention layers for the vector routes' tests, written from the formulas (not
from attnquery's model classes): Llama/Qwen-style rotary grouped-query layers with biases, a
causal mask, optional sliding windows, dynamic NTK scaling and rounding to a narrow format."""

import numpy as np


def bfloat16(a):
    """``a`` rounded to bfloat16 (round to nearest even on the top 16 bits of float32)."""
    b = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


ROUND = {"float64": lambda a: a, "float32": lambda a: a.astype(np.float32).astype(np.float64),
         "float16": lambda a: a.astype(np.float16).astype(np.float64), "bfloat16": bfloat16}


class Layer:
    """``out_n = sum_h W_O,h softmax_i(q_hn . k_gi / sqrt(dh)) (W_V,g x_i + b_V,g) + b_O`` with
    ``q = R_n (W_Q x + b_Q)``, ``k = R_i (W_K x + b_K)`` (rotate-half RoPE of ``base``, or none
    with ``base=None``), head h reading key/value head ``h // (H / G)``.

    ``window``: token n sees tokens i with ``n - window < i <= n``; ``ntk_from``: dynamic NTK
    scaling (factor 2) of the base for sequences longer than it; ``softcap``: logits ``z``
    soft-capped to ``softcap tanh(z / softcap)`` (Gemma 2); ``fmt``: answers rounded to that
    format, after Gaussian noise of standard deviation ``noise`` is added to every entry (a new
    draw per answer). ``outputs``: "all" (every token's) or "last"."""

    def __init__(self, d, H, G=None, seed=0, base=10000.0, causal=True, outputs="all",
                 window=None, ntk_from=None, fmt="float64", bias=0.3, scale=1.0, softcap=None,
                 noise=0.0):
        G = G or H
        rng = np.random.default_rng(seed)
        self.d, self.H, self.G, self.dh = d, H, G, d // H
        dh = self.dh
        s = scale / np.sqrt(d)
        self.WQ = rng.standard_normal((H, dh, d)) * s * 2
        self.WK = rng.standard_normal((G, dh, d)) * s * 2
        self.WV = rng.standard_normal((G, dh, d)) / np.sqrt(d)
        self.WO = rng.standard_normal((H, d, dh)) / np.sqrt(dh)
        self.bQ = bias * rng.standard_normal((H, dh))
        self.bK = bias * rng.standard_normal((G, dh))
        self.bV, self.bO = bias * rng.standard_normal((G, dh)), bias * rng.standard_normal(d)
        self.base, self.causal, self.outputs = base, causal, outputs
        self.window, self.ntk_from, self.fmt = window, ntk_from, fmt
        self.softcap = softcap
        self.noise, self._noise = noise, np.random.default_rng([seed, 1])

    def _rope(self, x, pos, N):
        if self.base is None:
            return x
        dh, base = x.shape[-1], self.base
        if self.ntk_from is not None and N > self.ntk_from:
            base = base * (2.0 * N / self.ntk_from - 1.0) ** (dh / (dh - 2))
        inv = base ** (-np.arange(0, dh, 2) / dh)
        ang = pos[:, None] * inv
        c, s = np.cos(ang), np.sin(ang)
        x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def __call__(self, X):
        X = np.asarray(X, dtype=np.float64)
        B, N, _ = X.shape
        rows = N if self.outputs == "all" else 1
        per = max(1, 2**24 // (rows * N))  # queries per block: the logits of 16 M pairs
        if B > per:
            return np.concatenate([self(X[b:b + per]) for b in range(0, B, per)])
        pos = np.arange(N, dtype=np.float64)
        rows = np.arange(N) if self.outputs == "all" else np.array([N - 1])
        i, n = np.arange(N)[None, :], rows[:, None]
        seen = np.ones((rows.size, N), dtype=bool)
        if self.causal:
            seen &= i <= n
        if self.window is not None:
            seen &= (i > n - self.window) & (i <= n) if self.causal else np.abs(i - n) < self.window
        out = np.zeros((B, rows.size, self.d))
        per = self.H // self.G
        for g in range(self.G):
            k = self._rope(X @ self.WK[g].T + self.bK[g], pos, N)  # (B, N, dh)
            v = X @ self.WV[g].T + self.bV[g]
            for h in range(g * per, (g + 1) * per):
                q = self._rope(X[:, rows] @ self.WQ[h].T + self.bQ[h], pos[rows], N)
                z = np.einsum("bnr,bir->bni", q, k) / np.sqrt(self.dh)
                if self.softcap is not None:
                    z = self.softcap * np.tanh(z / self.softcap)
                z = np.where(seen, z, -np.inf)
                a = np.exp(z - z.max(axis=2, keepdims=True))
                a /= a.sum(axis=2, keepdims=True)
                out += np.einsum("bni,bir->bnr", a, v) @ self.WO[h].T
        out += self.bO
        if self.noise:
            out = out + self.noise * self._noise.standard_normal(out.shape)
        out = ROUND[self.fmt](out)
        return out if self.outputs == "all" else out[:, 0]


class ScalarHead:
    """A one-head :class:`Layer` (last token's output, no biases) read out along a unit vector
    ``u``: ``f(X) = u^T W_O softmax_i(q_N . k_i / sqrt(d)) W_V x_i``, a scalar-answer head with
    rotate-half RoPE of ``base`` (none with ``base=None``: then a position-free head with
    ``W = W_Q^T W_K / sqrt(d)`` and ``v = W_V^T W_O^T u``). ``scale`` scales ``W_Q`` and
    ``W_K`` (small: logits small on unit tokens)."""

    def __init__(self, d, seed=0, base=10000.0, scale=0.1):
        self.layer = Layer(d, 1, seed=seed, base=base, outputs="last", bias=0.0, scale=scale)
        u = np.random.default_rng(seed).standard_normal(d)
        self.u = u / np.linalg.norm(u)
        self.v = self.layer.WV[0].T @ (self.layer.WO[0].T @ self.u)

    def __call__(self, X):
        return self.layer(X) @ self.u
