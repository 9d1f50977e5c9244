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

A narrow format (float16, bfloat16; :class:`SplitTolerances` of the served route) holds no
T of 1e10: with T of a few hundred or less a crossing has a width (about
``10 / (T |Delta^T W_h v|)`` in s), a jump divided by a small eps is lost in the rounding, and
a few random points lie near a crossing. Then the bisection stops at intervals wider than a
crossing and takes contiguous changing intervals as one (``merge``), uses a line only where
``Delta_0``'s jumps hold at random points (:func:`_star_points`; a fresh ``Delta_0`` every
:data:`LINES_PER_DIFFERENCE` lines), reads the perturbed differences' parts at those points
from ``Delta_0``'s patterns (``star``, :func:`_star`: eps 0.1, not 1e-5), reads every
difference's patterns again against its own parts (:func:`_settle`), leaves out points whose
patterns are not 0/1 and differences whose parts do not fit (``drop``, :func:`_consistent`),
and solves the projectors by least squares over the refined differences
(``solve_projectors``).

Every token's outputs (``rows``, :data:`ROWS`) let one query carry many points: in
``[T Delta; b_1; ..; b_m]`` the row of each token b_i answers ``T sum_h sigma_hi Delta^T V_h``
plus a mixture of the b's values (a head whose weight is not on ``T Delta`` spreads it over
the b's), which is ``|b| / T`` of a part: one query per key difference (the separators, the
refinement's points) and one per bisection level, where two-token queries ask one per point.
T is then 1e16 (the mixture 1e-13 of a part at points of norm 1e3), and the perturbed
differences, asked at the same points, carry the same mixture, which their subtraction
cancels.

