"""The lines of :class:`~.generic.MultiHeadLearner`: asking them, fitting them by sums of
attention terms, and the terms at the first anchor (functions of the learner's parameters)."""

from __future__ import annotations

import numpy as np

from .._base import QueryLedger
from .lines import LineFit, fit_tanh_sum, predicted_error
from .matching import match_additive

__all__ = ["ask_lines", "fit_lines", "first_anchor"]


def ask_lines(ledger: QueryLedger, vsum, y, U, t):
    """Even part over t of ``g(t u) = f([y + t u; y]) - y^T s`` for each row u of U
    (``s = vsum``).

    Returns e (n_lines, n_t) = even part / t.
    """
    n, d = U.shape
    ts = np.concatenate([t, -t])
    X = np.empty((n, ts.size, 2, d))
    X[:, :, 0, :] = y + ts[None, :, None] * U[:, None, :]
    X[:, :, 1, :] = y
    ans = ledger.ask(X.reshape(-1, 2, d), "lines").reshape(n, ts.size)
    return (ans[:, : t.size] + ans[:, t.size:] - 2.0 * float(y @ vsum)) / (2.0 * t)


def fit_lines(E, t, kmax, fit_tol) -> list[LineFit]:
    """Each row of E (the even parts of :func:`ask_lines`) fitted by a sum of at most kmax
    attention terms (``fit_tol``: the learner's), with its predicted error."""
    out = []
    for i, fit in enumerate(fit_tanh_sum(t, E, kmax, fit_tol)):
        err = predicted_error(t, E[i], fit) if fit.n_terms else np.inf
        out.append(LineFit(fit.n_terms, fit.rates, fit.coef, err))
    return out


def first_anchor(ledger: QueryLedger, vsum, y, t, kmax, r_dir, *, fit_tol, line_tol, match_tol,
                 max_line_rounds):
    """Terms at the first anchor: a reference line u0 and lines u0 +- u_i (additivity).

    ``fit_tol``, ``line_tol``, ``match_tol``, ``max_line_rounds``: the learner's parameters.
    Returns (rows_u, rows_a, rows_b, K, n_accepted, n_rejected); rows_u is None when too
    few lines were accepted with this reference line.
    """
    d = y.size
    # reference: among a few candidate lines, the most common number of terms K, then the
    # best conditioned line with K terms
    U0 = r_dir.standard_normal((4, d))
    U0 /= np.linalg.norm(U0, axis=1, keepdims=True)
    fits = fit_lines(ask_lines(ledger, vsum, y, U0, t), t, kmax, fit_tol)
    ks = np.array([f.n_terms for f in fits])
    if not np.any(ks):
        return None, None, None, 0, 0, len(fits)
    vals, counts = np.unique(ks[ks > 0], return_counts=True)
    K = int(vals[np.argmax(counts)])
    errs = np.array([f.err if f.n_terms == K else np.inf for f in fits])
    i0 = int(np.argmin(errs))
    if errs[i0] > 0.1 * line_tol:
        return None, None, None, K, 0, len(fits)
    u0, ref = U0[i0], fits[i0]
    p0 = np.stack([ref.rates, 2.0 * ref.coef], axis=1)  # gauge: a(u0) > 0 for every term
    rows_a, rows_b, rows_u = [p0[:, 0]], [p0[:, 1]], [u0]
    n_acc = n_rej = 0
    for _ in range(max_line_rounds):
        need = d + 2 - n_acc
        if need <= 0:
            break
        if n_acc:  # ask for as many lines as the acceptance rate so far needs
            need = min(int(np.ceil(need * (n_acc + n_rej) / n_acc)) + 2, 8 * d)
        Ui = r_dir.standard_normal((need, d))
        Ui /= 2.0 * np.linalg.norm(Ui, axis=1, keepdims=True)
        fits = fit_lines(
            ask_lines(ledger, vsum, y, np.concatenate([u0 + Ui, u0 - Ui]), t), t, K, fit_tol)
        for i in range(need):
            res = match_additive(p0, fits[i], fits[need + i], line_tol=line_tol,
                                 match_tol=match_tol)
            if res is None:
                n_rej += 1
                continue
            rows_u.append(Ui[i])
            rows_a.append(res[0])
            rows_b.append(res[1])
            n_acc += 1
        if n_acc == 0:
            break  # no line matches this reference line: it is wrong, try another one
    if n_acc < d:
        return None, None, None, K, n_acc, n_rej
    return rows_u, rows_a, rows_b, K, n_acc, n_rej
