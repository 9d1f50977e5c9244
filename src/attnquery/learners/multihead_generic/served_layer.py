"""The layer learner's served route: a whole attention layer from answers that are not exact,
within a budget (beyond the paper; docs/served.md).

:class:`ServedLayerLearner` is what :class:`~.layer.AttentionLayerLearner` fits with
``route="served"``. Its budget is the fit's query ledger
(:class:`~attnquery.learners._base.QueryLedger`), opened with ``cap=n_queries`` and the check's
queries as its ``reserve``: every plan below reads ``ledger.left()``, and no query beyond
``n_queries`` is asked (:class:`~attnquery.errors.BudgetExceededError` instead). The served
pieces (the noise, the tolerances tied to it, the passes) are :mod:`.served`'s.
"""

from __future__ import annotations

import dataclasses
from numbers import Integral

import numpy as np

from ...errors import ConfigError
from .._base import CHECK_LENGTH, DEFAULT_VERIFY, NOISE_MODES, check_oracle, judge_noise
from .._params import Interval, Options
from .._probes import read_head_constants
from .._registry import LearnerSpec
from . import served
from ._route import (
    BIAS_PARAMS,
    LAYER_PARAMS,
    SERVED_STAGES,
    LayerRoute,
    assembled,
    layer_probe_count,
    layer_shape,
    missing_probe_count,
    set_init_params,
)
from ._state import ServedPlan, _Layer
from .heads import PILOT

__all__ = ["ServedLayerLearner"]


