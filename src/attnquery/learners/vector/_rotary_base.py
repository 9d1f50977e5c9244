"""``rope_base=None``: the base of a rotary layer's frequencies measured from its form queries.

Beyond the paper. In the form queries of :mod:`.rotary_layer` every key set is seen by many
rows ``rho`` (the padding's copies of a probe); the difference of two keys' log-weights in a
row is, along the rows, a sum of ``cos(theta_j rho)``, ``sin(theta_j rho)`` and a constant
(``cos(theta (p - rho))`` expands so), with the frequencies ``theta_j = base^(-2j/r)`` of every
head. All heads, probes, key sets and key pairs share the rows, so for a candidate base one
small least squares (rows by ``r + 1`` basis functions) fits every such signal at once, and its
relative residual is zero at the box's base and nowhere else. The base is found by a scan of
``ln(base)`` over :data:`BASE_RANGE` on the rows up to offset 511 (the minima of the scan
refined, the best kept), then refined on every row read (to offset ``check_length - 1``, where
the frequencies turn furthest). To offset 511 a base and its roots can fit alike (for a head
of 64 dimensions and base 1e5, base 316 fits the rows to offset 511 to 1e-11): every minimum
that fits as well as the best is refined, and the one that fits every row read is kept; where
two far apart fit every row read alike the base is not identified from those offsets
(NotIdentifiableError). No query is asked for it: the form stage's answers serve.

A box whose frequencies are not ``base^(-2j/r)`` for any base (scaled RoPE, partial rotary
dimensions) leaves a residual above :data:`BASE_RTOL` and is refused by name.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar

from ...errors import ModelMismatchError, NotIdentifiableError
from ...models import rope_frequencies
from ._rotary_reads import FORMS_RCOND, rotary_basis

__all__ = ["measure_base", "BASE_RANGE", "BASE_RTOL"]

#: the bases searched (every published RoPE base lies between: 1e4 Llama 2, 1e5 SmolLM2,
#: 5e5 Llama 3, 1e6 Qwen2)
BASE_RANGE = (2.0, 1e9)
#: step of the scan in ln(base): a tenth of the narrowest minimum's width at offset 511 (the
#: phase of theta_j rho moves by at most rho / (e ln base) per unit of ln(base))
SCAN_STEP = 0.002
#: local minima of the scan refined at least (the box's base is the one whose residual
#: vanishes on every row read)
CANDIDATES = 12
#: every minimum of the scan whose squared relative residual is below this is a candidate
#: (and at least CANDIDATES): half a step from the box's base the fast frequencies' phases at
#: offset 511 are off by up to 0.016 radian; to offset 511 a head of 32 dimensions fits bases
#: from 20 to 300 and 1e5 alike (hundreds of minima)
CANDIDATE_RES = 1e-3
#: a refined candidate far from the best whose relative residual on every row read is within
#: this factor of the best one's is a rival: the base is not identified
FIT_SPREAD = 1e2
#: signals (key pairs of a probe and key set, per head) used, evenly drawn
MAX_SIGNALS = 600
#: the largest relative residual a measured base may leave (float64 answers leave 1e-12 to
#: 1e-10)
BASE_RTOL = 1e-7


class _Signals:
    """The log-weight differences of a group of form queries: rows ``rho`` (R,) and signals
    (R, C), every column a key pair of one probe, key set and head."""

    def __init__(self, offsets: np.ndarray, ells: list, n_sets: int):
        E, k = offsets.shape
        R = E // n_sets
        self.rho = -offsets[:R, 0]  # the rows, up to a shift (which the fit absorbs)
        cols = []
        for ell in ells:  # (P, E, k) per head
            P = ell.shape[0]
            g = ell.reshape(P, n_sets, R, k)
            cols.append((g[..., 1:] - g[..., :1]).transpose(2, 0, 1, 3).reshape(R, -1))
        G = np.concatenate(cols, axis=1)
        G = G[:, np.all(np.isfinite(G), axis=0)]
        if G.shape[1] > MAX_SIGNALS:
            G = G[:, np.linspace(0, G.shape[1] - 1, MAX_SIGNALS).round().astype(int)]
        self.G = G
        self.norm2 = float(np.sum(G * G))

    def residual(self, log_base: float, r: int) -> float:
        """The signals' relative squared residual outside the span of the rows' basis
        functions at base ``exp(log_base)``."""
        B = rotary_basis(self.rho, rope_frequencies(r, math.exp(log_base)))
        U, s, _ = np.linalg.svd(B, full_matrices=False)
        U = U[:, s > FORMS_RCOND * s[0]]
        E = self.G - U @ (U.T @ self.G)
        return float(np.sum(E * E)) / self.norm2


def _total(groups, r: int):
    return lambda x: sum(g.residual(x, r) for g in groups)


def _refine(f, x0: float, width: float) -> float:
    """The minimum of ``f`` within ``width`` of ``x0``: Brent's bounded search in the offset
    from ``x0`` (its tolerance is relative to the argument, so the offset, small, keeps it
    near float64's spacing of ln(base)), then once more about the point found."""
    for w in (width, width * 1e-4):
        t = minimize_scalar(lambda t, c=x0: f(c + t), bounds=(-w, w), method="bounded",
                            options={"xatol": 1e-15}).x
        x0 = x0 + t
    return x0


def measure_base(groups: list, r: int, longest: int) -> tuple[float, float]:
    """The base of the rotary frequencies from the form equations' groups ``(offsets, ells,
    n_sets)`` (the first the short group, the rows to offset 511), for heads of ``r`` rotated
    dimensions; ``longest`` is the longest offset read (for the message). Returns the base and
    the relative residual it leaves.

    Raises NotIdentifiableError when bases far apart fit every row read alike, and
    ModelMismatchError when no base in :data:`BASE_RANGE` fits the signals to
    :data:`BASE_RTOL` (the frequencies are not ``base^(-2j/r)``)."""
    sig = [_Signals(*g) for g in groups]
    sig = [s for s in sig if s.G.shape[1] and s.norm2 > 0]
    if not sig or sig[0].rho.size <= r + 1:
        raise ModelMismatchError(
            "rope_base=None: the form queries left too few finite log-weights to measure the "
            "base (give rope_base)", error=0.0, allowed=1.0)
    short = _total(sig[:1], r)
    xs = np.arange(math.log(BASE_RANGE[0]), math.log(BASE_RANGE[1]), SCAN_STEP)
    res = np.array([short(x) for x in xs])
    inner = (res[1:-1] <= res[:-2]) & (res[1:-1] <= res[2:])
    minima = np.flatnonzero(inner) + 1
    minima = minima[np.argsort(res[minima])]
    if not minima.size:
        raise ModelMismatchError("rope_base=None: the residual has no minimum over the bases "
                                 f"{BASE_RANGE[0]:g} to {BASE_RANGE[1]:g}", error=1.0,
                                 allowed=BASE_RTOL)
    # to offset 511 a base and its roots can fit alike (base^(1/2) holds every other frequency
    # of base, and its extra slow ones span the missing slow ones there): every minimum that
    # fits well enough is a candidate, told apart on every row read
    minima = minima[:max(CANDIDATES, np.count_nonzero(res[minima] <= CANDIDATE_RES))]
    refined = [_refine(short, xs[i], SCAN_STEP) for i in minima]
    full = _total(sig, r)
    fit = np.array([full(x) for x in refined])
    x0 = refined[int(np.argmin(fit))]
    x = _refine(full, x0, SCAN_STEP * 512 / max(longest, 512))
    fx = full(x)
    if fx > fit.min():  # the refinement never leaves the best candidate worse
        x, fx = x0, float(fit.min())
    rel = math.sqrt(fx / len(sig))
    if not rel <= BASE_RTOL:
        raise ModelMismatchError(
            f"rope_base=None: no base of the rotary frequencies base^(-2j/{r}) fits the form "
            f"queries (to offset {longest}): the best, {math.exp(x):.6g}, leaves a relative "
            f"residual of {rel:.2g} where {BASE_RTOL:g} is allowed; the box's frequencies are "
            "of another form (scaled RoPE, partial rotary dimensions): give rope_base, or "
            "check the box", error=rel, allowed=BASE_RTOL)
    rivals = [y for y, f in zip(refined, fit, strict=True)
              if math.sqrt(f / len(sig)) <= max(FIT_SPREAD * rel, 1e-12)
              and abs(y - x) > SCAN_STEP]
    if rivals:
        raise NotIdentifiableError(
            f"rope_base=None: the bases {math.exp(min(x, rivals[0])):.6g} and "
            f"{math.exp(max(x, rivals[0])):.6g} fit the form queries to offset {longest} alike: "
            "the base is not identified from those offsets (a longer check_length reads "
            "further ones) - give rope_base")
    return math.exp(x), rel
