"""The heads' value maps of a layer from vector answers: splitting ``V_sum = sum_h V_h``.

One-token queries give ``x^T V_sum + beta`` only. When the heads fill d (``H dh = d`` and
``V_sum`` of rank d), the maps ``E_h`` with ``x^T V_h = x^T E_h V_sum`` are complementary
projectors: ``Delta^T = sum_h Delta^T E_h``, each part in head h's subspace ``U_h`` (dim dh).

A two-token query ``[b + T Delta; b]`` answers, at its last token,
``y = b^T + T sum_h sigma(T Delta^T (W_h b + c_h)) Delta^T E_h`` (in the coordinates
``(o - beta) V_sum^+``): with T huge every head's weight is 0 or 1 to the last bit, and along a
line ``b = b0 + s v`` head h's weight flips once, where ``Delta^T (W_h b + c_h)`` changes sign.
The answer is piecewise constant in s and each jump is one head's part ``+-Delta^T E_h``
exactly. Bisection of one line for a key difference ``Delta_0`` separates its H jumps (it stops
when H intervals hold one each); a point between each two neighbouring intervals is a
separator. A nearby difference ``Delta_0 + eps Delta_j`` moves every crossing by about eps, so
the same H + 1 separators still isolate its jumps, ``+-(Delta_0 + eps Delta_j)^T E_h`` in the
same order: subtracting ``Delta_0``'s jumps and dividing by eps gives ``Delta_j``'s part in
every head, matched to the head by its place on the line. dh such ``Delta_j`` give a basis of
every ``U_h``, hence the projectors and ``V_h = E_h V_sum``: one line's bisection and
``(dh + 1) (H + 1)`` queries at the separators.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import ModelMismatchError, NotIdentifiableError

__all__ = ["split_values", "split_outputs", "split_queries", "scan_queries_per_line",
           "values_from_parts", "KEY_SCALE", "LINE_HALF", "LEVELS", "PERTURB",
           "SplitTolerances", "EXACT"]

#: the key difference's scale T: logits of order 1e10 saturate every weight to 0 or 1 except
#: within about 1e-10 (in s) of its crossing, far inside the last bisection interval
KEY_SCALE = 1e10
#: each line runs over s in [-LINE_HALF, LINE_HALF] (a crossing farther out is missed)
LINE_HALF = 1e3
#: bisection levels: final intervals of 2 LINE_HALF 2^-31, about 1e-6
LEVELS = 31
#: singular values of a value map below this fraction of the largest count as zero (its rank)
RANK_RTOL = 1e-10
#: a change of the scaled answer (tokens of norm about 1) below this is rounding
CHANGE_TOL = 1e-9
#: a line that crosses another number of jumps than n_heads, or whose separators do not isolate
#: the perturbed differences' jumps, is replaced by a fresh line up to RETRIES times
RETRIES = 2
#: a head's parts must span d / H dimensions to this (relative singular value)
MATCH_TOL = 1e-8
#: eps of the perturbed differences ``Delta_0 + eps Delta_j``: their parts are exact to about
#: 1e-16 / eps relative (times the projectors' norms: they only read the 0/1 patterns of the
#: refinement, which gives the exact parts), and their crossings move by about eps times the
#: line's scale
PERTURB = 1e-5
#: bisection levels after the line's jumps are isolated: the intervals shrink 2^EXTRA_LEVELS
#: times about their crossings, so that the separators between them lie far from every
#: crossing (MiniLM layer 0: with none, nearby differences moved crossings past separators)
EXTRA_LEVELS = 8
#: a perturbed difference's jump may differ from Delta_0's by at most this fraction of the
#: largest jump (it differs by about PERTURB; a crossing moved past a separator changes a jump
#: by a whole part)
MOVED_TOL = 1e-2


class SplitTolerances(NamedTuple):
    """The split's tolerances: :data:`CHANGE_TOL`, :data:`MATCH_TOL`, :data:`MOVED_TOL` and
    :data:`PERTURB` for answers exact to float64 (:data:`EXACT`), and ``refine``, the factor
    on the refinement's random points (:data:`REFINE_SHARE`, :data:`REFINE_EXTRA`); the served
    route passes its format's (:mod:`~attnquery.learners.vector_served`)."""

    change: float = CHANGE_TOL
    match: float = MATCH_TOL
    moved: float = MOVED_TOL
    perturb: float = PERTURB
    refine: int = 1
    #: read the parts in the answers' own coordinates, ``Delta^T V_h`` (in ``R^{d_out}``),
    #: rather than in those of ``V_sum^+``: the pseudo-inverse amplifies the answers' rounding
    #: by ``V_sum``'s condition number (float32, d = 96: 6e3; d = 192: 2e4), where exact
    #: answers lose nothing
    output_frame: bool = False
    #: the refinement reads the exact parts of ``spread (dh + 1)`` key differences (the
    #: ``dh + 1`` of the scan and fresh random ones): a head's basis from ``dh + 1`` parts in
    #: its ``dh`` dimensions is conditioned like a square random matrix (about ``4 dh``), from
    #: twice as many about 6
    spread: int = 1
    #: read every head's value map again from the exact parts of d orthogonal key differences
    #: (:func:`values_from_parts`; every token's outputs only), rather than cutting ``V_sum``
    #: along the projectors, which amplify its one-token estimate's rounding (float32, d = 384,
    #: 12 heads: V 1.2e-6 to 5.9e-5)
    values_from_parts: bool = False


