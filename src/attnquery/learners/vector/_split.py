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
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...errors import ModelMismatchError, NotIdentifiableError

__all__ = ["split_values", "split_outputs", "split_queries", "scan_queries_per_line",
           "values_from_parts", "KEY_SCALE", "ROW_KEY_SCALE", "LINE_HALF", "LEVELS", "PERTURB",
           "SplitTolerances", "EXACT", "ROWS"]

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
#: ... and the approximate parts of the perturbed differences (divided by :data:`PERTURB`: exact
#: to about 1e-16 / PERTURB, times the answers' scale) to this, where ``match`` is tighter:
#: their projectors only read the refinement's 0/1 patterns, and the exact parts are held to
#: ``match``. A float64 layer of 8 heads of 4 at d = 32 (the study's generic_h8 case, seed 0 of
#: the bench) was refused at 1.1e-8
APPROX_MATCH = 1e-6
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

#: norm of the refinement's random points: far from the origin, ``W_h b`` outweighs the key bias
#: and every head's weight flips between the points (at norm 1 and d = 64, some heads' did not)
REFINE_NORM = 100.0


class SplitTolerances(NamedTuple):
    """The split's tolerances: :data:`CHANGE_TOL`, :data:`MATCH_TOL`, :data:`MOVED_TOL` and
    :data:`PERTURB` for answers exact to float64 (:data:`EXACT`), and ``refine``, the factor
    on the refinement's random points (:data:`REFINE_SHARE`, :data:`REFINE_EXTRA`); the served
    route passes its format's (:mod:`~attnquery.learners.vector.served`)."""

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
    #: the key difference's scale T (:data:`KEY_SCALE`), the lines' half extent
    #: (:data:`LINE_HALF`), the refinement's points' norm (:data:`REFINE_NORM`) and the
    #: bisection's levels (:data:`LEVELS`): a narrow format's answers need a T whose tokens it
    #: holds (float16: below 65504), so that the crossings have a width (in s, about
    #: ``1 / (T |Delta^T W_h v|)``) the bisection must not resolve
    key_scale: float = KEY_SCALE
    line_half: float = LINE_HALF
    refine_norm: float = REFINE_NORM
    levels: int = LEVELS
    #: the norm of the line's point b0 (1): the crossings lie about that far from it (in s),
    #: their spacing in logits about ``key_scale line_norm``
    line_norm: float = 1.0
    #: fresh lines tried after the first (None: :data:`RETRIES`): at a moderate key scale a line
    #: misses a crossing beyond its end, or merges two, more often
    retries: int | None = None
    #: the separators are asked for ``perturbed (dh + 1)`` key differences (``Delta_0`` and
    #: its perturbations): their approximate parts are divided by ``perturb``, which a narrow
    #: format's rounding (float16: 5e-4 / 5e-2) leaves at about 1e-2; a head's basis from
    #: ``dh + 1`` of them is then lost in it (its smallest singular value about 2e-2), from
    #: three times as many it is not (about 0.4)
    perturbed: int = 1
    #: crossings of a finite width (a moderate ``key_scale``) span neighbouring bisection
    #: intervals: with ``merge``, a run of contiguous changing intervals is one jump (and the
    #: bisection stops at more than twice ``n_heads`` runs, not intervals)
    merge: bool = False
    #: the share of the refinement's points that may be left out as not saturated (their
    #: patterns off by more than ``moved``; then also those whose residual is an outlier),
    #: and with ``star`` the share of refined differences left out as not fitting
    #: (:func:`_consistent`)
    drop: float = 0.0
    #: read the perturbed differences' parts at ``Delta_0``'s random points (:func:`_star`:
    #: their patterns are mostly ``Delta_0``'s, read against its parts) rather than at the
    #: line's separators: their crossings then need not stay between the separators, and
    #: ``perturb`` may be large enough (5e-2 or more) for a narrow format's rounding
    star: bool = False
    #: the projectors as the least squares ``(D embed) E_h = P_h`` over the refined key
    #: differences D and head h's exact parts P_h (where they number at least the parts'
    #: dimension), rather than from the heads' bases, whose inverse amplifies the parts'
    #: rounding by the angles between the heads' subspaces (float16, d = 32, 2 heads: V 14
    #: floors from the bases); the bases still check that each head's parts span d / H
    #: dimensions
    solve_projectors: bool = False
    #: ask the points of one key difference as the rows of one query ``[T Delta; b_1; ..]``
    #: (every token's outputs; see the module docstring), not one two-token query each
    rows: bool = False
    #: read every head's value map again from the exact parts of d orthogonal key differences
    #: (:func:`values_from_parts`; every token's outputs only), rather than cutting ``V_sum``
    #: along the projectors, which amplify its one-token estimate's rounding (float32, d = 384,
    #: 12 heads: V 1.2e-6 to 5.9e-5)
    values_from_parts: bool = False


