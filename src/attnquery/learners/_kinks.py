"""The FFN learner's kink search along lines (:class:`~attnquery.learners.ffn.
ReLUNetworkLearner`, step 1 of its method).

Along random lines ``p + t q`` and ``q + t p``, a grid of values is refined by bisection: an
interval whose midpoint lies on the chord is linear; a kink interval between two linear
neighbours is located exactly as the intersection of the neighbours' lines, and accepted when
the values at the kink and just beside it lie on those lines and both halves pass the chord
test (otherwise it is split). :func:`search_lines` runs the rounds under a frozen
:class:`SearchPlan` (the learner's parameters); ``f`` asks one batch of one-row queries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..errors import SearchLimitError

__all__ = ["SearchPlan", "Kink", "Interval", "Line", "Ask", "T_END", "W_MIN", "search_lines"]

#: the search along a line covers t in [-T_END, T_END]
T_END = 1.25
#: an interval narrower than this is given up (two kinks closer than rounding can resolve)
W_MIN = 2.5e-12

# interval states
UNKNOWN, LINEAR, NONLINEAR, SPLIT, KINK = "unknown", "linear", "nonlinear", "split", "kink"


@dataclass
class Kink:
    """A kink at ``t`` on a line: ``f(t)``, the slopes of ``f`` on both sides, and the radius
    of the neighbourhood in which ``f`` is linear on either side (set after the search)."""

    t: float
    f: float
    slope_left: float
    slope_right: float
    radius: float = float("nan")


@dataclass
class Interval:
    """A piece ``[l, r]`` of a line with ``f(l) = fl``, ``f(r) = fr`` and a search state."""

    l: float  # noqa: E741 - the interval's left end
    r: float
    fl: float
    fr: float
    state: str = UNKNOWN
    fmid: float = float("nan")  # f at the midpoint, once asked
    kink: Kink | None = None  # the candidate, in state KINK

    @property
    def mid(self) -> float:
        return 0.5 * (self.l + self.r)

    @property
    def width(self) -> float:
        return self.r - self.l

    @property
    def slope(self) -> float:
        return (self.fr - self.fl) / (self.r - self.l)

    def split(self, t: float, ft: float) -> list[Interval]:
        """The two halves at ``t`` (where ``f = ft``), both to be tested."""
        return [Interval(self.l, t, self.fl, ft), Interval(t, self.r, ft, self.fr)]


@dataclass
class Line:
    """The kink search along the line ``base + t dirn``."""

    base: np.ndarray
    dirn: np.ndarray
    tol: float
    intervals: list[Interval]
    kinks: list[Kink] = field(default_factory=list)
    pending: list[Kink] = field(default_factory=list)  # candidates whose halves are tested
    given_up: list[float] = field(default_factory=list)  # ends of the intervals given up
    lost: int = 0

    def point(self, t) -> np.ndarray:
        return self.base + np.asarray(t, dtype=float)[..., None] * self.dirn

    def n_open(self) -> int:
        return sum(1 for it in self.intervals if it.state != LINEAR)


@dataclass
class Ask:
    """Queries one interval needs this round: its midpoint, or a kink candidate's test."""

    line: Line
    interval: Interval
    ts: np.ndarray
    left: Interval | None = None  # the kink test's linear neighbours
    right: Interval | None = None


class SearchPlan(NamedTuple):
    """The learner's parameters the search reads (see :class:`~attnquery.learners.ffn.
    ReLUNetworkLearner`)."""

    n_line_pairs: int
    n_grid: int
    rtol: float
    max_rounds: int
    max_kinks: int


def search_lines(f, d: int, rng, plan: SearchPlan) -> tuple[list[Line], int]:
    """Find the kinks along ``2 n_line_pairs`` random lines (see the module docstring).
    Returns the lines and the rounds the search took."""
    lines = start_lines(f, d, rng, plan)
    n_rounds = 0
    for rnd in range(1, int(plan.max_rounds) + 1):
        n_rounds = rnd
        asks = [a for ln in lines for a in plan_asks(ln)]
        changed = [split_marked(ln) for ln in lines]
        if any(changed) or not asks:
            if any(changed):
                continue  # the partition moved: plan again, before asking anything
            break
        ask(f, asks)
        for ln in lines:
            confirm(ln)
            open_candidates(ln)
        check_open(lines, plan)
    else:
        if any(it.state != LINEAR for ln in lines for it in ln.intervals):
            raise SearchLimitError(
                f"the kink search along the lines is still open after max_rounds = "
                f"{plan.max_rounds} rounds: the answers are not piecewise linear at rtol = "
                f"{plan.rtol:g} (noise or lower precision than float64?)"
            )
    for ln in lines:
        set_radii(ln)
    return lines, n_rounds


def start_lines(f, d: int, rng, plan: SearchPlan) -> list[Line]:
    """The line pairs ``p + t q``, ``q + t p`` and their values on the initial grid."""
    L = 2 * int(plan.n_line_pairs)
    G = rng.standard_normal((L, d))
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    base = np.empty((L, d))
    dirn = np.empty((L, d))
    base[0::2], dirn[0::2] = G[0::2], G[1::2]
    base[1::2], dirn[1::2] = G[1::2], G[0::2]
    ts = np.linspace(-T_END, T_END, int(plan.n_grid) + 1)
    pts = base[:, None, :] + ts[None, :, None] * dirn[:, None, :]
    vals = f(pts.reshape(-1, d)).reshape(L, ts.size)
    lines = []
    for k in range(L):
        scale = float(np.max(np.abs(vals[k])))
        tol = plan.rtol * scale if scale > 0 else 1e-300
        ivs = [Interval(ts[j], ts[j + 1], vals[k, j], vals[k, j + 1])
               for j in range(ts.size - 1)]
        lines.append(Line(base[k], dirn[k], tol, ivs))
    return lines