#: the tolerances for answers exact to float64
EXACT = SplitTolerances()


def scan_queries_per_line(n_heads: int) -> int:
    """Queries one line's bisection asks at most: its two ends and, per level, the midpoints of
    at most ``n_heads`` intervals (those holding a jump)."""
    return 2 + LEVELS * n_heads


#: random points b per key difference of the refinement (times n_heads, plus REFINE_EXTRA): their
#: saturated answers are 0/1 combinations of the difference's H parts, which need H
#: independent patterns
REFINE_SHARE = 2
REFINE_EXTRA = 4
#: norm of the refinement's random points: far from the origin, ``W_h b`` outweighs the key bias
#: and every head's weight flips between the points (at norm 1 and d = 64, some heads' did not)
REFINE_NORM = 100.0


def split_queries(d: int, n_heads: int, tols: SplitTolerances = EXACT) -> int:
    """Queries :func:`split_values` asks at most (every line retried)."""
    dh = d // n_heads
    refine = ((1 + RETRIES) * tols.spread * (dh + 1) * tols.refine
              * (REFINE_SHARE * n_heads + REFINE_EXTRA))
    parts = (1 + RETRIES) * d if tols.values_from_parts else 0
    return ((1 + RETRIES) * (scan_queries_per_line(n_heads) + (dh + 1) * (n_heads + 1)) + refine
            + parts)


def _parts(oracle, read, b, Delta) -> np.ndarray:
    """``sum_h sigma_h Delta^T E_h`` for the queries ``[b + T Delta; b]``, one per row, in the
    coordinates ``read(o, b)`` gives the last token's answers o (the answer less ``b``'s own
    value and the offset)."""
    X = np.stack([b + KEY_SCALE * Delta, b], axis=1)
    o = np.asarray(oracle(X), dtype=np.float64)
    o = o[:, -1] if o.ndim == 3 else o
    return read(o, b) / KEY_SCALE