#: the tolerances for answers exact to float64
EXACT = SplitTolerances()
#: the key scale of :data:`ROWS`: a row's mixture of the other points' values is ``|b| / T``
#: of a part (1e-13 at the lines' ends, norm 1e3; at 1e14 the layers' W were read to about
#: 1e-10, at 1e16 to about 1e-12, as by two-token queries)
ROW_KEY_SCALE = 1e16
#: the tolerances for every token's outputs exact to float64: the points of a key difference
#: asked as the rows of one query
ROWS = EXACT._replace(rows=True, key_scale=ROW_KEY_SCALE)


def scan_queries_per_line(n_heads: int, levels: int = LEVELS, merge: bool = False,
                          rows: bool = False) -> int:
    """Queries one line's bisection asks at most: its two ends and, per level (of ``levels``),
    the midpoints of at most ``n_heads`` intervals (those holding a jump; with ``merge``,
    ``4 n_heads``: runs of contiguous intervals, at most ``2 n_heads`` of two each); with
    ``rows``, one query for the ends and one per level (and one more, the last)."""
    if rows:
        return 2 + levels
    return 2 + levels * n_heads * (4 if merge else 1)


#: random points b per key difference of the refinement (times n_heads, plus REFINE_EXTRA): their
#: saturated answers are 0/1 combinations of the difference's H parts, which need H
#: independent patterns
REFINE_SHARE = 2
REFINE_EXTRA = 4


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


def _key_tokens(Delta: np.ndarray, key_scale: float, float32: bool = False) -> np.ndarray:
    """The first tokens ``T Delta`` (k, d) of row queries (T = ``key_scale``); with
    ``float32`` rounded to float32 values (in float64), which a box rounding its input to
    float32 takes unchanged."""
    TD = key_scale * Delta
    return TD.astype(np.float32).astype(np.float64) if float32 else TD


def _ask_rows(oracle, Delta: np.ndarray, b: np.ndarray, key_scale: float,
              first: bool = False, float32: bool = False) -> np.ndarray:
    """Every token's answers (k, m, d_out) to the row queries ``[T Delta_j; b_j1; ..; b_jm]``,
    one per key difference ``Delta_j`` (Delta (k, d), the points b (k, m, d); T =
    ``key_scale``; see the module docstring): the rows of the b's, with ``first`` also the
    first token's (k, m + 1, d_out). With ``float32`` the first tokens are sent as float32
    values (:func:`_key_tokens`)."""
    X = np.concatenate([_key_tokens(Delta, key_scale, float32)[:, None], b], axis=1)
    o = np.asarray(oracle(X), dtype=np.float64)
    return o if first else o[:, 1:]


def _parts(oracle, read, b, Delta, key_scale: float = KEY_SCALE,
           rows: bool = False) -> np.ndarray:
    """``sum_h sigma_h Delta_j^T E_h`` (k, m, dim) at the points b (k, m, d) of each key
    difference ``Delta_j`` (Delta (k, d)): the queries ``[b + T Delta_j; b]`` (T =
    ``key_scale``), one per point, in the coordinates ``read(o, b)`` gives the last token's
    answers o (the answer less ``b``'s own value and the offset). With ``rows``, one query
    ``[T Delta_j; b_j1; ..; b_jm]`` per difference (:func:`_ask_rows`), read at its b rows."""
    k, m, d = b.shape
    if rows:
        o = _ask_rows(oracle, Delta, b, key_scale)
    else:
        X = np.stack([b + key_scale * Delta[:, None], np.broadcast_to(b, (k, m, d))], axis=2)
        o = np.asarray(oracle(X.reshape(k * m, 2, d)), dtype=np.float64)
        o = o[:, -1] if o.ndim == 3 else o
    return (read(o.reshape(k * m, -1), b.reshape(k * m, d)) / key_scale).reshape(k, m, -1)


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


