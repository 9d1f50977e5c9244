"""Error metrics and fits used to score learners and to check the study's claims."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .theory import nuclear_statdim  # noqa: F401  (public here too; defined in theory)

__all__ = [
    "relative_error",
    "absolute_error",
    "random_inputs",
    "functional_error",
    "max_error_by_length",
    "PowerLawFit",
    "fit_power_law",
    "fit_power_law_within",
    "fit_linear",
    "nuclear_statdim",
    "head_errors",
    "match_heads",
    "rotary_layer_errors",
    "match_neurons",
    "fit_counted",
]


def fit_counted(learner, oracle, record_refusal: bool = False) -> dict:
    """Fit ``learner`` on ``oracle`` and count its queries as the study records them.

    Returns the metrics ``n_queries`` (queries the oracle counted for learning: all of the fit's
    but the check queries), ``verify_queries`` (the check queries, counted by the oracle),
    ``verify_error`` (the disagreement the check saw; None without a check, or where it is not
    a number), ``verified`` (whether the estimate passed its check; None without a check) and
    ``verify_vacuous`` (whether that check could not have failed, the learner's
    ``verify_vacuous_``; None without a check).

    With ``record_refusal``, a learner that refuses its estimate
    (:class:`~attnquery.errors.ModelMismatchError`: the answers are not what it assumes) is
    recorded with ``verified = False`` instead of raising; its estimate's attributes are set,
    so the cell can still measure how far off it is (experiments that run learners outside
    their assumptions on purpose: noise, rounding, too few measurements).
    """
    from .errors import ModelMismatchError

    n0 = oracle.n_queries
    verified = True
    try:
        learner.fit(oracle)
    except ModelMismatchError:
        if not record_refusal:
            raise
        verified = False
    n_check = int(getattr(learner, "n_verify_queries_", 0) or 0)
    err = float(getattr(learner, "verify_error_", float("nan")))
    return {
        "n_queries": int(oracle.n_queries - n0 - n_check),
        "verify_queries": n_check,
        "verify_error": err if n_check and np.isfinite(err) else None,
        "verified": verified if n_check else None,
        "verify_vacuous": bool(getattr(learner, "verify_vacuous_", False)) if n_check else None,
    }


def absolute_error(est, true) -> float:
    """Frobenius (or Euclidean) norm of ``est - true``."""
    return float(np.linalg.norm(np.asarray(est, dtype=float) - np.asarray(true, dtype=float)))


def relative_error(est, true) -> float:
    """``||est - true|| / ||true||``; the absolute error when ``true`` is 0."""
    true = np.asarray(true, dtype=float)
    den = float(np.linalg.norm(true))
    num = absolute_error(est, true)
    return num / den if den > 0 else num


def random_inputs(d: int, rng, n: int = 256, lengths=(1, 2, 4, 8)) -> list[np.ndarray]:
    """Held-out random inputs: ``n`` sequences of each length, tokens ~ N(0, I_d / d)."""
    rng = np.random.default_rng(rng)
    return [rng.standard_normal((n, N, d)) / np.sqrt(d) for N in lengths]


def max_error_by_length(f_true, f_hat, d: int, rng, n_sequences) -> dict[int, float]:
    """Relative maximum difference ``max |f_hat - f_true| / max |f_true|`` per sequence length.

    ``n_sequences`` maps each length N to how many random sequences of N tokens
    (tokens ~ N(0, I_d / d), drawn from ``rng`` in the mapping's order) it is measured on; used
    where the error is reported against the length (rotary heads, up to thousands of tokens).
    """
    out = {}
    for N, n in n_sequences.items():
        X = rng.standard_normal((n, N, d)) / np.sqrt(d)
        y = f_true(X)
        out[N] = float(np.max(np.abs(f_hat(X) - y)) / np.max(np.abs(y)))
    return out


def functional_error(f_true, f_hat, d: int, rng, n: int = 256, lengths=(1, 2, 4, 8)) -> float:
    """Relative RMS difference of two functions on held-out random inputs of several lengths.

    ``sqrt(mean (f_hat - f_true)^2) / sqrt(mean f_true^2)`` over every input (the absolute RMS
    difference when ``f_true`` is identically 0 on them).
    """
    num = den = 0.0
    for X in random_inputs(d, rng, n=n, lengths=lengths):
        a = np.asarray(f_true(X), dtype=float)
        b = np.asarray(f_hat(X), dtype=float)
        num += float(np.sum((a - b) ** 2))
        den += float(np.sum(a**2))
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


def head_errors(W_hat, v_hat, W, v) -> dict:
    """The standard error metrics of one recovered head against the truth."""
    return {
        "rel_err_W": relative_error(W_hat, W),
        "abs_err_W": absolute_error(W_hat, W),
        "rel_err_v": relative_error(v_hat, v),
        "err_v": absolute_error(v_hat, v),
    }


@dataclass(frozen=True)
class PowerLawFit:
    """``y = C x^slope`` fitted by least squares on log-log axes, with a confidence interval."""

    slope: float
    intercept: float
    lo: float
    hi: float
    n: int
    level: float = 0.95

    @property
    def coefficient(self) -> float:
        return float(np.exp(self.intercept))

    def __str__(self) -> str:
        pct = int(round(100 * self.level))
        return f"{self.slope:.3f} [{self.lo:.3f}, {self.hi:.3f}] ({pct}% CI, n={self.n})"


def fit_linear(x, y, level: float = 0.95) -> PowerLawFit:
    """Ordinary least squares ``y = intercept + slope x`` with a t-interval for the slope."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 3 or np.ptp(x) == 0:
        raise ConfigError(f"a fit needs at least 3 points at 2 distinct x; got {x.size}")
    import scipy.stats  # here, not at the top: it costs every study job half a second to import

    res = scipy.stats.linregress(x, y)
    dof = x.size - 2
    t = scipy.stats.t.ppf(0.5 + level / 2, dof)
    half = t * res.stderr
    return PowerLawFit(
        slope=float(res.slope),
        intercept=float(res.intercept),
        lo=float(res.slope - half),
        hi=float(res.slope + half),
        n=int(x.size),
        level=level,
    )


def fit_power_law_within(x, y, groups, level: float = 0.95) -> PowerLawFit:
    """One exponent for several power laws ``y = C_g x^slope`` with a constant per group.

    Least squares of log y on log x after demeaning both within each group (a fixed effect per
    group); the t-interval uses ``n - G - 1`` degrees of freedom for n points in G groups, and
    the reported intercept is 0 (the constants are the groups'). Positive finite points only.

    Raises
    ------
    ConfigError
        When fewer than 2 residual degrees of freedom remain, or no group has two distinct x.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    g = np.asarray(groups)
    ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    lx, ly, g = np.log(x[ok]), np.log(y[ok]), g[ok]
    _, code = np.unique(g.astype(str), return_inverse=True)
    n, G = lx.size, int(code.max()) + 1 if lx.size else 0
    cnt = np.bincount(code, minlength=G) if n else np.zeros(0)
    cx = lx - (np.bincount(code, lx, G) / cnt)[code] if n else lx
    cy = ly - (np.bincount(code, ly, G) / cnt)[code] if n else ly
    sxx = float(cx @ cx)
    dof = n - G - 1
    if dof < 2 or sxx <= 0:
        raise ConfigError(f"a fit within groups needs 2 residual degrees of freedom and a group "
                          f"with 2 distinct x; got {n} points in {G} groups")
    slope = float(cx @ cy) / sxx
    resid = cy - slope * cx
    import scipy.stats  # here, not at the top (see fit_linear)

    half = scipy.stats.t.ppf(0.5 + level / 2, dof) * float(np.sqrt(resid @ resid / dof / sxx))
    return PowerLawFit(slope=slope, intercept=0.0, lo=slope - half, hi=slope + half, n=n,
                       level=level)


def fit_power_law(x, y, level: float = 0.95) -> PowerLawFit:
    """Fit ``y = C x^slope`` on log-log axes (positive points only)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = (x > 0) & (y > 0)
    return fit_linear(np.log(x[ok]), np.log(y[ok]), level=level)



def match_heads(W_hat, v_hat, W, v) -> dict:
    """Match recovered heads to true heads up to permutation (Hungarian algorithm).

    The cost of pairing recovered head i with true head j is
    ``||W_hat_i - W_j||_F^2 + ||v_hat_i - v_j||^2``, so the optimal assignment minimises the
    total squared parameter distance (scipy.optimize.linear_sum_assignment). Unequal numbers of
    heads are allowed: unmatched true heads are compared with a zero head.

    Parameters
    ----------
    W_hat, v_hat : sequences of arrays (d, d) and (d,)
        Recovered heads, in any order.
    W, v : sequences of arrays (d, d) and (d,)
        True heads.

    Returns
    -------
    dict
        ``perm``: array (H,), ``perm[j]`` is the index of the recovered head matched to true
        head j (-1 when none is left); ``rel_err_W``, ``rel_err_v``, ``abs_err_W``, ``err_v``:
        per-true-head error arrays; ``max_rel_err_W``, ``max_rel_err_v``: their maxima;
        ``param_distance``: ``sqrt(sum of squared distances) / sqrt(sum ||W_j||^2 + ||v_j||^2)``,
        the relative distance of the stacked parameters after matching.
    """
    import scipy.optimize

    W_hat = [np.asarray(x, dtype=float) for x in W_hat]
    v_hat = [np.asarray(x, dtype=float) for x in v_hat]
    W = [np.asarray(x, dtype=float) for x in W]
    v = [np.asarray(x, dtype=float) for x in v]
    if len(W_hat) != len(v_hat) or len(W) != len(v):
        raise ConfigError("match_heads needs as many W's as v's on each side")
    if not W:
        raise ConfigError("match_heads needs at least one true head")
    H, K = len(W), len(W_hat)
    cost = np.empty((H, K))
    for j in range(H):
        for i in range(K):
            cost[j, i] = np.sum((W_hat[i] - W[j]) ** 2) + np.sum((v_hat[i] - v[j]) ** 2)
    perm = -np.ones(H, dtype=int)
    if K:
        rows, cols = scipy.optimize.linear_sum_assignment(cost)
        perm[rows] = cols
    d = W[0].shape[0]
    zW, zv = np.zeros((d, d)), np.zeros(d)
    out = {k: np.empty(H) for k in ("rel_err_W", "rel_err_v", "abs_err_W", "err_v")}
    num = den = 0.0
    for j in range(H):
        Wh = W_hat[perm[j]] if perm[j] >= 0 else zW
        vh = v_hat[perm[j]] if perm[j] >= 0 else zv
        out["rel_err_W"][j] = relative_error(Wh, W[j])
        out["rel_err_v"][j] = relative_error(vh, v[j])
        out["abs_err_W"][j] = absolute_error(Wh, W[j])
        out["err_v"][j] = absolute_error(vh, v[j])
        num += out["abs_err_W"][j] ** 2 + out["err_v"][j] ** 2
        den += float(np.sum(W[j] ** 2) + np.sum(v[j] ** 2))
    out["perm"] = perm
    out["max_rel_err_W"] = float(out["rel_err_W"].max())
    out["max_rel_err_v"] = float(out["rel_err_v"].max())
    out["param_distance"] = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
    return out


def layer_errors(W_hat, v_hat, c_hat, W, v, c) -> dict:
    """:func:`match_heads`, plus each matched head's relative error of its key bias.

    ``c_hat`` and ``c`` are the recovered and the true key biases (sequences of arrays (d,), in
    the order of ``W_hat`` and ``W``); a true head without a match is compared with 0. Returns
    :func:`match_heads`'s dict with ``rel_err_c`` (per true head) and ``max_rel_err_c`` added.
    """
    m = match_heads(W_hat, v_hat, W, v)
    c = [np.asarray(x, dtype=float) for x in c]
    c_hat = [np.asarray(x, dtype=float) for x in c_hat]
    if len(c) != len(W) or len(c_hat) != len(W_hat):
        raise ConfigError("layer_errors needs one key bias per head on each side")
    m["rel_err_c"] = np.array([relative_error(c_hat[i] if i >= 0 else np.zeros_like(cj), cj)
                               for i, cj in zip(m["perm"], c, strict=True)])
    m["max_rel_err_c"] = float(m["rel_err_c"].max())
    return m


def rotary_layer_errors(learned, truth, offsets=(-1, -511)) -> dict:
    """Errors of a recovered layer of rotary heads against the truth, heads matched.

    Both layers give ``value_maps()`` (H, d, d_out), ``output_bias`` and head h's form
    ``M(delta, h)`` (d+1, d+1) at a relative offset (a
    :class:`~attnquery.models.vector.RotaryFormLayer` or a rotary
    :class:`~attnquery.models.vector.VectorAttentionLayer`). The forms are compared on their
    key rows ``M[:d]`` (the last row, the key's constant coordinate, is determined only up to a
    part constant over the offsets, which the softmax cancels); the heads are matched by
    :func:`match_heads` on the first offset's key rows and the value maps.

    Returns
    -------
    dict
        ``rel_err_M`` ({offset: worst head's relative error of the key rows}), ``rel_err_V``
        (worst head), ``rel_err_output_bias``, ``matched`` (``matched[j]``: the recovered head
        matched to true head j).
    """
    H = truth.n_heads
    if learned.n_heads != H:
        raise ConfigError(f"the recovered layer has {learned.n_heads} heads, the truth {H}")
    d = truth.d

    def forms(layer, delta):
        return [layer.M(delta, h)[:d] for h in range(H)]

    V_hat, V = learned.value_maps(), truth.value_maps()
    m = match_heads(forms(learned, offsets[0]), list(V_hat.reshape(H, -1)),
                    forms(truth, offsets[0]), list(V.reshape(H, -1)))
    perm = m["perm"]
    rel_M = {}
    for delta in offsets:
        got, want = forms(learned, delta), forms(truth, delta)
        rel_M[int(delta)] = max(relative_error(got[perm[j]], want[j]) for j in range(H))
    return {"rel_err_M": rel_M, "rel_err_V": m["max_rel_err_v"],
            "rel_err_output_bias": relative_error(learned.output_bias, truth.output_bias),
            "matched": perm.tolist()}


def match_neurons(A_hat, w_hat, A, w) -> dict:
    """Match the neurons of two bias-free ReLU layers up to permutation and positive scale.

    A neuron ``w ReLU(a^T x)`` is unchanged by ``(w, a) -> (w / c, c a)`` for ``c > 0``; its
    invariant is the vector ``w a``. Neurons are paired by the Hungarian algorithm on the
    squared distances of these vectors.

    Parameters
    ----------
    A_hat, w_hat : arrays (d, m_hat), (m_hat,)
    A, w : arrays (d, m), (m,)

    Returns
    -------
    dict
        ``same_width`` (m_hat == m), ``perm`` (``perm[j]`` matched to true neuron j, -1 if
        none), ``rel_err`` (relative Frobenius error of the stacked ``w_j a_j`` after matching,
        unmatched true neurons compared with 0) and ``max_rel_err`` (worst neuron).
    """
    import scipy.optimize

    P_hat = np.asarray(A_hat, dtype=float) * np.asarray(w_hat, dtype=float)[None, :]
    P = np.asarray(A, dtype=float) * np.asarray(w, dtype=float)[None, :]
    m, m_hat = P.shape[1], P_hat.shape[1]
    cost = np.sum((P[:, :, None] - P_hat[:, None, :]) ** 2, axis=0)
    perm = -np.ones(m, dtype=int)
    if m and m_hat:
        rows, cols = scipy.optimize.linear_sum_assignment(cost)
        perm[rows] = cols
    matched = np.where(perm[None, :] >= 0, P_hat[:, np.maximum(perm, 0)], 0.0)
    per = np.linalg.norm(matched - P, axis=0) / np.maximum(np.linalg.norm(P, axis=0), 1e-300)
    return {
        "same_width": bool(m == m_hat),
        "perm": perm,
        "rel_err": relative_error(matched, P),
        "max_rel_err": float(per.max()) if m else 0.0,
    }
