"""The readings of the rotary vector routes (:class:`~attnquery.learners.vector.rotary.
RotaryVectorLearner`, :class:`~attnquery.learners.vector.rotary_layer.RotaryLayerVectorLearner`):
every head's attention weights in one row of a vector answer, the heads' query and key row
spaces, their rotary forms in those spaces (see that module's docstring), and what both routes
share: the offsets their form queries reach (:func:`form_offset`, every offset the check asks),
their parameters (:data:`ROTARY_PARAMS`), their refusals and their query plan
(:func:`rotary_plan`), long queries asked in
blocks (:func:`ask_blocks`) and ``fit_bias=False`` (:func:`drop_biases`)."""

from __future__ import annotations

import numbers

import numpy as np

from ...errors import ConfigError, ModelMismatchError, NotIdentifiableError
from .._base import CHECK_LENGTH_PARAM, VERIFY_PARAM, BaseLearner
from .._params import Interval
from ._attention import ATTENTION_TOL, MIN_WEIGHT

__all__ = ["head_weights", "whitened_solve", "row_space", "rotary_basis", "solve_forms",
           "FORMS_RCOND", "SPACE_RTOL", "BLOCK_BYTES", "vanishing", "ask_blocks", "form_offset",
           "rotary_plan", "BIAS_RTOL", "drop_biases", "ROTARY_PARAMS"]

#: the parameters both rotary routes take, and their constraints (each route adds its own)
ROTARY_PARAMS = {
    "random_state": BaseLearner._parameter_constraints["random_state"],
    "rope_base": [Interval(numbers.Real, 1, None, closed="neither"), None],
    "head_dim": [Interval(numbers.Integral, 2, None, closed="left"), None],
    "causal": ["boolean"],
    "max_offset": [Interval(numbers.Integral, 1, None, closed="left"), None],
    "verify": [VERIFY_PARAM],
    "check_length": [CHECK_LENGTH_PARAM],
    "fit_bias": ["boolean"],
    "n_queries": [Interval(numbers.Integral, 1, None, closed="left"), None],
}

#: float64 bytes of query tokens per call of the oracle when the form stages ask long queries
#: (a layer at d = 256 asks thousands of queries of 4,096 tokens: gigabytes at once otherwise)
BLOCK_BYTES = 64 * 2**20

#: relative singular value below which the form equations' directions are left out (the
#: slowest frequencies barely turn over the offsets asked: only their sum is determined)
FORMS_RCOND = 1e-12
#: the collected query/key vectors must span the head dimension above this relative singular
#: value and nothing beyond it (measured noise: 1e-11 to 1e-8 relative)
SPACE_RTOL = 1e-6
#: with ``fit_bias=False`` the measured biases must be below this, relative (the output offset
#: to the values' largest output, the forms' bias rows and columns to their largest bilinear
#: part); the fresh check on the bias-free estimate then decides
BIAS_RTOL = 1e-6


def head_weights(vals: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, float]:
    """The weights a (n, M, s) with ``y[q, m] = sum_j a[q, m, j] vals[q, j]`` and every row's
    weights summing to one, from one head's coordinates ``y`` (n, M, r) of M rows of n queries
    that see the same s distinct values ``vals`` (n, s, r) (lumped tokens: one value), and the
    largest residual of that solve relative to the answers.

    Raises ModelMismatchError where a row is no such weighted sum (relative residual above
    :data:`~attnquery.learners.vector._attention.ATTENTION_TOL`) or a weight is negative."""
    n, s, r = vals.shape
    unit = max(float(np.max(np.abs(vals))), 1.0)
    P = np.concatenate([vals, np.full((n, s, 1), unit)], axis=2)
    Y = np.concatenate([y, np.full(y.shape[:2] + (1,), unit)], axis=2)
    a = _right_solve(P, Y)
    res = float(np.max(np.abs(a @ P - Y))) / float(np.max(np.abs(Y)))
    if res > ATTENTION_TOL or np.min(a) < -ATTENTION_TOL:
        raise ModelMismatchError(
            f"the answers differ by {res:.3g} (relative) from every attention-weighted sum of "
            f"the tokens' values (or a weight is negative, {np.min(a):.3g}), where float64 "
            f"rounding explains {ATTENTION_TOL:g}: the box is not {what}",
            error=max(res, float(-np.min(a))), allowed=ATTENTION_TOL)
    return a, res