This module scans the lines and splits (:func:`split_values`, :func:`split_outputs`,
:func:`values_from_parts`); the tolerances, the queries that read a difference's parts, their
refinement and the projectors are :mod:`._parts`'s.
"""

from __future__ import annotations

import numpy as np

from ...errors import ModelMismatchError, NotIdentifiableError
from ._parts import (
    APPROX_MATCH,
    EXACT,
    EXTRA_LEVELS,
    KEY_SCALE,
    LEVELS,
    LINE_HALF,
    PERTURB,
    RANK_RTOL,
    REFINE_EXTRA,
    REFINE_NORM,
    REFINE_SHARE,
    RETRIES,
    ROW_KEY_SCALE,
    ROWS,
    SplitTolerances,
    _ask_rows,
    _basis,
    _consistent,
    _from_bases,
    _key_tokens,
    _parts,
    _projectors,
    _refine,
    _star,
    _star_points,
)

__all__ = ["split_values", "split_outputs", "split_queries", "scan_queries_per_line",
           "values_from_parts", "KEY_SCALE", "ROW_KEY_SCALE", "LINE_HALF", "LEVELS", "PERTURB",
           "SplitTolerances", "EXACT", "ROWS"]


def scan_queries_per_line(n_heads: int, levels: int = LEVELS, merge: bool = False,
                          rows: bool = False) -> int:
    """Queries one line's bisection asks at most: its two ends and, per level (of ``levels``),
    the midpoints of at most ``n_heads`` intervals (those holding a jump; with ``merge``,
    ``4 n_heads``: runs of contiguous intervals, at most ``2 n_heads`` of two each); with
    ``rows``, one query for the ends and one per level (and one more, the last)."""
    if rows:
        return 2 + levels
    return 2 + levels * n_heads * (4 if merge else 1)


def split_queries(d: int, n_heads: int, tols: SplitTolerances = EXACT) -> int:
    """Queries :func:`split_values` asks at most (every line retried)."""
    dh = d // n_heads
    points = 1 if tols.rows else tols.refine * (REFINE_SHARE * n_heads + REFINE_EXTRA)
    refine = (1 + RETRIES) * (tols.perturbed + tols.spread - 1) * (dh + 1) * points
    lines = 1 + (RETRIES if tols.retries is None else tols.retries)
    scan = scan_queries_per_line(n_heads, tols.levels, tols.merge, tols.rows)
    if tols.star:  # per line Delta_0 at its separators and random points; once the others
        points = tols.refine * (REFINE_SHARE * n_heads + REFINE_EXTRA)
        return (lines * (scan + n_heads + 1 + points)
                + (tols.perturbed * (dh + 1) - 1) * points + refine)
    separators = 1 if tols.rows else n_heads + 1
    parts = (1 + RETRIES) * d if tols.values_from_parts else 0
    return lines * (scan + tols.perturbed * (dh + 1) * separators) + refine + parts


def _scan(oracle, read, Delta, b0, v, n_heads,
          tols: SplitTolerances = EXACT) -> tuple[np.ndarray, np.ndarray]:
    """The jumps along the line ``b0 + s v`` (s in ``[-tols.line_half, tols.line_half]``) for
    the key difference ``Delta``: bisection, one batch per level, until ``n_heads`` intervals
    hold a change (beyond ``tols.change``) each and :data:`EXTRA_LEVELS` more (or
    ``tols.levels`` in all).
    Returns the jumps (k, d) and their intervals (k, 2), in the order of s."""
    half = tols.line_half
    lo, hi = np.array([-half]), np.array([half])
    g = _parts(oracle, read, (b0 + np.array([[-half], [half]]) * v)[None], Delta[None],
               tols.key_scale, tols.rows)[0]
    glo, ghi = g[:1], g[1:]
    extra = EXTRA_LEVELS
    for _ in range(tols.levels + 1):
        keep = np.max(np.abs(ghi - glo), axis=1) > tols.change
        lo, hi, glo, ghi = lo[keep], hi[keep], glo[keep], ghi[keep]
        count = _runs(lo, hi).size if tols.merge else lo.size
        if count == n_heads:
            extra -= 1
        # each head crosses a line once: more changing intervals than heads (beyond a few
        # crossings split by a midpoint) mean answers that are not piecewise constant (logits
        # that do not saturate, such as soft-capped ones): stop before the intervals multiply
        if lo.size == 0 or extra < 0 or count > 2 * n_heads:
            break
        mid = (lo + hi) / 2
        gm = _parts(oracle, read, (b0 + mid[:, None] * v)[None], Delta[None],
                    tols.key_scale, tols.rows)[0]
        lo, hi = np.concatenate([lo, mid]), np.concatenate([mid, hi])
        glo, ghi = np.concatenate([glo, gm]), np.concatenate([gm, ghi])
    order = np.argsort(lo)
    J, iv = (ghi - glo)[order], np.stack([lo[order], hi[order]], axis=1)
    if tols.merge and len(iv):  # a run of contiguous intervals is one crossing: its changes add
        starts = _runs(iv[:, 0], iv[:, 1])
        J = np.add.reduceat(J, starts, axis=0)
        iv = np.stack([iv[starts, 0], iv[np.r_[starts[1:], len(iv)] - 1, 1]], axis=1)
    return J, iv


#: with ``SplitTolerances.star``, the key difference ``Delta_0`` (and its perturbations) is
#: drawn afresh after this many lines that gave no jumps to use (a float16 layer of 4 heads at
#: d = 32: one head crossed 9 lines of one ``Delta_0`` slowly, in 2 to 10 runs)
LINES_PER_DIFFERENCE = 3

#: with ``SplitTolerances.merge``, a line is used only where the gap between two neighbouring
#: crossings is at least ISOLATION times the wider one's run (a slow crossing, wide at a
#: moderate key scale, else reaches the separator between them)
ISOLATION = 2.0


def _isolated(iv: np.ndarray) -> bool:
    """Whether the crossings' runs iv (k, 2), in the order of s, are far enough apart for
    separators between them (:data:`ISOLATION`)."""
    widths = iv[:, 1] - iv[:, 0]
    gaps = iv[1:, 0] - iv[:-1, 1]
    return bool(np.all(gaps >= ISOLATION * np.maximum(widths[1:], widths[:-1])))


def _runs(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The first index of each run of contiguous intervals ``[lo, hi]`` (in the order of lo)."""
    order = np.argsort(lo)
    lo, hi = lo[order], hi[order]
    return np.flatnonzero(np.r_[True, lo[1:] != hi[:-1]]) if lo.size else np.zeros(0, int)


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
            f"the summed value map of rank d; the one-token answers give a map of rank {rank}"
            + ("" if d % H else f", and {H} does not divide {d}")
            + ": heads that do not fill d, or one-token answers that are not affine in the "
            "token (an operation after the attention, such as a normalisation of the "
            "outputs, that removes a direction)")
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
    H = heads_fill(d_out, n_heads)
    E = _split(oracle, lambda o, b: o - beta - b @ V_sum, V_sum, H, rng, tols)
    return np.einsum("do,hoe->hde", V_sum, E), E


