"""A whole attention layer of a real model: many low-rank heads with their biases.

Beyond the paper. The black box is a self-attention layer read out along a vector,

    f(X) = sum_h softmax(X (W_h x_N + c_h))^T (X v_h) + beta,

with H heads whose score matrices ``W_h`` have rank ``r`` (``H r = d`` in standard multi-head
attention: 12 heads of rank 32 at d = 384 for MiniLM), key biases ``c_h`` and an offset ``beta``
(:func:`attnquery.realheads.build_layer`). :class:`AttentionLayerLearner` recovers every head up to
a permutation, with two facts about two-row queries ``[x + delta; x]``:

    f([x + delta; x]) = beta + x^T V + sum_h sigma(delta^T a_h(x)) delta^T v_h,
    a_h(x) = W_h x + c_h,   V = sum_h v_h.

* **Saturation.** For a large ``delta`` every logit ``delta^T a_h(x)`` is far from 0, every sigmoid
  is 0 or 1 to float64 precision, and f is exactly linear in delta: its gradient is the sum of the
  ``v_h`` of the heads whose logit is positive. Around a circle
  ``delta(theta) = T (cos theta p + sin theta q)`` each head's logit changes sign twice (at
  antipodal angles), so the circle splits into 2H arcs; along an arc f is exactly
  ``T (cos theta p + sin theta q)^T G`` (a sinusoid, which three equally spaced answers test), and
  the gradients G of consecutive arcs differ by exactly one ``+-v_h``. Half a turn gives every
  ``v_h`` once, exactly (finite differences of a linear function), and ``V = sum_h v_h`` fixes the
  signs.
* **Isolation by the value.** A ``delta`` orthogonal to every ``v_h`` but ``v_g`` silences every
  head but g whatever its attention weights: ``f - beta - x^T V = sigma(delta^T a_g(x)) delta^T
  v_g``. On the subspace ``Delta_g`` of such deltas (dimension ``d - H + 1``) head g is a single
  head with a key bias and an offset, measured by the single-head probes of
  :class:`~attnquery.learners._probes.Prober` with ``v = V`` (``delta^T V = delta^T v_g`` there):
  its key bias along ``Delta_g`` from ``d - H + 1`` probes with a zero last token, then a
  two-sided sketch of rank r (``(d - H + 1) r`` probes along ``Delta_g`` with r random last
  tokens, and ``(r + p)(d - r)`` probes along r + p random directions of ``Delta_g`` with the
  coordinate last tokens) gives ``B_g^T W_g`` for an orthonormal basis ``B_g`` of ``Delta_g``.
* **The H - 1 missing directions.** ``Delta_g`` misses the directions ``nu_j`` (j != g) of the
  dual basis of the v's (``nu_j^T v_h = [j = h]``). ``nu_j^T a_g(x)`` is read from
  ``delta = P + s nu_g + t nu_j`` with P orthogonal to every v: only heads g and j speak, and P,
  whose logits are known from the isolated measurements, saturates head j (logit -60, weight
  ``e^-60``), so the answer is ``s sigma(delta^T a_g(x))``. As ``W_g`` has rank r with the row
  space found by the sketch, r + 1 last tokens per missing direction suffice.

Queries: ``d + 1`` (V and beta, one-row queries), the circle (a few coarse scans of
``n_grid`` angles while its scale grows, refinements of ``36`` angles per unsaturated stretch,
and ``2d + 1`` per arc for its gradient: about ``(H + 1)(2d + 1)`` plus a few thousand; in
served mode also ``16 H`` per circle for its isolation test, :func:`.served.isolation_test`), and
exactly :func:`layer_probe_count` for the rest:
``H [(d - H + 1)(r + 1) + (r + p)(d - r)]`` for the isolated heads (key bias, right and left
sketch; ``p`` = ``oversample``) and ``2 H (H - 1)(r + 1)`` for the missing directions, plus
the probes asked again at a smaller scale (``n_requeried_``) and the verification. At MiniLM's
size (d = 384, H = 12, r = 32) that is about 1.1 times the layer's degrees of freedom
``H (r (2d - r) + 2d) + 1`` (:func:`layer_dof`).

Routes: :class:`AttentionLayerLearner` fits one estimator per route, over the shared
measurement modules :mod:`.scan` (the circle) and :mod:`.heads` (the isolated heads and the
missing directions): :class:`~.exact_layer.ExactLayerLearner` on exact answers,
:class:`~.served_layer.ServedLayerLearner` on served ones (``route="served"``) within
``n_queries`` (its budget is the fit's query ledger, ``cap=n_queries``, the check kept in
reserve) and
:class:`~.rotary_layer.RotaryLayerLearner` for rotary layers.

Limits: the value vectors must be linearly independent (``H <= d``) and every head's query
vector ``a_h(x)`` nonzero at the scan's last token (a head whose ``W_h`` and ``c_h`` vanish, or
whose v is 0, is not a head the learner can see); the learner raises
:class:`~attnquery.errors.SearchLimitError` when no circle separates all the heads,
:class:`~attnquery.errors.AssumptionViolation` when the answers contradict the layer model, and
:class:`~attnquery.errors.ModelMismatchError` when the assembled layer disagrees with fresh
queries.
"""

