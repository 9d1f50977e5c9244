"""A whole rotary attention layer with grouped-query attention (Llama-style), beyond the paper.

:class:`RotaryLayerLearner`, the rotary route of
:class:`~attnquery.learners.AttentionLayerLearner`, which fits it with ``positions="rotary"``.
The box is a self-attention layer with rotary positions (RoPE, "rotate half"), H query heads
and G key/value heads, read out along a vector (:class:`attnquery.models.RotaryAttentionLayer`
without biases): a sum of H rotary heads (:mod:`attnquery.learners.rotary`)

    f(X) = sum_h sum_i softmax(s_h)_i v_h^T x_i,   s_{h,i} = x_i^T M^h_{i-N} x_N,

with ``M^h_delta = K_g^T Rot_{-delta} Q_h`` (g the key/value head of h). Heads of one group
share ``K_g`` (so the column space of every ``M^h``) but not ``v_h`` (a slice of the output
projection read out), so the H value vectors are in general position.

**The method.** Two facts about the probes ``[x + delta; x]`` and ``[x + delta; x; x]``:

* their answer is ``x^T V + sum_h alpha_h delta^T v_h`` (V = sum_h v_h), whatever the positions,
  and the logit of ``alpha_h`` is ``delta^T M^h_{-1} x + k_h(x)`` (two rows; three rows:
  ``delta^T M^h_{-2} x + k'_h(x)``), with a constant ``k_h(x)`` that does not depend on delta;
* for a large delta every logit is saturated and f is linear in delta.

So, as in :mod:`attnquery.learners.multihead_generic.layer`:

1. ``V`` from the d one-row queries, then every ``v_h`` from the arcs of a circle of saturated
   queries (the layer learner's scan, unchanged: with a small last token the constants
   ``k_h`` only shift the crossings);
2. head g isolated by its value vector: deltas in ``Delta_g`` (orthogonal to every ``v_h`` but
   ``v_g``, dimension ``m = d - H + 1``) silence every other head, and the rotary learner's
   scaled probes (first token ``s b + c u``, last token ``s b``; the constant read by the pair
   ``+-u_0``, n + 1 probes for n first directions and one last token) give
   ``Y1 = B_g^T M^g_{-1}`` (m x d, rank r) in three stages, as the rotary learner's low-rank
   route: a right sketch ``Y1 Z`` (k = r + 8 random last tokens) gives its column space
   approximately, r first directions along it (with ``|u^T V|`` bounded below) and every
   coordinate last token give r combinations of its rows, hence its row space exactly, and
   ``Y1 V_r`` on that row space gives ``Y1 = (Y1 V_r) V_r^T``; then ``Y2 = B_g^T M^g_{-2} V_r``
   (m x r, three-row probes). With ``Y1 = U S V_r^T``, ``T = S^{-1} U^T Y2 = G^{-1} D G`` as
   for one head
   (:class:`~attnquery.learners.RotaryValueQueryLearner`), whose eigenvalues are the frequencies
   and eigenvectors give ``Q_h`` up to the rotary gauge: the restriction ``B_g^T K_g^T`` of the
   keys is enough for that;
3. the H - 1 missing directions of the keys ``nu_j^T M^g_{-1}`` (nu the dual basis of the
   v's) from the layer learner's silencing probes (head j silenced at logit -60, each probe with
   and without ``t nu_j``, so the constants cancel), r last tokens along the row space each
   (scaled so that the constants stay about 1);
4. ``M^g_{-1}`` then gives ``K_h = D (M^g_{-1} Q_h^+)^T``; heads whose ``M^h_{-1}`` share a
   column space share their keys: ``kv_groups_``.

Queries: ``d`` (V), the circle (as the layer learner), ``H [(m + 1)(k + 2 r) + d (r + 1)]``
for the isolated heads (plus the pilots asked again, ``n_requeried_``) and ``2 H (H - 1) r``
for the missing directions, plus the check (:func:`rotary_layer_probe_count`). The sketch
matches the dense measurement of ``Y1`` (``H (m + 1)(d + r)`` probes) in precision: the
worst functional error of 32 random layers (d = 48 and 64, 2 to 8 heads, bases 1e4 and 1e6)
at 1,024 tokens was 9e-10 with either. Biases are not supported
(``fit_bias=False``; Llama and Mistral have none).
"""