class ServedLayerLearner(LayerRoute):
    """Recover a whole attention layer, every head with its biases, from served answers within
    ``n_queries``: the served route of :class:`~.layer.AttentionLayerLearner`.

    Parameters
    ----------
    n_queries : int
        The fit's budget (the ledger's ``cap``); the check's ``verify`` queries are kept back
        for it (the ledger's ``reserve``).
    noise : {"format", "measured"}
        How the answers' measured noise is judged against their format.
    n_heads, rank, fit_bias, n_grid, max_planes, oversample, rtol, verify, check_length,
    max_logit, min_logit, initial_logit_scale, block_bytes, random_state
        As :class:`~.layer.AttentionLayerLearner`'s.

    Attributes
    ----------
    heads_, W_factors_, W_, v_, key_bias_, offset_, n_heads_, rank_, n_queries_,
    n_queries_by_stage_, n_requeried_, scan_, verify_error_, n_verify_queries_, noise_level_,
    answer_format_, noise_floor_, noise_above_format_, n_passes_, n_missing_passes_,
    head_passes_
        As :class:`~.layer.AttentionLayerLearner`'s in served mode
        (``n_queries_by_stage_``: :data:`SERVED_STAGES`).
    """

    _parameter_constraints = {
        **LAYER_PARAMS, **BIAS_PARAMS,
        "n_queries": [Interval(Integral, 1, None, closed="left")],
        "noise": [Options(NOISE_MODES)],
    }
    spec = LearnerSpec(
        name="layer_served", oracle="value", returns="layer", fits_bias=True,
        stages=SERVED_STAGES, description="the layer learner's served route "
        "(AttentionLayerLearner with route='served')", label="attention layer (served)",
        command_line=False)

    def __init__(self, *, n_heads: int, n_queries: int, rank: int | None = None,
                 fit_bias: bool = True, n_grid: int = 720, max_planes: int = 6,
                 oversample: int = 2, rtol: float = 1e-8, verify: int = DEFAULT_VERIFY,
                 check_length: int = CHECK_LENGTH, max_logit: float = 10.0,
                 min_logit: float = 1e-5, initial_logit_scale: float = 1.0,
                 block_bytes: int = 16 * 2**20, noise: str = "format", random_state=None):
        set_init_params(self, locals())

    @property
    def _what(self) -> str:
        """The fit's name in budget refusals."""
        return f"AttentionLayerLearner(route='served', n_queries={int(self.n_queries)})"

    def fit(self, oracle):
        """Recover the layer behind ``oracle`` within ``n_queries``; returns self.

        Raises
        ------
        BudgetExceededError
            When a step does not fit in what ``n_queries`` (or the oracle's budget) leaves.
        ConfigError
            When ``n_queries`` does not pay for reading V and beta, the noise and the check.
        SearchLimitError, AssumptionViolation, NotIdentifiableError
            As the exact route's; AssumptionViolation also for answers noisier than
            :data:`.served.LAYER_MAX_NOISE`.
        ModelMismatchError
            If the assembled layer disagrees with fresh random queries beyond the check's
            tolerance, or (``noise="format"``) the answers carry more noise than their format
            explains.
        """
        self._validate_params()
        d = check_oracle(oracle)
        H, r = layer_shape(self, d)
        self._check_least(d, H, r)
        rng = self._rng()
        r_scan, r_sketch, r_verify, r_base = rng.spawn(4)
        bias = bool(self.fit_bias)
        base = r_base.standard_normal(d) if bias else None
        reader = served.FormatReader(oracle)  # the format of every answer read
        with self._open_ledger(reader, SERVED_STAGES, what="the layer",
                               cap=int(self.n_queries), reserve=int(self.verify)) as ledger:
            with ledger.stage("v_sum"):
                self.noise_level_ = noise = self._noise(ledger, d, bias, rng)
                # against the answers' format: the check's tolerance, VERIFY_NOISE units of
                # this noise, then stays within the format's floor in "format" mode (the
                # warning names the line that called AttentionLayerLearner.fit, the entry)
                judge_noise(self, noise, reader.formats.format, d,
                            f"an attention layer of {int(self.n_heads)} heads", stacklevel=5)
                V, beta = self._constants(ledger, d, rng)
            run = _Layer(ledger, V, beta, None if base is None else base / np.linalg.norm(base),
                         noise=noise)
            scan = self._scan(run, H, r_scan)  # every v_h, from a circle of saturated queries
            self.scan_ = scan.info
            plan = self._plan(run, H, r)  # the passes the budget left pays for
            self.n_passes_, self.n_missing_passes_ = plan.reps, plan.reps * plan.missing_reps
            (vs, Ks, Qs, cs), self.head_passes_ = self._heads(run, plan, scan.vs, H, r, bias,
                                                              r_sketch)
            layer, token = assembled(vs, Ks, Qs, cs, run.beta, r)
            vars(self).update(layer._asdict())
            with ledger.stage("verify"):
                self._verify_fit(ledger, self.predict, r_verify, rtol=self._rtol(noise),
                                 what=f"an attention layer of {H} heads of rank {r}",
                                 token_scale=token, check_length=self.check_length)
            self.n_requeried_ = int(ledger.n_requeried)
            self.n_queries_ = ledger.total
        return self

    def least_queries(self, d: int, H: int, r: int) -> int:
        """The fewest queries a fit at dimension d of H heads of rank r asks besides its circle
        scan: V and beta (``d + 1``), the noise's, V and beta again, the rough pass and one
        pass over the isolated heads and the missing directions (``per`` each, the smaller plan
        of answers without a full sketch), the value vectors' saturated queries, each head's
        probers' pilots and the check."""
        per = layer_probe_count(d, H, r, int(self.oversample), bool(self.fit_bias)) - d - 1
        return (d + 1 + 2 * served.NOISE_QUERIES + served.constant_queries(d) + 2 * per
                + H * served.value_queries(d) + 2 * H * 2 * PILOT + int(self.verify))

    def _check_least(self, d: int, H: int, r: int) -> None:
        """ConfigError, before any query, when ``n_queries`` is below :meth:`least_queries`."""
        least = self.least_queries(d, H, r)
        if int(self.n_queries) < least:
            raise ConfigError(
                f"n_queries = {self.n_queries} does not pay for reading V and beta, the noise "
                f"and the check, with one pass over the {H} heads of rank {r} at d = {d}: at "
                f"least {least} queries besides the circle scan's are needed")

    def _noise(self, ledger, d: int, bias: bool, rng) -> float:
        """The answers' relative noise (:func:`.served.measure_noise`), after the ``d + 1``
        one-row queries of V and beta (V = 0 refused; both are read again by
        :meth:`_constants`) and the check that the oracle's own budget pays for
        ``n_queries``.

        Raises
        ------
        ConfigError
            When ``n_queries`` does not pay for reading V and beta, the noise and the check.
        """
        ledger.need(d + 1, "reading V and beta", reserved=True)
        read_head_constants(ledger, d, bias=bias, key_bias=False)
        n = int(self.n_queries)
        ledger.need(n - ledger.total, self._what, reserved=True)
        if n < d + 1 + 2 * served.NOISE_QUERIES + int(self.verify):
            raise ConfigError(f"n_queries = {n} does not pay for reading V and beta, the noise "
                              "and the check")
        return served.measure_noise(ledger, d, rng.spawn(1)[0], float(np.sqrt(d)))

    @staticmethod
    def _constants(ledger, d: int, rng) -> tuple[np.ndarray, float]:
        """V and beta again, by least squares over :func:`.served.constant_queries` one-row
        queries (:func:`.served.constants`)."""
        ledger.need(served.constant_queries(d), "reading V and beta again", reserved=True)
        return served.constants(ledger, d, rng.spawn(1)[0])

    def _rtol(self, noise: float) -> float:
        """The check's tolerance: ``rtol``, or ``VERIFY_NOISE`` units of the answers' noise if
        larger (narrow formats: ``NARROW_VERIFY_NOISE``, :func:`.served.verify_units`). With
        ``noise="format"`` that noise has been judged against the answers' format
        (:func:`~attnquery.learners._base.judge_noise`), so the tolerance is at most those
        units of ``NOISE_FORMAT_FACTOR`` times its floor."""
        return float(max(self.rtol, served.verify_units(noise) * noise))

    def _plan(self, run: _Layer, H: int, r: int) -> ServedPlan:
        """How many passes over the isolated and missing probes what the ledger has left pays
        for.

        Raises
        ------
        BudgetExceededError
            When not even one pass fits (:func:`.served.plan_repeats`).
        """
        d = run.d
        per = layer_probe_count(d, H, r, int(self.oversample), bool(self.fit_bias)) - d - 1
        miss = missing_probe_count(H, r, bool(self.fit_bias))
        if served.full_sketch(run.noise):  # the left sketch's r more columns per head
            per += H * r * (r + int(self.oversample))
        # the rough pass and the value vectors' saturated queries come first; each head's two
        # probers ask their pilots again once in the rough pass and once over the passes
        left = run.ledger.left() - per - H * served.value_queries(d) - 2 * H * 2 * PILOT
        reps = served.plan_repeats(left, per, self._what)
        k = served.missing_factor(per - miss, miss, left, reps)
        return ServedPlan(reps, k, per - miss, served.MARGIN * left)

    def _heads(self, run: _Layer, plan: ServedPlan, vs, H: int, r: int, bias: bool, rng):
        """Every head's value vector, factors (K, Q) and key bias, and the passes over each
        head's isolated probes: ``((vs, Ks, Qs, cs), head_passes)``.

        A rough pass of the isolated heads and their missing directions first; from it, the
        value vectors measured again from saturated queries
        (:func:`.served.saturated_values`: the error of the scan's v's would leak into every
        isolated head, as a bias that averaging does not remove), and each head's right sketch
        taken along its rough row space (random sketch directions make ``V_g^T B_s`` a random
        r x r matrix whose condition number, up to 1e3 on the synthetic layers, multiplies the
        noise); then ``plan.reps`` passes, and in float32 the passes the plan leaves
        (:meth:`_more_passes`).
        """
        rough = dataclasses.replace(run, rough=True)
        heads = [self._isolated(rough, vs, g, r, bias, rng) for g in range(H)]
        Ks, Qs, cs = self._missing_directions(rough, vs, heads, bias)
        run.ledger.need(H * served.value_queries(run.d), "the value vectors", reserved=True)
        with run.ledger.stage("values"):
            vs = served.saturated_values(run, Ks, Qs, cs, rng)
        rows = [Q.T for Q in Qs]
        run = dataclasses.replace(run, reps=plan.reps, missing_reps=plan.missing_reps,
                                  rough_heads=(Ks, Qs, cs))
        heads = [self._isolated(run, vs, g, r, bias, rng, rows[g]) for g in range(H)]
        passes = [int(plan.reps)] * H
        if served.full_sketch(run.noise):  # the passes the plan leaves, to the noisiest heads
            heads, passes = self._more_passes(run, plan, vs, heads, r, bias, rng, rows)
        return (vs, *self._missing_directions(run, vs, heads, bias)), passes

    def _more_passes(self, run: _Layer, plan: ServedPlan, vs, heads, r: int, bias: bool, rng,
                     rows) -> tuple[list, list]:
        """Served float32: the whole passes over one head's isolated probes that the ledger
        leaves after the planned ones (and the missing directions' and the margin's share),
        given one at a time to the head whose error, as its two sketches' disagreement predicts
        it, is the largest (:func:`.served.share_passes`), and merged with its planned passes
        (:func:`.served.merged`); returns the heads and the passes over each. On MiniLM layer
        1 (learner seed 0) the plan found 633,921 queries left where two passes needed
        638,963, and the fit spent 3.15 ``layer_dof`` of 4 before this."""
        H = len(heads)
        per_head = -(-plan.pass_cost // H) + 4 * PILOT  # its probers' pilots asked twice
        miss = missing_probe_count(H, r, bias) * run.reps * run.missing_reps
        more = int(max(0, run.ledger.left() - miss - plan.margin) // per_head)
        if more == 0:
            return heads, [int(run.reps)] * H
        n = served.share_passes([h.spread for h in heads], run.reps, more)
        return [heads[g] if n[g] == run.reps else served.merged(
            heads[g], self._isolated(dataclasses.replace(run, reps=int(n[g] - run.reps)), vs,
                                     g, r, bias, rng, rows[g]), run.reps, int(n[g] - run.reps))
            for g in range(H)], [int(k) for k in n]

    # -- the served settings of the shared measurements (scan.py, heads.py) ----------------------
    @staticmethod
    def _isolation(run: _Layer, vs, x0, scale: float, rng,
                   factor: float = served.ISOLATION_SCALE) -> float:
        """How far the scan's v's are from isolating every head
        (:func:`.served.isolation_test`; the scan refuses a circle beyond its settings'
        ``isolation_tol``)."""
        run.ledger.need(served.isolation_queries(vs.shape[0]), "the scan's check",
                        reserved=True)
        return served.isolation_test(run, vs, x0, factor * scale, rng)[0]

    def _gradient_pairs(self, run: _Layer, H: int, most: int) -> int:
        """Distinct step pairs per coordinate of the arcs' gradients, at most ``most``: what
        the ledger has left pays for (:func:`.served.gradient_pairs`)."""
        return served.gradient_pairs(run.ledger.left(), run.d, H + 1, most)

    @staticmethod
    def _scan_tols(run: _Layer, errs, D) -> tuple[float, float]:
        """The scan's two tolerances (:meth:`.scan.CircleScan._scan_tols`) widened by the
        gradients' estimated errors and the answers' noise."""
        Vn = max(float(np.linalg.norm(run.V)), 1e-300)
        vmin = max(float(np.min(np.linalg.norm(D, axis=1))), 1e-300)
        base = 1e-8 + 1e3 * run.noise
        return (base + 8.0 * float(errs[0] + errs[-1]) / Vn,
                1e-6 + 1e3 * run.noise + 8.0 * float(np.linalg.norm(errs)) / vmin)

    def _probe_settings(self, run: _Layer) -> dict:
        """Larger logits (a logit's rounding error does not shrink with it); in float32 also
        each probe at its own scale after the rough pass, and a larger key bias share
        (docs/notes/2026-11-27-served.md, "The left sketch in full")."""
        full = served.full_sketch(run.noise)
        return {"max_logit": min(self.max_logit, served.NOISY_MAX_LOGIT),
                "target": served.NOISY_TARGET, "repilot": True,
                "relimit": served.RELIMIT * served.NOISY_TARGET,
                "entry_target": served.ENTRY_TARGET if full and run.rough_heads else None,
                "bias_logit": served.BIAS_LOGIT if full else 1.0}

    def _missing_passes(self, run: _Layer, nu, heads, silent, g, j, Q, bias):
        """:meth:`.heads.HeadProbes._missing` averaged over ``run.reps * run.missing_reps``
        passes at dithered scales ``t``, weighted by ``t^2``; after the rough pass at the logit
        scale ``served.MISSING_LOGIT`` (1 in narrow formats) and the answer scale
        ``served.MISSING_ANSWER`` (the rough pass: once, at 1 and 1)."""
        scale = 1.0 if run.rough or served.narrow(run.noise) else served.MISSING_LOGIT
        size = 1.0 if run.rough else served.MISSING_ANSWER
        if run.reps * run.missing_reps == 1:
            return self._missing(run, nu, heads, silent, g, j, Q, bias, factor=scale,
                                 answer=size)
        f = served.dithers(run.reps * run.missing_reps)
        out = [self._missing(run, nu, heads, silent, g, j, Q, bias, factor=scale * fk,
                             answer=size) for fk in f]
        w = f * f / np.sum(f * f)
        return (sum(wk * o[0] for wk, o in zip(w, out, strict=True)),
                float(sum(wk * o[1] for wk, o in zip(w, out, strict=True))))
