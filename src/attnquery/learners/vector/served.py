"""The vector learner's served route: a head from vector answers rounded to float32, float16 or
bfloat16 (beyond the paper; docs/vector.md, "Served answers").

A served module (onnxruntime in float32 or float16, bfloat16 on an accelerator) rounds every
answer to its format. :class:`~attnquery.learners.VectorLayerLearner` reads the format of its
first one-token answers (:func:`attnquery.precision.answer_format`, free: they are asked anyway)
and, where it is a narrow one, hands the fit to :class:`ServedVectorLearner` on the same query
ledger. What changes against the float64 route:

* V and beta by least squares over :data:`VALUE_SAMPLES` ``(d + 1)`` one-token queries in
  antipodal pairs (``f([x]) + f([-x]) = 2 beta`` exactly): their scatter is the answers'
  relative noise, judged against the format's floor as the scalar learners judge it
  (:func:`~attnquery.learners._noise.judge_noise`, ``noise="format"`` or ``"measured"``);
* the attention stage asks :data:`SERVED_OVERSAMPLE` times the float64 route's queries, and the
  weighted logit least squares leaves out weights below :data:`MIN_WEIGHT_UNITS` units of the
  noise (their logarithm is rounding);
* the tolerances of the attention matrices and of the check are multiples of the format's
  rounding floor (:func:`attnquery.precision.rounding_floor`, or the measured noise where that
  is larger), not float64's ``1e-9`` and ``1e-8``;
* a layer's split (:mod:`._split`) takes the format's tolerances: float32's, and for
  float16 and bfloat16 a key scale the format holds (:data:`WIDE_SPLIT`, or
  :data:`TIGHT_SPLIT` where a float16 box's answers to it overflow) with the narrow options
  (crossings of finite width, perturbed differences read at shared points, projectors by
  least squares);
* every served fit, head or layer, is checked to :data:`VERIFY_UNITS` noise units, on tokens
  of norm :data:`VERIFY_SCALE` (where logits that are not a bilinear form, soft-capped ones,
  show);
* a layer's split reads the parts in the answers' own coordinates, and every head's value map
  again from the exact parts of d orthonormal key differences
  (:func:`~._split.values_from_parts`, every token's outputs): cut from the one-token
  estimate of ``V_sum`` along the heads' projectors, its rounding is amplified (float32,
  d = 384: 1.2e-6 to 5.9e-5);
* the shared-token route's groups are smaller and more numerous (more shared tokens, each read
  less precisely) and their rows' logits spread wider (:data:`SHARED_OVERSAMPLE`,
  :data:`SHARED_RANK_SAMPLES`, :data:`SHARED_TARGET_SPREAD`), and its (W, c) is refined by one
  weighted least squares over every row of the groups' attention matrices
  (:data:`SHARED_REFINE`, :mod:`._refine`), then by Gauss-Newton on the groups' answers
  themselves (:data:`SHARED_ANSWER_STEPS`, :mod:`._answers`).
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import AnswerError, ConfigError, ModelMismatchError, NotIdentifiableError
from ...precision import answer_format
from .._base import CHECK_LENGTH, DEFAULT_VERIFY
from .._noise import NOISE_MODES, judge_noise
from .._params import Options
from .._registry import LearnerSpec
from ._answers import ANSWER_STEPS
from ._layer import STAGES, VectorLayerRoute
from ._refine import REFINE_SWEEPS
from ._split import SplitTolerances, split_values

__all__ = ["ServedVectorLearner", "VALUE_SAMPLES", "SERVED_OVERSAMPLE", "ATTENTION_UNITS",
           "MIN_WEIGHT_UNITS", "VERIFY_UNITS", "NARROW_SPLIT", "WIDE_SPLIT", "TIGHT_SPLIT",
           "NARROW_VERIFY_UNITS", "TIGHT_SHRINK", "SHARED_OVERSAMPLE", "SHARED_RANK_SAMPLES",
           "SHARED_TARGET_SPREAD", "SHARED_REFINE", "SHARED_ANSWER_STEPS", "VERIFY_SCALE"]

#: one-token queries per unknown of each column of V and beta (d + 1): the least squares then
#: averages the answers' rounding over VALUE_SAMPLES answers
VALUE_SAMPLES = 8
#: the attention stage asks this many times the float64 route's queries (``OVERSAMPLE`` logit
#: differences per unknown of (W, c), :mod:`.vector`), so that the least squares averages the
#: weights' rounding
SERVED_OVERSAMPLE = 32
#: the attention matrices' residual (and the most negative weight) allowed, in units of the
#: answers' noise
ATTENTION_UNITS = 30.0
#: weights below this many units of the answers' noise are left out of the logit equations
MIN_WEIGHT_UNITS = 3.0
#: the check's relative tolerance, in units of the answers' noise (the format's floor, or the
#: measured noise where larger): one rule for single heads and layers in every format. Valid
#: boxes' checks (1 to 4096 tokens) measured 0.10 to 0.41 units in float32, 0.45 to 0.92 in
#: float16 and 0.49 to 1.10 in bfloat16 (45 fits: heads at d = 16 and 32, a layer of 4 heads at
#: d = 32, every token's outputs and the last token's, 3 seeds; docs/notes/2026-12-05-vector-
#: lengths.md), layers of several heads in float16 and bfloat16 0.5 to 1.7; the former 100
#: units for single heads (0.39 relative in bfloat16) passed a head with a sliding window of 200
#: tokens 0.05 off
VERIFY_UNITS = 10.0
#: the norm of the check queries' tokens (the float64 route's: 1). Logits grow as its square,
#: and a box whose logits bend away from a bilinear form where they are large (soft-capped,
#: ``cap tanh(s / cap)``) shows there: a soft-capped head (cap 100, d = 16, Gaussian noise 5e-6
#: per answer entry) was 2.6 to 7.2 units off on tokens of norm 1, within VERIFY_UNITS, and
#: 139 to 296 units off on tokens of norm 2, where the same head without the cap stays at 0.45
#: to 0.61 units (docs/notes/2026-12-05-noisy-checks.md)
VERIFY_SCALE = 2.0
#: a layer's split (:mod:`._split`) under float32 rounding: a change of the saturated
#: answers beyond SPLIT_CHANGE_UNITS noise units is a jump; nearby key differences
#: ``Delta_0 + SPLIT_PERTURB Delta_j`` (float64: 1e-5, whose division amplifies the rounding
#: 1e5 times); a head's approximate parts span d / H dimensions to SPLIT_MATCH, its patterns
#: are 0/1 to SPLIT_MOVED (float64: 1e-8 and 1e-2)
SPLIT_CHANGE_UNITS = 100.0
SPLIT_PERTURB = 1e-3
SPLIT_MATCH = 1e-2
SPLIT_MOVED = 0.1
#: ... it reads the parts in the answers' own coordinates (``SplitTolerances.output_frame``:
#: ``V_sum^+`` amplifies their rounding by its condition number), of SPLIT_SPREAD (dh + 1) key
#: differences, each from SPLIT_REFINE times the float64 route's random points. The split alone
#: with the true V_sum, worst V: d = 96, 6 heads: 9.3e-6 in V_sum^+'s frame at (1, 4), 1.1e-6
#: at (3, 1); d = 192, 12 heads: refused in V_sum^+'s frame, 7.3e-6 at (3, 1)
SPLIT_REFINE = 1
SPLIT_SPREAD = 3
#: the shared-token route's groups hold this many times the float64 route's queries per unknown
#: (``GROUP_OVERSAMPLE``, :mod:`._heads`), and the heads' row spaces are read to
#: SHARED_ROW_RTOL (float64: 1e-8). d = 96, 6 float32 heads of 16, the groups the float64 rule
#: asks: worst W 1.5e-4 at 1 (the float64 route's groups), 6.3e-5 at 8 (2,820 queries),
#: 2.4e-5 at 32 (4,760 queries)
SHARED_OVERSAMPLE = 8.0
#: ... and groups are added until the shared tokens' row-space samples number SHARED_RANK_SAMPLES
#: times the heads' rank (more groups of fewer queries: more shared tokens, each read less
#: precisely), whose rows' logits spread over about SHARED_TARGET_SPREAD (float64: 1). d = 96,
#: 6 heads of 16 (2,600 attention queries): worst W 2.2e-5 with 5 groups of 32, spread 1; 1.2e-5 at
#: spread 2 (1.4e-5 at 1.5, 1.5e-5 at 2.5, 3.1e-5 at 3, 3.2e-4 at 4); 5.6e-6 at spread 2 with
#: 20 groups of 8 (5.8e-6 with 40 groups of 4), before the refinement. With it (below) the
#: error falls as the square root of the groups' queries, which the issue's budget (20,000 at
#: d = 384) pays for: 12 heads of 32 at d = 384, the true value maps, worst W refined 8.3e-6
#: at 6 (18 groups, 4,630 queries), 5.7e-6 at 12 on the first head (35 groups, 8,999)
SHARED_RANK_SAMPLES = 12.0
#: With the Gauss-Newton step on the answers (SHARED_ANSWER_STEPS), wider spreads pay: d = 96,
#: worst W 3.0e-7 at 2, 2.0e-7 at 2.5, 1.9e-7 at 3, 1.6e-7 at 3.5 (2 more groups), 1.4e-7 at 4
#: (7 more groups); 3 keeps the groups' count
SHARED_TARGET_SPREAD = 3.0
SHARED_ROW_RTOL = 1e-4
#: sweeps of the weighted least squares over every row of the groups' attention matrices that
#: refine the route's (W, c) (:mod:`._refine`). Float32, 12 heads of 32 at d = 384 (4,630
#: attention queries, the true value maps): worst W 2.9e-5 from the route, 8.3e-6 refined;
#: d = 96, 6 heads of 16: 8.5e-6 and 1.3e-6
SHARED_REFINE = REFINE_SWEEPS
#: then Gauss-Newton steps on the groups' answers, every head at once (the answers' own least
#: squares; :mod:`._answers`). Float32, d = 96, 6 heads of 16 (5,074 attention queries,
#: the value maps the learner reads): worst W 8.1e-7 from the refinement above, 2.7e-7 after one
#: step, the same after two
SHARED_ANSWER_STEPS = ANSWER_STEPS
#: a layer's split under float16 and bfloat16 rounding (:data:`NARROW_SPLIT`), where float64's
#: key scale (1e10) overflows float16 and the crossings of a moderate one have a width: a jump
#: is a change beyond NARROW_CHANGE_UNITS noise units and runs of contiguous changing intervals
#: are one crossing (``merge``), the perturbed differences ``Delta_0 + NARROW_PERTURB Delta_j``
#: are read at Delta_0's points (``star``), patterns off by more than NARROW_MOVED are left
#: out (at most NARROW_DROP of the points: weights near their crossing), NARROW_REFINE times
#: the float64 route's points per difference, a head's parts span d / H dimensions to
#: NARROW_MATCH, and the projectors solve the least squares over 2 H (dh + 1) refined
#: differences (``solve_projectors``)
NARROW_CHANGE_UNITS = 10.0
NARROW_PERTURB = 0.1
NARROW_MOVED = 0.25
NARROW_DROP = 0.15
NARROW_REFINE = 8
NARROW_MATCH = 0.1
#: the key scale and reach of the narrow split, wide: key differences of scale 300 and lines
#: and points of norm 10 (logits of a few thousand: crossings 10 / (T |Delta^T W_h v|), about
#: 0.03 in s, narrower than the bisection's last intervals, 20 / 2^9); the tokens' norms
#: (300) hold in float16, the scores (about ``|x|^2 sqrt(dh)``) only where the engine computes
#: them in a wider type, as onnxruntime's CPU provider evidently does (scores of 4e6 answered)
WIDE_SPLIT = dict(key_scale=300.0, line_half=10.0, refine_norm=10.0, levels=9)
#: lines tried after the first by the narrow split (float32's 2): a line is used only where
#: it shows n_heads runs whose jumps hold at random points, which a slow crossing, two
#: crossings in one run or one beyond the line's end often prevents (the tight split, 4 heads
#: at d = 32: 2 to 10 runs on 9 lines of one study draw, 4 on its 10th; each line asks at
#: most 2 + 36 n_heads queries, and 8 n_heads + 32 more where it shows n_heads runs)
NARROW_RETRIES = 17
#: ... and tight, where the wide split's answers overflow (a float16 box that computes its
#: scores in float16): tokens of norm at most about 55 (scale 40, lines of half extent 25
#: about a point of norm 3, points of norm 25), whose scores stay below 65504 for heads of 16
#: with logits of unit scale; their crossings are wider and slow ones more common
TIGHT_SPLIT = dict(key_scale=40.0, line_half=25.0, line_norm=3.0, refine_norm=25.0, levels=9)
#: where the tight split's answers overflow too (heads of 16 at d = 32, 2 of 20 study draws:
#: scores past 65504 at the refinement's tokens of norm about 47), it starts again with its
#: lengths (key scale, reach, norms) times each of these in turn: scores times their squares
TIGHT_SHRINK = (0.7, 0.5)
#: the formats whose layers are split with the narrow tolerances
NARROW_SPLIT = ("float16", "bfloat16")
#: the check's relative tolerance for such layers: :data:`VERIFY_UNITS`, as for every served fit
#: (kept as a name of its own for callers)
NARROW_VERIFY_UNITS = VERIFY_UNITS


class ServedVectorLearner(VectorLayerRoute):
    """Recover an attention head from served vector answers (float32, float16, bfloat16).

    The served route of :class:`~attnquery.learners.VectorLayerLearner`, which hands a fit to
    it when its first one-token answers are in a narrow format; see the module docstring for
    what differs. Its parameters are that learner's and ``noise``; its fitted attributes are
    that learner's and those below.

    Parameters
    ----------
    noise : {"format", "measured"}
        How the answers' measured noise is judged against their format (default
        ``"format"``: more than ``NOISE_FORMAT_FACTOR`` times the format's floor is refused by
        name; ``"measured"``: warned about, and the tolerances follow the measured noise).
    n_attention_queries : int, optional
        Queries of the attention stage (default :data:`SERVED_OVERSAMPLE` times the float64
        route's).

    Attributes
    ----------
    answer_format_ : str
        The format of the one-token answers (``"float64"`` for answers in no narrow format).
    noise_level_ : float
        The answers' relative noise, measured from the antipodal one-token pairs.
    noise_floor_ : float or None
        The format's rounding floor at d (None for float64 answers).
    noise_above_format_ : bool
        Whether the noise exceeded ``NOISE_FORMAT_FACTOR`` floors (with ``noise="measured"``).
    noise_unit_ : float
        The unit of the tolerances: the floor, or the measured noise where that is larger.
    split_key_scale_ : float
        Layers of several heads: the scale of the split's key differences (float32: 1e10;
        float16 and bfloat16: 300, or 40 where a float16 box's answers overflow at 300, and
        28 or 20 where they overflow at 40 too).
    """

    def __init__(self, *, n_heads=None, n_kv_heads=None, causal=False, positions="none",
                 fit_bias=True, n_attention_queries=None, n_queries=None,
                 verify=DEFAULT_VERIFY, check_length=CHECK_LENGTH, noise="format",
                 random_state=None):
        super().__init__(n_heads=n_heads, n_kv_heads=n_kv_heads, causal=causal,
                         positions=positions, fit_bias=fit_bias,
                         n_attention_queries=n_attention_queries, n_queries=n_queries,
                         verify=verify, check_length=check_length, random_state=random_state)
        self.noise = noise

    _parameter_constraints = {**VectorLayerRoute._parameter_constraints,
                              "noise": [Options(NOISE_MODES)]}
    spec = LearnerSpec(
        name="vector_served", oracle="vector", returns="vector layer", stages=STAGES,
        fits_bias=True, description="the vector learner's served route: float32, float16 or "
        "bfloat16 vector answers (VectorLayerLearner on answers in a narrow format)",
        label="vector answers (served)")

    #: queries of d / 4 tokens (float64: d / 2 for every token's answers, 3 d / 4 for the last
    #: token's), their attention matrices better conditioned. W in units of the format's floor:
    #: last token, bfloat16 at d = 16 (1,200 attention queries) 10.4 at 3/4, 2.2 at 1/2, 0.97 at
    #: 1/4, float32 at d = 32 5.2, 1.9, 1.1; every token, bfloat16 at d = 32 (900 queries) 6.1
    #: at 1/2, 1.2 at 1/4
    _last_fill = 0.25
    #: the split's spend depends on the answers' format (a float16 split may be asked again at a
    #: smaller key scale): no plan to spend whole
    _spend_split_plan = False

    @property
    def _all_fill(self) -> float:
        """d / 4 tokens for a single head; a layer's queries keep the float64 route's H N = d / 2
        (d / 4 took a float32 layer of 2 heads at d = 16 to 6,528 queries of 2 tokens)."""
        return 0.25 if (self.n_heads or 1) == 1 else 0.5

    def _validate_extra(self) -> None:
        super()._validate_extra()
        if self.positions != "none":
            raise ConfigError("positions='rotary': served answers are read for heads without "
                              "positions so far")

    # -- V and beta, and the noise ----------------------------------------------------------------
    def _read_values(self, oracle, d: int) -> tuple[np.ndarray, np.ndarray]:
        """V and beta by least squares over antipodal one-token queries; measures the answers'
        relative noise from their sums and judges it against their format."""
        self._validate_extra()  # reached from VectorLayerLearner's dispatch too
        self._served_answers = None
        n = math.ceil(VALUE_SAMPLES * (d + 1) / 2)
        z = self._rng_values.standard_normal((n, d))
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        oracle.need(2 * n, "the value stage (served answers)", reserved=True)
        y = np.asarray(oracle(np.concatenate([z, -z])[:, None, :]), dtype=np.float64)
        y = y[:, 0] if y.ndim == 3 else y
        if not np.all(np.isfinite(y)):
            raise ModelMismatchError("one-token answers that are not finite: the box overflows "
                                     "at tokens of norm 1", error=float("inf"), allowed=0.0)
        odd, even = 0.5 * (y[:n] - y[n:]), 0.5 * (y[:n] + y[n:])
        V = np.linalg.lstsq(z, odd, rcond=None)[0]
        beta = even.mean(axis=0) if self.fit_bias else np.zeros(y.shape[1])
        rms = float(np.sqrt(np.mean(y * y)))
        # each sum f([x]) + f([-x]) - 2 beta carries two answers' rounding: sqrt(2) of one's
        spread = float(np.std(even - even.mean(axis=0)) * np.sqrt(2.0))
        noise = max(spread / max(rms, np.finfo(float).tiny), float(np.finfo(float).eps))
        fmt = answer_format(y)
        judge_noise(self, noise, fmt, d, "a vector attention head", stacklevel=6)
        self.noise_level_ = noise
        self.noise_unit_ = max(noise, self.noise_floor_ or 0.0)
        if not np.any(np.abs(V) > self.noise_unit_ * rms):
            raise NotIdentifiableError("every one-token answer is the offset (V = 0): the "
                                       "attention weights, and so W, are not identifiable")
        return V, beta

    def _fit_layer(self, ledger, rng, d: int, outputs: str):
        self._rng_values = rng
        return super()._fit_layer(ledger, rng, d, outputs)

    def _plan(self, d: int, V: np.ndarray, H: int, outputs: str) -> tuple[int, int]:
        if self.n_attention_queries is not None:
            return super()._plan(d, V, H, outputs)
        N, n = super()._plan(d, V, H, outputs)
        return N, int(SERVED_OVERSAMPLE * n)

    # -- the tolerances: the answers' format's -------------------------------------------------
    def _attention_tol(self) -> float:
        return ATTENTION_UNITS * self.noise_unit_

    def _min_weight(self) -> float:
        return MIN_WEIGHT_UNITS * self.noise_unit_

    def _verify_tol(self) -> float:
        """:data:`VERIFY_UNITS` units of the answers' noise: heads and layers alike."""
        return VERIFY_UNITS * self.noise_unit_

    def _verify_scale(self) -> float:
        """Check queries of tokens of norm :data:`VERIFY_SCALE`."""
        return VERIFY_SCALE

    def _split_values(self, ledger, V_sum, beta, H: int, rng) -> np.ndarray:
        """The split with the format's tolerances; in float16, the wide split first and the
        tight one where its answers overflow (:data:`WIDE_SPLIT`, :data:`TIGHT_SPLIT`), shrunk
        by :data:`TIGHT_SHRINK` where they overflow too. Sets ``split_key_scale_``."""
        tols = self._split_tolerances()
        self.split_key_scale_ = tols.key_scale
        try:
            return split_values(ledger, V_sum, beta, H, rng, tols)
        except AnswerError:
            if self.answer_format_ != "float16":
                raise
        for shrink in (1.0, *TIGHT_SHRINK):
            tols = self._split_tolerances(tight=shrink)
            self.split_key_scale_ = tols.key_scale
            try:
                return split_values(ledger, V_sum, beta, H, rng, tols)
            except AnswerError:
                if shrink == TIGHT_SHRINK[-1]:
                    raise

    def _split_tolerances(self, tight: float = 0.0) -> SplitTolerances:
        """The split's tolerances for the answers' format; for float16 and bfloat16 the wide
        split's (``tight`` 0) or the tight split's with its lengths times ``tight``."""
        if getattr(self, "answer_format_", None) in NARROW_SPLIT:
            H = self.n_heads or 1
            reach = WIDE_SPLIT if not tight else {
                k: v if k == "levels" else tight * v for k, v in TIGHT_SPLIT.items()}
            return SplitTolerances(
                change=NARROW_CHANGE_UNITS * self.noise_unit_, match=NARROW_MATCH,
                moved=NARROW_MOVED, perturb=NARROW_PERTURB, refine=NARROW_REFINE,
                output_frame=True, spread=max(1, 2 * H - 2), perturbed=3, merge=True,
                drop=NARROW_DROP, star=True, solve_projectors=True, retries=NARROW_RETRIES,
                **reach)
        return SplitTolerances(change=SPLIT_CHANGE_UNITS * self.noise_unit_, match=SPLIT_MATCH,
                               moved=SPLIT_MOVED, perturb=SPLIT_PERTURB, refine=SPLIT_REFINE,
                               output_frame=True, spread=SPLIT_SPREAD,
                               values_from_parts=self.outputs_ == "all")

    def _shared_options(self) -> dict:
        return dict(group_oversample=SHARED_OVERSAMPLE, row_rtol=SHARED_ROW_RTOL,
                    refine=SHARED_REFINE, answer_steps=SHARED_ANSWER_STEPS,
                    rank_samples=SHARED_RANK_SAMPLES, target_spread=SHARED_TARGET_SPREAD)