def heads_fill(d_out: int, n_heads) -> int:
    """H, where the heads' output subspaces can fill d_out (H divides it), else
    NotIdentifiableError (the splits by outputs read no other layer)."""
    H = int(n_heads)
    if d_out % H:
        raise NotIdentifiableError(
            f"splitting the value maps by their outputs needs heads whose output subspaces "
            f"fill d_out: H = {H} dividing d_out = {d_out}")
    return H


def _split(oracle, read, embed, H: int, rng, tols: SplitTolerances = EXACT) -> np.ndarray:
    """The heads' projectors (H, dim, dim) in the coordinates ``read`` gives (of dimension
    dim, H dh; ``embed`` (d, dim) maps a key difference to them): one line's bisection, the
    jumps of nearby differences at its separators, and their refinement (:func:`_refine`)."""
    d, dim = embed.shape
    dh = dim // H
    counts, moved, refused, smallest = [], [], None, 1.0
    retries = RETRIES if tols.retries is None else tols.retries
    for i in range(1 + retries):
        # the key differences; with star fresh ones every LINES_PER_DIFFERENCE lines: a head
        # nearly flat along Delta_0 (small W_h^T Delta_0) crosses every line slowly
        if i == 0 or (tols.star and i % LINES_PER_DIFFERENCE == 0):
            D0 = rng.standard_normal(d) / np.sqrt(d)
            Dj = rng.standard_normal((tols.perturbed * (dh + 1) - 1, d)) / np.sqrt(d)
            Deltas = np.concatenate([D0[None], D0 + tols.perturb * Dj])
        b0, v = _line(rng, d)
        b0 = tols.line_norm * b0
        J, iv = _scan(oracle, read, D0, b0, v, H, tols)
        counts.append(J.shape[0])
        sizes = np.max(np.abs(J), axis=1) if len(J) else np.zeros(1)
        smallest = min(smallest, float(np.min(sizes) / max(np.max(sizes), np.finfo(float).tiny)))
        # with star the separators need only stand outside Delta_0's runs: its jumps are
        # checked, and read again, at random points (:func:`_star_points`)
        if J.shape[0] != H or (tols.merge and not tols.star and not _isolated(iv)):
            continue
        seps = np.concatenate([[-tols.line_half], (iv[1:, 0] + iv[:-1, 1]) / 2,
                               [tols.line_half]])
        asked = Deltas[:1] if tols.star else Deltas
        points = b0 + seps[:, None] * v
        g = _parts(oracle, read, np.broadcast_to(points, (len(asked),) + points.shape), asked,
                   tols.key_scale, tols.rows)  # (k, separators, dim)
        P = np.diff(g, axis=1)  # (k, H, dim): jump k of each difference
        unit = float(np.max(np.abs(P[0])))
        shift = float(np.max(np.abs(P[1:] - P[0]))) / unit if len(P) > 1 else 0.0
        if tols.star:  # Delta_0's jumps checked at random points
            try:
                start = _star_points(oracle, read, P[0], D0, rng, tols)
            except ModelMismatchError as e:
                refused = e
                continue
        moved.append(shift)
        if shift <= tols.moved:
            break
    else:
        if refused is not None and not moved:
            raise refused
        if counts[-1] != H or not moved:
            raise ModelMismatchError(
                f"the saturated answers along {1 + retries} lines change at {min(counts)} to "
                f"{max(counts)} places where n_heads={H} switches were declared, the smallest "
                f"change {smallest:.2g} of the largest (a head's switch changes the answer by "
                "a whole part): the box has another number of heads, or its answers are not "
                "piecewise constant along a line (noise in the answers, or logits that do not "
                "saturate, such as soft-capped ones)", error=float(max(counts)),
                allowed=float(H))
        raise ModelMismatchError(
            f"the jumps of nearby key differences differ by {min(moved):.3g} of a jump "
            f"({1 + retries} lines; at most {tols.moved:g} expected): the box is not a layer "
            f"of n_heads={H} heads that fill d (another number of heads, or heads that do not "
            "fill d)", error=min(moved), allowed=tols.moved)
    if tols.star:  # the perturbed differences' parts at Delta_0's points (:func:`_star`)
        P = _star(oracle, read, start, Deltas, tols)
    parts = np.concatenate([P[:1], (P[1:] - P[0]) / tols.perturb])  # (k, H, dim)
    D = np.concatenate([D0[None], Dj])
    exact, read_ok = _refine(oracle, read, embed, D,
                             _projectors(parts, dh, max(tols.match, APPROX_MATCH)), rng, tols)
    exact, D = _consistent(exact, D[read_ok], dh, tols)
    if tols.spread > 1:  # fresh differences, their patterns read by the refined projectors
        fresh = rng.standard_normal(((tols.spread - 1) * (dh + 1), d)) / np.sqrt(d)
        more, read_ok = _refine(oracle, read, embed, fresh, _projectors(exact, dh, tols.match),
                                rng, tols)
        exact, D = _consistent(np.concatenate([exact, more]),
                               np.concatenate([D, fresh[read_ok]]), dh, tols)
    E = _from_bases([_basis(exact[:, k], dh, tols.match) for k in range(H)], dh)
    if tols.solve_projectors and D.shape[0] >= dim:  # (D embed) E_h = the parts of head h
        E = np.linalg.lstsq(D @ embed, exact.reshape(len(D), H * dim),
                            rcond=None)[0].reshape(dim, H, dim).transpose(1, 0, 2)
    return E


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
    ``V_sum``). The differences ``T Delta`` are sent as float32 values (:func:`_ask_rows`), so
    that a box rounding its input to float32 sees the D solved with. A difference whose
    patterns do not yet determine its H parts (a head whose weight did not flip) is asked
    again at fresh points, its answers replaced, up to :data:`RETRIES` times.

    Raises
    ------
    ModelMismatchError
        The answers are no 0/1 combinations of the approximate parts (off by more than
        ``tols.moved``), or a head's weight did not flip over every try.
    """
    H, d, d_out = V.shape
    m = tols.refine * (REFINE_SHARE * H + REFINE_EXTRA)
    Q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    D = _key_tokens(Q, KEY_SCALE, float32=True) / KEY_SCALE  # the differences the box sees
    pinv = np.linalg.pinv(np.einsum("kd,hdo->kho", D, V))  # (d, d_out, H)
    g, S = np.empty((d, m + 1, d_out)), np.empty((d, m + 1, H))
    todo = np.arange(d)
    for _ in range(1 + RETRIES):  # a difference whose patterns miss a head: fresh points
        b = rng.standard_normal((todo.size, m, d)) * (REFINE_NORM / np.sqrt(d))
        o = _ask_rows(oracle, Q[todo], b, KEY_SCALE, first=True, float32=True)
        g[todo] = (o - beta) / KEY_SCALE
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