from __future__ import annotations

import inspect
from numbers import Integral
from typing import NamedTuple

import numpy as np

from ...errors import AssumptionViolation
from ...models import RotaryAttentionHead, rotate_half
from .._base import DEFAULT_VERIFY, check_oracle
from .._params import Interval
from .._probes import read_head_constants
from .._registry import LearnerSpec
from ..rotary import FREQ_TOL, RotaryValueQueryLearner, _first_tokens, _RotaryProber
from ._route import (
    LAYER_PARAMS,
    LayerRoute,
    check_kv_heads,
    fitted_attributes,
    layer_shape,
    set_init_params,
)
from ._state import _Head, _Layer

__all__ = ["RotaryLayerLearner", "fit_rotary_layer", "predict_rotary_layer", "is_rotary_fit",
           "rotary_layer_probe_count", "ROTARY_STAGES", "ROTARY_VERIFY_LENGTHS"]

#: the stages ``n_queries_by_stage_`` counts with ``positions="rotary"``
ROTARY_STAGES = ("v_sum", "circle", "isolated", "missing", "verify")
#: sequence lengths of the check queries
ROTARY_VERIFY_LENGTHS = (2, 3, 64, 1024)
#: extra random last tokens of the right sketch of each isolated head (at least)
SKETCH_OVERSAMPLE = 8
#: two heads share their keys when the column spaces of their forms differ by less than this
GROUP_TOL = 1e-6


def rotary_layer_probe_count(d: int, n_heads: int, rank: int, oversample: int = 2) -> int:
    """Queries outside the circle scan and the check, when no probe is asked twice:
    ``d + H [(m + 1)(k + 2 r) + d (r + 1)] + 2 H (H - 1) r`` with ``m = d - H + 1`` and
    ``k = min(m, r + max(8, oversample))``."""
    H, r = int(n_heads), int(rank)
    m = d - H + 1
    k = min(m, d, r + max(SKETCH_OVERSAMPLE, int(oversample)))
    return int(d + H * ((m + 1) * (k + 2 * r) + d * (r + 1)) + 2 * H * (H - 1) * r)


