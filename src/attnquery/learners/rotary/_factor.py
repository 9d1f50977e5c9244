"""From the two forms to a rotary head: the thin SVD of ``M_{-1}``, the eigen-decomposition of
``T = S^{-1} U^T M_{-2} V = G^{-1} D G`` into frequencies and factors, and the query and key
biases (:mod:`attnquery.learners.rotary`, "From two forms to every form" and "Biases").

Each function returns its result as a frozen value; nothing here asks a query.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...errors import AssumptionViolation, NotIdentifiableError
from ...models import rope_frequencies, rotate_half
from ._common import FREQ_TOL, PASS_TOL

__all__ = ["Svd", "Factors", "thin_svd", "factor", "rotary_factors", "biases"]


class Svd(NamedTuple):
    """The thin SVD ``M_{-1} = U_s diag(S) Vt`` on its rank (frozen)."""

    U_s: np.ndarray
    S: np.ndarray
    Vt: np.ndarray


class Factors(NamedTuple):
    """A rotary factorisation (frozen): T's eigenvalues and eigenvectors, ordered as the
    R/2 positive angles, the dimensions not rotated, the negative angles; the frequencies and
    the factors ``Q``, ``K`` (rows in the rotary basis, the score scale folded into ``K``)."""

    eigenvalues: np.ndarray
    E: np.ndarray
    half: int
    frequencies: np.ndarray
    Q: np.ndarray
    K: np.ndarray

    @property
    def rotary_dim(self) -> int:
        """R, the rotated dimensions."""
        return 2 * self.half

    @property
    def rank(self) -> int:
        """The head dimension d_h (the rank of the forms)."""
        return int(self.E.shape[0])


def thin_svd(M: np.ndarray, tol: float) -> Svd:
    """The SVD of ``M`` on the singular values above ``tol`` times the largest.

    Raises
    ------
    NotIdentifiableError
        When ``M = 0``: the scores carry no signal.
    """
    U, S, Vt = np.linalg.svd(M)
    if not S[0] > 0:
        raise NotIdentifiableError("M_{-1} = 0: the scores carry no signal")
    r = int(np.sum(S > tol * S[0]))
    return Svd(U[:, :r], S[:r], Vt[:r])


def factor(T: np.ndarray, svd: Svd, unit_tol: float, rotary_dim=None,
           rope_base=None) -> Factors:
    """Frequencies and rotary factors from ``T = G^{-1} D G`` (module docstring of
    :mod:`attnquery.learners.rotary`).

    Parameters
    ----------
    T : ndarray (r, r)
        ``S^{-1} U_s^T M_{-2} V``.
    svd : Svd
        The thin SVD of ``M_{-1}``.
    unit_tol : float
        How far T's eigenvalues may leave the unit circle.
    rotary_dim : int, optional
        R when known (else the number of positive angles).
    rope_base : float, optional
        The base whose frequencies the angles must match (to ``FREQ_TOL``); they are then used.

    Raises
    ------
    AssumptionViolation
        When the eigenvalues leave the unit circle, do not come in conjugate pairs, or do not
        match ``rope_base``.
    """
    r = T.shape[0]
    lam, E = np.linalg.eig(T)
    mod = np.abs(lam)
    if not np.all(np.abs(mod - 1.0) <= unit_tol):
        worst = float(np.max(np.abs(mod - 1.0)))
        raise AssumptionViolation(
            f"not a rotary head: the relative-position map M_(-1)^+ M_(-2) has eigenvalues "
            f"off the unit circle (|lambda| - 1 up to {worst:.3g}); a rotary head's are "
            "e^(+-i theta_j) and 1")
    ang = np.angle(lam)
    order = np.argsort(-ang, kind="stable")
    lam, E, ang = lam[order], E[:, order], ang[order]
    if rotary_dim is not None:
        half = int(rotary_dim) // 2
    else:
        half = int(np.sum(ang > PASS_TOL))
    pos, neg = ang[:half], ang[::-1][:half]
    passes = ang[half:r - half]
    if half > r // 2 or np.any(pos <= PASS_TOL) or not np.allclose(
            pos, -neg, rtol=0, atol=1e-8) or np.any(np.abs(passes) > max(PASS_TOL, 1e-8)):
        raise AssumptionViolation(
            f"not a rotary head with {2 * half} rotated dimensions: the angles of the "
            f"eigenvalues are {np.sort(ang)[::-1][:8]}... (a rotary head has R/2 pairs "
            "+-theta_j and R - d_h zeros)")
    theta = pos.copy()
    if rope_base is not None:
        want = rope_frequencies(2 * half, float(rope_base)) if half else theta
        if half == 0 or np.max(np.abs(want - theta)) > FREQ_TOL:
            raise AssumptionViolation(
                f"the frequencies found ({theta[:4]}...) are not those of rope_base="
                f"{rope_base} ({want[:4]}...)")
        theta = want
    Q, K = rotary_factors(E, theta, half, svd)
    return Factors(lam, E, half, theta, Q, K)


def rotary_factors(E: np.ndarray, theta: np.ndarray, half: int, svd: Svd):
    """``(Q, K)`` from the eigenvectors E of T (columns ordered as the eigenvalues: the R/2
    positive angles, the passes, the negative angles) and the frequencies ``theta``."""
    U_s, S, Vt = svd
    r = E.shape[0]
    # G^{-1} = [Re E; -Im E; real basis of the eigenvalue-1 space], gauge fixed by a unit
    # eigenvector whose largest entry is real and positive
    Ep = E[:, :half]
    big = np.argmax(np.abs(Ep), axis=0)
    ph = Ep[big, np.arange(half)]
    Ep = Ep * (np.conj(ph) / np.abs(ph))[None, :]
    Ep = Ep / np.linalg.norm(Ep, axis=0)[None, :]
    n_pass = r - 2 * half
    if n_pass:
        Epass = E[:, half:half + n_pass]
        basis = np.concatenate([Epass.real, Epass.imag], axis=1)
        ub, sb, _ = np.linalg.svd(basis, full_matrices=False)
        Ppass = ub[:, :n_pass]
    else:
        Ppass = np.zeros((r, 0))
    Ginv = np.concatenate([Ep.real, -Ep.imag, Ppass], axis=1)
    G = np.linalg.inv(Ginv)
    Q = G @ Vt
    # K^T = U S G^{-1} D^{-1}, i.e. K = D (U S G^{-1})^T: every row of U S G^{-1} rotated by
    # one position
    KT = (U_s * S) @ Ginv  # (d, r)
    K = rotate_half(KT, np.full(KT.shape[0], 1.0), theta).T
    return Q, K


def biases(fac: Factors, bias_data):
    """The query and key biases ``(b_Q, b_K)`` in the basis of ``fac.Q`` and ``fac.K``, from the
    zero-last-token probes (``g1 = g_{-1}``, ``dk1 = k_{-1} - k_0``) and the two-row columns'
    constants ``Cp`` at token scales ``sc``, ``bias_data = (g1, dk1, Cp, sc)`` (module
    docstring, "Biases"); zeros when ``bias_data`` is None (a head fitted without biases)."""
    if bias_data is None:
        return np.zeros(fac.rank), np.zeros(fac.rank)
    g1, dk1, Cp, sc = bias_data
    theta = fac.frequencies
    half = theta.size
    # g_{-1} = K^T D b_Q
    Db = np.linalg.lstsq(fac.K.T, g1, rcond=None)[0]
    b_Q = rotate_half(Db[None, :], np.array([-1.0]), theta)[0]
    m0 = np.einsum("jr,rj->j", fac.K.T, fac.Q)  # diag of M_0 = K^T Q
    g0 = fac.K.T @ b_Q
    # the column constant: -C' = dk1 + s (h_{-1} - h_0)_j - s^2 m0_j - s g0_j, with
    # h_{-1} - h_0 = Q^T (D^T - I) b_K
    w = (-Cp - dk1 + sc**2 * m0 + sc * g0) / sc
    z = np.linalg.lstsq(fac.Q.T, w, rcond=None)[0]
    b_K = np.zeros(fac.Q.shape[0])
    zc = (z[:half] + 1j * z[half:2 * half]) / (np.exp(-1j * theta) - 1.0)
    b_K[:half], b_K[half:2 * half] = zc.real, zc.imag
    return b_Q, b_K
