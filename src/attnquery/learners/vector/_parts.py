"""A key difference's parts, for the split of :mod:`._split`: the split's tolerances
(:class:`SplitTolerances`, :data:`EXACT`, :data:`ROWS`), the queries that read a difference's
parts at points b (:func:`_parts`, every token's outputs as rows: :func:`_ask_rows`), their
refinement in a narrow format (:func:`_star_points`, :func:`_star`, :func:`_settle`,
:func:`_refine`, :func:`_consistent`) and the projectors the parts give (:func:`_projectors`).
:mod:`._split`'s docstring gives the method."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...errors import ModelMismatchError

__all__ = ["KEY_SCALE", "ROW_KEY_SCALE", "LINE_HALF", "LEVELS", "PERTURB", "SplitTolerances",
           "EXACT", "ROWS"]

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

#: random points b per key difference of the refinement (times n_heads, plus REFINE_EXTRA): their
#: saturated answers are 0/1 combinations of the difference's H parts, which need H
#: independent patterns
REFINE_SHARE = 2
REFINE_EXTRA = 4


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