def _star_points(oracle, read, P0: np.ndarray, D0: np.ndarray, rng, tols: SplitTolerances):
    """``Delta_0``'s answers at the random points of :func:`_star` and their patterns: the
    points b (n, d), the answers (n, dim), the parts P0 (H, dim) signed as the patterns say,
    and the patterns (n, H) with which are kept.

    The patterns are read against the line's jumps P0, then again against the parts the kept
    ones give (:func:`_settle`): a line whose crossings lie close together has separators
    where a weight is not quite 0 or 1, and jumps off by a few percent.

    Raises
    ------
    ModelMismatchError
        More points are off than ``tols.drop`` allows (the line's jumps are not the heads'
        parts: two crossings in one run and one beyond the line's end, or a box that is not
        such a layer), or the patterns do not tell the H parts apart (a head whose weight
        did not flip).
    """
    H = P0.shape[0]
    n = tols.refine * (REFINE_SHARE * H + REFINE_EXTRA)
    b = rng.standard_normal((n, D0.size)) * (tols.refine_norm / np.sqrt(D0.size))
    g0 = _parts(oracle, read, b[None], D0[None], tols.key_scale, tols.rows)[0]
    # a line's jump is +- a part (the weight rises or falls along it): the sign its patterns say
    sig = np.round(np.linalg.lstsq(P0.T, g0.T, rcond=None)[0])  # (H, n)
    P0 = P0 * np.where(np.sum(sig < 0, axis=1) > np.sum(sig > 0, axis=1), -1.0, 1.0)[:, None]
    S0, keep0 = _settle(g0, *_patterns(g0, P0, H, tols, check=False), H, tols)
    if np.mean(~keep0) > tols.drop:
        raise ModelMismatchError(
            f"saturated answers are no 0/1 combinations of the heads' parts (off at "
            f"{np.mean(~keep0):.3g} of the points, {tols.drop:g} allowed): the box is not a "
            f"layer of n_heads={H} heads that fill d (another number of heads, or heads that "
            "do not fill d)", error=float(np.mean(~keep0)), allowed=tols.drop)
    if np.linalg.matrix_rank(S0[keep0]) < H:
        raise ModelMismatchError(
            f"a head's weight did not flip at {n} random points: the box is not a layer of "
            f"n_heads={H} heads that fill d", error=float(np.mean(~keep0)), allowed=tols.drop)
    return b, g0, P0, S0, keep0


def _star(oracle, read, start, Deltas: np.ndarray, tols: SplitTolerances) -> np.ndarray:
    """The exact parts (k, H, dim) of the differences ``Deltas`` (k, d) read: ``Delta_0`` (the
    first), whose answers, parts and patterns at random points ``start`` holds
    (:func:`_star_points`), and its perturbations ``Delta_0 + perturb Delta_j``.

    Every perturbation is asked at the same random points b (norm ``tols.refine_norm``).
    A perturbed difference's patterns differ from ``Delta_0``'s only where b lies within
    about ``perturb`` (in angle) of a head's crossing, so a least squares over ``Delta_0``'s
    patterns, less the points whose residual is an outlier, gives its parts approximately, and
    its own patterns read against them the exact parts. Points whose patterns are off by more
    than ``tols.moved`` (not saturated) are left out; a perturbed difference off at more than
    the share ``tols.drop`` of them is left out (the parts of more than ``dim / H`` are
    needed: a head's basis).

    Raises
    ------
    ModelMismatchError
        Too few differences are read.
    """
    b, g0, _, S0, keep0 = start
    n, dim = g0.shape
    H = S0.shape[1]
    rest = _parts(oracle, read, np.broadcast_to(b, (len(Deltas) - 1, n, b.shape[1])),
                  Deltas[1:], tols.key_scale, tols.rows)
    g = np.concatenate([g0[None], rest])
    parts, lost = [], []
    for j in range(len(Deltas)):  # one batch asked; each difference's least squares
        S, keep = _settle(g[j], S0, keep0, H, tols)  # Delta_0's patterns first, then its own
        if j == 0 or np.mean(~keep) <= tols.drop:  # Delta_0's patterns passed above
            parts.append(_parts_lstsq(S[keep], g[j][keep], True))
        else:  # its patterns moved too far from Delta_0's (a head nearly flat along Delta_0)
            lost.append(float(np.mean(~keep)))
    if len(parts) <= dim // H:
        raise ModelMismatchError(
            f"saturated answers are no 0/1 combinations of the heads' parts ({len(lost)} of "
            f"{len(Deltas)} key differences off at more than {tols.drop:g} of the points): the "
            f"box is not a layer of n_heads={H} heads that fill d (another number of heads, or "
            "heads that do not fill d)", error=min(lost), allowed=tols.drop)
    return np.stack(parts)


#: :func:`_star` reads a perturbed difference's patterns against its parts this many times
#: (the first parts from ``Delta_0``'s patterns, off at some points), as does :func:`_refine`
#: in a narrow format (the first parts from the approximate projectors)
STAR_ROUNDS = 3