def plan_asks(ln: Line) -> list[Ask]:
    """What each interval needs: a midpoint (unknown), a kink test (nonlinear between two
    linear neighbours, where their lines cross inside it), or a split (marked SPLIT)."""
    asks = []
    ivs = ln.intervals
    for k, it in enumerate(ivs):
        if it.state == UNKNOWN:
            asks.append(Ask(ln, it, np.array([it.mid])))
            continue
        if it.state != NONLINEAR:
            continue
        left = ivs[k - 1] if k > 0 else None
        right = ivs[k + 1] if k + 1 < len(ivs) else None
        if left is not None and right is not None and \
                left.state == LINEAR and right.state == LINEAR:
            t_star = crossing(it, left.slope, right.slope)
            if np.isfinite(t_star) and it.l < t_star < it.r:
                # t* is also checked just inside both pieces: two kinks on the same side
                # of t* would put one of these off its line
                eta = 1e-6 * it.width
                asks.append(Ask(ln, it, np.array([t_star, t_star - eta, t_star + eta]),
                                 left, right))
                continue
            it.state = SPLIT
        elif UNKNOWN in (getattr(left, "state", None), getattr(right, "state", None)):
            continue  # wait for the neighbour's test
        else:
            it.state = SPLIT
    return asks


def split_marked(ln: Line) -> bool:
    """Split every interval marked SPLIT at its midpoint (no query: f there is known); give
    up on one narrower than :data:`W_MIN`. Returns whether anything changed."""
    changed = False
    new = []
    for it in ln.intervals:
        if it.state != SPLIT:
            new.append(it)
            continue
        changed = True
        if it.width < W_MIN:
            ln.lost += 1
            ln.given_up += [it.l, it.r]
            new.append(Interval(it.l, it.r, it.fl, it.fr, LINEAR))
        else:
            new += it.split(it.mid, it.fmid)
    ln.intervals = new
    return changed


def ask(f, asks: list[Ask]) -> None:
    """One batch for every ask of the round, then the chord and kink tests."""
    sizes = np.array([a.ts.size for a in asks])
    P = np.concatenate([a.line.point(a.ts) for a in asks])
    for a, vals in zip(asks, np.split(f(P), np.cumsum(sizes)[:-1]), strict=True):
        it, tol = a.interval, a.line.tol
        if a.left is None:  # chord test
            it.fmid = vals[0]
            it.state = LINEAR if abs(vals[0] - 0.5 * (it.fl + it.fr)) <= tol else NONLINEAR
            continue
        # the neighbours' lines, through the interval's ends
        t, sl, sr = a.ts[0], a.left.slope, a.right.slope
        tt = np.array([a.ts[0], a.ts[1], a.ts[2], it.mid])
        got = np.array([vals[0], vals[1], vals[2], it.fmid])
        pred = np.where(tt <= t, it.fl + sl * (tt - it.l), it.fr + sr * (tt - it.r))
        pred[0] = it.fl + sl * (t - it.l)
        if np.all(np.abs(got - pred) <= tol):
            it.state = KINK
            it.kink = Kink(t, vals[0], sl, sr)
        else:
            it.state = SPLIT


def confirm(ln: Line) -> None:
    """A candidate whose halves both pass the chord test is a kink; if one fails, the
    interval held more than one kink and the candidate is dropped."""
    starting = {it.l: it.state for it in ln.intervals}
    ending = {it.r: it.state for it in ln.intervals}
    keep = []
    for cand in ln.pending:
        a, b = ending.get(cand.t), starting.get(cand.t)
        if a == LINEAR and b == LINEAR:
            ln.kinks.append(cand)
        elif UNKNOWN in (a, b):
            keep.append(cand)
    ln.pending = keep


def open_candidates(ln: Line) -> None:
    """Split each interval holding a new candidate at the candidate, to test both halves."""
    new = []
    for it in ln.intervals:
        if it.state == KINK:
            ln.pending.append(it.kink)
            new += it.split(it.kink.t, it.kink.f)
        else:
            new.append(it)
    ln.intervals = new


def check_open(lines: list[Line], plan: SearchPlan) -> None:
    """Stop when a line holds more open intervals than ``n_grid + 2 max_kinks``."""
    limit = int(plan.n_grid) + 2 * int(plan.max_kinks)
    worst = max(ln.n_open() for ln in lines)
    if worst > limit:
        raise SearchLimitError(
            f"a line holds {worst} unresolved intervals, more than n_grid + 2 max_kinks = "
            f"{limit}: the answers are not piecewise linear at rtol = {plan.rtol:g} (noise "
            "or lower precision than float64?), or the network is wider than max_kinks"
        )


def set_radii(ln: Line) -> None:
    """Each kink's neighbourhood: 0.4 times the distance to the nearest other kink, open
    interval, interval given up or end of the line (at most 0.1); f is linear on either
    side within it."""
    obst = [it.l for it in ln.intervals if it.state != LINEAR] + \
        [it.r for it in ln.intervals if it.state != LINEAR] + ln.given_up + [-T_END, T_END]
    obst = np.array(obst)
    kt = np.array([kk.t for kk in ln.kinks])
    for i, kk in enumerate(ln.kinks):
        others = np.concatenate([np.delete(kt, i), obst])
        kk.radius = min(0.4 * float(np.min(np.abs(others - kk.t))), 0.1)


def crossing(it: Interval, sl: float, sr: float) -> float:
    """Where the line of slope ``sl`` through the interval's left end crosses the line of slope
    ``sr`` through its right end (NaN if parallel)."""
    if sl == sr:
        return float("nan")
    return (it.fr - it.fl + sl * it.l - sr * it.r) / (sl - sr)
