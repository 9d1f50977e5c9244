"""The layer learner's exact route: a whole attention layer from exact answers (beyond the paper).

:class:`ExactLayerLearner` is what :class:`~.layer.AttentionLayerLearner` fits with
``route="exact"`` (the default with ``positions="none"``): V and beta from ``d + 1`` one-row
queries, every ``v_h`` from the circle scan (:mod:`.scan`), each head isolated by its value
vector and its missing directions measured once (:mod:`.heads`), then the check. The method and
its query count are :mod:`.layer`'s.
"""

from __future__ import annotations

import numpy as np

from .._base import CHECK_LENGTH, DEFAULT_VERIFY, check_oracle
from .._probes import read_head_constants
from .._registry import LearnerSpec
from ._route import (
    BIAS_PARAMS,
    LAYER_PARAMS,
    STAGES,
    LayerRoute,
    assembled,
    layer_shape,
    set_init_params,
)
from ._state import _Layer

__all__ = ["ExactLayerLearner"]


class ExactLayerLearner(LayerRoute):
    """Recover a whole attention layer from exact answers, every head with its biases, up to a
    permutation: the exact route of :class:`~.layer.AttentionLayerLearner`.

    Parameters
    ----------
    n_heads, rank, fit_bias, n_grid, max_planes, oversample, rtol, verify, check_length,
    max_logit, min_logit, initial_logit_scale, block_bytes, random_state
        As :class:`~.layer.AttentionLayerLearner`'s.

    Attributes
    ----------
    heads_, W_factors_, W_, v_, key_bias_, offset_, n_heads_, rank_, n_queries_,
    n_queries_by_stage_, n_requeried_, scan_, verify_error_, n_verify_queries_
        As :class:`~.layer.AttentionLayerLearner`'s (``n_queries_by_stage_``: :data:`STAGES`).
    noise_level_, answer_format_, noise_floor_ : None
    noise_above_format_ : bool
        False: exact answers are not judged.
    n_passes_, n_missing_passes_ : int
        1: every probe is asked once.
    head_passes_ : list of int
        1 per head.
    """

    _parameter_constraints = {**LAYER_PARAMS, **BIAS_PARAMS}
    spec = LearnerSpec(
        name="layer_exact", oracle="value", returns="layer", fits_bias=True, stages=STAGES,
        description="the layer learner's exact route (AttentionLayerLearner with route "
        "'exact', the default without positions)", label="attention layer (exact)",
        command_line=False)

    def __init__(self, *, n_heads: int, rank: int | None = None, fit_bias: bool = True,
                 n_grid: int = 720, max_planes: int = 6, oversample: int = 2,
                 rtol: float = 1e-8, verify: int = DEFAULT_VERIFY,
                 check_length: int = CHECK_LENGTH, max_logit: float = 10.0,
                 min_logit: float = 1e-5, initial_logit_scale: float = 1.0,
                 block_bytes: int = 16 * 2**20, random_state=None):
        set_init_params(self, locals())

    def fit(self, oracle):
        """Recover the layer behind ``oracle``; returns self.

        Raises
        ------
        SearchLimitError
            If no circle of the scan separates all the heads.
        AssumptionViolation
            If the answers contradict the layer model.
        ModelMismatchError
            If the assembled layer disagrees with fresh random queries beyond ``rtol``.
        NotIdentifiableError
            If every one-row answer is the same (V = 0).
        """
        self._validate_params()
        d = check_oracle(oracle)
        H, r = layer_shape(self, d)
        r_scan, r_sketch, r_verify, r_base = self._rng().spawn(4)
        bias = bool(self.fit_bias)
        base = r_base.standard_normal(d) if bias else None
        with self._open_ledger(oracle, STAGES, what="the layer") as ledger:
            ledger.need(d + 1, "reading V and beta", reserved=True)
            with ledger.stage("v_sum"):
                head = read_head_constants(ledger, d, bias=bias, key_bias=False)
            # exact answers: the noise is not measured, nor judged
            self.noise_level_, self.answer_format_, self.noise_floor_ = None, None, None
            self.noise_above_format_ = False
            run = _Layer(ledger, head.v, head.offset,
                         None if base is None else base / np.linalg.norm(base))
            scan = self._scan(run, H, r_scan)  # every v_h, from a circle of saturated queries
            self.scan_ = scan.info
            self.n_passes_ = self.n_missing_passes_ = 1
            heads = [self._isolated(run, scan.vs, g, r, bias, r_sketch) for g in range(H)]
            self.head_passes_ = [1] * H
            layer, token = assembled(scan.vs, *self._missing_directions(run, scan.vs, heads,
                                                                        bias), run.beta, r)
            vars(self).update(layer._asdict())
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, r_verify, rtol=float(self.rtol),
                                 what=f"an attention layer of {H} heads of rank {r}",
                                 token_scale=token, check_length=self.check_length)
            self.n_requeried_ = int(ledger.n_requeried)
            self.n_queries_ = ledger.total
        return self