def _settle(g: np.ndarray, S: np.ndarray, keep: np.ndarray, H: int, tols: SplitTolerances):
    """The patterns (n, H) of the answers g (n, dim) and which are kept, read
    :data:`STAR_ROUNDS` times against the parts that the kept patterns S[keep] give (each
    round's parts fit more of the points: patterns first read against approximate parts are
    off where those parts are)."""
    for _ in range(STAR_ROUNDS):
        if np.linalg.matrix_rank(S[keep]) < H:
            break
        S, keep = _patterns(g, _parts_lstsq(S[keep], g[keep], True), H, tols, check=False)
    return S, keep


def _patterns(g: np.ndarray, P: np.ndarray, H: int, tols: SplitTolerances, check: bool):
    """The 0/1 patterns (n, H) of the answers g (n, dim) against the parts P (H, dim) (a least
    squares) and which of them are kept (off by at most ``tols.moved``); with ``check``, raises
    ModelMismatchError where more than the share ``tols.drop`` is off."""
    sig = np.linalg.lstsq(P.T, g.T, rcond=None)[0].T
    S = np.round(sig)
    offs = np.max(np.abs(sig - S), axis=1)
    keep = (offs <= tols.moved) & np.all((S == 0) | (S == 1), axis=1)
    if check and np.mean(~keep) > tols.drop:
        raise ModelMismatchError(
            f"saturated answers are no 0/1 combinations of the heads' parts (off by "
            f"{np.max(offs):.3g} at {np.mean(~keep):.3g} of the points, {tols.drop:g} allowed): "
            f"the box is not a layer of n_heads={H} heads that fill d (another number of "
            "heads, or heads that do not fill d)", error=float(np.max(offs)),
            allowed=tols.moved)
    return S, keep


def _refine(oracle, read, embed, D: np.ndarray, E: np.ndarray, rng,
            tols: SplitTolerances = EXACT) -> tuple[np.ndarray, np.ndarray]:
    """The exact parts (k, H, dim) of the differences D (k, d), from approximate projectors E
    (H, dim, dim) (``embed`` (d, dim) maps a difference to the coordinates), and which of the
    differences were read (k,) (all but in a narrow format, ``tols.star``).

    The perturbed parts carry the error of the division by PERTURB (times the projectors'
    norms); at random points b the saturated answers of ``[b + T D; b]`` are 0/1 combinations
    of D's exact parts, whose pattern E reads; a least squares over the patterns gives them.
    A difference whose patterns do not yet determine its H parts (a head whose weight did not
    flip between the points) is asked at fresh points, up to :data:`RETRIES` times. The
    points have norm ``tols.refine_norm``, the differences scale ``tols.key_scale``; with
    ``tols.drop``, up to that share of the points may show patterns off by more than
    ``tols.moved`` (a weight near a crossing: not saturated at a moderate key scale) and are
    left out, as are the points whose residual is an outlier (:func:`_parts_lstsq`).

    With ``tols.star`` each difference's patterns are read again against its own parts
    (:func:`_settle`: E reads them wrong where its approximate parts are off, at a third of
    the points for some differences of a float16 layer of 4 heads), and a difference still
    off at more than ``tols.drop`` of its points, or whose patterns do not determine its parts
    after the retries, is left out; more than ``dim / H`` must remain."""
    H, dim, d = E.shape[0], E.shape[1], D.shape[1]
    n = tols.refine * (REFINE_SHARE * H + REFINE_EXTRA)
    approx = np.einsum("jd,hde->jhe", D @ embed, E)  # (k, H, dim)
    g_all = [np.zeros((0, dim)) for _ in range(D.shape[0])]
    S_all = [np.zeros((0, H)) for _ in range(D.shape[0])]
    read_ok = np.ones(D.shape[0], dtype=bool)
    todo = np.arange(D.shape[0])
    off = 0.0
    for _ in range(1 + RETRIES):
        b = rng.standard_normal((todo.size, n, d)) * (tols.refine_norm / np.sqrt(d))
        g = _parts(oracle, read, b, D[todo], tols.key_scale, tols.rows)  # (todo, n, dim)
        seen = np.einsum("jnd,hde->jnhe", g, E)
        a = approx[todo]
        sig = np.einsum("jnhe,jhe->jnh", seen, a) / np.einsum("jhe,jhe->jh", a, a)[:, None]
        S = np.round(sig)
        offs = np.max(np.abs(sig - S), axis=2)  # (todo, n)
        bad = (offs > tols.moved) | np.any((S != 0) & (S != 1), axis=2)
        off = max(off, float(np.max(offs)))
        if tols.star:  # each difference's patterns read again against its own parts
            for i in range(todo.size):
                S[i], keep = _settle(g[i], S[i], ~bad[i], H, tols)
                bad[i] = ~keep
            lose = np.mean(bad, axis=1) > tols.drop
            read_ok[todo[lose]] = False
            bad[lose] = True
        elif np.mean(bad) > tols.drop:
            raise ModelMismatchError(
                f"saturated answers are no 0/1 combinations of the heads' parts (off by "
                f"{off:.3g} at {np.mean(bad):.3g} of the points, {tols.drop:g} allowed): the "
                f"box is not a layer of n_heads={H} heads that fill d (another number of "
                "heads, or heads that do not fill d)", error=off, allowed=tols.moved)
        for i, j in enumerate(todo):
            g_all[j] = np.concatenate([g_all[j], g[i][~bad[i]]])
            S_all[j] = np.concatenate([S_all[j], S[i][~bad[i]]])
        todo = np.array([j for j in todo if read_ok[j]
                         and np.linalg.matrix_rank(S_all[j]) < H], dtype=int)
        if todo.size == 0:
            break
    else:
        if not tols.star:
            raise ModelMismatchError(
                f"a head's weight did not flip at {(1 + RETRIES) * n} random points: the box "
                f"is not a layer of n_heads={H} heads that fill d", error=float(todo.size),
                allowed=0.0)
        read_ok[todo] = False
    if np.count_nonzero(read_ok) <= dim // H:
        raise ModelMismatchError(
            f"saturated answers are no 0/1 combinations of the heads' parts (off by {off:.3g}; "
            f"{np.count_nonzero(~read_ok)} of {D.shape[0]} key differences off at more than "
            f"{tols.drop:g} of the points): the box is not a layer of n_heads={H} heads that "
            "fill d (another number of heads, or heads that do not fill d)",
            error=float(np.mean(~read_ok)), allowed=tols.drop)
    parts = np.stack([_parts_lstsq(S_all[j], g_all[j], tols.drop > 0) if read_ok[j]
                      else np.zeros((H, dim)) for j in range(D.shape[0])])
    return parts[read_ok], read_ok