def _right_solve(P: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """``Y @ pinv(P)`` for a stack of P (n, s, c) of full row rank s <= c: from the QR
    factorization of P^T (a third of the pseudo-inverse's SVD work), by the pseudo-inverse
    where a P is numerically of lower rank."""
    Q, R = np.linalg.qr(np.swapaxes(P, 1, 2))
    diag = np.abs(np.diagonal(R, axis1=1, axis2=2))
    if P.shape[1] > P.shape[2] or np.any(diag <= 1e-10 * np.max(diag, axis=1, keepdims=True)):
        return Y @ np.linalg.pinv(P)
    return np.swapaxes(np.linalg.solve(R, np.swapaxes(Y @ Q, 1, 2)), 1, 2)


def whitened_solve(Z: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """The least-squares solutions (c, e) of ``Z x = rhs[:, i]`` (Z (n, e), n > e, rhs (n, c)),
    each divided by its residual's standard deviation (its noise: a column whose answers
    carry more rounding, such as a small weight's logarithm, counts less in the span)."""
    x, res, rank, _ = np.linalg.lstsq(Z, rhs, rcond=None)
    n, e = Z.shape
    if rank < e or res.size == 0:
        raise NotIdentifiableError("the subspace queries' tokens do not determine the "
                                   "coefficients (a singular design)")
    norm = np.linalg.norm(x, axis=0)
    noise = np.maximum(np.sqrt(res / (n - e)), np.finfo(float).eps * norm)
    return (x / noise).T


def row_space(vectors: np.ndarray, dim: int, what: str) -> np.ndarray:
    """An orthonormal basis (dim, d) of the span of ``vectors`` (k, d), which should have
    dimension ``dim``: NotIdentifiableError where they span fewer (relative singular value
    :data:`SPACE_RTOL`), ModelMismatchError where they span more."""
    _, s, Vt = np.linalg.svd(vectors, full_matrices=False)
    if s.size < dim or s[dim - 1] <= SPACE_RTOL * s[0]:
        raise NotIdentifiableError(
            f"the {vectors.shape[0]} vectors of the {what} span fewer than the head "
            f"dimension {dim}: too few to tell the row space")
    if s.size > dim and s[dim] > SPACE_RTOL * s[0]:
        raise ModelMismatchError(
            f"the vectors of the {what} span more than the head dimension {dim} (relative "
            f"singular value {s[dim] / s[0]:.3g}): the box is not a layer of rotary heads of "
            "that dimension", error=float(s[dim] / s[0]), allowed=SPACE_RTOL)
    return Vt[:dim]


def vanishing(small: np.ndarray, offsets: np.ndarray) -> None:
    """Refuse keys whose weights vanish (``small``, below
    :data:`~attnquery.learners.vector._attention.MIN_WEIGHT`) at ``offsets`` (same shape): a
    ModelMismatchError where every key from some offset on vanishes and none nearer does (the
    box masks distant keys: a sliding window), else a NotIdentifiableError (too peaked)."""
    far = np.abs(offsets)
    w = float(np.min(far[small]))
    if not np.any(~small & (far >= w)):
        raise ModelMismatchError(
            f"every key at an offset of {w:.0f} or more gets no attention weight (below "
            f"{MIN_WEIGHT:g}) and every nearer key does get weight: the box masks distant keys "
            f"(a sliding window of about {w:.0f} tokens?), so it is not rotary heads over the "
            "whole sequence as declared", error=w, allowed=float(np.max(far)) + 1)
    raise NotIdentifiableError(
        f"attention weights below {MIN_WEIGHT:g} at offsets from {w:.0f} on, mixed with larger "
        "ones at longer offsets: the heads are too peaked for tokens of norm 1")


def rotary_basis(delta: np.ndarray, frequencies: np.ndarray) -> np.ndarray:
    """[cos(theta_j delta), sin(theta_j delta), 1] per offset: shape (..., R + 1)."""
    a = delta[..., None] * frequencies
    return np.concatenate([np.cos(a), np.sin(a), np.ones(delta.shape + (1,))], axis=-1)


def solve_forms(kappa: np.ndarray, offsets: np.ndarray, ell: np.ndarray,
                frequencies: np.ndarray) -> tuple[np.ndarray, int]:
    """The forms ``T_b(p)`` (nb, e, P) of P probes from the log-weights ``ell`` (P, E, k) of
    E rows, each seeing the k keys of coordinates ``kappa`` (E, k, e) at ``offsets`` (E, k):
    ``ell[p, e, i] = sum_b basis_b(offsets[e, i]) kappa[e, i]^T T_b(p)`` plus a constant of
    the row (the softmax's). Every probe shares the rows: one least squares (rows centred,
    directions below :data:`FORMS_RCOND` left out) serves all, so the solutions are linear in
    the probes' tokens. Returns the forms and the equations' numerical rank."""
    B = rotary_basis(offsets, frequencies)  # (E, k, nb)
    E, k, nb = B.shape
    e = kappa.shape[2]
    D = (B[:, :, :, None] * kappa[:, :, None, :]).reshape(E, k, nb * e)
    D = (D - D.mean(axis=1, keepdims=True)).reshape(E * k, nb * e)
    rhs = (ell - ell.mean(axis=2, keepdims=True)).reshape(ell.shape[0], E * k).T
    if not np.all(np.isfinite(rhs)):
        vanishing(~np.all(np.isfinite(ell), axis=0), offsets)
    T, _, rank, _ = np.linalg.lstsq(D, rhs, rcond=FORMS_RCOND)
    return T.reshape(nb, e, -1), int(rank)


def form_offset(max_offset, check_length: int) -> int:
    """The longest relative offset the form queries ask: ``max_offset``, by default
    ``check_length - 1`` (the longest offset a check query of ``check_length`` tokens holds).

    The forms are read at the offsets asked and nowhere else (the slowest frequencies' forms
    are determined only as a sum over those offsets), so a ``max_offset`` below
    ``check_length - 1`` would leave the check's longest queries to an extrapolation:
    ConfigError (before any query)."""
    need = int(check_length) - 1
    if max_offset is None:
        return max(need, 1)
    if int(max_offset) < need:
        raise ConfigError(
            f"max_offset={max_offset} does not reach the offsets of the check's longest query "
            f"(check_length={check_length}: offsets up to {need}); the forms hold only at the "
            "offsets the form queries ask, so max_offset must be at least check_length - 1 "
            "(or left None)")
    return int(max_offset)


def rotary_plan(ledger, n_queries, fit_bias: bool, plan: dict, exact: bool = True) -> None:
    """Refuse, before the queries of ``plan`` (stage -> queries), what a rotary route cannot
    honour: ``n_queries`` (the most the fit may ask) below the plan's sum (ConfigError), or an
    oracle budget below it (:class:`~attnquery.errors.BudgetExceededError`). ``exact=False``
    where the plan is a least need (a layer's split asks a number of queries that depends on the
    box). ``fit_bias=False`` asks the same queries (:func:`drop_biases`)."""
    n = int(sum(plan.values()))
    what = ", ".join(f"{k} {v}" for k, v in plan.items() if v)
    if n_queries is not None and int(n_queries) < n:
        raise ConfigError(
            f"n_queries={n_queries} is below the {n} queries this rotary fit asks "
            f"{'' if exact else 'at least '}({what}); give at least {n} or None")
    ledger.need(n, f"the rotary fit ({what})", reserved=True)


def drop_biases(est, values: np.ndarray) -> None:
    """``fit_bias=False`` on a rotary route: the biases the route read must be noise, below
    :data:`BIAS_RTOL` relative, else ModelMismatchError naming their size; then they are set to
    exactly 0, before the check. Measured by their effect at the offsets the forms were read
    at (up to ``form_offset(est.max_offset, est.check_length)``): beta against the largest
    output of the values ``values`` (..., d, d_out) of unit tokens; the forms' rows of the key's
    constant coordinate (key bias: their sum over the offsets' rotary basis, less its mean over
    the offsets, which the softmax cancels) and columns of the query's (query bias) against
    the largest bilinear part. The slowest frequencies' forms are told apart from the constant
    one only as a sum, so each form alone may hold large opposite parts: only the sums count.
    ``est`` has ``output_bias_``, ``frequencies_``, ``cos_forms_``, ``sin_forms_`` and
    ``const_form_`` (forms (..., e, e), the constant coordinate last)."""
    beta = est.output_bias_
    out = float(np.max(np.abs(np.sum(values.reshape(-1, *values.shape[-2:]), axis=0))))
    L = form_offset(est.max_offset, est.check_length)
    delta = -np.arange(L + 1.0) if est.causal else np.arange(-L, L + 1.0)
    B = rotary_basis(delta, est.frequencies_)  # (n, nb)
    F = np.concatenate([est.cos_forms_, est.sin_forms_, est.const_form_[..., None, :, :]],
                       axis=-3).reshape(-1, B.shape[1], *est.const_form_.shape[-2:])
    some = B[np.unique(np.linspace(0, B.shape[0] - 1, 65).round().astype(int))]
    inner = max(float(np.max(np.linalg.norm(np.einsum("nb,bij->nij", some, f[:, :-1, :-1]),
                                            ord=2, axis=(1, 2)))) for f in F)
    key, query = 0.0, 0.0
    for f in F:
        g = B @ f[:, -1, :-1]  # (n, e - 1): the key bias's logit, per query coordinate
        key = max(key, float(np.max(np.linalg.norm(g - g.mean(axis=0), axis=1))))
        query = max(query, float(np.max(np.linalg.norm(B @ f[:, :-1, -1], axis=1))))
    sizes = {"output offset beta": float(np.max(np.abs(beta))) / max(out, 1e-300),
             "key bias (the forms' key constant rows)": key / max(inner, 1e-300),
             "query bias (the forms' query constant columns)": query / max(inner, 1e-300)}
    worst = max(sizes, key=sizes.get)
    if not sizes[worst] <= BIAS_RTOL:
        raise ModelMismatchError(
            f"fit_bias=False, but the box's {worst} measures {sizes[worst]:.3g} (relative; "
            f"{', '.join(f'{k} {v:.3g}' for k, v in sizes.items())}), where at most "
            f"{BIAS_RTOL:g} is noise: the box has biases; fit it with fit_bias=True",
            error=sizes[worst], allowed=BIAS_RTOL)
    est.output_bias_ = np.zeros_like(beta)
    for F in (est.cos_forms_, est.sin_forms_, est.const_form_):
        F[..., -1, :] = 0.0
        F[..., :, -1] = 0.0


def ask_blocks(oracle, n: int, make, keep=None) -> np.ndarray:
    """The answers to ``n`` queries whose tokens ``make(lo, hi)`` (hi - lo, N, d) builds,
    asked in blocks of about :data:`BLOCK_BYTES` of tokens; ``keep(O)`` reduces each block's
    answers (the rows a stage reads of every token's outputs) before they are joined."""
    first = make(0, 1)
    per = max(1, int(BLOCK_BYTES // max(first.nbytes, 1)))
    out = []
    for lo in range(0, n, per):
        X = first if lo == 0 and per == 1 else make(lo, min(n, lo + per))
        O = np.asarray(oracle(X), dtype=np.float64)
        out.append(O if keep is None else keep(O))
    return np.concatenate(out)
