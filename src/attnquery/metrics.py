"""Error metrics and fits used to score learners and to check the study's claims."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.stats

from .errors import ConfigError

__all__ = [
    "relative_error",
    "absolute_error",
    "random_inputs",
    "functional_error",
    "PowerLawFit",
    "fit_power_law",
    "fit_linear",
    "head_errors",
]


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


def fit_power_law(x, y, level: float = 0.95) -> PowerLawFit:
    """Fit ``y = C x^slope`` on log-log axes (positive points only)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = (x > 0) & (y > 0)
    return fit_linear(np.log(x[ok]), np.log(y[ok]), level=level)
