"""Seeded generators of the ground-truth models.

Every generator is a pure function of its parameters and a seed (an int, a sequence of ints, or
a ``numpy.random.Generator``): random heads (:func:`random_head`), the heads that meet a
theorem's assumptions (:func:`theorem_head`, :func:`membership_head`), one-layer transformers,
multi-head models (generic, orthogonal-subspace, and the non-identifiable pairs), and rotary
heads and layers.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ModelError
from ..rng import as_rng, haar_orthogonal
from ..theory import NON_IDENTIFIABLE_CONSTRUCTIONS
from .heads import AttentionHead
from .layers import MultiHeadAttention
from .rotary import RotaryAttentionHead, RotaryAttentionLayer
from .transformer import OneLayerTransformer

__all__ = [
    "random_v",
    "random_head",
    "theorem_head",
    "assumptions_met",
    "membership_head",
    "random_transformer",
    "random_multihead",
    "random_orthogonal_split",
    "orthogonal_subspace_multihead",
    "non_identifiable_pair",
    "random_rotary_head",
    "random_rotary_layer",
]


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
    _check_scales(logit_scale, bias)
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
    H, G = _gqa_heads(n_heads, n_kv_heads)
    dh = d // H if head_dim is None else int(head_dim)
    if dh < 2:
        raise ModelError(f"head_dim must be >= 2; got {dh}")
    W_Q, W_K, W_V, W_O = _draw_gqa_weights(rng, H, G, dh, d, d, logit_scale)
    r = rng.standard_normal(d)
    r /= np.linalg.norm(r)
    b = _draw_gqa_biases(rng, H, G, dh, d, bias)
    return RotaryAttentionLayer(W_Q, W_K, W_V, W_O, r, rope_base=rope_base,
                                rotary_dim=dh if rotary_dim is None else rotary_dim, **b)


# -- shared by the grouped-query layers' generators (and random_vector_layer's) ----------------
def _gqa_heads(n_heads, n_kv_heads) -> tuple[int, int]:
    """H query heads and G key/value heads (default H), G dividing H."""
    H = int(n_heads)
    G = H if n_kv_heads is None else int(n_kv_heads)
    if H < 1 or G < 1 or H % G:
        raise ModelError(f"n_kv_heads must divide n_heads; got H={n_heads}, G={n_kv_heads}")
    return H, G


def _check_scales(logit_scale, bias) -> None:
    if not (np.isfinite(logit_scale) and logit_scale > 0):
        raise ModelError(f"logit_scale must be positive; got {logit_scale}")
    if not (np.isfinite(bias) and bias >= 0):
        raise ModelError(f"bias must be a non-negative standard deviation; got {bias}")


def _draw_gqa_weights(rng, H: int, G: int, dh: int, d: int, d_out: int, logit_scale,
                      dk: int | None = None):
    """``W_Q`` (H, dk, d) and ``W_K`` (G, dk, d) with ``N(0, logit_scale)`` entries, ``W_V``
    (G, dh, d) with ``N(0, 1 / d)`` and ``W_O`` (d_out, H dh) with ``N(0, 1 / (H dh))``, drawn
    in that order (``dk`` defaults to dh)."""
    sd = np.sqrt(logit_scale)
    dk = dh if dk is None else dk
    W_Q = rng.standard_normal((H, dk, d)) * sd
    W_K = rng.standard_normal((G, dk, d)) * sd
    W_V = rng.standard_normal((G, dh, d)) / np.sqrt(d)
    W_O = rng.standard_normal((d_out, H * dh)) / np.sqrt(H * dh)
    return W_Q, W_K, W_V, W_O


def _draw_gqa_biases(rng, H: int, G: int, dh: int, d_out: int, bias,
                     dk: int | None = None) -> dict:
    """``b_Q, b_K`` (of dk, default dh), ``b_V, b_O`` with ``N(0, bias^2)`` entries (drawn in
    that order), or none (``{}``) when ``bias`` is 0."""
    if not bias > 0:
        return {}
    dk = dh if dk is None else dk
    return dict(b_Q=rng.standard_normal((H, dk)) * bias,
                b_K=rng.standard_normal((G, dk)) * bias,
                b_V=rng.standard_normal((G, dh)) * bias,
                b_O=rng.standard_normal(d_out) * bias)
