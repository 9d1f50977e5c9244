"""The rotary learner's float64 routes: the dense route (every column of ``M_{-1}``, the
refinement, the biases) and the low-rank route (sketches of a form of rank r), over the
measurements of :mod:`._prober` (:mod:`attnquery.learners.rotary`, "Queries", "Biases",
"Refinement").

A route is a frozen value built by ``fit`` from the parameters; its :meth:`forms` measures
``M_{-1}`` (stage ``M1``) and ``M_{-2}`` on its spaces (stage ``M2``) through the fit's
:class:`~attnquery.learners._base.QueryLedger` and returns them as a frozen :class:`Forms`.
Its budget decisions read the ledger's :meth:`~attnquery.learners._base.QueryLedger.left`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...errors import BudgetExceededError, NotIdentifiableError
from .._base import ROUNDING_RTOL
from .._probes import balanced_orthonormal
from ._common import (
    CHECK_FACTOR,
    REFINE_CONDITION,
    UNIT_TOL,
    rotary_refine_count,
    rotary_refine_rows,
)
from ._factor import Svd, thin_svd
from ._prober import _balanced_rows, _first_tokens

__all__ = ["Forms", "DenseRoute", "LowRankRoute", "over_cap", "room_for", "check_plan"]


class Forms(NamedTuple):
    """What a route measured (frozen): the thin SVD of ``M_{-1}``, ``T = S^{-1} U_s^T M_{-2}
    V`` and, with ``fit_bias``, the biases' measurements ``(g_{-1}, k_{-1} - k_0, C', s)``
    (None without), and how many times a served head's ``M_{-1}`` was measured again."""

    svd: Svd
    T: np.ndarray
    bias_data: tuple | None
    n_m1_repeats: int = 0


def over_cap(ledger, n: int) -> bool:
    """Whether ``n`` more queries (the check included) exceed what the fit's own cap
    (``ledger.cap``, the learner's ``n_queries``) leaves; False without a cap."""
    return ledger.cap is not None and n > ledger.cap - ledger.total


def room_for(ledger, n: int) -> bool:
    """Whether ``n`` more queries fit :meth:`QueryLedger.left` (the cap and the oracle's budget,
    the reserve for the check kept)."""
    left = ledger.left()
    return left is None or n <= left


def check_plan(ledger, n: int, n_check: int, n_queries) -> None:
    """Refuse a plan of ``n`` queries (``n_check`` of them the check) before any query: the
    fit's cap first, then the oracle's budget (:meth:`QueryLedger.need`).

    Raises
    ------
    BudgetExceededError
        When the plan exceeds ``n_queries`` or the oracle's budget.
    """
    if over_cap(ledger, n):
        raise BudgetExceededError(
            f"rotary recovery needs {n} queries (with {n_check} check queries); "
            f"n_queries={n_queries}")
    ledger.need(n, f"rotary recovery ({n} queries with the check)", reserved=True)


@dataclass(frozen=True)
class _Float64Route:
    """What the float64 routes share: the answers' format, its tolerances and the check."""

    d: int
    n_check: int
    unit_tol = UNIT_TOL
    noise_level = 0.0

    def blocks(self, ledger, pr, fac, svd, rng, lengths, rope_base) -> None:
        """No blocks at long offsets: float64 forms need none (module docstring, "Precision")."""
        return None

    def check_rtol(self, condition: float, lengths) -> float:
        """The check's relative tolerance: T carries the rounding of the forms magnified by
        the condition number of ``M_{-1}``, grown about N-fold at N tokens (module docstring,
        "Precision")."""
        return max(ROUNDING_RTOL, CHECK_FACTOR * np.finfo(float).eps * condition * max(lengths))

    def check_args(self, lengths, check_rtol: float, predict) -> dict:
        """The arguments of the self-check (:meth:`BaseLearner._verify_fit`)."""
        return {"rtol": check_rtol, "atol": 0.0, "lengths": lengths, "n_checks": self.n_check}