def _scan(oracle, read, Delta, b0, v, n_heads,
          change: float = CHANGE_TOL) -> tuple[np.ndarray, np.ndarray]:
    """The jumps along the line ``b0 + s v`` for the key difference ``Delta``: bisection, one
    batch per level, until ``n_heads`` intervals hold a change each and :data:`EXTRA_LEVELS`
    more (or :data:`LEVELS` in all).
    Returns the jumps (k, d) and their intervals (k, 2), in the order of s."""
    lo, hi = np.array([-LINE_HALF]), np.array([LINE_HALF])
    g = _parts(oracle, read, b0 + np.array([[-LINE_HALF], [LINE_HALF]]) * v,
               np.stack([Delta, Delta]))
    glo, ghi = g[:1], g[1:]
    extra = EXTRA_LEVELS
    for _ in range(LEVELS + 1):
        keep = np.max(np.abs(ghi - glo), axis=1) > change
        lo, hi, glo, ghi = lo[keep], hi[keep], glo[keep], ghi[keep]
        if lo.size == n_heads:
            extra -= 1
        # each head crosses a line once: more changing intervals than heads (beyond a few
        # crossings split by a midpoint) mean answers that are not piecewise constant (logits
        # that do not saturate, such as soft-capped ones): stop before the intervals multiply
        if lo.size == 0 or extra < 0 or lo.size > 2 * n_heads:
            break
        mid = (lo + hi) / 2
        gm = _parts(oracle, read, b0 + mid[:, None] * v, np.repeat(Delta[None], mid.size, 0))
        lo, hi = np.concatenate([lo, mid]), np.concatenate([mid, hi])
        glo, ghi = np.concatenate([glo, gm]), np.concatenate([gm, ghi])
    order = np.argsort(lo)
    return (ghi - glo)[order], np.stack([lo[order], hi[order]], axis=1)


def _line(rng: np.random.Generator, d: int) -> tuple[np.ndarray, np.ndarray]:
    """A random line: a point b0 of norm about 1 and a unit direction v."""
    b0 = rng.standard_normal(d) / np.sqrt(d)
    v = rng.standard_normal(d)
    return b0, v / np.linalg.norm(v)


def split_values(oracle, V_sum: np.ndarray, beta: np.ndarray, n_heads: int,
                 rng: np.random.Generator, tols: SplitTolerances = EXACT) -> np.ndarray:
    """The heads' value-output maps (H, d, d_out) behind ``V_sum`` (see the module docstring).

    Asks at most :func:`split_queries` queries: per try, one line's bisection (at most
    :data:`LEVELS` + 1 batches) and one batch at its separators; a fresh line is tried (at
    most :data:`RETRIES` times) when the line crosses another number of jumps than
    ``n_heads`` (a crossing beyond its end, or two in one final interval) or its separators do
    not isolate the perturbed differences' jumps.

    Raises
    ------
    NotIdentifiableError
        ``V_sum`` has rank below d, or H does not divide d (the heads do not fill d: not
        split so far).
    ModelMismatchError
        Every line shows another number of heads than ``n_heads``, or a head's parts span
        more than d / H dimensions.
    """
    d = V_sum.shape[0]
    H = int(n_heads)
    s = np.linalg.svd(V_sum, compute_uv=False)
    rank = int(np.count_nonzero(s > RANK_RTOL * s[0]))
    if d % H or rank < d:
        raise NotIdentifiableError(
            f"splitting the value maps needs heads that fill d: H = {H} dividing d = {d} and "
            f"the summed value map of rank d (rank {rank})")
    if tols.output_frame:  # the parts read in the answers' own coordinates (see SplitTolerances)
        V = split_outputs(oracle, V_sum, beta, H, rng, tols)[0]
        return values_from_parts(oracle, V, beta, rng, tols) if tols.values_from_parts else V
    Vp = np.linalg.pinv(V_sum)
    E = _split(oracle, lambda o, b: (o - beta) @ Vp - b, np.eye(d), H, rng, tols)
    return np.einsum("hde,eo->hdo", E, V_sum)