from __future__ import annotations

import inspect
from numbers import Integral, Real

import numpy as np

from ...errors import ConfigError
from ...models import MultiHeadAttention
from .._base import (
    BLOCK_BYTES_PARAM,
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    N_QUERIES_PARAM,
    NOISE_MODES,
    BaseLearner,
)
from .._params import Interval, Options
from .._probes import PROBE_PARAMS, check_probe_params
from .._registry import LearnerSpec
from ._route import (
    SERVED_STAGES,
    STAGES,
    DenseScores,
    check_kv_heads,
    fitted_attributes,
    layer_dof,
    layer_probe_count,
    missing_probe_count,
)
from .exact_layer import ExactLayerLearner
from .heads import PILOT, SILENCE
from .rotary_layer import RotaryLayerLearner, is_rotary_fit, predict_rotary_layer
from .scan import CLEAN_TOL, GRADIENT_SCALE
from .served_layer import ServedLayerLearner

__all__ = ["AttentionLayerLearner", "ROUTES", "layer_dof", "layer_probe_count",
           "missing_probe_count", "STAGES", "SERVED_STAGES", "ExactLayerLearner",
           "ServedLayerLearner", "RotaryLayerLearner", "SILENCE", "CLEAN_TOL",
           "GRADIENT_SCALE", "PILOT"]


#: the routes ``route`` names, their estimators (``route_``: the name of the one that ran)
ROUTE_CLASSES = {"exact": ExactLayerLearner, "served": ServedLayerLearner,
                 "rotary": RotaryLayerLearner}
ROUTE_NAMES = {cls: name for name, cls in ROUTE_CLASSES.items()}
#: the values of ``route``
ROUTES = ("auto", *ROUTE_CLASSES)