@dataclass(frozen=True)
class DenseRoute(_Float64Route):
    """``rank=None``: ``M_{-1}`` on every coordinate last token, ``M_{-2}`` likewise, the
    refinement (``refine``) and the biases (``fit_bias``)."""

    fit_bias: bool = False
    refine: object = "auto"
    rank_tol: float = 1e-9

    def forms(self, ledger, pr, v, rng) -> Forms:
        """``M_{-1}`` (all d columns) and ``M_{-2}``: ``2 d^2 + d`` probes (``2 d^2 + 4 d + 2``
        with ``fit_bias``), plus the refinement where it runs."""
        d = self.d
        with ledger.stage("M1"):
            A = balanced_orthonormal(v, rng)  # rows u_l, |u_l^T v| = ||v|| / sqrt(d)
            eye = np.eye(d)
            m0 = g2f = None
            if self.fit_bias:
                with ledger.stage("bias"):
                    g1f, dk1 = pr.zero_probes(A, 1)
                    g2f, _ = pr.zero_probes(A, 2)
                t, Cp, sc = pr.pairs(A, eye, 1, gf=g1f, raw=True)
            else:
                t, m0 = pr.pairs(A, eye)  # t[j] = A M_{-1} e_j
            svd = thin_svd(A.T @ t.T, self.rank_tol)
            small = None
            if self._asks_pilot_again(ledger, svd.S):  # the pilot column again, at the learnt scale
                with ledger.stage("refine"):
                    if self.fit_bias:
                        t[0], Cp[0], sc[0] = (a[0] for a in pr.pairs(A, eye[:1], 1, gf=g1f,
                                                                     raw=True))
                    else:
                        t[0], m0[0] = (a[0] for a in pr.pairs(A, eye[:1]))
                svd = thin_svd(A.T @ t.T, self.rank_tol)
                small = None if self.fit_bias else self._small_rows(ledger, pr, A.T @ t.T,
                                                                    svd.U_s, m0)
            if small is not None:
                svd = thin_svd(small[1], self.rank_tol)
            M1 = A.T @ t.T
            m1 = np.diag(M1).copy()
        with ledger.stage("M2"):
            if self.fit_bias:  # the constants are unknown: d + 1 probes per column
                t2, _ = pr.pairs(A, eye, 2, gf=g2f)
            else:
                t2 = pr.triples(A, eye, m1, m0)  # t2[j] = A M_{-2} e_j
            M2 = A.T @ t2.T
            if small is not None:  # the same rows of M_{-2}, at their own scales
                F = small[0]
                with ledger.stage("refine"):
                    M2 = M2 + F.T @ (pr.rows(F, F @ M2, 2, m1, m0) - F @ M2)
            T = svd.U_s.T @ M2 @ svd.Vt.T / svd.S[:, None]
        bias_data = (A.T @ g1f, float(dk1), Cp, sc) if self.fit_bias else None
        return Forms(svd, T, bias_data)

    def _asks_pilot_again(self, ledger, S) -> bool:
        """Whether the pilot column is asked again (module docstring, "Refinement"):
        ``refine=True`` always; ``"auto"`` when ``cond(M_{-1}) >= REFINE_CONDITION`` and its
        ``d + 1`` queries fit the ledger with the rest of the plan."""
        if self.refine is not True and (self.refine is False
                                        or S[0] < REFINE_CONDITION * S[-1]):
            return False
        d = self.d
        rest = d * d + rotary_refine_count(d) + (d + 1 if self.fit_bias else 0)
        return self.refine is True or room_for(ledger, rest)

    def _small_rows(self, ledger, pr, M1, U_s, m0):
        """The rows of M_{-1} on its ``rotary_refine_rows(d)`` smallest left singular
        directions (the last columns of U_s), asked again each at its own logit scale (module
        docstring, "Refinement"; without biases, when the ledger has room for them and
        ``M_{-2}``): returns those directions (rows) and M_{-1} with the rows replaced, or
        None."""
        d = self.d
        k = rotary_refine_rows(d)
        if k == 0 or self.fit_bias or not room_for(ledger, d * d + 2 * k * d):
            return None
        F = U_s[:, -min(k, U_s.shape[1]):].T
        with ledger.stage("refine"):
            R1 = pr.rows(F, F @ M1, 1, None, m0)
        return F, M1 + F.T @ (R1 - F @ M1)


@dataclass(frozen=True)
class LowRankRoute(_Float64Route):
    """``rank=r`` (r < d): ``M_{-1}`` of rank r from sketches, then the r x r block of
    ``M_{-2}`` on its row and column spaces."""

    rank: int = 1
    oversample: int = 8

    def forms(self, ledger, pr, v, rng) -> Forms:
        """``d (k + 2 r + 3) + r^2 + 2 r`` queries with v (module docstring):

        1. A left sketch ``Psi M_{-1}`` (k = r + oversample balanced first tokens, the
           coordinate last tokens) gives the row space approximately (its error grows with the
           condition number of ``Psi U``, about 65 at k = r + 8).
        2. ``M_{-1} V_Z`` on that row space (r last tokens, d first tokens) gives the column
           space U accurately (``V^T V_Z`` is nearly orthogonal).
        3. ``U^T M_{-1}`` (r first tokens in U, the coordinate last tokens) gives
           ``M_{-1} = U (U^T M_{-1})``.
        """
        d, r = self.d, self.rank
        with ledger.stage("M1"):
            k = min(d, r + int(self.oversample))
            A = balanced_orthonormal(v, rng)
            eye = np.eye(d)
            Psi = _balanced_rows(k, v, rng)
            Z, _ = pr.pairs(Psi, eye)  # Z[j] = Psi M_{-1} e_j
            Vz = np.linalg.svd(Z.T, full_matrices=False)[2][:r].T  # (d, r): row space, roughly
            Y, _ = pr.pairs(A, Vz.T)  # Y[m] = A M_{-1} Vz[:, m]
            U = np.linalg.svd(A.T @ Y.T, full_matrices=False)[0][:, :r]  # column space (d, r)
            F, H = _first_tokens(U, v, rng)
            X3, _ = pr.pairs(F, eye)  # X3[j] = F M_{-1} e_j = H U^T M_{-1} e_j
            UtM = H.T @ X3.T  # (r, d) = U^T M_{-1}
            P, S, Vt = np.linalg.svd(UtM, full_matrices=False)
            U_s = U @ P
            if not S[0] > 0:
                raise NotIdentifiableError("M_{-1} = 0: the scores carry no signal")
        with ledger.stage("M2"):
            Afirst, Hm = _first_tokens(U_s, v, rng)
            Blast = Vt  # (r, d)
            m1 = np.einsum("kd,kd->k", Blast @ (U_s * S) @ Vt, Blast)  # b^T M_{-1} b
            # b^T M_0 b from one two-row probe per b (its M_{-1} part is known)
            m0 = pr.constants(Afirst[0], Blast, (Afirst[0] @ U_s * S) @ (Vt @ Blast.T))
            t2 = pr.triples(Afirst, Blast, m1, m0)  # (r, r): t2[m] = Afirst M_{-2} b_m
            T = Hm.T @ t2.T / S[:, None]  # = U_s^T M_{-2} V / S, as U_s^T Afirst^T = Hm^T
        return Forms(Svd(U_s, S, Vt), T, None)
