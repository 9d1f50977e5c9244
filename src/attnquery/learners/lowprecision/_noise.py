"""The noise model of the low-precision learners: the answers' relative noise against the
learners' limit, each sketch entry's noise as a function of its size, and the tail factors
the probes' scales leave room for."""

from __future__ import annotations

import numpy as np

from ...errors import AssumptionViolation
from ._constants import MAX_NOISE_LEVEL


def noise_model(side) -> np.ndarray:
    """Each entry's standard deviation of one measurement, ``sqrt(a + b T^2)``: ``a`` and
    ``b`` (non-negative) fitted to the medians of ``(x_1 - x_2)^2 / 2`` over 16 bins of the
    entries' ``|T|``, from the side's last two uniform passes (a noise of the answers' own
    size gives ``b``, one of the box's rounding whatever the entry gives ``a``)."""
    import scipy.optimize

    T = np.abs(side.mean()).ravel()
    half = ((side.last[-1] - side.last[-2]) ** 2 / 2.0).ravel()
    ok = np.isfinite(half)
    T, half = T[ok], half[ok]
    edges = np.quantile(T, np.linspace(0.0, 1.0, 17))
    b = np.clip(np.searchsorted(edges, T, side="right") - 1, 0, 15)
    rows = [(np.mean(T[b == i] ** 2), np.median(half[b == i]) / 0.455)
            for i in range(16) if np.count_nonzero(b == i) >= 8]
    if len(rows) < 2:
        return np.ones(side.count.shape)
    t2, v = np.asarray(rows).T
    sc = np.maximum(v, 1e-300)  # relative residuals: every bin counts alike
    (a, bb), _ = scipy.optimize.nnls(np.column_stack([np.ones_like(t2), t2]) / sc[:, None],
                                     v / sc)
    sd = np.sqrt(a + bb * side.mean() ** 2)
    return sd if np.all(np.isfinite(sd)) and sd.max() > 0 else np.ones(side.count.shape)


def tail(n: int) -> float:
    """About how many times their root-mean-square the largest of n Gaussian values is,
    ``sqrt(2 ln 2n)``."""
    return float(np.sqrt(2.0 * np.log(2.0 * n)))


def spread_root(k: int) -> float:
    """``sqrt(chi2_k(0.025) / k)``: a root-mean-square estimated from k values is at least
    this fraction of the true one, 39 times out of 40."""
    import scipy.stats  # here, not at the top: importing it costs every study job 0.5 s

    return float(np.sqrt(scipy.stats.chi2.ppf(0.025, k) / k))


def check_noise(acc) -> None:
    """Raise when the answers are too coarse for the learner's error model."""
    rel = acc.noise() if acc.dof >= 10 else 0.0
    if rel > MAX_NOISE_LEVEL:
        raise AssumptionViolation(
            f"the answers carry a relative noise of {rel:.3g}, above "
            f"the {MAX_NOISE_LEVEL:g} this learner allows: a pair's log-ratio is then biased "
            "by about the noise squared, which no number of queries averages away")

