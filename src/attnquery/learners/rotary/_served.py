"""The rotary learner's served route: a head whose answers are float32 values
(:mod:`attnquery.learners.rotary`, "Served heads").

The route measures ``M_{-1}`` as the dense route does, asks its pilot column again, measures it
again with other first tokens as its budget allows (averaged), then ``M_{-2}``; after the
factorisation its blocks ``Y T^(L-1) X`` at long offsets refine the frequencies and the
eigenvectors. Its budget is a :class:`~attnquery.learners._base.QueryLedger` nested in the
fit's, with the cap ``n_queries`` (default ``SERVED_QUERY_FACTOR (d^2 + d)``) and the check's
queries in reserve: the repeats and the blocks spend what its
:meth:`~attnquery.learners._base.QueryLedger.left` leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import ml_dtypes
import numpy as np

from ...errors import AssumptionViolation, BudgetExceededError
from ...precision import storage_dtype
from .._base import QueryLedger
from .._probes import balanced_orthonormal
from ._common import (
    REFINE_MIN_SEPARATION,
    SERVED_M1_REPEATS,
    SERVED_MAX_BLOCKS,
    SERVED_MAX_OFFSET,
    SERVED_MIN_BLOCKS,
    SERVED_QUERY_FACTOR,
    SERVED_RANK_FACTOR,
    SERVED_RTOL,
    SERVED_UNIT_TOL,
    SERVED_VERIFY,
    SERVED_VERIFY_LENGTHS,
    VERIFY_LENGTHS,
    rotary_query_count,
    rotary_refine_count,
)
from ._factor import Factors, Svd, rotary_factors, thin_svd
from ._routes import Forms, over_cap

__all__ = ["ServedRoute", "Blocks", "_long_offset", "_long_offsets", "_block_eigen",
           "_correct_mixing"]


class Blocks(NamedTuple):
    """What a served head's blocks gave (frozen): the factors refined by them (T's
    eigenvalues kept), the long offsets (the first measured twice) and the relative noise."""

    factors: Factors
    long_offsets: tuple
    noise_level: float


@dataclass(frozen=True)
class ServedRoute:
    """float32 answers on the dense route without biases (module docstring, "Served heads").

    Build it with :meth:`open` once the v stage has shown the answers' format."""

    d: int
    n_check: int
    rank_tol: float
    u: float
    budget: QueryLedger
    unit_tol = SERVED_UNIT_TOL

    @property
    def noise_level(self) -> float:
        """The answers' relative noise before the blocks measure it: the unit roundoff."""
        return self.u

    @classmethod
    def open(cls, ledger, fmt: str, *, rank, fit_bias: bool, n_queries, n_verify: int,
             rank_tol: float) -> ServedRoute:
        """The served route of a fit whose v stage (asked through ``ledger``) gave answers in
        the format ``fmt``.

        Raises
        ------
        AssumptionViolation
            When the answers are not float32 values, or the low-rank route or ``fit_bias`` is
            asked for.
        BudgetExceededError
            When ``n_queries`` is below the route's least plan (the pilot column asked again
            and the check's ``SERVED_VERIFY`` queries).
        """
        if fmt != "float32" or rank is not None or fit_bias:
            raise AssumptionViolation(
                f"the answers are {fmt} values (a served head): the served "
                "route takes float32 answers, on the dense route without biases (rank=None, "
                "fit_bias=False)")
        d = ledger.d
        n_check = max(n_verify, SERVED_VERIFY) if n_verify else 0
        least = rotary_query_count(d) + rotary_refine_count(d) + n_check
        if over_cap(ledger, least - ledger.total):
            raise BudgetExceededError(
                f"a served (float32) head needs at least {least} queries (the pilot column "
                f"asked again and {n_check} check queries); n_queries={n_queries}")
        u = float(ml_dtypes.finfo(storage_dtype(fmt)).eps) / 2
        cap = SERVED_QUERY_FACTOR * (d * d + d) if n_queries is None else n_queries
        budget = QueryLedger(ledger, what=f"{ledger.what}'s served route",
                             cap=cap - ledger.total, reserve=n_check)
        return cls(d, n_check, max(rank_tol, SERVED_RANK_FACTOR * u), u, budget)

    # -- the forms ------------------------------------------------------------------------------
    def forms(self, ledger, pr, v, rng) -> Forms:
        """``M_{-1}`` (its pilot column asked again, then measured again and averaged as the
        budget allows) and ``M_{-2}``."""
        d = self.d
        with ledger.stage("M1"):
            A = balanced_orthonormal(v, rng)
            eye = np.eye(d)
            t, m0 = pr.pairs(A, eye)  # t[j] = A M_{-1} e_j
            thin_svd(A.T @ t.T, self.rank_tol)  # M_{-1} = 0 is refused before more queries
            with ledger.stage("refine"):  # the pilot column again, at the learnt scale
                t[0], m0[0] = (a[0] for a in pr.pairs(A, eye[:1]))
            r = thin_svd(A.T @ t.T, self.rank_tol).S.size
            t, m0, k = self._repeats(pr, v, rng, A, t, m0, r)
            svd = thin_svd(A.T @ t.T, self.rank_tol)
            M1 = A.T @ t.T
            m1 = np.diag(M1).copy()
        with ledger.stage("M2"):
            t2 = pr.triples(A, eye, m1, m0)  # t2[j] = A M_{-2} e_j
            M2 = A.T @ t2.T
            T = svd.U_s.T @ M2 @ svd.Vt.T / svd.S[:, None]
        return Forms(svd, T, None, k)

    def _repeats(self, pr, v, rng, A, t, m0, r: int):
        """``M_{-1}`` measured again with other first tokens (balanced orthonormal bases) and
        averaged with the first: as many of ``SERVED_M1_REPEATS`` (d (d + 1) queries each) as
        leave room for ``M_{-2}`` (d^2) and ``SERVED_MIN_BLOCKS`` blocks of at most ``r^2``
        queries each. Returns ``t`` (rows ``A M_{-1} e_j``) and the constants ``m0``, averaged,
        and the number of repeats."""
        d = A.shape[0]
        spare = self.budget.left() - d * d - SERVED_MIN_BLOCKS * r * r
        k = int(min(SERVED_M1_REPEATS, max(0, spare // (d * (d + 1)))))
        eye = np.eye(d)
        for _ in range(k):
            A2 = balanced_orthonormal(v, rng)
            t2, m02 = pr.pairs(A2, eye)  # t2[j] = A2 M_{-1} e_j
            t, m0 = t + t2 @ A2 @ A.T, m0 + m02
        return t / (k + 1), m0 / (k + 1), k

    # -- the blocks at long offsets -------------------------------------------------------------
    def blocks(self, ledger, pr, fac: Factors, svd: Svd, rng, lengths, rope_base):
        """Blocks ``C_k = Y T^(L_k - 1) X`` of the rotated pairs at long offsets (stage
        ``refine``), as many as the budget pays for (``R^2`` queries each, at most
        ``SERVED_MAX_BLOCKS``); None when there is no pair, no room or no offset that separates
        the pairs.

        The first offset keeps every ``e^(+-i (L_1 - 1) theta_j)`` apart and is measured twice
        (averaged; their spread is the noise level): its eigenvalues give the frequencies
        (L_1 - 1)-fold more precisely than T, its eigenvectors replace T's. The other offsets
        separate the pairs of eigenvalues that T and the offsets before separate least
        (:func:`_long_offsets`), and the mixing of each pair of eigenvectors is corrected (to
        first order) by whichever of T and the blocks separates their eigenvalues most."""
        U_s, S, Vt = svd
        half = fac.half
        R = 2 * half
        n_blocks = min(SERVED_MAX_BLOCKS, self.budget.left() // max(1, R * R))
        if half < 1 or n_blocks < 1:
            return None
        theta = fac.frequencies
        # the coarse angles (error about 10 u cond(M_{-1})) must unwrap: (L - 1) times their
        # error stays below 0.1 rad
        max_offset = int(min(min(max(lengths), SERVED_MAX_OFFSET) - 1,
                             1 + 0.01 / (self.u * S[0] / S[-1])))
        offsets = _long_offsets(theta, max_offset, max(0, n_blocks - 2))
        if offsets is None:
            return None
        lam, E = fac.eigenvalues, fac.E
        Ep = E[:, :half]
        X = np.concatenate([Ep.real, Ep.imag], axis=1)  # (r, R) real basis of the pairs
        Yc = np.linalg.inv(E)[:half]
        Yc = np.concatenate([Yc.real, Yc.imag], axis=0)
        Y = np.linalg.solve(Yc @ X, Yc)  # left invariant basis, Y X = I
        L = offsets[0]
        with ledger.stage("refine"):
            Cs = np.array([_measure_block(pr, X, Y, svd, fac, L, rng)  # Y T^(L-1) X
                           for _ in range(min(2, n_blocks))])
            C = Cs.mean(axis=0)
            noise = self.u
            if len(Cs) > 1:  # the answers' own noise: the spread of the repeats (relative)
                noise = float(np.sqrt(np.mean(Cs.var(axis=0, ddof=1)))
                              / np.sqrt(np.mean(C**2)))
            mu, W = _block_eigen(C, L, theta, self.unit_tol)
            Tx = Y @ (E @ (lam[:, None] * np.linalg.solve(E, X)))  # Y T X
            sources = [C, Tx] + [_measure_block(pr, X, Y, svd, fac, Lk, rng)
                                 for Lk in offsets[1:]]
        W = _correct_mixing(W, sources, [L] + [2] + list(offsets[1:]), theta)
        ang = np.angle(mu[:half])
        ref = (ang + 2 * np.pi * np.round(((L - 1) * theta - ang) / (2 * np.pi))) / (L - 1)
        E = E.copy()
        E[:, :half] = X @ W[:, :half]
        freq = ref if rope_base is None else theta
        Q, K = rotary_factors(E, freq, half, svd)
        return Blocks(Factors(lam, E, half, freq, Q, K), tuple(int(x) for x in offsets), noise)

    # -- the check ------------------------------------------------------------------------------
    def check_rtol(self, condition: float, lengths) -> float:
        """The served route's goal, ``SERVED_RTOL`` (relative to each length's answers)."""
        return SERVED_RTOL

    def check_args(self, lengths, check_rtol: float, predict) -> dict:
        """The arguments of the self-check: relative to each length's largest answer on its
        own, on ``SERVED_VERIFY_LENGTHS`` when ``verify_lengths`` is the default (the answers
        of long sequences are averages, 10 to 30 times smaller than short ones', and a
        tolerance relative to all of them together let errors of 5e-5 at 4,096 tokens
        pass)."""
        if tuple(lengths) == VERIFY_LENGTHS:
            lengths = SERVED_VERIFY_LENGTHS

        def atol(X):
            return np.full(X.shape[0], check_rtol * np.max(np.abs(predict(X))))

        return {"rtol": 0.0, "atol": atol, "lengths": lengths, "n_checks": self.n_check}


def _measure_block(pr, X, Y, svd: Svd, fac: Factors, L: int, rng) -> np.ndarray:
    """``C = Y S^{-1} U^T M_{-L} V X`` (m x m) from ``m^2`` probes ``[c a; 0 ...; s b]``: last
    tokens along ``V X``, first tokens an orthonormal basis of the span of ``U S^{-1} Y^T``
    (balanced against v); ``b^T M_0 b`` estimated from the factors of T."""
    U_s, S, Vt = svd
    B = (Vt.T @ X).T  # (m, d)
    nb = np.linalg.norm(B, axis=1)
    B = B / nb[:, None]
    A0 = Y @ (U_s / S[None, :]).T  # (m, d)
    Qa, Rr = np.linalg.qr(A0.T)
    H = balanced_orthonormal(Qa.T @ pr.v, rng)
    F = H @ Qa.T
    m0 = np.einsum("kr,kr->k", B @ fac.K.T, B @ fac.Q.T)  # b^T M_0 b, estimated
    t = pr.long_pairs(F, B, L, m0)  # t[k, l] = F[l] M_{-L} B[k]
    return Rr.T @ H.T @ t.T * nb[None, :]


def _long_offset(theta: np.ndarray, max_offset: int):
    """The offset L (2 <= L <= max_offset) whose ``e^(+-i (L - 1) theta_j)`` are far apart on
    the unit circle: the largest L whose smallest gap is at least half the best; None when none
    separates them by ``REFINE_MIN_SEPARATION`` more than L = 2 does."""
    n = np.arange(1, max(2, max_offset), dtype=np.float64)  # n = L - 1
    P = np.mod(n[:, None] * np.concatenate([theta, -theta])[None, :], 2 * np.pi)
    P.sort(axis=1)
    gaps = np.diff(P, axis=1)
    wrap = 2 * np.pi - (P[:, -1] - P[:, 0])
    sep = np.minimum(gaps.min(axis=1), wrap) if P.shape[1] > 1 else wrap
    best = float(sep.max())
    if best < max(REFINE_MIN_SEPARATION, sep[0]):
        return None
    return int(n[np.nonzero(sep >= 0.5 * best)[0][-1]]) + 1


def _long_offsets(theta: np.ndarray, max_offset: int, n_more: int):
    """The long offsets of a served head's blocks: first :func:`_long_offset`'s (None when it
    has none), then ``n_more`` other offsets chosen one by one among about 256 up to
    ``max_offset``: each maximises the product, over the pairs of eigenvalues
    ``e^(+-i theta_j)``, of their best separation ``|e^(i (L-1) phi_a) - e^(i (L-1) phi_b)|``
    by T (L = 2) and the offsets chosen so far, each capped at 1 (the mixing of a pair's
    eigenvectors is the noise divided by it)."""
    first = _long_offset(theta, max_offset)
    if first is None:
        return None
    phi = np.concatenate([theta, -theta])
    diff = phi[:, None] - phi[None, :]
    off = ~np.eye(phi.size, dtype=bool)

    def sep(n):  # (k, m, m) separations at the powers n = L - 1
        return np.abs(2.0 * np.sin(np.asarray(n, dtype=np.float64)[:, None, None] * diff / 2))

    best = np.maximum(sep([1])[0], sep([first - 1])[0])
    cand = np.unique(np.linspace(1, max(1, max_offset - 1), 256).astype(int))
    S_all = sep(cand)
    out = [first]
    taken = cand == first - 1
    for _ in range(min(n_more, int(np.sum(~taken)))):
        capped = np.where(off, np.minimum(np.maximum(best[None], S_all), 1.0), 1.0)
        score = np.where(taken, -np.inf, np.sum(np.log(capped), axis=(1, 2)))
        k = int(np.argmax(score))
        taken[k] = True
        out.append(int(cand[k]) + 1)
        best = np.maximum(best, S_all[k])
    return out


def _block_eigen(C, L: int, theta, unit_tol: float):
    """Eigenvalues and eigenvectors of the block ``C = Y T^(L-1) X`` ordered as
    ``e^(i (L-1) theta)``, ``e^(-i (L-1) theta)``.

    Raises
    ------
    AssumptionViolation
        When they are not a rotary head's (off the unit circle, or not the angles of T
        multiplied by L - 1).
    """
    mu, W = np.linalg.eig(C)
    want = np.exp(1j * (L - 1) * np.concatenate([theta, -theta]))
    match = np.argmin(np.abs(mu[None, :] - want[:, None]), axis=1)
    if np.unique(match).size < want.size or np.max(np.abs(mu[match] - want)) > 0.1 \
            or np.max(np.abs(np.abs(mu) - 1)) > unit_tol:
        raise AssumptionViolation(
            f"not a rotary head: at the offset {L} the form M_(-{L}) is not M_(-1) rotated "
            f"by (L - 1) theta_j (M_(-1)^+ M_(-{L}) has the eigenvalues "
            f"{np.round(mu, 4)[:4]}..., a rotary head's {np.round(want, 4)[:4]}...)")
    return mu[match], W[:, match]


def _correct_mixing(W, sources, offsets, theta):
    """First-order correction of the eigenvectors W of the first source: for each pair (a, b)
    of eigenvalues, the source (a matrix ``Y T^(L-1) X`` at offset L, T itself at L = 2) whose
    eigenvalues ``e^(i (L-1) phi)`` are farthest apart gives the mixing
    ``(W^-1 B W)_ab / (mu_b - mu_a)``.

    Raises
    ------
    AssumptionViolation
        When a source's eigenvalues are not ``e^(i (L-1) phi)`` (to 0.1).
    """
    phi = np.concatenate([theta, -theta])
    m = phi.size
    best = np.zeros((m, m))
    corr = np.zeros((m, m), dtype=complex)
    for B, L in zip(sources, offsets, strict=True):
        Bp = np.linalg.solve(W, B @ W)
        dg = np.diag(Bp)
        if np.max(np.abs(dg - np.exp(1j * (L - 1) * phi))) > 0.1:
            raise AssumptionViolation(
                f"not a rotary head: at the offset {L} the form M_(-{L}) is not M_(-1) "
                "rotated by (L - 1) theta_j")
        dm = dg[None, :] - dg[:, None]
        use = np.abs(dm) > best
        corr = np.where(use, Bp / np.where(use, dm, 1.0), corr)
        best = np.where(use, np.abs(dm), best)
    np.fill_diagonal(corr, 0.0)
    return W @ (np.eye(m) + corr)
