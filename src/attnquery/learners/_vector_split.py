"""The heads' value maps of a layer from vector answers: splitting ``V_sum = sum_h V_h``.

One-token queries give ``x^T V_sum + beta`` only. When the heads fill d (``H dh = d`` and
``V_sum`` of rank d), the maps ``E_h`` with ``x^T V_h = x^T E_h V_sum`` are complementary
projectors: ``Delta^T = sum_h Delta^T E_h``, each part in head h's subspace ``U_h`` (dim dh).

A two-token query ``[b + T Delta; b]`` answers, at its last token,
``y = b^T + T sum_h sigma(T Delta^T (W_h b + c_h)) Delta^T E_h`` (in the coordinates
``(o - beta) V_sum^+``): with T huge every head's weight is 0 or 1 to the last bit, and along a
line ``b = b0 + s v`` head h's weight flips once, where ``Delta^T (W_h b + c_h)`` changes sign.
The answer is piecewise constant in s and each jump is one head's part ``+-Delta^T E_h``
exactly: bisection finds the H jumps of a line. The parts of ``Delta_0``, ``Delta_j`` and
``Delta_0 + Delta_j`` add up head by head (``E_h`` is linear), which tells which jump of
``Delta_j`` belongs to which head of ``Delta_0``; dh such ``Delta_j`` give a basis of every
``U_h``, hence the projectors and ``V_h = E_h V_sum``.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelMismatchError, NotIdentifiableError

__all__ = ["split_values", "scan_queries_per_line", "KEY_SCALE", "LINE_HALF", "LEVELS"]

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
#: a line that crosses another number of jumps than n_heads is scanned again along a fresh line
#: up to RETRIES times (at d = 16 with 8 heads, 2 of 12 fits met such a line without retries)
RETRIES = 2
#: a match of parts (Delta_0's + Delta_j's = (Delta_0 + Delta_j)'s) must hold to this
MATCH_TOL = 1e-8


def scan_queries_per_line(n_heads: int) -> int:
    """Queries one line's bisection asks: its two ends and, per level, the midpoints of at
    most ``n_heads`` intervals (those holding a jump)."""
    return 2 + LEVELS * n_heads


def _parts(oracle, Vp, beta, b, Delta) -> np.ndarray:
    """``sum_h sigma_h Delta^T E_h`` for the queries ``[b + T Delta; b]``, one per row."""
    X = np.stack([b + KEY_SCALE * Delta, b], axis=1)
    o = np.asarray(oracle(X), dtype=np.float64)
    o = o[:, -1] if o.ndim == 3 else o
    return ((o - beta) @ Vp - b) / KEY_SCALE


def _scan(oracle, Vp, beta, Deltas, b0, v) -> list[np.ndarray]:
    """The jumps along the lines ``b0[i] + s v[i]`` for every row i of ``Deltas`` (S, d): a list
    of S arrays (k, d). All lines are bisected together, one batch per level."""
    S = Deltas.shape[0]
    ends = np.concatenate([np.full(S, -LINE_HALF), np.full(S, LINE_HALF)])
    sid = np.concatenate([np.arange(S), np.arange(S)])
    g = _parts(oracle, Vp, beta, b0[sid] + ends[:, None] * v[sid], Deltas[sid])
    scan, lo, hi, glo, ghi = np.arange(S), ends[:S], ends[S:], g[:S], g[S:]
    keep = np.max(np.abs(ghi - glo), axis=1) > CHANGE_TOL
    scan, lo, hi, glo, ghi = scan[keep], lo[keep], hi[keep], glo[keep], ghi[keep]
    for _ in range(LEVELS):
        if scan.size == 0:
            break
        mid = (lo + hi) / 2
        gm = _parts(oracle, Vp, beta, b0[scan] + mid[:, None] * v[scan], Deltas[scan])
        scan = np.concatenate([scan, scan])
        lo, hi = np.concatenate([lo, mid]), np.concatenate([mid, hi])
        glo, ghi = np.concatenate([glo, gm]), np.concatenate([gm, ghi])
        keep = np.max(np.abs(ghi - glo), axis=1) > CHANGE_TOL
        scan, lo, hi, glo, ghi = scan[keep], lo[keep], hi[keep], glo[keep], ghi[keep]
    order = np.lexsort((lo, scan))
    scan, lo, hi, jump = scan[order], lo[order], hi[order], (ghi - glo)[order]
    # intervals that touch hold one jump split by a midpoint inside its crossing
    new = np.ones(scan.size, dtype=bool)
    new[1:] = (scan[1:] != scan[:-1]) | (lo[1:] != hi[:-1])
    starts = np.flatnonzero(new)
    jumps = np.add.reduceat(jump, starts, axis=0) if starts.size else jump
    owner = scan[starts]
    return [jumps[owner == s] for s in range(S)]


def _lines(rng: np.random.Generator, S: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """S random lines: points b0 of norm about 1 and unit directions v, each (S, d)."""
    b0 = rng.standard_normal((S, d)) / np.sqrt(d)
    v = rng.standard_normal((S, d))
    return b0, v / np.linalg.norm(v, axis=1, keepdims=True)


def _match(J0, Jj, Js, H: int, unit: float) -> np.ndarray:
    """For each head k of ``J0`` the index of ``Jj``'s part of the same head: the one with
    ``+-J0[k] +- Jj[i] = +-Js[m]`` for some m; -1 when no unique one matches."""
    out = np.full(H, -1)
    for k in range(H):
        err = np.full(H, np.inf)
        for i in range(H):
            for s1 in (1.0, -1.0):
                for s2 in (1.0, -1.0):
                    e = np.max(np.abs(J0[k] + s1 * Jj[i] - s2 * Js), axis=1).min()
                    err[i] = min(err[i], e)
        good = np.flatnonzero(err <= MATCH_TOL * unit)
        if good.size == 1:
            out[k] = good[0]
    return out


def split_values(oracle, V_sum: np.ndarray, beta: np.ndarray, n_heads: int,
                 rng: np.random.Generator) -> np.ndarray:
    """The heads' value-output maps (H, d, d_out) behind ``V_sum`` (see the module docstring).

    Asks ``(2 dh + 1) * scan_queries_per_line(H)`` queries at most, in ``LEVELS + 1``
    batches, and as many again for each line scanned again (at most :data:`RETRIES` times).

    Raises
    ------
    NotIdentifiableError
        ``V_sum`` has rank below d, or H does not divide d (the heads do not fill d: not
        split so far).
    ModelMismatchError
        A line shows another number of heads than ``n_heads``, or the parts do not add up
        head by head, or a head's parts span more than d / H dimensions.
    """
    d, d_out = V_sum.shape
    H = int(n_heads)
    s = np.linalg.svd(V_sum, compute_uv=False)
    rank = int(np.count_nonzero(s > RANK_RTOL * s[0]))
    if d % H or rank < d:
        raise NotIdentifiableError(
            f"splitting the value maps needs heads that fill d: H = {H} dividing d = {d} and "
            f"the summed value map of rank d (rank {rank})")
    dh = d // H
    Vp = np.linalg.pinv(V_sum)
    D0 = rng.standard_normal(d) / np.sqrt(d)
    Dj = rng.standard_normal((dh, d)) / np.sqrt(d)
    Deltas = np.concatenate([D0[None], Dj, D0 + Dj])
    J = _scan(oracle, Vp, beta, Deltas, *_lines(rng, Deltas.shape[0], d))
    for _ in range(RETRIES):  # a crossing beyond a line's end, or two crossings in one interval
        bad = [i for i, j in enumerate(J) if j.shape[0] != H]
        if not bad:
            break
        again = _scan(oracle, Vp, beta, Deltas[bad], *_lines(rng, len(bad), d))
        for i, j in zip(bad, again, strict=True):
            J[i] = j
    counts = [j.shape[0] for j in J]
    if any(c != H for c in counts):
        raise ModelMismatchError(
            f"lines of saturated two-token queries cross {min(counts)} to {max(counts)} heads' "
            f"switches (after {RETRIES} fresh lines) where n_heads={H} was declared: the box "
            "has another number of heads", error=float(max(counts)),
            allowed=float(H))
    unit = float(np.max(np.abs(J[0])))
    groups = [[J[0][k]] for k in range(H)]
    for j in range(dh):
        m = _match(J[0], J[1 + j], J[1 + dh + j], H, unit)
        if np.any(m < 0) or np.unique(m).size != H:
            raise ModelMismatchError(
                "the heads' parts of two key differences do not add up head by head: the box "
                "is not a layer of heads that fill d", error=1.0, allowed=MATCH_TOL)
        for k in range(H):
            groups[k].append(J[1 + j][m[k]])
    bases = []
    for g in groups:
        U, sv, _ = np.linalg.svd(np.array(g).T, full_matrices=False)
        if sv[dh] > MATCH_TOL * sv[0]:
            raise ModelMismatchError(
                f"a head's parts span more than d / H = {dh} dimensions: the heads do not "
                "fill d as declared", error=float(sv[dh] / sv[0]), allowed=MATCH_TOL)
        bases.append(U[:, :dh])
    B = np.concatenate(bases, axis=1)
    Binv = np.linalg.inv(B)
    # E_h = (B S_h B^-1)^T, S_h selecting head h's columns; V_h = E_h V_sum
    return np.stack([(B[:, h * dh:(h + 1) * dh] @ Binv[h * dh:(h + 1) * dh]).T @ V_sum
                     for h in range(H)])