class AttentionLayerLearner(DenseScores, BaseLearner):
    """Recover a whole attention layer, every head with its biases, up to a permutation.

    See the module docstring for the method and the query count. The fit is one of three
    estimators, picked by the parameter ``route`` (:meth:`route_estimator`), whose fitted
    attributes it takes: :class:`~.exact_layer.ExactLayerLearner` (exact answers),
    :class:`~.served_layer.ServedLayerLearner` (served answers) and :class:`~.rotary_layer.
    RotaryLayerLearner` (``positions="rotary"``).

    Parameters
    ----------
    n_heads : int
        Number of heads H.
    rank : int, optional
        Rank r of every head's score matrix (the head dimension). Default ``d // n_heads``, as
        in standard multi-head attention.
    fit_bias : bool
        Learn the key biases ``c_h`` and the offset ``beta`` (default). With False the layer is
        taken to have none (the zero token and the key-bias probes are not asked).
    n_grid : int
        Points of the coarse scan of the circle.
    max_planes : int
        Circles tried before :class:`~attnquery.errors.SearchLimitError`.
    oversample : int
        Extra left-sketch directions per head.
    rtol : float
        Largest relative disagreement with the verification queries.
    verify : int
        Verification queries spent last (0 turns the check off): 6 fresh random queries of 2
        to ``check_length`` tokens and copies of the two longest with their first N - 1 tokens
        permuted, which the box must answer alike
        (:func:`~attnquery.learners._base.check_plan`).
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is such a layer on every
        input of up to ``check_length`` tokens, such as one with a wider sliding window,
        passes. With ``positions="rotary"`` the check asks the rotary layer's own lengths
        instead (:data:`~attnquery.learners.multihead_generic.rotary_layer.ROTARY_VERIFY_LENGTHS`).
    max_logit, min_logit, initial_logit_scale : float
        Logit window of the probes (see :class:`~attnquery.learners.SketchLowRankLearner`).
    block_bytes : int
        Memory bound on one batch of probes.
    n_kv_heads : int, optional
        Number G of key/value heads (grouped-query attention) with ``positions="rotary"``: the
        heads found sharing keys must form that many groups. None: not checked.
    positions : {"none", "rotary"}
        "none" (default): the layer of the module docstring. "rotary": a Llama-style layer with
        rotary positions and grouped-query attention, without biases
        (:mod:`attnquery.learners.multihead_generic.rotary_layer`; ``heads_`` are then
        :class:`~attnquery.models.RotaryAttentionHead` s and ``kv_groups_``,
        ``frequencies_`` are set).
    n_queries : int, optional
        The most queries the whole fit asks, its check's included (default None: no cap), on
        every route: no query beyond it is asked (:class:`~attnquery.errors.
        BudgetExceededError` naming it instead). The served route spends it: see ``route``.
    route : {"auto", "exact", "served", "rotary"}
        The route the fit takes (``route_`` says which ran). "auto" (default): "rotary" with
        ``positions="rotary"``, else "exact"; whether the answers are served (rounded to a
        narrow format or otherwise inexact) cannot be told before they are read, so served
        answers need ``route="served"``. "exact": :class:`~.exact_layer.ExactLayerLearner`,
        exact answers. "rotary": :class:`~.rotary_layer.RotaryLayerLearner`, with
        ``positions="rotary"``. "served" (beyond the paper; docs/served.md): answers that are
        not exact (a layer computed in float32, say), within the budget ``n_queries`` (which it
        needs, and spends). The answers' relative noise is measured first and every tolerance
        (the scan's saturation test, the finite differences, the check) is tied to it; the
        arcs' gradients and every isolated and missing-direction probe are averaged over as
        many distinct queries as the budget pays for (:mod:`.served`); V and beta are read
        again by least squares (:func:`.served.constants`). Narrow formats (noise above
        :data:`.served.NARROW_NOISE`, float16) get the scan's own constants
        (:func:`.served.scan_settings`); float32 the left sketch read in full and each probe
        at its own scale (:func:`.served.full_sketch`, docs/served.md); answers noisier than
        :data:`.served.LAYER_MAX_NOISE` (bfloat16's) are refused with
        :class:`~attnquery.errors.AssumptionViolation`. A route that does not apply to the
        parameters (``"exact"`` or ``"served"`` with ``positions="rotary"``, ``"rotary"``
        without, ``"served"`` without ``n_queries``) is a ConfigError naming it, before any
        query.
    noise : {"format", "measured"}
        Served mode: how the answers' measured noise is judged when every answer is a float32,
        float16 or bfloat16 value (``answer_format_``). "format" (default): at most
        ``NOISE_FORMAT_FACTOR`` (4) times what the format's rounding explains
        (``noise_floor_``, :func:`~attnquery.precision.rounding_floor`), else
        :class:`~attnquery.errors.ModelMismatchError` right after the noise is measured (a box
        that is not a layer, or one that adds noise: the check's tolerance, ``VERIFY_NOISE``
        units of the noise, would grow with it). "measured": the answers are declared noisier
        than their format; the learner warns with
        :class:`~attnquery.errors.NoiseAboveFormatWarning`, sets ``noise_above_format_`` and
        goes on with the noise it measured. Answers in no narrow format are not judged.
        docs/served.md, "Noise judged against the format".
    random_state : int, sequence of ints, Generator or None
        Seed of every random choice (scan plane, sketches, checks).

    Attributes
    ----------
    heads_ : list of AttentionHead
        The heads, factored (``W_h = K_h^T Q_h``), with their key biases (no offset).
    W_factors_ : list of (L, R)
        ``W_h = L @ R.T``.
    W_ : list of ndarray (d, d)
        Dense score matrices, formed on request.
    v_ : list of ndarray (d,)
    key_bias_ : list of ndarray (d,)
    offset_ : float
    n_heads_, rank_ : int
    n_queries_ : int
        Queries counted by the oracle during ``fit`` (the verification included).
    n_queries_by_stage_ : dict
        Queries per stage (``v_sum``, ``circle``, ``isolated``, ``missing``, ``verify``).
    n_requeried_ : int
        Probes of the isolated heads asked again at a smaller scale (0 on ordinary layers).
    scan_ : dict
        The circle that separated the heads: its scale ``T``, the planes tried, the narrowest
        arc between two estimated crossings (radians); served mode: ``rejected``, circles whose
        v's passed the arcs' checks but leaked in the isolation test
        (:func:`.served.isolation_test`), and ``isolation``, the kept circle's deviation in it
        (None in exact mode).
    verify_error_ : float
    n_verify_queries_ : int
    noise_level_ : float or None
        Served mode: the answers' measured relative noise (None in exact mode).
    answer_format_ : str or None
        Served mode: the narrowest format holding every answer read before the noise was
        judged ("bfloat16", "float16", "float32" or "float64"; None in exact mode).
    noise_floor_ : float or None
        Served mode, narrow formats: the relative noise the format's rounding explains
        (:func:`~attnquery.precision.rounding_floor`; None otherwise).
    noise_above_format_ : bool
        Whether the noise exceeded ``NOISE_FORMAT_FACTOR`` times ``noise_floor_`` (only with
        ``noise="measured"``, which warns; "format" raises).
    n_passes_ : int
        Passes over the isolated and missing-direction probes (1 in exact mode; in served
        mode after one rough pass).
    n_missing_passes_ : int
        Passes over the missing-direction probes (served mode: a multiple of ``n_passes_``,
        :func:`.served.missing_factor`; 1 in exact mode).
    head_passes_ : list of int
        Passes over each head's isolated probes: ``n_passes_`` each, and in served float32
        the whole passes the budget leaves after them, given to the heads whose probes were the
        noisiest (:func:`.served.share_passes`).
    """


    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        "noise": [Options(NOISE_MODES)],
        **PROBE_PARAMS,
        "n_heads": [Interval(Integral, 1, None, closed="left")],
        "rank": [Interval(Integral, 1, None, closed="left"), None],
        "fit_bias": ["boolean"],
        "n_grid": [Interval(Integral, 64, None, closed="left")],
        "max_planes": [Interval(Integral, 1, None, closed="left")],
        "oversample": [Interval(Integral, 0, None, closed="left")],
        "rtol": [Interval(Real, 0, 1, closed="neither")],
        "block_bytes": [BLOCK_BYTES_PARAM],
        "n_kv_heads": [Interval(Integral, 1, None, closed="left"), None],
        "positions": [Options({"none", "rotary"})],
        "n_queries": [N_QUERIES_PARAM, None],
        "route": [Options(ROUTES)],
    }
    spec = LearnerSpec(
        name="layer", oracle="value", returns="layer", fits_bias=True,
        stages=tuple(dict.fromkeys(STAGES + SERVED_STAGES)),
        description="a whole attention layer, H heads of rank d / H with their biases (beyond "
        "the paper; --param n_heads=H)", label="attention layer")

    def __init__(
        self,
        *,
        n_heads: int,
        rank: int | None = None,
        fit_bias: bool = True,
        n_grid: int = 720,
        max_planes: int = 6,
        oversample: int = 2,
        rtol: float = 1e-8,
        verify: int = DEFAULT_VERIFY,
        check_length: int = CHECK_LENGTH,
        max_logit: float = 10.0,
        min_logit: float = 1e-5,
        initial_logit_scale: float = 1.0,
        block_bytes: int = 16 * 2**20,
        n_kv_heads: int | None = None,
        positions: str = "none",
        n_queries: int | None = None,
        noise: str = "format",
        route: str = "auto",
        random_state=None,
    ):
        self.n_heads = n_heads
        self.rank = rank
        self.fit_bias = fit_bias
        self.n_grid = n_grid
        self.max_planes = max_planes
        self.oversample = oversample
        self.rtol = rtol
        self.verify = verify
        self.check_length = check_length
        self.max_logit = max_logit
        self.min_logit = min_logit
        self.initial_logit_scale = initial_logit_scale
        self.block_bytes = block_bytes
        self.n_kv_heads = n_kv_heads
        self.positions = positions
        self.n_queries = n_queries
        self.noise = noise
        self.random_state = random_state
        self.route = route

    # ------------------------------------------------------------------------------------------
    def _validate_extra(self):
        check_probe_params(self)
        if self.n_kv_heads is not None:
            if self.positions != "rotary":
                raise ConfigError(f"n_kv_heads is read with positions='rotary' only; got "
                                  f"n_kv_heads={self.n_kv_heads!r} with positions="
                                  f"{self.positions!r}")
            check_kv_heads(self.n_heads, self.n_kv_heads)
        self._route_class()  # a route that does not apply: ConfigError naming it
        if self.positions == "rotary" and self.fit_bias:
            raise ConfigError("positions='rotary' learns layers without biases: fit_bias=False")

    def _route_class(self) -> type:
        """The route class ``route`` names ("auto": from ``positions``); ConfigError naming
        the route where it does not apply."""
        rotary = self.positions == "rotary"
        name = self.route if self.route != "auto" else ("rotary" if rotary else "exact")
        if (name == "rotary") != rotary:
            raise ConfigError(f"route={self.route!r} does not apply with positions="
                              f"{self.positions!r}: the rotary route reads positions='rotary' "
                              "layers, the exact and served routes positions='none' ones")
        if name == "served" and self.n_queries is None:
            raise ConfigError("route='served' spends a budget: give n_queries (the most "
                              "queries the fit asks, the check's included)")
        return ROUTE_CLASSES[name]

    def route_estimator(self) -> BaseLearner:
        """The route estimator ``route`` picks, unfitted, with the parameters it takes:
        :class:`~.rotary_layer.RotaryLayerLearner` (``"rotary"``; "auto" with
        ``positions="rotary"``), :class:`~.served_layer.ServedLayerLearner` (``"served"``) or
        :class:`~.exact_layer.ExactLayerLearner` (``"exact"``; "auto" without positions)."""
        cls = self._route_class()
        params = self.get_params()
        names = inspect.signature(cls.__init__).parameters
        return cls(**{k: v for k, v in params.items() if k in names})

    def fit(self, oracle):
        """Recover the layer behind ``oracle`` with the route its parameters pick
        (:meth:`route_estimator`); returns self, with the route's fitted attributes (also those
        it had set when it raised) and ``route_``, the route that ran ("exact", "served" or
        "rotary").

        Raises
        ------
        ConfigError
            If a parameter is not valid, before any query.
        SearchLimitError
            If no circle of the scan separates all the heads.
        AssumptionViolation
            If the answers contradict the layer model (a scan whose arcs do not add up, value
            vectors that do not sum to V, a measurement out of range).
        ModelMismatchError
            If the assembled layer disagrees with fresh random queries beyond ``rtol``, or (served
            mode, ``noise="format"``) the answers are float32, float16 or bfloat16 values
            carrying more than ``NOISE_FORMAT_FACTOR`` times the noise their format explains.
        BudgetExceededError
            When a step does not fit in ``n_queries`` (or the oracle's budget).
        NotIdentifiableError
            If every one-row answer is the same (V = 0).
        """
        self._validate_params()
        route = self.route_estimator()
        self.route_ = ROUTE_NAMES[type(route)]
        try:
            route.fit(oracle)
        finally:
            for name, value in fitted_attributes(route).items():
                setattr(self, name, value)
        return self

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered layer on inputs X (B, N, d)."""
        if is_rotary_fit(self):  # heads_ are rotary heads: rotary_layer.py
            return predict_rotary_layer(self, X)
        return MultiHeadAttention(self.heads_, offset=self.offset_)(X)
