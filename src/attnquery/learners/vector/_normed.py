"""A layer's attention read through its input norm and residual (beyond the paper).

A decoder layer's attention half is ``x -> x + attn(RMSNorm(x))`` with
``RMSNorm(x) = g * x / sqrt(mean(x^2) + eps)``. The residual is known: it is subtracted. The
norm is not invertible (every token's scale is lost), but it reaches an open set: for a
token z with ``mean(z^2) < 1`` the token ``x = z sqrt(eps / (1 - mean(z^2)))`` has
``x / sqrt(mean(x^2) + eps) = z`` exactly, so ``RMSNorm(x) = g * z``. :class:`NormedInputs`
asks the box at such x and answers as the attention module of the *folded* maps
``W diag(g) c`` would at ``z / c`` (c = :data:`FOLD_SCALE` ``sqrt(d)``: tokens of norm about 1,
as the rotary routes ask, reach attention at half the norm's largest mean square).

What the answers fix (the gauge): only ``diag(g) W_Q^T``, ``diag(g) W_K^T`` and
``diag(g) W_V^T`` as products, and eps. The gain folds into the fitted maps; eps is measured
first (:func:`measure_eps`), from one-token answers, whose output is linear in ``RMSNorm(x)``:
``f(t e) / f(e) = t sqrt(1 + eps) / sqrt(t^2 + eps)`` for a token e of mean square 1.
"""

from __future__ import annotations

import numpy as np

from ...errors import ModelMismatchError, NotIdentifiableError

__all__ = ["NormedInputs", "measure_eps", "EPS_SCALES", "FOLD_SCALE", "NORMS",
           "MAX_MEAN_SQUARE", "EPS_QUERIES"]

#: the input norms a layer may be read through (None: the module's own inputs)
NORMS = (None, "rms")
#: token scales t of the eps measurement (one-token queries t e, e of mean square 1)
EPS_SCALES = (1e-3, 1e-6)
#: queries of the eps measurement: the zero token, e, and e at each scale
EPS_QUERIES = 2 + len(EPS_SCALES)
#: the folded tokens' scale: z = FOLD_SCALE sqrt(d) z', so a token z' of norm 1 reaches the
#: attention at mean square 1/4 of the largest the norm lets through
FOLD_SCALE = 0.5
#: the largest mean square of a folded token the adapter asks (1 is unreachable)
MAX_MEAN_SQUARE = 0.95
#: one-token answers' agreement with a norm's (relative): direction and eps's two readings
EPS_RTOL = 1e-6


def measure_eps(oracle, d: int, residual: bool, rng: np.random.Generator) -> float:
    """The norm's eps from :data:`EPS_QUERIES` one-token queries (see the module's docstring).

    Raises
    ------
    ModelMismatchError
        The one-token answers are not those of attention behind an RMS norm: answers not along
        one direction, scaling with the token (no norm), or two readings of eps that disagree.
    NotIdentifiableError
        eps measured 0: the norm keeps only the tokens' directions, and no open set of inputs
        reaches the attention.
    """
    e = rng.standard_normal(d)
    e /= np.sqrt(np.mean(e * e))
    t = np.array((1.0,) + EPS_SCALES)
    X = np.concatenate([np.zeros((1, 1, d)), (t[:, None] * e)[:, None, :]])
    Y = np.asarray(oracle(X), dtype=np.float64)
    Y = Y[:, 0] if Y.ndim == 3 else Y
    if residual:
        Y = Y - X[:, 0]
    f = Y[1:] - Y[0]
    top = float(np.linalg.norm(f[0]))
    if top == 0.0:
        raise NotIdentifiableError("the one-token answers do not depend on the token: the "
                                   "layer's value maps are 0 behind its norm")
    r = f[1:] @ f[0] / top**2
    off = float(np.max(np.linalg.norm(f[1:] - np.outer(r, f[0]), axis=1)
                       / np.linalg.norm(f[1:], axis=1)))
    if not off <= EPS_RTOL:
        raise ModelMismatchError(
            f"one-token answers at scales 1 and {EPS_SCALES} are not along one direction "
            f"(relative {off:.3g}): the box is not attention behind an RMS norm",
            error=off, allowed=EPS_RTOL)
    rho, t2 = r**2, t[1:] ** 2
    if np.any(np.abs(rho - t2) <= 1e-9 * t2):
        raise ModelMismatchError(
            "the one-token answers scale with the token: no RMS norm before the attention "
            "(fit with input_norm=None)", error=0.0, allowed=0.0)
    eps = t2 * (1 - rho) / (rho - t2)
    if eps[-1] <= 0 or not np.all(np.isfinite(eps)):
        if abs(eps[-1]) < 1e-14:
            raise NotIdentifiableError(
                "the norm's eps is 0: it keeps only the tokens' directions, and no open set of "
                "inputs reaches the attention (its weights are read nowhere but a sphere)")
        raise ModelMismatchError(
            f"the one-token answers give no positive eps (read {eps.tolist()}): the box is not "
            "attention behind an RMS norm", error=float(abs(eps[-1])), allowed=0.0)
    gap = float(abs(eps[0] - eps[-1]) / eps[-1])
    if not gap <= EPS_RTOL * max(1.0, float(t2[0] / eps[-1])):
        raise ModelMismatchError(
            f"the norm's eps reads {eps[0]:.6g} at scale {EPS_SCALES[0]:g} and {eps[-1]:.6g} at "
            f"{EPS_SCALES[-1]:g}: the box is not attention behind an RMS norm",
            error=gap, allowed=EPS_RTOL)
    return float(eps[-1])


class NormedInputs:
    """The oracle of a layer behind an RMS norm (and a residual), seen as its attention
    module's on folded tokens (see the module's docstring). Every call is one call of
    ``oracle`` with the same queries; its other attributes are ``oracle``'s.

    Parameters
    ----------
    oracle : the layer's oracle (or a ledger around it)
    eps : float or None
        The norm's eps (:func:`measure_eps`); None: no norm (the tokens are asked as they are).
    residual : bool
        Subtract the residual (each answered token's input).
    """

    def __init__(self, oracle, eps: float | None, residual: bool):
        self._oracle, self.residual = oracle, bool(residual)
        self.eps = None if eps is None else float(eps)
        self.scale = 1.0 if eps is None else FOLD_SCALE * np.sqrt(int(oracle.d))

    def __getattr__(self, name):
        return getattr(self._oracle, name)

    def tokens(self, Z) -> np.ndarray:
        """The inputs x the folded tokens Z' (..., d) are asked as."""
        if self.eps is None:
            return np.asarray(Z, dtype=np.float64)
        Z = self.scale * np.asarray(Z, dtype=np.float64)
        m = np.mean(Z * Z, axis=-1, keepdims=True)
        if np.max(m, initial=0.0) > MAX_MEAN_SQUARE:
            raise NotIdentifiableError(
                f"a folded token of mean square {float(np.max(m)):.3g} does not reach the "
                f"attention through the norm (at most {MAX_MEAN_SQUARE}): the route asked a "
                "token beyond what the norm lets through")
        return Z * np.sqrt(self.eps / (1.0 - m))

    def __call__(self, Z) -> np.ndarray:
        X = self.tokens(Z)
        O = np.asarray(self._oracle(X), dtype=np.float64)
        if self.residual:
            O = O - (X if O.ndim == 3 else X[:, -1])
        return O