def split_outputs(oracle, V_sum: np.ndarray, beta: np.ndarray, n_heads: int,
                  rng: np.random.Generator,
                  tols: SplitTolerances = EXACT) -> tuple[np.ndarray, np.ndarray]:
    """The heads' value-output maps (H, d, d_out) behind ``V_sum`` where the heads' *output*
    subspaces fill d_out (``H dv = d_out``), whatever the rank of ``V_sum``: grouped-query
    layers, whose heads share value maps (``V_sum`` of rank at most G dv).

    The same lines as :func:`split_values`, read in the output coordinates
    ``o - beta - b^T V_sum``: each jump is one head's ``Delta^T V_h``, in head h's output
    subspace. Returns the maps ``V_h = V_sum E_h`` and the output projectors E (H, d_out,
    d_out) (``o E_h`` is head h's part of an output o less the offset). Asks at most
    :func:`split_queries` ``(d_out, n_heads)`` queries.

    Raises
    ------
    NotIdentifiableError
        H does not divide d_out.
    ModelMismatchError
        As :func:`split_values`: another number of heads, or heads whose output subspaces do
        not fill d_out.
    """
    d, d_out = V_sum.shape
    H = int(n_heads)
    if d_out % H:
        raise NotIdentifiableError(
            f"splitting the value maps by their outputs needs heads whose output subspaces "
            f"fill d_out: H = {H} dividing d_out = {d_out}")
    E = _split(oracle, lambda o, b: o - beta - b @ V_sum, V_sum, H, rng, tols)
    return np.einsum("do,hoe->hde", V_sum, E), E


def _split(oracle, read, embed, H: int, rng, tols: SplitTolerances = EXACT) -> np.ndarray:
    """The heads' projectors (H, dim, dim) in the coordinates ``read`` gives (of dimension
    dim, H dh; ``embed`` (d, dim) maps a key difference to them): one line's bisection, the
    jumps of nearby differences at its separators, and their refinement (:func:`_refine`)."""
    d, dim = embed.shape
    dh = dim // H
    D0 = rng.standard_normal(d) / np.sqrt(d)
    Dj = rng.standard_normal((dh, d)) / np.sqrt(d)
    Deltas = np.concatenate([D0[None], D0 + tols.perturb * Dj])
    counts, moved = [], []
    for _ in range(1 + RETRIES):
        b0, v = _line(rng, d)
        J, iv = _scan(oracle, read, D0, b0, v, H, tols.change)
        counts.append(J.shape[0])
        if J.shape[0] != H:
            continue
        seps = np.concatenate([[-LINE_HALF], (iv[1:, 0] + iv[:-1, 1]) / 2, [LINE_HALF]])
        S = seps.size
        g = _parts(oracle, read, np.tile(b0 + seps[:, None] * v, (dh + 1, 1)),
                   np.repeat(Deltas, S, axis=0)).reshape(dh + 1, S, dim)
        P = np.diff(g, axis=1)  # (dh + 1, H, dim): jump k of each difference
        unit = float(np.max(np.abs(P[0])))
        shift = float(np.max(np.abs(P[1:] - P[0]))) / unit
        moved.append(shift)
        if shift <= tols.moved:
            break
    else:
        if counts[-1] != H or not moved:
            raise ModelMismatchError(
                f"lines of saturated two-token queries cross {min(counts)} to {max(counts)} "
                f"heads' switches ({1 + RETRIES} lines) where n_heads={H} was declared: the "
                "box has another number of heads, or answers that do not saturate (soft-capped "
                "logits)", error=float(max(counts)), allowed=float(H))
        raise ModelMismatchError(
            f"the jumps of nearby key differences differ by {min(moved):.3g} of a jump "
            f"({1 + RETRIES} lines; at most {tols.moved:g} expected): the box is not a layer "
            f"of n_heads={H} heads that fill d (another number of heads, or heads that do not "
            "fill d)", error=min(moved), allowed=tols.moved)
    parts = np.concatenate([P[:1], (P[1:] - P[0]) / tols.perturb])  # (dh + 1, H, dim)
    exact = _refine(oracle, read, embed, np.concatenate([D0[None], Dj]),
                    _projectors(parts, dh, tols.match), rng, tols.moved, tols.refine)
    if tols.spread > 1:  # fresh differences, their patterns read by the refined projectors
        fresh = rng.standard_normal(((tols.spread - 1) * (dh + 1), d)) / np.sqrt(d)
        exact = np.concatenate([exact, _refine(oracle, read, embed, fresh,
                                               _projectors(exact, dh, tols.match), rng,
                                               tols.moved, tols.refine)])
    return _from_bases([_basis(exact[:, k], dh, tols.match) for k in range(H)], dh)


