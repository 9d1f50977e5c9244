"""What the layer learner's route estimators share: their common parameters and rules, the
query counts of the method, the assembled layer and the fitted attributes one estimator takes
from another.

The routes are :class:`~.exact_layer.ExactLayerLearner` (exact answers),
:class:`~.served_layer.ServedLayerLearner` (served answers within ``n_queries``) and
:class:`~.rotary_layer.RotaryLayerLearner` (rotary positions, grouped-query
attention); :class:`~.layer.AttentionLayerLearner` picks one by its parameter ``route``.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import NamedTuple

import numpy as np

from ...errors import ConfigError
from ...models import AttentionHead, MultiHeadAttention
from .._base import BLOCK_BYTES_PARAM, CHECK_LENGTH_PARAM, BaseLearner, check_scalar
from .._params import Interval
from .._probes import PROBE_PARAMS, check_probe_params
from .heads import HeadProbes
from .scan import CircleScan

__all__ = ["LAYER_PARAMS", "BIAS_PARAMS", "STAGES", "SERVED_STAGES", "layer_dof",
           "layer_probe_count", "missing_probe_count", "layer_shape", "check_kv_heads",
           "set_init_params", "fitted_attributes", "AssembledLayer", "assembled", "DenseScores",
           "LayerRoute"]

#: the stages whose queries ``n_queries_by_stage_`` counts
STAGES = ("v_sum", "circle", "isolated", "missing", "verify")
#: served mode: also ``values``, the value vectors measured again from saturated queries
SERVED_STAGES = ("v_sum", "circle", "isolated", "missing", "values", "verify")

#: the parameters every route takes, with their constraints (beside ``verify`` and
#: ``random_state``, :class:`~attnquery.learners._base.BaseLearner`'s)
LAYER_PARAMS = {
    **BaseLearner._parameter_constraints,
    **PROBE_PARAMS,
    "n_heads": [Interval(Integral, 1, None, closed="left")],
    "rank": [Interval(Integral, 1, None, closed="left"), None],
    "n_grid": [Interval(Integral, 64, None, closed="left")],
    "max_planes": [Interval(Integral, 1, None, closed="left")],
    "oversample": [Interval(Integral, 0, None, closed="left")],
    "rtol": [Interval(Real, 0, 1, closed="neither")],
    "block_bytes": [BLOCK_BYTES_PARAM],
}
#: the position-free routes' parameters beside :data:`LAYER_PARAMS`
BIAS_PARAMS = {"fit_bias": ["boolean"], "check_length": [CHECK_LENGTH_PARAM]}


def layer_dof(d: int, n_heads: int, rank: int, bias: bool = True) -> int:
    """Degrees of freedom of a layer: ``H (r (2d - r) + 2d) + 1`` (``H (r (2d - r) + d)``
    without biases): per head a rank-r ``W_h``, ``v_h`` and ``c_h``, and one offset."""
    per = rank * (2 * d - rank) + (2 * d if bias else d)
    return int(n_heads * per + (1 if bias else 0))


def layer_probe_count(d: int, n_heads: int, rank: int, oversample: int = 2,
                      bias: bool = True) -> int:
    """Queries of :class:`~.layer.AttentionLayerLearner` outside its circle scan and its
    verification: V and beta (``d + 1``), the isolated heads
    ``H [(d - H + 1)(r + 1) + (r + p)(d - r)]`` and the missing directions
    ``2 H (H - 1)(r + 1)`` (each ``r`` instead of ``r + 1``, and ``d`` for V alone, without
    biases), when no probe is asked twice."""
    H, r, p, b = int(n_heads), int(rank), int(oversample), int(bool(bias))
    return int(d + b + H * ((d - H + 1) * (r + b) + (r + p) * (d - r))
               + missing_probe_count(H, r, bias))


def missing_probe_count(n_heads: int, rank: int, bias: bool = True) -> int:
    """Queries of one pass over every head's missing directions, ``2 H (H - 1)(r + 1)``
    (``r`` instead of ``r + 1`` without biases)."""
    H = int(n_heads)
    return 2 * H * (H - 1) * (int(rank) + int(bool(bias)))


def layer_shape(learner, d: int) -> tuple[int, int]:
    """The rules of a layer learner's parameters that need d (each parameter already valid):
    returns (H, r), ``r = d // n_heads`` when ``rank`` is None.

    Raises
    ------
    ConfigError
        When ``n_heads`` exceeds d, ``rank`` exceeds ``d // 2``, or ``rank + oversample``
        exceeds ``d - n_heads + 1`` (the dimension in which each head is isolated).
    """
    H = check_scalar(learner.n_heads, "n_heads", Integral, min_val=1, max_val=d)
    r = check_scalar(d // H if learner.rank is None else learner.rank, "rank", Integral,
                     min_val=1, max_val=d // 2)
    m = d - H + 1
    p = int(learner.oversample)
    if r + p > m:
        raise ConfigError(f"rank + oversample = {r + p} exceeds d - n_heads + 1 = {m}, the "
                          "dimension in which each head is isolated")
    return H, r


def check_kv_heads(n_heads: int, n_kv_heads) -> None:
    """``n_kv_heads`` (None: not checked) must divide ``n_heads``; raise ConfigError."""
    if n_kv_heads is not None and (n_kv_heads > n_heads or n_heads % n_kv_heads):
        raise ConfigError(f"n_kv_heads must divide n_heads = {n_heads}; got {n_kv_heads}")


def set_init_params(est, args: dict) -> None:
    """Set a route's constructor arguments (``locals()`` in its ``__init__``) as its
    parameters, under their own names (what ``get_params`` reads)."""
    for name, value in args.items():
        if name not in ("self", "__class__"):
            setattr(est, name, value)


def fitted_attributes(est) -> dict:
    """The fitted attributes ``est`` holds now (public names ending in ``_``), as a new dict:
    what an estimator that delegates its fit to a route takes from it."""
    return {k: v for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")}


class AssembledLayer(NamedTuple):
    """A position-free layer from its measured parts, under the fitted attributes' names."""

    heads_: list
    W_factors_: list
    v_: list
    key_bias_: list
    offset_: float
    n_heads_: int
    rank_: int