class _LayerProber(_RotaryProber):
    """The rotary learner's probes with first token ``s b + c u`` (last tokens ``s b``), whose
    answer is ``s b^T V + alpha c u^T V`` when u lies in an isolated head's ``Delta_g``."""

    def _ask(self, first, last, c, s, n_last):
        n, d = first.shape
        X = np.empty((n, 1 + n_last, d))
        X[:, 1:, :] = (s[:, None] * last)[:, None, :]
        X[:, 0, :] = c[:, None] * first + X[:, 1, :]
        y = self.oracle(X) - self.beta - s * (last @ self.v)
        alpha = y / (c * (first @ self.v))
        ok = (alpha > 0) & (alpha < 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(ok, alpha, 0.5)
            return np.where(ok, np.log(a) - np.log1p(-a), np.nan)


class RotaryLayer(NamedTuple):
    """A rotary layer from its measured parts, under the fitted attributes' names."""

    heads_: list
    v_: list
    offset_: float
    frequencies_: np.ndarray
    rotary_dim_: int
    n_heads_: int
    rank_: int
    kv_groups_: np.ndarray
    n_kv_heads_: int


class _Isolated(NamedTuple):
    """One head isolated (module docstring, step 2)."""

    B: np.ndarray  # (d, m) orthonormal basis of Delta_g
    Y1: np.ndarray  # B^T M_(-1), rank r
    Vt: np.ndarray  # (r, d) its row space
    Q: np.ndarray  # the head's queries, up to the rotary gauge
    freq: np.ndarray
    rotary_dim: int


class RotaryLayerLearner(LayerRoute):
    """Recover a whole rotary attention layer with grouped-query attention, without biases,
    up to a permutation of its heads: the rotary route of
    :class:`~attnquery.learners.AttentionLayerLearner` (``positions="rotary"``; module
    docstring).

    Parameters
    ----------
    n_kv_heads : int, optional
        Number G of key/value heads: the heads found sharing keys must form that many groups.
        None: not checked.
    n_heads, rank, n_grid, max_planes, oversample, rtol, verify, max_logit, min_logit,
    initial_logit_scale, block_bytes, random_state
        As :class:`~attnquery.learners.AttentionLayerLearner`'s. The check asks
        :data:`ROTARY_VERIFY_LENGTHS`, without prefix-permuted copies.

    Attributes
    ----------
    heads_ : list of RotaryAttentionHead
    v_ : list of ndarray (d,)
    offset_ : float
        0.
    frequencies_ : ndarray
        The rotary frequencies (the same for every head).
    rotary_dim_ : int
    n_heads_, rank_ : int
    kv_groups_ : ndarray of int
        The key/value group of each head (heads whose forms share a column space).
    n_kv_heads_ : int
    n_queries_, n_queries_by_stage_, n_requeried_, scan_, verify_error_, n_verify_queries_
        As :class:`~attnquery.learners.AttentionLayerLearner`'s
        (``n_queries_by_stage_``: :data:`ROTARY_STAGES`).
    """

    _parameter_constraints = {
        **LAYER_PARAMS,
        "n_kv_heads": [Interval(Integral, 1, None, closed="left"), None],
    }
    spec = LearnerSpec(
        name="layer_rotary", oracle="value", returns="layer", stages=ROTARY_STAGES,
        description="the layer learner's rotary route (AttentionLayerLearner with "
        "positions='rotary'): rotary positions, grouped-query attention, no biases",
        label="rotary attention layer", command_line=False)

    def __init__(self, *, n_heads: int, rank: int | None = None, n_grid: int = 720,
                 max_planes: int = 6, oversample: int = 2, rtol: float = 1e-8,
                 verify: int = DEFAULT_VERIFY, max_logit: float = 10.0,
                 min_logit: float = 1e-5, initial_logit_scale: float = 1.0,
                 block_bytes: int = 16 * 2**20, n_kv_heads: int | None = None,
                 random_state=None):
        set_init_params(self, locals())

    def _validate_extra(self):
        super()._validate_extra()
        check_kv_heads(self.n_heads, self.n_kv_heads)

    def fit(self, oracle):
        """Recover the rotary layer behind ``oracle`` (module docstring); returns self.

        Raises
        ------
        SearchLimitError
            If no circle of the scan separates all the heads (a value or output bias, too).
        AssumptionViolation
            If the answers contradict a rotary layer (the heads' frequencies differ, a form
            of rank below r), or the heads share keys in other than ``n_kv_heads`` groups.
        ModelMismatchError
            If the assembled layer disagrees with fresh random queries beyond ``rtol``.
        """
        self._validate_params()
        d = check_oracle(oracle)
        H, r = layer_shape(self, d)
        r_scan, r_probe, r_verify = self._rng().spawn(3)
        with self._open_ledger(oracle, ROTARY_STAGES, what="the rotary layer") as ledger:
            ledger.need(d, "reading V", reserved=True)
            with ledger.stage("v_sum"):
                V = read_head_constants(ledger, d, bias=False, key_bias=False).v
            run = _Layer(ledger, V, 0.0)
            scan = self._scan(run, H, r_scan)
            self.scan_ = scan.info
            with ledger.stage("isolated"):
                iso = [_isolated(self, run, scan.vs, g, r, r_probe) for g in range(H)]
            with ledger.stage("missing"):
                M1 = _missing_directions(self, run, scan.vs, iso)
            vars(self).update(_rotary_heads(scan.vs, iso, M1, H, r)._asdict())
            if self.n_kv_heads is not None and self.n_kv_heads_ != self.n_kv_heads:
                raise AssumptionViolation(f"the heads share keys in {self.n_kv_heads_} groups, "
                                          f"not n_kv_heads={self.n_kv_heads}")
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, r_verify, rtol=self.rtol,
                                 what=f"a rotary attention layer of {H} heads of rank {r}",
                                 lengths=ROTARY_VERIFY_LENGTHS, permuted=False)
            self.n_requeried_ = int(ledger.n_requeried)
            self.n_queries_ = ledger.total
        return self

    def predict(self, X) -> np.ndarray:
        """The sum of the recovered rotary heads on inputs X (B, N, d)."""
        return predict_rotary_layer(self, X)