def _refine(oracle, read, embed, D: np.ndarray, E: np.ndarray, rng,
            moved: float = MOVED_TOL, factor: int = 1) -> np.ndarray:
    """The exact parts (k, H, dim) of the differences D (k, d), from approximate projectors E
    (H, dim, dim) (``embed`` (d, dim) maps a difference to the coordinates).

    The perturbed parts carry the error of the division by PERTURB (times the projectors'
    norms); at random points b the saturated answers of ``[b + T D; b]`` are 0/1 combinations
    of D's exact parts, whose pattern E reads; a least squares over the patterns gives them.
    A difference whose patterns do not yet determine its H parts (a head whose weight did not
    flip between the points) is asked at fresh points, up to :data:`RETRIES` times."""
    H, dim, d = E.shape[0], E.shape[1], D.shape[1]
    n = factor * (REFINE_SHARE * H + REFINE_EXTRA)
    approx = np.einsum("jd,hde->jhe", D @ embed, E)  # (k, H, dim)
    g_all = [np.zeros((0, dim)) for _ in range(D.shape[0])]
    S_all = [np.zeros((0, H)) for _ in range(D.shape[0])]
    todo = np.arange(D.shape[0])
    for _ in range(1 + RETRIES):
        b = rng.standard_normal((todo.size * n, d)) * (REFINE_NORM / np.sqrt(d))
        g = _parts(oracle, read, b, np.repeat(D[todo], n, axis=0)).reshape(todo.size, n, dim)
        seen = np.einsum("jnd,hde->jnhe", g, E)
        a = approx[todo]
        sig = np.einsum("jnhe,jhe->jnh", seen, a) / np.einsum("jhe,jhe->jh", a, a)[:, None]
        S = np.round(sig)
        off = float(np.max(np.abs(sig - S)))
        if off > moved or np.any((S != 0) & (S != 1)):
            raise ModelMismatchError(
                f"saturated answers are no 0/1 combinations of the heads' parts (off by "
                f"{off:.3g}): the box is not a layer of n_heads={H} heads that fill d (another "
                "number of heads, or heads that do not fill d)", error=off, allowed=moved)
        for i, j in enumerate(todo):
            g_all[j] = np.concatenate([g_all[j], g[i]])
            S_all[j] = np.concatenate([S_all[j], S[i]])
        todo = np.array([j for j in todo if np.linalg.matrix_rank(S_all[j]) < H], dtype=int)
        if todo.size == 0:
            break
    else:
        raise ModelMismatchError(
            f"a head's weight did not flip at {(1 + RETRIES) * n} random points: the box is "
            f"not a layer of n_heads={H} heads that fill d", error=float(todo.size), allowed=0.0)
    return np.stack([np.linalg.lstsq(S_all[j], g_all[j], rcond=None)[0]
                     for j in range(D.shape[0])])


def _basis(parts: np.ndarray, dh: int, match: float = MATCH_TOL) -> np.ndarray:
    """An orthonormal basis (d, dh) of one head's parts (k, d); raises ModelMismatchError when
    they span more than dh dimensions."""
    U, sv, _ = np.linalg.svd(parts.T, full_matrices=False)
    if sv[dh] > match * sv[0]:
        raise ModelMismatchError(
            f"a head's parts span more than d / H = {dh} dimensions: the heads do not "
            "fill d as declared (another number of heads, or heads that do not fill d)",
            error=float(sv[dh] / sv[0]), allowed=match)
    return U[:, :dh]


def _from_bases(bases, dh: int) -> np.ndarray:
    """The projectors E_h (H, d, d), ``x^T E_h`` in head h's subspace, from the heads' bases:
    ``E_h = (B S_h B^-1)^T``, S_h selecting head h's columns of B."""
    B = np.concatenate(bases, axis=1)
    Binv = np.linalg.inv(B) if B.shape[0] == B.shape[1] else np.linalg.pinv(B)
    return np.stack([(B[:, h * dh:(h + 1) * dh] @ Binv[h * dh:(h + 1) * dh]).T
                     for h in range(len(bases))])