def assembled(vs, Ks, Qs, cs, beta: float, r: int) -> tuple[AssembledLayer, float]:
    """The layer of the value vectors ``vs``, factors ``K_h``, ``Q_h`` (``W_h = K_h^T Q_h``),
    key biases ``cs`` and offset ``beta``, and the token scale of its check queries (the
    one at which the largest ``W_h`` moves the logits by about 1)."""
    H, d = len(Ks), int(np.shape(vs)[1])
    layer = AssembledLayer(
        heads_=[AttentionHead(vs[g], K=Ks[g], Q=Qs[g], key_bias=cs[g]) for g in range(H)],
        W_factors_=[(K.T, Q.T) for K, Q in zip(Ks, Qs, strict=True)],
        v_=[vs[g].copy() for g in range(H)], key_bias_=[c.copy() for c in cs],
        offset_=beta, n_heads_=H, rank_=r)
    token = float(np.sqrt(d) / np.sqrt(max(np.linalg.norm(K.T @ Q) for K, Q in
                                           zip(Ks, Qs, strict=True))))
    return layer, token


class DenseScores:
    """``W_``, the dense score matrices, formed from ``W_factors_`` on request."""

    @property
    def W_(self) -> list[np.ndarray]:
        """Dense score matrices (d x d each), formed from the factors on request."""
        if not hasattr(self, "W_factors_"):
            raise AttributeError("W_ is available after fit()")
        return [L @ R.T for L, R in self.W_factors_]


class LayerRoute(DenseScores, CircleScan, HeadProbes, BaseLearner):
    """A route of the layer learner: the circle scan and the head probes over the shared
    parameters (:data:`LAYER_PARAMS`); each route declares its own ``__init__``,
    constraints, spec and ``fit``."""

    def _validate_extra(self):
        check_probe_params(self)

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered layer on inputs X (B, N, d)."""
        return MultiHeadAttention(self.heads_, offset=self.offset_)(X)