def fit_rotary_layer(est, oracle, d: int, H: int, r: int) -> None:
    """Fit :class:`RotaryLayerLearner` with the parameters of ``est`` (a layer learner with
    ``positions="rotary"``) on ``oracle`` and give ``est`` its fitted attributes (also those
    set when it raised). Kept with the former entry point's signature: ``d``, ``H`` and ``r``
    are read again from the oracle and ``est``. :class:`~attnquery.learners.
    AttentionLayerLearner` fits the route itself."""
    names = inspect.signature(RotaryLayerLearner.__init__).parameters
    route = RotaryLayerLearner(**{k: v for k, v in est.get_params().items() if k in names})
    try:
        route.fit(oracle)
    finally:
        vars(est).update(fitted_attributes(route))


def is_rotary_fit(est) -> bool:
    """Whether ``est`` holds a fitted rotary layer (its ``heads_`` are rotary heads)."""
    heads = getattr(est, "heads_", None)
    return isinstance(heads, list) and bool(heads) and isinstance(heads[0], RotaryAttentionHead)


def predict_rotary_layer(est, X) -> np.ndarray:
    """The sum of the recovered rotary heads on inputs X (B, N, d)."""
    return sum(h(X) for h in est.heads_) + est.offset_


def _coords(t: np.ndarray) -> np.ndarray:
    """``B^T y`` from the values ``u_l^T y`` of the probe directions ``u_0 = b_0``,
    ``u_l = b_l + b_0`` (rows of t: one per direction)."""
    out = t.copy()
    out[1:] -= t[0]
    return out


def _isolated(est, run, vs, g: int, r: int, rng) -> _Isolated:
    """Head g isolated (module docstring, step 2): ``Y1 = B^T M_{-1}`` of rank r from a
    two-sided sketch, its SVD, and the rotary factorisation from ``U^T B^T M_{-2} V``."""
    d = run.d
    B = est._probe_basis(vs, g)
    m = B.shape[1]
    pr = _LayerProber(run.ledger, run.V, 0.0, est, d)
    # right sketch: the column space of Y1 (in the coordinates of B) from k random last tokens,
    # with the probe directions u_0 = b_0, u_l = b_l + b_0 (every u^T v_g = |P v_g|)
    U = B.T.copy()
    U[1:] += B[:, 0]
    k = min(m, d, r + max(SKETCH_OVERSAMPLE, int(est.oversample)))
    Bs = rng.standard_normal((k, d))
    Bs /= np.linalg.norm(Bs, axis=1, keepdims=True)
    t, _ = pr.pairs(U, Bs, 1)  # t[i] = U M_{-1} Bs_i
    Uc = np.linalg.svd(_coords(t.T), full_matrices=False)[0][:, :r]  # (m, r)
    # left: r first directions along that column space (|u^T V| bounded below), every
    # coordinate last token: F Y1, whose rows span the row space of Y1
    F, Hm = _first_tokens(Uc, B.T @ run.V, rng)
    A = F @ B.T  # (r, d)
    t1, _ = pr.pairs(A, np.eye(d), 1)  # t1[j] = F Y1 e_j
    S0, Vt = np.linalg.svd(t1.T, full_matrices=False)[1:]  # r combinations of the rows: the
    if not S0[-1] > 1e-9 * S0[0]:  # row space, exact whatever the error of U_c
        raise AssumptionViolation(
            f"head {g}'s form M_(-1), seen along its isolated directions, has rank below {r}: "
            "not a layer of rotary heads of that rank")
    # Y1 V on that row space: Y1 = (Y1 V) V^T, the column space now as exact as the probes
    t3, _ = pr.pairs(U, Vt, 1)
    Us, S, Wt = np.linalg.svd(_coords(t3.T), full_matrices=False)
    Vt = Wt @ Vt  # Y1 = Us S Vt
    t2, _ = pr.pairs(U, Vt, 2)  # t2[i] = U M_{-2} V_i
    T = (Us.T @ _coords(t2.T)) / S[:, None]  # S^{-1} U_s^T Y2 V
    one = RotaryValueQueryLearner()
    one._factor(T, Us, S, Vt)
    run.ledger.n_requeried += int(pr.n_requeried)
    return _Isolated(B, (Us * S) @ Vt, Vt, one.Q_, one.frequencies_, int(one.rotary_dim_))