def _projectors(parts: np.ndarray, dh: int, match: float = MATCH_TOL) -> np.ndarray:
    """The projectors (H, d, d) from every head's parts (k, H, d)."""
    return _from_bases([_basis(parts[:, k], dh, match) for k in range(parts.shape[1])], dh)


def values_from_parts(oracle, V: np.ndarray, beta: np.ndarray, rng: np.random.Generator,
                      tols: SplitTolerances = EXACT) -> np.ndarray:
    """The heads' value maps (H, d, d_out) read again from the exact parts of d key differences,
    given approximate maps V (the split's) that tell each answer's 0/1 pattern.

    The query ``[T Delta; b_1; ..; b_m]`` (m = ``REFINE_SHARE H + REFINE_EXTRA``) answers, in
    the row of each token b_i, ``T sum_h sigma_hi Delta^T V_h`` plus the offset and values of
    the b's (norm :data:`REFINE_NORM`, 1e-8 of the parts after dividing by T): every token's
    outputs give one difference's refinement (:func:`_refine`'s random points) in one query.
    The patterns ``sigma_i`` are the least-squares combination of the approximate parts
    ``Delta^T V_h`` rounded to 0/1; the exact parts are the least squares over the patterns,
    and ``V_h`` solves ``D V_h = P_h`` over d orthonormal differences D (no projector, no
    ``V_sum``). The differences ``T Delta`` are sent as float32 values, so that a box rounding
    its input to float32 sees the D solved with. A difference whose patterns do not yet
    determine its H parts (a head whose weight did not flip) is asked again at fresh points,
    its answers replaced, up to :data:`RETRIES` times.

    Raises
    ------
    ModelMismatchError
        The answers are no 0/1 combinations of the approximate parts (off by more than
        ``tols.moved``), or a head's weight did not flip over every try.
    """
    H, d, d_out = V.shape
    m = tols.refine * (REFINE_SHARE * H + REFINE_EXTRA)
    TD = (KEY_SCALE * np.linalg.qr(rng.standard_normal((d, d)))[0]).astype(np.float32)
    D = TD.astype(np.float64) / KEY_SCALE
    pinv = np.linalg.pinv(np.einsum("kd,hdo->kho", D, V))  # (d, d_out, H)
    g, S = np.empty((d, m + 1, d_out)), np.empty((d, m + 1, H))
    todo = np.arange(d)
    for _ in range(1 + RETRIES):  # a difference whose patterns miss a head: fresh points
        b = rng.standard_normal((todo.size, m, d)) * (REFINE_NORM / np.sqrt(d))
        X = np.concatenate([TD[todo, None].astype(np.float64), b], axis=1)
        g[todo] = (np.asarray(oracle(X), dtype=np.float64) - beta) / KEY_SCALE
        sig = g[todo] @ pinv[todo]
        S[todo] = np.clip(np.round(sig), 0, 1)
        off = float(np.max(np.abs(sig - S[todo])))
        if off > tols.moved:
            raise ModelMismatchError(
                f"saturated answers are no 0/1 combinations of the heads' parts (off by "
                f"{off:.3g}): the box is not a layer of n_heads={H} heads that fill d (another "
                "number of heads, or heads that do not fill d)", error=off, allowed=tols.moved)
        todo = np.flatnonzero(np.linalg.matrix_rank(S) < H)
        if todo.size == 0:
            break
    else:
        raise ModelMismatchError(
            f"a head's weight did not flip at {m + 1} random points, {1 + RETRIES} times: the "
            f"box is not a layer of n_heads={H} heads that fill d", error=float(todo.size),
            allowed=0.0)
    P = np.linalg.pinv(S) @ g  # (d, H, d_out): each difference's parts, least squares
    return np.linalg.solve(D, P.reshape(d, H * d_out)).reshape(d, H, d_out).transpose(1, 0, 2)
