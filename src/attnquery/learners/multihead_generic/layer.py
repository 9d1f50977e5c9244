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

Limits: the value vectors must be linearly independent (``H <= d``) and every head's query
vector ``a_h(x)`` nonzero at the scan's last token (a head whose ``W_h`` and ``c_h`` vanish, or
whose v is 0, is not a head the learner can see); the learner raises
:class:`~attnquery.errors.SearchLimitError` when no circle separates all the heads,
:class:`~attnquery.errors.AssumptionViolation` when the answers contradict the layer model, and
:class:`~attnquery.errors.ModelMismatchError` when the assembled layer disagrees with fresh
queries.
"""

from __future__ import annotations

import dataclasses
from numbers import Integral, Real

import numpy as np
import scipy.linalg

from ...errors import AnswerError, AssumptionViolation, ConfigError, SearchLimitError
from ...models import AttentionHead, MultiHeadAttention
from .._base import (
    BLOCK_BYTES_PARAM,
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    NOISE_MODES,
    BaseLearner,
    check_budget,
    check_oracle,
    check_scalar,
    judge_noise,
)
from .._params import Interval, Options
from .._probes import (
    PROBE_PARAMS,
    Prober,
    check_probe_params,
    coordinate_rows,
    read_head_constants,
)
from .._registry import LearnerSpec
from ..rotary_layer import fit_rotary_layer, is_rotary_fit, predict_rotary_layer
from . import served
from ._state import _Head, _Layer

__all__ = ["AttentionLayerLearner", "layer_dof", "layer_probe_count", "missing_probe_count",
           "STAGES", "SERVED_STAGES"]

#: the stages whose queries ``n_queries_by_stage_`` counts
STAGES = ("v_sum", "circle", "isolated", "missing", "verify")
#: served mode: also ``values``, the value vectors measured again from saturated queries
SERVED_STAGES = ("v_sum", "circle", "isolated", "missing", "values", "verify")

#: the logit that silences a head in the missing-direction probes: its weight is e^-60
SILENCE = 60.0
#: answers whose recurrence residual is below this, relative to the answers, are saturated
CLEAN_TOL = 1e-13
#: the gradients of the arcs are taken on a circle this many times larger than the one that
#: separated them: the same sign patterns, with every logit that much further from 0
GRADIENT_SCALE = 16.0
#: probes asked at the initial logit scale, before the answers have shown the head's scale
PILOT = 32


def layer_dof(d: int, n_heads: int, rank: int, bias: bool = True) -> int:
    """Degrees of freedom of a layer: ``H (r (2d - r) + 2d) + 1`` (``H (r (2d - r) + d)``
    without biases): per head a rank-r ``W_h``, ``v_h`` and ``c_h``, and one offset."""
    per = rank * (2 * d - rank) + (2 * d if bias else d)
    return int(n_heads * per + (1 if bias else 0))


def layer_probe_count(d: int, n_heads: int, rank: int, oversample: int = 2,
                      bias: bool = True) -> int:
    """Queries of :class:`AttentionLayerLearner` outside its circle scan and its verification:
    V and beta (``d + 1``), the isolated heads ``H [(d - H + 1)(r + 1) + (r + p)(d - r)]`` and
    the missing directions ``2 H (H - 1)(r + 1)`` (each ``r`` instead of ``r + 1``, and ``d``
    for V alone, without biases), when no probe is asked twice."""
    H, r, p, b = int(n_heads), int(rank), int(oversample), int(bool(bias))
    return int(d + b + H * ((d - H + 1) * (r + b) + (r + p) * (d - r))
               + missing_probe_count(H, r, bias))


def missing_probe_count(n_heads: int, rank: int, bias: bool = True) -> int:
    """Queries of one pass over every head's missing directions, ``2 H (H - 1)(r + 1)``
    (``r`` instead of ``r + 1`` without biases)."""
    H = int(n_heads)
    return 2 * H * (H - 1) * (int(rank) + int(bool(bias)))


class AttentionLayerLearner(BaseLearner):
    """Recover a whole attention layer, every head with its biases, up to a permutation.

    See the module docstring for the method and the query count.

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
        instead (:data:`~attnquery.learners.rotary_layer.ROTARY_VERIFY_LENGTHS`).
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
        (:mod:`attnquery.learners.rotary_layer`; ``heads_`` are then
        :class:`~attnquery.models.RotaryAttentionHead` s and ``kv_groups_``,
        ``frequencies_`` are set).
    n_queries : int, optional
        Served mode (beyond the paper; docs/served.md): a budget for answers that are not exact
        (a layer computed in float32, say). The answers' relative noise is measured first and
        every tolerance (the scan's saturation test, the finite differences, the check) is tied
        to it; the arcs' gradients and every isolated and missing-direction probe are averaged
        over as many distinct queries as the budget pays for (:mod:`.served`); no query beyond
        ``n_queries`` is asked (:class:`~attnquery.errors.BudgetExceededError` instead); V and
        beta are read again by least squares (:func:`.served.constants`). Narrow formats
        (noise above :data:`.served.NARROW_NOISE`, float16) get the scan's own constants
        (:func:`.served.scan_settings`); float32 the left sketch read in full and each probe at
        its own scale (:func:`.served.full_sketch`, docs/served.md); answers noisier
        than :data:`.served.LAYER_MAX_NOISE` (bfloat16's) are refused with
        :class:`~attnquery.errors.AssumptionViolation`. None (default): the exact learner, bit
        for bit as before.
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
        "n_queries": [Interval(Integral, 1, None, closed="left"), None],
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

    # ------------------------------------------------------------------------------------------
    def _validate_extra(self):
        check_probe_params(self)
        if self.n_kv_heads is not None:
            if self.positions != "rotary":
                raise ConfigError(f"n_kv_heads is read with positions='rotary' only; got "
                                  f"n_kv_heads={self.n_kv_heads!r} with positions="
                                  f"{self.positions!r}")
            if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
                raise ConfigError(f"n_kv_heads must divide n_heads = {self.n_heads}; got "
                                  f"{self.n_kv_heads}")
        if self.n_queries is not None and self.positions != "none":
            raise ConfigError("n_queries (served answers) is available with positions='none' "
                              "only")
        if self.positions == "rotary" and self.fit_bias:
            raise ConfigError("positions='rotary' learns layers without biases: fit_bias=False")

    def _validate(self, d: int) -> tuple[int, int]:
        """The rules that need d (the parameters are valid); returns (H, r)."""
        H = check_scalar(self.n_heads, "n_heads", Integral, min_val=1, max_val=d)
        r = check_scalar(d // H if self.rank is None else self.rank, "rank", Integral,
                         min_val=1, max_val=d // 2)
        m = d - H + 1
        p = int(self.oversample)
        if r + p > m:
            raise ConfigError(f"rank + oversample = {r + p} exceeds d - n_heads + 1 = {m}, the "
                              "dimension in which each head is isolated")
        return H, r

    def fit(self, oracle):
        """Recover the layer behind ``oracle``; returns self.

        Raises
        ------
        SearchLimitError
            If no circle of the scan separates all the heads.
        AssumptionViolation
            If the answers contradict the layer model (a scan whose arcs do not add up, value
            vectors that do not sum to V, a measurement out of range).
        ModelMismatchError
            If the assembled layer disagrees with fresh random queries beyond ``rtol``, or (served
            mode, ``noise="format"``) the answers are float32, float16 or bfloat16 values
            carrying more than ``NOISE_FORMAT_FACTOR`` times the noise their format explains.
        NotIdentifiableError
            If every one-row answer is the same (V = 0).
        """
        self._validate_params()
        d = check_oracle(oracle)
        H, r = self._validate(d)
        if self.positions == "rotary":  # a Llama-style layer: learners/rotary_layer.py
            fit_rotary_layer(self, oracle, d, H, r)
            return self
        rng = self._rng()
        r_scan, r_sketch, r_verify, r_base = rng.spawn(4)
        bias = bool(self.fit_bias)
        base = r_base.standard_normal(d) if bias else None
        if self.n_queries is not None:  # served mode: no query beyond n_queries
            oracle = served.Capped(oracle, int(self.n_queries))
        stages = STAGES if self.n_queries is None else SERVED_STAGES
        with self._open_ledger(oracle, stages, what="the layer") as ledger:
            run = self._start(ledger, d, bias, base, rng)  # V, beta (and the answers' noise)
            vs = self._scan(run, H, r_scan)  # every v_h, from a circle of saturated queries
            # the isolated heads and their missing directions (served mode: after a rough
            # pass, the v's measured again from saturated queries; docs/served.md)
            vs, Ks, Qs, cs = self._heads(run, vs, H, r, bias, r_sketch)
            self.heads_ = [AttentionHead(vs[g], K=Ks[g], Q=Qs[g], key_bias=cs[g])
                           for g in range(H)]
            self.W_factors_ = [(K.T, Q.T) for K, Q in zip(Ks, Qs, strict=True)]
            self.v_ = [vs[g].copy() for g in range(H)]
            self.key_bias_ = [c.copy() for c in cs]
            self.offset_ = run.beta
            self.n_heads_, self.rank_ = H, r
            token = float(np.sqrt(d) / np.sqrt(max(np.linalg.norm(K.T @ Q) for K, Q in
                                                   zip(Ks, Qs, strict=True))))
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, r_verify, rtol=self._rtol(run),
                                 what=f"an attention layer of {H} heads of rank {r}",
                                 token_scale=token, check_length=self.check_length)
            self.n_requeried_ = int(ledger.n_requeried)
            self.n_queries_ = ledger.total
        return self

    # -- served mode (n_queries set): docs/served.md, :mod:`.served` ----------------------------
    def _start(self, ledger, d: int, bias: bool, base, rng) -> _Layer:
        """V and beta from one-row queries; in served mode also the answers' relative noise
        (``noise_level_``; None in exact mode)."""
        check_budget(ledger, d + 1, "reading V and beta")
        with ledger.stage("v_sum"):
            head = read_head_constants(ledger, d, bias=bias, key_bias=False)
            noise = None
            if self.n_queries is not None:
                self._check_served_budget(ledger, d)
                noise = served.measure_noise(ledger, d, rng.spawn(1)[0],
                                             float(np.sqrt(d)))
                self.noise_level_ = noise
                # against the answers' format (ledger.oracle: the cap, which reads it): the
                # check's tolerance, VERIFY_NOISE units of this noise, then stays within the
                # format's floor in "format" mode
                judge_noise(self, noise, ledger.oracle.formats.format, d,
                            f"an attention layer of {int(self.n_heads)} heads", stacklevel=4)
            if noise is not None:  # served mode: V and beta averaged
                check_budget(ledger, served.constant_queries(d), "reading V and beta again")
                V, beta = served.constants(ledger, d, rng.spawn(1)[0])
                head = dataclasses.replace(head, v=V, offset=beta)
        self.noise_level_ = noise
        if noise is None:  # exact mode: the noise is not measured, nor judged
            self.answer_format_, self.noise_floor_, self.noise_above_format_ = None, None, False
        return _Layer(ledger, head.v, head.offset,
                      None if base is None else base / np.linalg.norm(base), noise=noise)

    def _check_served_budget(self, ledger, d: int) -> None:
        check_budget(ledger, int(self.n_queries) - (ledger.n_queries - ledger.n0),
                     f"AttentionLayerLearner(n_queries={int(self.n_queries)})")
        if int(self.n_queries) < d + 1 + 2 * served.NOISE_QUERIES + int(self.verify):
            raise ConfigError(f"n_queries = {int(self.n_queries)} does not pay for reading V "
                              "and beta, the noise and the check")

    def _budget_left(self, run: _Layer) -> int:
        """Queries of ``n_queries`` not yet spent, the check's kept back."""
        led = run.ledger
        return int(self.n_queries) - (led.n_queries - led.n0) - int(self.verify)

    def _plan(self, run: _Layer, H: int, r: int) -> _Layer:
        """Served mode: how many passes over the isolated and missing probes the budget left
        pays for (``n_passes_``; 1 in exact mode)."""
        if run.noise is None:
            self.n_passes_ = self.n_missing_passes_ = 1
            return run
        d = run.d
        per = layer_probe_count(d, H, r, int(self.oversample), bool(self.fit_bias)) - d - 1
        miss = missing_probe_count(H, r, bool(self.fit_bias))
        if served.full_sketch(run.noise):  # the left sketch's r more columns per head
            per += H * r * (r + int(self.oversample))
        # the rough pass and the value vectors' saturated queries come first; each head's two
        # probers ask their pilots again once in the rough pass and once over the passes
        left = (self._budget_left(run) - per - H * served.value_queries(d)
                - 2 * H * 2 * PILOT)
        reps = served.plan_repeats(left, per,
                                   f"AttentionLayerLearner(n_queries={int(self.n_queries)})")
        k = served.missing_factor(per - miss, miss, left, reps)
        self.n_passes_, self.n_missing_passes_ = reps, reps * k
        return dataclasses.replace(run, reps=reps, missing_reps=k, pass_cost=per - miss,
                                   reserve=served.MARGIN * left)

    def _heads(self, run: _Layer, vs, H: int, r: int, bias: bool, rng):
        """Every head's value vector, factors (K, Q) and key bias.

        Exact mode: the isolated heads (:meth:`_isolated`) and their missing directions, once.
        Served mode (:mod:`.served`): a rough pass of both first; from it, the value vectors
        measured again from saturated queries (:func:`.served.saturated_values`: the error of
        the scan's v's would leak into every isolated head, as a bias that averaging does not
        remove), and each head's right sketch taken along its rough row space (random sketch
        directions make ``V_g^T B_s`` a random r x r matrix whose condition number, up to
        1e3 on the synthetic layers, multiplies the noise); then ``n_passes_`` passes.
        """
        run = self._plan(run, H, r)  # served mode: passes the budget left pays for
        rows = [None] * H
        if run.noise is not None:
            rough = dataclasses.replace(run, reps=1, missing_reps=1, rough=True)
            heads = [self._isolated(rough, vs, g, r, bias, rng) for g in range(H)]
            Ks, Qs, cs = self._missing_directions(rough, vs, heads, bias)
            check_budget(run.ledger, H * served.value_queries(run.d), "the value vectors")
            with run.ledger.stage("values"):
                vs = served.saturated_values(run, Ks, Qs, cs, rng)
            rows = [Q.T for Q in Qs]
            run = dataclasses.replace(run, rough_heads=(Ks, Qs, cs))
        heads = [self._isolated(run, vs, g, r, bias, rng, rows[g]) for g in range(H)]
        self.head_passes_ = [int(run.reps)] * H
        if served.full_sketch(run.noise):  # the passes the plan leaves, to the noisiest heads
            heads = self._more_passes(run, vs, heads, r, bias, rng, rows)
        return (vs, *self._missing_directions(run, vs, heads, bias))

    def _more_passes(self, run: _Layer, vs, heads, r: int, bias: bool, rng, rows) -> list:
        """Served float32: the whole passes over one head's isolated probes that the budget
        leaves after the planned ones (and the missing directions' and the margin's share),
        given one at a time to the head whose error, as its two sketches' disagreement predicts
        it, is the largest (:func:`.served.share_passes`; ``head_passes_``), and merged with
        its planned passes (:func:`.served.merged`). On MiniLM layer 1 (learner seed 0) the
        plan found 633,921 queries left where two passes needed 638,963, and the fit spent
        3.15 ``layer_dof`` of 4 before this."""
        H = len(heads)
        per_head = -(-run.pass_cost // H) + 4 * PILOT  # its probers' pilots asked twice
        miss = missing_probe_count(H, r, bias) * run.reps * run.missing_reps
        more = int(max(0, self._budget_left(run) - miss - run.reserve) // per_head)
        if more == 0:
            return heads
        n = served.share_passes([h.spread for h in heads], run.reps, more)
        self.head_passes_ = [int(k) for k in n]
        return [heads[g] if n[g] == run.reps else served.merged(
            heads[g], self._isolated(dataclasses.replace(run, reps=int(n[g] - run.reps)), vs,
                                     g, r, bias, rng, rows[g]), run.reps, int(n[g] - run.reps))
            for g in range(H)]

    def _rtol(self, run: _Layer) -> float:
        """The check's tolerance: ``rtol``, or in served mode ``VERIFY_NOISE`` units of the
        answers' noise if larger (narrow formats: ``NARROW_VERIFY_NOISE``,
        :func:`.served.verify_units`). With ``noise="format"`` that noise has been judged
        against the answers' format (:func:`~attnquery.learners._base.judge_noise`), so the
        tolerance is at most those units of ``NOISE_FORMAT_FACTOR`` times its floor."""
        if run.noise is None:
            return float(self.rtol)
        return float(max(self.rtol, served.verify_units(run.noise) * run.noise))

    def _missing_directions(self, run: _Layer, vs, heads, bias):
        """Every head's factors (K, Q) and key bias, its H - 1 missing directions measured."""
        H = vs.shape[0]
        nu = np.linalg.pinv(vs).T  # (H, d) dual basis: nu_j^T v_h = [j = h]
        perp = np.linalg.svd(vs)[2][H:].T  # (d, d - H): orthogonal to every v
        silent = (perp, [perp.T @ h.B for h in heads])
        Ks, Qs, cs = [], [], []
        for g in range(H):
            K, Q, c = self._assemble(run, nu, heads, silent, g, bias)
            Ks.append(K)
            Qs.append(Q)
            cs.append(c)
        return Ks, Qs, cs

    @property
    def W_(self) -> list[np.ndarray]:
        """Dense score matrices (d x d each), formed from the factors on request."""
        if not hasattr(self, "W_factors_"):
            raise AttributeError("W_ is available after fit()")
        return [L @ R.T for L, R in self.W_factors_]

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered layer on inputs X (B, N, d)."""
        if is_rotary_fit(self):  # heads_ are rotary heads: learners/rotary_layer.py
            return predict_rotary_layer(self, X)
        return MultiHeadAttention(self.heads_, offset=self.offset_)(X)

    # -- the circle: every v_h ------------------------------------------------------------------
    def _phi(self, run: _Layer, x0, p, q, T, theta) -> tuple[np.ndarray, np.ndarray]:
        """``f([x0 + T (cos p + sin q); x0]) - beta - x0^T V`` and the raw answers."""
        theta = np.atleast_1d(theta)
        X = np.empty((theta.size, 2, run.d))
        X[:, 1] = x0
        X[:, 0] = x0 + T * (np.cos(theta)[:, None] * p + np.sin(theta)[:, None] * q)
        f = run.ledger.ask(X, "circle")
        return f - run.beta - float(x0 @ run.V), f

    @staticmethod
    def _clean(ph, f, step, scale=None, tol=CLEAN_TOL) -> np.ndarray:
        """Saturated interior points of equally spaced answers (end points False).

        The sinusoid recurrence ``phi(t + h) + phi(t - h) = 2 cos(h) phi(t)`` holds to
        rounding, ``CLEAN_TOL`` times the largest answer of the scan (``scale``; the heads'
        terms may cancel in one answer, not in its rounding), at a point and at both its
        neighbours: the residual alone also vanishes at the inflection point in the middle of
        a crossing.
        """
        res = ph[2:] + ph[:-2] - 2.0 * np.cos(step) * ph[1:-1]
        scale = 4.0 * (np.abs(f).max() if scale is None else scale)
        ok = np.zeros(ph.size, dtype=bool)
        ok[1:-1] = np.abs(res) <= tol * scale
        out = np.zeros(ph.size, dtype=bool)
        out[2:-2] = ok[1:-3] & ok[2:-2] & ok[3:-1]
        return out

    def _arcs(self, run: _Layer, x0, p, q, T, n_heads):
        """The saturated arcs of a half-turn from a saturated angle: one per head, plus one.

        A coarse grid of the whole circle gives a saturated starting angle; on the half-turn
        from it every head's logit changes sign once. The unsaturated stretches between
        saturated runs are refined (32 more angles each, up to 4 times), which separates
        crossings closer than the grid. Returns the arcs as (start, end) angles of saturated
        runs, in order, or None when this circle does not show ``n_heads + 1`` of them.
        """
        n = int(self.n_grid)
        step = 2 * np.pi / n
        th = step * np.arange(-1, n + 1)
        ph, f = self._phi(run, x0, p, q, T, th)
        fmax = float(np.abs(f).max())
        tol = served.clean_tol(run.noise or 0.0, CLEAN_TOL)
        clean = self._clean(ph, f, step, fmax, tol)[1:-1]
        th = th[1:-1]
        if not clean.any():
            return None
        i0 = int(np.argmax(clean))
        half = slice(i0, i0 + n // 2 + 1)  # [start, start + pi], the grid has n even points
        ang = list(th[half] if i0 + n // 2 < n else np.concatenate(
            [th[i0:], th[: i0 + n // 2 + 1 - n] + 2 * np.pi]))
        phis = list(np.concatenate([ph[1:-1], ph[1:-1]])[i0: i0 + n // 2 + 1])
        fs = list(np.concatenate([f[1:-1], f[1:-1]])[i0: i0 + n // 2 + 1])
        cl = list(np.concatenate([clean, clean])[i0: i0 + n // 2 + 1])
        cl[-1] = cl[0] = True  # the antipode of a saturated angle is saturated
        for _ in range(5):
            runs = self._runs(ang, cl)
            if len(runs) >= n_heads + 1:
                break
            new_a, new_p, new_f, new_c = [], [], [], []
            keep = np.ones(len(ang), dtype=bool)
            for (_, a_idx), (b_idx, _) in zip(runs[:-1], runs[1:], strict=True):
                # the gap's angles are replaced by 32 angles strictly inside it, with two more
                # on each side inside the saturated runs, so that every new angle has its
                # neighbours to be tested
                keep[a_idx + 1: b_idx] = False
                h = (ang[b_idx] - ang[a_idx]) / 33
                fine = ang[a_idx] + h * np.arange(-2, 36)
                fp, ff = self._phi(run, x0, p, q, T, fine)
                fc = self._clean(fp, ff, h, fmax, tol)
                new_a += list(fine[3:-3])
                new_p += list(fp[3:-3])
                new_f += list(ff[3:-3])
                new_c += list(fc[3:-3])
            merged = [np.concatenate([np.asarray(old)[keep], new]) for old, new in
                      ((ang, new_a), (phis, new_p), (fs, new_f), (cl, new_c))]
            order = np.argsort(merged[0], kind="stable")
            ang, phis, fs, cl = (list(m[order]) for m in merged)
        runs = self._runs(ang, cl)
        if len(runs) != n_heads + 1:
            return None
        return [(ang[i], ang[j]) for i, j in runs]

    @staticmethod
    def _runs(ang, clean) -> list[tuple[int, int]]:
        """(first, last) indices of the maximal runs of saturated angles."""
        runs, start = [], None
        for i, c in enumerate(clean):
            if c and start is None:
                start = i
            elif not c and start is not None:
                runs.append((start, i - 1))
                start = None
        if start is not None:
            runs.append((start, len(clean) - 1))
        return runs

    def _saturated(self, run: _Layer, x0, p, q, T, mids, widths) -> bool:
        """Whether every arc's centre is saturated: five angles around it, a tenth of the arc
        apart, pass the sinusoid test."""
        offs = np.arange(-2, 3)
        theta = (mids[:, None] + 0.1 * widths[:, None] * offs).ravel()
        ph, f = self._phi(run, x0, p, q, T, theta)
        scale = float(np.abs(f).max())
        tol = served.clean_tol(run.noise or 0.0, CLEAN_TOL)
        return all(self._clean(ph[5 * k: 5 * k + 5], f[5 * k: 5 * k + 5], 0.1 * w, scale,
                               tol)[2] for k, w in enumerate(widths))

    def _gradient(self, run: _Layer, delta, x0, h, pairs: int = 0):
        """Gradient of f at ``[x0 + delta; x0]`` along the coordinates, where f is linear, and
        an estimate of its error's norm (0 in exact mode).

        Each coordinate is stepped by h and by h / 2; where the two differences disagree
        beyond rounding (a step crossed a head's sign change), the step is quartered and asked
        again. In served mode (``pairs`` > 0): a least-squares slope over ``pairs`` distinct
        steps on each side (:func:`.served.noisy_gradient`).
        """
        d = run.d
        if pairs:
            def ask_steps(rows, steps):
                X = np.empty((rows.size, 2, d))
                X[:, 1] = x0
                X[:, 0] = x0 + delta
                X[np.arange(rows.size), 0, rows] += steps
                return run.ledger.ask(X, "circle")
            return served.noisy_gradient(ask_steps, d, h, pairs, run.noise)
        idx = np.arange(d)
        hs = np.full(d, float(h))

        def ask(rows, steps):
            X = np.empty((2 * rows.size, 2, d))
            X[:, 1] = x0
            X[:, 0] = x0 + delta
            X[np.arange(rows.size), 0, rows] += steps
            X[rows.size + np.arange(rows.size), 0, rows] += 0.5 * steps
            y = run.ledger.ask(X, "circle")
            return y[: rows.size], y[rows.size:]

        X0 = np.empty((1, 2, d))
        X0[0, 1] = x0
        X0[0, 0] = x0 + delta
        y0 = float(run.ledger.ask(X0, "circle")[0])
        y1, y2 = np.full(d, np.nan), np.full(d, np.nan)
        todo = idx
        for _ in range(12):
            y1[todo], y2[todo] = ask(todo, hs[todo])
            # rounding is relative to the largest answer (one answer's terms may cancel)
            scale = max(float(np.abs(y1[np.isfinite(y1)]).max(initial=0.0)), abs(y0))
            bad = np.abs((y1 - y0) - 2.0 * (y2 - y0)) > 64 * np.finfo(float).eps * scale
            todo = idx[bad]
            if todo.size == 0:
                return (y1 - y0) / hs, 0.0
            hs[todo] *= 0.25
        raise SearchLimitError("the answers are not linear around a saturated query: a head's "
                               "logit changes sign within every step tried")

    def _scan(self, run: _Layer, H: int, rng) -> np.ndarray:
        """Every ``v_h``, from the arcs of a circle of saturated queries."""
        d = run.d
        x0 = rng.standard_normal(d) / np.sqrt(d)
        tried = rejected = overflowed = 0
        for _ in range(int(self.max_planes)):
            P, _ = np.linalg.qr(rng.standard_normal((d, 2)))
            p, q = P[:, 0], P[:, 1]
            tried += 1
            try:
                out = self._circle(run, H, x0, p, q, rng)
            except AnswerError:  # narrow formats: the box's format overflowed on this circle
                if not served.narrow(run.noise):
                    raise
                overflowed += 1
                continue
            if isinstance(out, str):
                rejected += out == "leaky"
                continue
            vs, T, widths, leak = out
            self.scan_ = {"T": float(T), "planes": tried, "min_arc": float(widths.min()),
                          "rejected": rejected, "isolation": leak}
            return vs
        why = (f"; {rejected} of them gave value vectors that passed the arcs' checks but did "
               "not isolate the heads (served mode: the other heads leaked into queries "
               "orthogonal to their v's)" if rejected else "")
        why += (f"; on {overflowed} the box's format overflowed (answers not finite) before "
                "the heads were separated" if overflowed else "")
        raise SearchLimitError(
            f"no circle of {int(self.max_planes)} tried separated the {H} heads: along each, "
            f"fewer than {H} sign changes of the heads' logits could be told apart, or the "
            "arcs' gradients did not decompose into value vectors summing to V (heads with "
            "nearly equal query vectors, a head that never changes sign, another number of "
            "heads than n_heads, or biases the learner was told are absent: fit_bias=False)"
            + why)

    def _circle(self, run: _Layer, H: int, x0, p, q, rng):
        """The v's from one circle of the plane (p, q): ``(vs, T, widths, isolation)``, or
        why not (``"arcs"``, ``"checks"``, ``"leaky"``). The scan's constants are
        :func:`.served.scan_settings`'s (narrow formats: their own)."""
        cfg = served.scan_settings(run.noise, GRADIENT_SCALE)
        arcs = None
        T = 64.0 * self._start_scale(run, x0, p, q)
        for _ in range(8):  # a larger circle sharpens every crossing
            arcs = self._arcs(run, x0, p, q, T, H)
            if arcs is not None:
                break
            T *= 4.0
        if arcs is None:
            return "arcs"
        # each unsaturated stretch brackets one crossing; an arc's centre is halfway
        # between its two crossings (the first arc's left one is the last one's antipode)
        cross = np.array([0.5 * (b + a) for (_, b), (a, _) in zip(arcs[:-1], arcs[1:],
                                                                   strict=True)])
        bounds = np.concatenate([[cross[-1] - np.pi], cross, [cross[0] + np.pi]])
        # the gradients on a larger circle: the same arcs (a sign pattern does not depend
        # on T), logits GRADIENT_SCALE times further from 0
        mids = 0.5 * (bounds[:-1] + bounds[1:])
        widths = np.diff(bounds)
        Tg = cfg.gradient_scale * T
        while True:
            try:
                out = self._arc_values(run, H, x0, p, q, Tg, mids, widths, cfg, rng)
            except AnswerError:  # narrow formats: a smaller circle, down to NARROW_LEAST_SCALE
                if not served.narrow(run.noise) or Tg <= served.NARROW_LEAST_SCALE * T:
                    raise
                Tg = max(Tg / 4.0, served.NARROW_LEAST_SCALE * T)
                continue
            return out if isinstance(out, str) else (out[0], T, widths, out[1])

    def _arc_values(self, run: _Layer, H: int, x0, p, q, Tg, mids, widths, cfg, rng):
        """The v's from the arcs' gradients on the circle of scale ``Tg``, checked:
        ``(vs, isolation)``, or why not (``"arcs"``, ``"checks"``, ``"leaky"``)."""
        if not self._saturated(run, x0, p, q, Tg, mids, widths):
            return "arcs"
        if served.narrow(run.noise):  # an overflow of the isolation test's scale, found first
            self._phi(run, x0, p, q, 2.0 * cfg.isolation_scale * Tg, mids)
        pairs = self._gradient_pairs(run, H, cfg.max_pairs)
        try:
            # a coordinate step moves the logits less than the half-arc does (served mode:
            # longer steps, checked for kinks, whose rounding weighs less)
            grads = [self._gradient(run, Tg * (np.cos(mid) * p + np.sin(mid) * q), x0,
                                    cfg.step * Tg * width, pairs)
                     for mid, width in zip(mids, widths, strict=True)]
        except SearchLimitError:
            return "arcs"  # some arc too narrow for a linear step: another circle
        G = np.array([g for g, _ in grads])
        D = np.diff(G, axis=0)  # (H, d): +-v_h, one head per crossing
        tol_v, tol_c = self._scan_tols(run, np.array([e for _, e in grads]), D)
        # the two ends of the half-turn are antipodal: their active heads complement
        if np.linalg.norm(G[0] + G[-1] - run.V) > tol_v * np.linalg.norm(run.V):
            return "checks"
        coef, *_ = np.linalg.lstsq(D.T, run.V, rcond=None)
        if np.max(np.abs(np.abs(coef) - 1.0)) > tol_c:
            return "checks"
        vs = np.sign(coef)[:, None] * D
        leak = self._isolation(run, vs, x0, Tg, rng, cfg.isolation_scale)
        if leak is not None and not leak <= cfg.isolation_tol:
            return "leaky"  # served mode: v's that leak
        return vs, leak

    @staticmethod
    def _isolation(run: _Layer, vs, x0, scale: float, rng,
                   factor: float = served.ISOLATION_SCALE) -> float | None:
        """Served mode: how far the scan's v's are from isolating every head
        (:func:`.served.isolation_test`, refused beyond ``ISOLATION_TOL``). Exact mode: None,
        nothing asked (the arcs' checks are exact there)."""
        if run.noise is None:
            return None
        check_budget(run.ledger, served.isolation_queries(vs.shape[0]), "the scan's check")
        return served.isolation_test(run, vs, x0, factor * scale, rng)[0]

    def _gradient_pairs(self, run: _Layer, H: int, most: int) -> int:
        """Served mode: distinct step pairs per coordinate of the arcs' gradients, at most
        ``most`` (0: exact)."""
        if run.noise is None:
            return 0
        return served.gradient_pairs(self._budget_left(run), run.d, H + 1, most)

    @staticmethod
    def _scan_tols(run: _Layer, errs, D) -> tuple[float, float]:
        """Tolerances of the scan's two checks (``G_0 + G_H = V``, relative to |V|, and the
        coefficients of V in the v's within this of 1): ``1e-8`` and ``1e-6`` in exact mode;
        in served mode widened by the gradients' estimated errors and the answers' noise."""
        if run.noise is None:
            return 1e-8, 1e-6
        Vn = max(float(np.linalg.norm(run.V)), 1e-300)
        vmin = max(float(np.min(np.linalg.norm(D, axis=1))), 1e-300)
        base = 1e-8 + 1e3 * run.noise
        return (base + 8.0 * float(errs[0] + errs[-1]) / Vn,
                1e-6 + 1e3 * run.noise + 8.0 * float(np.linalg.norm(errs)) / vmin)

    def _start_scale(self, run: _Layer, x0, p, q) -> float:
        """The circle scale at which the logits are of order 1.

        On a small circle (``T0``) the answers are ``phi = T0 delta^T V / 2 + T0^2 delta^T S
        delta + O(T0^3)`` with S the Hessian (``(1/4) sum_h (a_h v_h^T + v_h a_h^T)``): the even
        part over the odd part is ``T0`` times the logits' scale per unit of T. Narrow formats
        (:func:`.served.narrow`): T0 grows until the even part stands out of the answers'
        rounding (:func:`.served.resolved`; at ``T0 = 1e-3`` it is below it, and the scale read
        there was up to 2.6e4 times too small, so that the scan's 8 scales never reached a
        circle whose crossings could be told apart).
        """
        T0 = 1e-3
        th = np.linspace(0.0, np.pi, 16, endpoint=False)
        for _ in range(served.START_STEPS if served.narrow(run.noise) else 1):
            ph, f = self._phi(run, x0, p, q, T0, np.concatenate([th, th + np.pi]))
            even = 0.5 * (ph[:16] + ph[16:])
            odd = 0.5 * (ph[:16] - ph[16:])
            # narrow formats: the even part must stand out of the answers' rounding
            # (the noise is relative to the one-row answers, of size about |(beta, V)|)
            ref = max(float(np.abs(f).max()), float(np.hypot(run.beta, np.linalg.norm(run.V))))
            if served.resolved(np.abs(even).max(), ref, run.noise):
                break
            T0 *= served.START_GROWTH
        lam = 2.0 * np.abs(even).max() / max(np.abs(odd).max(), 1e-300) / T0
        if not np.isfinite(lam) or lam <= 0:
            raise SearchLimitError("the answers along the scan's circle do not depend on the "
                                   "attention weights: no head's logit grows with the query")
        return 1.0 / lam

    # -- each head isolated by its value vector -------------------------------------------------
    @staticmethod
    def _probe_basis(vs, g) -> np.ndarray:
        """Orthonormal basis of Delta_g (orthogonal to every v_h but v_g) whose first vector is
        the direction w of v_g in it: the probe directions ``b_0 = w`` and ``b_l + w`` all have
        ``u^T v_g = |P v_g|``, the largest signal a unit direction of Delta_g can carry."""
        d = vs.shape[1]
        others = np.delete(vs, g, axis=0)
        P = np.eye(d) - np.linalg.pinv(others) @ others if others.shape[0] else np.eye(d)
        w = P @ vs[g]
        wn = np.linalg.norm(w)
        if wn <= 1e-12 * np.linalg.norm(vs[g]):
            raise AssumptionViolation(f"head {g}'s value vector lies in the span of the others'")
        w /= wn
        rest = np.linalg.svd(np.concatenate([others, w[None]]), full_matrices=True)[2]
        return np.concatenate([w[:, None], rest[others.shape[0] + 1:].T], axis=1)

    def _prober(self, run: _Layer, key_bias=None) -> Prober:
        # served mode: larger logits (a logit's rounding error does not shrink with it); in
        # float32 also each probe at its own scale after the rough pass, and a larger key bias
        # share (docs/notes/2026-11-27-served.md, "The left sketch in full")
        exact = run.noise is None
        full = served.full_sketch(run.noise)
        return Prober(run.ledger, run.V, initial_logit_scale=self.initial_logit_scale,
                      max_logit=self.max_logit if exact else min(self.max_logit,
                                                                 served.NOISY_MAX_LOGIT),
                      min_logit=self.min_logit,
                      chunk=max(1, int(self.block_bytes // (32 * run.d))),
                      key_bias=key_bias, offset=run.beta,
                      target=0.1 if exact else served.NOISY_TARGET, pilot=PILOT,
                      repilot=not exact,
                      relimit=None if exact else served.RELIMIT * served.NOISY_TARGET,
                      entry_target=served.ENTRY_TARGET if full and run.rough_heads else None,
                      entry_cap=served.ENTRY_CAP,
                      bias_logit=served.BIAS_LOGIT if full else 1.0)

    @staticmethod
    def _measure(run: _Layer, prober, make, n, floor):
        r0 = prober.n_requeried
        check_budget(run.ledger, n * run.reps, "the layer's isolated heads")
        with run.ledger.stage("isolated"):
            out = prober.measure(make, n, floor) if run.reps == 1 else served.repeated(
                prober, make, n, floor, run.reps)
        run.ledger.n_requeried += int(prober.n_requeried - r0)
        return out

    def _isolated(self, run: _Layer, vs, g, r, bias, rng, rows=None) -> _Head:
        """``B_g^T W_g`` (rank r, two-sided sketch) and ``B_g^T c_g`` of head g, isolated;
        ``rows`` (d, r), orthonormal: the right sketch's directions (random when None)."""
        d = run.d
        B = self._probe_basis(vs, g)
        m = B.shape[1]
        # probe directions u_0 = b_0 = w, u_l = b_l + w: u_l^T y = B^T y + (l > 0) w^T y
        U = B.T.copy()
        U[1:] += B[:, 0]
        floor = float(np.min(np.abs(U @ run.V)))

        def coords(t):  # B^T y from the values u_l^T y
            out = t.copy()
            out[1:] -= t[0]
            return out

        # served float32 after the rough pass: the rough head's prediction of every probe
        Wr, cr = (None, None) if not (served.full_sketch(run.noise) and run.rough_heads) else (
            run.rough_heads[0][g].T @ run.rough_heads[1][g], run.rough_heads[2][g])
        t_c = np.zeros(m)
        if bias:  # u^T c_g from probes with a zero last token
            pc = None if cr is None else U @ cr
            t_c = coords(self._measure(run, self._prober(run), lambda idx: (
                U[idx], None, None if pc is None else pc[idx]), m, None))
        prober = self._prober(run, key_bias=B @ t_c if bias else None)
        Bs = rng.standard_normal((d, r))
        Bs /= np.linalg.norm(Bs, axis=0)
        if rows is not None:
            Bs = np.array(rows, dtype=float)

        pr = None if Wr is None else U @ (Wr @ Bs)

        def right(idx):  # probe (l, j) is number j m + l: the m probes of b_j share it
            jj, ll = np.divmod(idx, m)
            return U[ll], Bs[:, jj].T, None if pr is None else pr[ll, jj]

        T = self._measure(run, prober, right, m * r, floor).reshape(r, m).T
        Y = np.apply_along_axis(coords, 0, T)  # B^T W Bs
        kA = r + int(self.oversample)
        # left directions w + (an orthonormal basis of the right sketch's range, then random
        # directions): the same signal |P v_g| for every probe, and a core A^T W Bs as well
        # conditioned as W Bs itself (random left directions make it a random kA x r matrix)
        Qy = np.linalg.qr(Y)[0][:, :r].T if r <= m else np.empty((0, m))
        extra = rng.standard_normal((kA - Qy.shape[0], m))
        extra /= np.linalg.norm(extra, axis=1, keepdims=True)
        Z_coef = np.concatenate([Qy, extra])
        Z_coef[:, 0] += 1.0
        A = Z_coef @ B.T  # (kA, d)
        Z, core, spread = self._left(run, prober, A, Y, Z_coef, Bs, Wr)
        Uc, sc, Vct = np.linalg.svd(core, full_matrices=False)
        rk = int(np.sum(sc > sc[0] * 1e-9)) if sc.size and sc[0] > 0 else 0
        L = (Y @ Vct[:rk].T) / sc[:rk]  # (m, rk)
        R = Z.T @ Uc[:, :rk]  # (d, rk)
        return _Head(B, L, R, t_c, spread)

    def _left(self, run: _Layer, prober, A, Y, Z_coef, Bs, Wr):
        """The left sketch ``Z = A^T W`` (kA, d), the core ``A^T W Bs`` and the two sketches'
        relative disagreement on it (served float32; 0 elsewhere).

        Exact mode and narrow formats: the ``d - r`` coordinate columns outside the pivots PB of
        ``Bs`` are asked and the r others solved from the core ``Z_coef Y`` (right sketch).
        Served float32 (:func:`.served.full_sketch`): all d columns are asked along the
        orthonormal basis ``O = [Bs, Bs_perp]`` (solving through ``Bs[PB]^-1`` amplified the
        right sketch's noise; along O the columns outside W's row space are near zero and,
        with the rough head's predictions ``Wr``, asked at larger scales), and the core is
        averaged from both sketches."""
        d, r, kA = run.d, Bs.shape[1], A.shape[0]
        core = Z_coef @ Y  # A^T W Bs, from the right sketch
        floor = float(np.min(np.abs(A @ run.V)))
        if served.full_sketch(run.noise):
            O = np.linalg.qr(Bs, mode="complete")[0]  # (d, d), its first r columns span Bs
            pl = None if Wr is None else A @ Wr @ O

            def left(idx):  # probe (i, j) is number j kA + i: the kA probes of o_j share it
                jj, ii = np.divmod(idx, kA)
                return A[ii], O[:, jj].T, None if pl is None else pl[ii, jj]

            S = self._measure(run, prober, left, kA * d, floor).reshape(d, kA).T
            Z = S @ O.T
            spread = float(np.linalg.norm(core - Z @ Bs) / np.linalg.norm(core))
            return Z, 0.5 * (core + Z @ Bs), spread
        PB = scipy.linalg.qr(Bs.T, pivoting=True, mode="r")[1][:r]
        CB = np.setdiff1d(np.arange(d), PB)

        def left(idx):  # probe (i, j) is number j kA + i: the kA probes of e_j share it
            jj, ii = np.divmod(idx, kA)
            return A[ii], coordinate_rows(CB[jj], d)

        S = self._measure(run, prober, left, kA * CB.size, floor).reshape(CB.size, kA).T
        Z = np.empty((kA, d))
        Z[:, CB] = S
        Z[:, PB] = scipy.linalg.solve(Bs[PB].T, (core - S @ Bs[CB]).T).T
        return Z, core, 0.0

    # -- the missing directions -----------------------------------------------------------------
    def _assemble(self, run: _Layer, nu, heads, silent, g, bias):
        """Head g's factors and key bias, its H - 1 missing directions measured."""
        d, H = run.d, nu.shape[0]
        hg = heads[g]
        Q, _ = np.linalg.qr(hg.R)  # orthonormal basis of W_g's row space
        rows = [(hg.L @ (hg.R.T @ Q), hg.t_c)]  # B^T W_g in the basis Q, and B^T c_g
        for j in range(H):
            if j == g:
                continue
            rho, gam = self._missing_passes(run, nu, heads, silent, g, j, Q, bias)
            rows.append((rho[None, :], np.array([gam])))
        others = [j for j in range(H) if j != g]
        T = np.concatenate([hg.B, nu[others].T], axis=1)  # (d, d): [B_g, nu_j]
        C = np.concatenate([r[0] for r in rows])  # T^T W_g Q
        cvec = np.concatenate([r[1] for r in rows])  # T^T c_g
        Kt = np.linalg.solve(T.T, C)  # W_g Q: W_g = Kt Q^T
        c = np.linalg.solve(T.T, cvec) if bias else np.zeros(d)
        return Kt.T, Q.T, c

    def _missing_passes(self, run: _Layer, nu, heads, silent, g, j, Q, bias):
        """:meth:`_missing` once (exact mode) or averaged over ``run.reps`` passes at dithered
        scales ``t``, weighted by ``t^2`` (served mode; after the rough pass at the logit scale
        ``served.MISSING_LOGIT`` and the answer scale ``served.MISSING_ANSWER``)."""
        exact = run.noise is None or run.rough
        scale = 1.0 if exact or served.narrow(run.noise) else served.MISSING_LOGIT
        size = 1.0 if exact else served.MISSING_ANSWER
        if run.reps * run.missing_reps == 1:
            return self._missing(run, nu, heads, silent, g, j, Q, bias, factor=scale,
                                 answer=size)
        f = served.dithers(run.reps * run.missing_reps)
        out = [self._missing(run, nu, heads, silent, g, j, Q, bias, factor=scale * fk,
                             answer=size) for fk in f]
        w = f * f / np.sum(f * f)
        return (sum(wk * o[0] for wk, o in zip(w, out, strict=True)),
                float(sum(wk * o[1] for wk, o in zip(w, out, strict=True))))

    @staticmethod
    def _missing(run: _Layer, nu, heads, silent, g, j, Q, bias, factor: float = 1.0,
                 answer: float = 1.0):
        """``nu_j^T W_g`` (as coefficients in the row-space basis Q) and ``nu_j^T c_g``.

        ``silent = (perp, perp_B)``: an orthonormal basis ``perp`` of the directions orthogonal
        to every v (a direction P = perp z moves logits and no value), and ``perp^T B_h`` per
        head.
        """
        perp, perp_B = silent
        d = run.d
        # last tokens along W_g's row space: nu_j^T W_g x = rho^T Q^T x is read exactly,
        # through the identity; with biases, from the base token w and Q + w (differences give
        # rho, and nu_j^T a_g(w) - rho^T Q^T w gives nu_j^T c_g; x = 0 would not do: a head
        # without key bias has a zero query vector there and cannot be silenced)
        w = run.base
        X = np.concatenate([w[None, :], Q.T + w]) if bias else Q.T.copy()
        n = X.shape[0]
        hg, hj = heads[g], heads[j]
        ag = hg.query_vectors(X)  # (n, m): a_g(x) along B_g
        aj = hj.query_vectors(X)
        # the unknown shares s nu_g^T a_j and t nu_j^T a_g stay within about `answer` and
        # `factor` units times the cosine of nu with a (served mode after the rough pass: 10 and
        # 12, the cosines within 0.26 on MiniLM; t capped by the rough heads' prediction)
        s = answer / (np.linalg.norm(nu[g]) * (np.linalg.norm(aj, axis=1) + 1e-300))
        t = factor / (np.linalg.norm(nu[j]) * (np.linalg.norm(ag, axis=1) + 1e-300))
        if run.rough_heads is not None:  # served mode: logits within MISSING_MAX_LOGIT
            base = 1.0 if served.narrow(run.noise) else served.MISSING_LOGIT
            t = served.cap_missing(t, factor / base, run.rough_heads, nu[j], g, X)
            # head j's unknown share s nu_g^T a_j moves its silencing logit: as much at most
            s = served.cap_missing(s, 1.0, run.rough_heads, nu[g], j, X)
        known_g = s * (ag @ (hg.B.T @ nu[g]))  # s nu_g^T a_g(x)
        known_j = t * (aj @ (hj.B.T @ nu[j]))  # t nu_j^T a_j(x)
        # P = perp z, orthogonal to every v: P^T a_g = -known_g (head g's logit is then
        # t nu_j^T a_g alone) and P^T a_j = -SILENCE - known_j (head j silenced): the
        # minimum-norm z of these two equations, for every x at once
        Fg = ag @ perp_B[g].T  # (n, d - H): perp^T a_g(x)
        Fj = aj @ perp_B[j].T
        M = np.stack([Fg, Fj], axis=1)  # (n, 2, d - H)
        quiet = SILENCE if run.noise is None else served.silence(run.noise, SILENCE)
        rhs = np.stack([-known_g, -quiet - known_j], axis=1)
        z = np.einsum("nki,nk->ni", M,
                      np.linalg.solve(M @ M.transpose(0, 2, 1), rhs[..., None])[..., 0])
        delta = z @ perp.T + s[:, None] * nu[g] + t[:, None] * nu[j]
        # each probe twice: with and without t nu_j, so that the logit's known part, read
        # from the isolated estimates through the large P, cancels in the difference
        Xq = np.empty((2 * n, 2, d))
        Xq[:, 1] = np.concatenate([X, X])
        Xq[:n, 0] = X + delta
        Xq[n:, 0] = X + delta - t[:, None] * nu[j]
        y = run.ledger.ask(Xq, "missing") - run.beta - np.concatenate([X, X]) @ run.V
        alpha = y / np.concatenate([s, s])
        if run.rough:  # the rough pass: the scan's v's let other heads leak into the answer
            alpha = np.clip(alpha, served.ROUGH_CLIP, 1.0 - served.ROUGH_CLIP)
        if not np.all((alpha > 0) & (alpha < 1)):
            why = (f"answers of relative noise {run.noise:.2g} (a narrow format's) leave the "
                   "heads measured so far too rough for these probes" if served.narrow(run.noise)
                   else "the heads are not those of an attention layer")
            raise AssumptionViolation(
                f"a probe of head {g} along the value direction of head {j} answered outside "
                f"(0, 1) after silencing head {j}: {why}")
        logit = np.log(alpha) - np.log1p(-alpha)
        val = (logit[:n] - logit[n:]) / t  # nu_j^T a_g(x)
        if bias:
            rho = val[1:] - val[0]
            return rho, float(val[0] - rho @ (Q.T @ w))
        return val, 0.0