#: with ``SplitTolerances.drop``, a refinement point whose residual exceeds TRIM_UNITS times
#: the median residual is left out (a weight near its crossing, off by more than rounding)
TRIM_UNITS = 5.0


def _consistent(parts: np.ndarray, D: np.ndarray, dh: int, tols: SplitTolerances):
    """The refined parts (k, H, dim) and differences D (k, d) less those whose parts lie off
    their heads' subspaces (with ``tols.star``; else all): patterns read self-consistently
    but wrong (two heads' columns mixed, where the approximate projectors were poor) give
    parts off by a whole part, and a head's parts then span ``dh + 1`` dimensions. The
    difference without which the parts lie closest to ``dh`` dimensions (the worst head's
    singular value ``dh`` over its largest) is left out where that is :data:`TRIM_UNITS`
    times closer than with it, then the next, up to the share ``tols.drop`` of them."""
    if not tols.star:
        return parts, D

    def spread(idx):  # the worst head's singular value dh over its largest
        sv = np.linalg.svd(parts[idx].transpose(1, 2, 0), compute_uv=False)  # (H, min)
        return float(np.max(sv[:, dh] / sv[:, 0]))

    keep = np.ones(len(parts), dtype=bool)
    for _ in range(int(tols.drop * len(parts))):
        idx = np.flatnonzero(keep)
        if idx.size <= dh + 2:
            break
        without = [spread(idx[idx != j]) for j in idx]
        best = int(np.argmin(without))
        if spread(idx) <= TRIM_UNITS * without[best]:
            break
        keep[idx[best]] = False
    return parts[keep], D[keep]


def _parts_lstsq(S: np.ndarray, g: np.ndarray, trim: bool) -> np.ndarray:
    """The parts (H, dim) whose 0/1 combinations S (n, H) are the answers g (n, dim): least
    squares, with ``trim`` once more without the points whose residual is an outlier."""
    P = np.linalg.lstsq(S, g, rcond=None)[0]
    if trim:
        r = np.max(np.abs(g - S @ P), axis=1)
        keep = r <= TRIM_UNITS * np.median(r)
        if not keep.all() and np.linalg.matrix_rank(S[keep]) == S.shape[1]:
            P = np.linalg.lstsq(S[keep], g[keep], rcond=None)[0]
    return P


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