def _missing_directions(est, run, vs, iso) -> list[np.ndarray]:
    """Every head's full ``M^g_{-1}`` (d x d, rank r): its rows along ``Delta_g`` from the
    isolated head, the H - 1 missing rows ``nu_j^T M^g_{-1}`` measured (module docstring)."""
    H = vs.shape[0]
    nu = np.linalg.pinv(vs).T  # (H, d): nu_j^T v_h = [j = h]
    perp = np.linalg.svd(vs)[2][H:].T  # (d, d - H): orthogonal to every v
    heads = [_Head(h.B, h.Y1 @ h.Vt.T, h.Vt.T, np.zeros(h.B.shape[1])) for h in iso]
    silent = (perp, [perp.T @ h.B for h in iso])
    # last tokens of norm eps: the constants k(x) ~ eps^2 |M| stay about 1 or less
    eps = min(1.0, 1.0 / np.sqrt(max(np.linalg.norm(h.Y1, 2) for h in iso)))
    out = []
    for g in range(H):
        Qo = iso[g].Vt.T  # (d, r) orthonormal basis of the row space
        rows = [heads[g].L]  # B_g^T M Qo
        for j in range(H):
            if j != g:
                rho, _ = est._missing(run, nu, heads, silent, g, j, eps * Qo, False)
                rows.append(rho[None, :] / eps)
        others = [j for j in range(H) if j != g]
        Tm = np.concatenate([iso[g].B, nu[others].T], axis=1)  # (d, d)
        MQ = np.linalg.solve(Tm.T, np.concatenate(rows))  # M Qo (d, r)
        out.append(MQ @ Qo.T)
    return out


def _rotary_heads(vs, iso, M1, H: int, r: int) -> RotaryLayer:
    """The heads ``K_h^T Rot Q_h`` from ``M^h_{-1}`` and the isolated factorisation, the
    frequencies (the same for every head), and the heads that share their keys."""
    freqs = [h.freq for h in iso]
    if any(f.size != freqs[0].size or (f.size and np.max(np.abs(f - freqs[0])) > FREQ_TOL)
           for f in freqs):
        raise AssumptionViolation("the heads' frequencies differ: not one rotary layer")
    heads = []
    for g in range(H):
        Q, theta = iso[g].Q, iso[g].freq
        KT = M1[g] @ np.linalg.pinv(Q)  # (d, r): K^T D, as M_{-1} = K^T D Q
        K = rotate_half(KT, np.full(KT.shape[0], 1.0), theta).T
        heads.append(RotaryAttentionHead(Q, K, vs[g], frequencies=theta, scale=1.0))
    groups = _groups(M1, r)
    return RotaryLayer(heads_=heads, v_=[v.copy() for v in vs], offset_=0.0,
                       frequencies_=freqs[0], rotary_dim_=int(iso[0].rotary_dim), n_heads_=H,
                       rank_=r, kv_groups_=groups, n_kv_heads_=int(groups.max()) + 1)


def _groups(M1, r: int) -> np.ndarray:
    """Group index per head: heads whose forms have the same column space (their keys)."""
    P = [np.linalg.svd(M, full_matrices=False)[0][:, :r] for M in M1]
    groups = -np.ones(len(P), dtype=int)
    n = 0
    for h in range(len(P)):
        if groups[h] >= 0:
            continue
        for k in range(h, len(P)):
            if groups[k] < 0 and np.linalg.norm(P[h] - P[k] @ (P[k].T @ P[h]), 2) < GROUP_TOL:
                groups[k] = n
        n += 1
    return groups
