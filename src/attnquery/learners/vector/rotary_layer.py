"""Extraction from vector answers: a layer of rotary heads (RoPE, biases, causal mask, GQA).

Beyond the paper. A Qwen2-style layer has H query heads over G key/value heads; head h (of
kv head g) has, for key x_i at position i and query x_n at position n, with ``y = [x; 1]``,
the logit ``(Q_h y_n)^T R_(i-n) (K_g y_i)`` (``Q_h = [W_Q, b_Q]`` scaled, ``K_g = [W_K, b_K]``,
R the rotation of RoPE) and the layer answers every token's ``sum_h sum_i a_hni x_i^T V_h +
beta``. Every token's outputs (``outputs="all"``) are read in five stages (the last token's,
``outputs="last"``, in the same five, stages 3 and 4 from the last row alone:
:mod:`._rotary_last`):

1. ``V``: ``V_sum = sum_h V_h`` and beta from d + 1 one-token queries.
2. ``split``: the heads' output subspaces (which fill d_out: ``H dh = d_out``) from saturated
   two-token lines (:func:`~attnquery.learners.vector._split.split_outputs`); V_h is
   ``V_sum`` projected on head h's; heads with the same input space of V_h share a
   key/value head (``head_groups_``). A row of an answer then gives every head's weights on up
   to dh distinct values.
3. ``subspaces``: queries ``[f_1..f_m, r_1..r_k, p_1..p_m']`` with the f and p fixed and the r
   random: the logit difference of two fixed keys in row r_j is linear in ``y(r_j)`` with a
   coefficient in the row space of ``Q_h``, and that of a random key r_i against f_1 in row
   p_j is linear in ``y(r_i)`` with one in the row space of ``K_g``; one least squares over
   the queries per row gives them, and their span the head's query and key bases (dh each).
4. ``forms``: in those bases the logit is ``kappa_i^T M_(i-n) zeta_n`` with
   ``M_delta = sum_j cos(theta_j delta) P_j + sin(theta_j delta) S_j + C`` of (dh + 1)^2
   entries each. ``dh + 5`` probe tokens p are asked as the padding of queries of
   ``min(max_offset, 511) + 1`` tokens holding a few fixed keys (the padding's identical values
   are lumped), and of a few (:func:`long_sets`) of ``max_offset + 1`` tokens (default
   ``check_length``: every offset the check asks): every padding row is a query of token p that
   sees the keys at its own offsets, so one query gives hundreds of rows of equations, linear
   in ``P_j zeta_p``, ``S_j zeta_p`` and ``C zeta_p``. Every probe shares the keys and rows,
   so one least squares serves all and the forms follow by the probes' coordinates'
   pseudo-inverse: the estimate is linear in the query token, exact at every offset asked
   (only the sum of the slowest frequencies' forms is determined there).
5. ``verify``: fresh queries of 1 to ``check_length`` tokens (default 4096).

Every stage's queries but the split's are planned before the first (the split retries a line
where the box's answers call for it, so its count depends on the box): ``n_queries`` or an
oracle budget below the plan is refused before any query, and below what is left after the
split before any further query.

The frequencies are those of the declared ``rope_base`` over the whole head (Qwen2's), or,
with ``rope_base=None`` and every token's outputs, of the base measured from stage 4's answers
(:mod:`._rotary_base`).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ...errors import ConfigError, ModelMismatchError
from ...models import rope_frequencies
from .._base import (
    CHECK_LENGTH,
    DEFAULT_VERIFY,
    BaseLearner,
    check_lengths,
)
from .._params import Interval, Options
from .._registry import LearnerSpec
from ._check import CHECK_LENGTHS, VERIFY_RTOL, vector_oracle, verify_fit  # noqa: F401
from ._normed import EPS_QUERIES, NORMS, NormedInputs, measure_eps
from ._rotary_base import measure_base
from ._rotary_last import last_plan, read_forms_last, read_spaces_last
from ._rotary_reads import (
    ROTARY_PARAMS,
    drop_biases,
    form_offset,
    rotary_basis,  # noqa: F401 (importable from here as before)
    rotary_plan,
    solve_forms,
)
from ._rotary_rows import (  # noqa: F401
    NEAR_ROWS,
    ROW_OVERSAMPLE,
    SPACE_OVERSAMPLE,
    SPACE_VECTORS,
    FormEquationsMixin,
)
from ._spans import spans_queries, split_spans
from ._split import split_outputs

__all__ = ["RotaryLayerVectorLearner", "STAGES"]

#: the stages of a fit, as ``n_queries_by_stage_`` counts them
STAGES = ("V", "split", "subspaces", "forms", "verify")
#: the values of ``split``: "spans" reads the heads from unsaturated weights
#: (:mod:`._spans`), "saturate" from saturated two-token lines (:mod:`._split`)
SPLITS = ("auto", "spans", "saturate")
#: distinct keys of the form stage per unknown key coordinate (dh + 1)
KEY_OVERSAMPLE = 5.0
#: probes of the form stage beyond the dh + 1 coordinates of a query token
EXTRA_PROBES = 4
#: distinct values a row's weights are read on, per dimension of a head's values
SLOT_SHARE = 0.75
#: input spaces of two heads' value maps closer than this share a key/value head
GROUP_TOL = 1e-6
#: longest offset of most form queries (every token's outputs): a query of N tokens costs a box
#: N^2 per head, so only :func:`long_sets` key sets per probe reach ``max_offset``
SHORT_OFFSET = 511


def _slots(r: int) -> int:
    """Distinct values a row's weights are read on: :data:`SLOT_SHARE` of a head's value rank
    r (the weights' systems stay well conditioned)."""
    return max(3, min(r - 1, int(SLOT_SHARE * r)))


def long_sets(e: int, k: int) -> int:
    """Key sets per probe of the form queries that reach ``max_offset`` (every token's
    outputs): their k keys each, one more set than it takes to span the e key coordinates
    (the slowest frequencies' forms are told apart only at the long offsets)."""
    return math.ceil(e / k) + 1


class RotaryLayerVectorLearner(FormEquationsMixin, BaseLearner):
    """Recover a layer of rotary heads (RoPE, biases, grouped-query attention) from a
    :class:`~attnquery.oracles.VectorOracle` answering every token's outputs or the last
    token's.

    See the module's docstring for the method and ``docs/vector.md`` for measured query counts
    and errors.

    Parameters
    ----------
    n_heads : int
        Number H of query heads; their output subspaces must fill d_out (``H dh = d_out``).
    n_kv_heads : int, optional
        Number G of key/value heads (default H); checked against the heads' value maps.
    rope_base : float or None
        Base of the rotary frequencies ``rope_base^(-2j/dh)`` (10000, the default, in Qwen2
        0.5B's config family; 1e6 in later ones; 1e5 in SmolLM2). None: measured from the form
        queries' answers, no query of its own (:mod:`._rotary_base`; every token's outputs
        only); a box whose frequencies are of no base is refused (ModelMismatchError).
    head_dim : int, optional
        dh of the queries and keys (rotated whole); default the rank of a head's value map.
    causal : bool
        Token n attends to tokens i <= n only (a decoder's mask; the same answers from the last
        token's outputs, which see every token either way).
    max_offset : int, optional
        Longest relative offset the form queries ask (their length minus one); default
        ``check_length - 1``. The forms hold at the offsets asked, so a value below
        ``check_length - 1`` is refused (ConfigError): the check never reaches beyond what was
        read.
    verify : int
        Fresh check queries after the fit (default 8), spread over :data:`CHECK_LENGTHS` up
        to ``check_length``; 0 turns the check off.
    check_length : int
        Tokens of the longest check query (default
        :data:`~attnquery.learners._check.CHECK_LENGTH`, 4096).
    fit_bias : bool
        True (the default): read the query/key biases (part of the forms) and beta. False: the
        box has none; the same queries are asked, the biases read must be noise
        (:data:`~._rotary_reads.BIAS_RTOL`, else ModelMismatchError naming their size)
        and the returned ones are exactly 0, checked so on the fresh queries.
    n_queries : int, optional
        The most queries the fit may ask; below its plan (every stage but the saturated
        split's, whose count depends on the box) it is refused (ConfigError) before any query.
    split : {"auto", "spans", "saturate"}
        How the heads' output subspaces are read. "spans" (:mod:`._spans`): from every token's
        outputs, with weights strictly between 0 and 1 (tokens of norm about 1.2 at most), in
        ``2 (2 (2 dh + 16) - 1) + 16`` queries of 64 tokens (:func:`._spans.spans_queries`).
        "saturate" (:mod:`._split`): from saturated two-token lines (key differences
        multiplied by 1e10 to 1e16), from every token's outputs or the last token's. "auto"
        (default): "spans" from every token's outputs, "saturate" from the last token's.
    input_norm : {None, "rms"}
        None (default): the box is the attention module. "rms": the box reads its inputs
        through an RMS norm, ``g * x / sqrt(mean(x^2) + eps)`` with the gain g and eps unknown
        (a decoder layer's ``input_layernorm``): eps is measured from 4 one-token queries
        (``norm_eps_``), every query reaches the attention through the norm (no token is
        scaled beyond it), and the gain is folded into the fitted forms and value maps (only
        their products with it are identifiable). Every token's outputs only, with
        ``split="spans"`` (or "auto").
    residual : bool
        The box adds each token's input to its output (the attention half of a decoder layer,
        ``x + attn(RMSNorm(x))`` with ``input_norm="rms"``): subtracted from every answer,
        and added back by :meth:`predict`.
    random_state : int, Generator or None

    Attributes
    ----------
    V_ : ndarray (H, d, d_out)
        Per head the value-output map (heads in the order the split found them).
    output_bias_ : ndarray (d_out,)
    head_groups_ : ndarray (H,)
        The key/value head each head reads (numbered in order of first appearance).
    query_bases_, key_bases_ : ndarray (H, dh, d)
        Orthonormal bases of each head's query and key row spaces (``zeta = [Bq x; 1]``,
        ``kappa = [Bk x; 1]``).
    frequencies_ : ndarray (dh/2,)
    rope_base_ : float
        The base of ``frequencies_``: ``rope_base``, or the measured one.
    base_residual_ : float or None
        With ``rope_base=None``, the relative residual the measured base leaves in the form
        equations (float64 answers: about 1e-12 to 1e-10); else None.
    cos_forms_, sin_forms_ : ndarray (H, dh/2, dh+1, dh+1)
        P_j and S_j per head, in the bases' coordinates (:meth:`M` gives the full form).
    const_form_ : ndarray (H, dh+1, dh+1)
        C (up to terms the softmax cancels).
    forms_rank_ : ndarray (H,)
        Numerical rank of each head's form equations.
    split_ : str
        The split that ran, ``"spans"`` or ``"saturate"`` (None with one head).
    norm_eps_ : float or None
        With ``input_norm="rms"``, the norm's eps as measured; else None.
    norm_scale_ : float
        The folded tokens' scale: the fitted forms and value maps read
        ``x / sqrt(mean(x^2) + norm_eps_) / norm_scale_`` (1 without a norm).
    n_queries_, n_tokens_ : int
    n_queries_by_stage_ : dict
    verify_error_ : float
    n_verify_queries_ : int
    """

    def __init__(self, *, n_heads=1, n_kv_heads=None, rope_base=10000.0, head_dim=None,
                 causal=True, max_offset=None, verify=DEFAULT_VERIFY,
                 check_length=CHECK_LENGTH, fit_bias=True, n_queries=None, split="auto",
                 input_norm=None, residual=False, random_state=None):
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.rope_base = rope_base
        self.head_dim = head_dim
        self.causal = causal
        self.max_offset = max_offset
        self.verify = verify
        self.check_length = check_length
        self.fit_bias = fit_bias
        self.n_queries = n_queries
        self.split = split
        self.input_norm = input_norm
        self.residual = residual
        self.random_state = random_state

    _parameter_constraints = {
        **ROTARY_PARAMS,
        "split": [Options(SPLITS)],
        "input_norm": [Options(NORMS)],
        "residual": ["boolean"],
        "n_heads": [Interval(numbers.Integral, 1, None, closed="left")],
        "n_kv_heads": [Interval(numbers.Integral, 1, None, closed="left"), None],
    }
    spec = LearnerSpec(
        name="vector_rotary_layer", oracle="vector", returns="vector layer", stages=STAGES,
        fits_bias=True, command_line=False,
        description="vector answers (every token's or the last token's) of a layer of rotary "
        "heads with biases and grouped-query attention (beyond the paper; declared rope_base)",
        label="rotary layer, vector answers")

    def _validate_extra(self) -> None:
        G = self.n_kv_heads
        if G is not None and self.n_heads % G:
            raise ConfigError(f"n_kv_heads={G} must divide n_heads={self.n_heads}")
        if self.head_dim is not None and self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even (rotated pairs)")
        self._form_offset()

    def _check_base(self, last: bool) -> None:
        """``rope_base=None`` is measured from every token's outputs only (ConfigError before
        any query otherwise)."""
        if self.rope_base is None and last:
            raise ConfigError("rope_base=None (the base measured from the answers) needs every "
                              "token's outputs; from the last token's, give rope_base")
        if self.input_norm is not None and (last or self.split == "saturate"):
            raise ConfigError(
                f"input_norm={self.input_norm!r} is read from every token's outputs with "
                "split='spans' or 'auto' (through the norm no token saturates a head; the "
                "last token's outputs are not read through it yet)"
                + (f"; got split={self.split!r}" if self.split == "saturate" else
                   "; the oracle answers the last token's"))

    def _split_kind(self, last: bool, H: int) -> str | None:
        """The split that runs: None for one head, else ``split`` ("auto": "spans" from every
        token's outputs, "saturate" from the last token's)."""
        if H == 1:
            return None
        if self.split == "auto":
            return "saturate" if last else "spans"
        if self.split == "spans" and last:
            raise ConfigError("split='spans' reads every token's outputs; the oracle answers "
                              "the last token's (use split='saturate' or 'auto')")
        return self.split

    def _form_offset(self) -> int:
        """The longest offset the form queries ask (:func:`~._rotary_reads.
        form_offset`)."""
        return form_offset(self.max_offset, self.check_length)

    def _plan(self, d: int, dh: int, last: bool) -> dict:
        """Queries per stage after the split, for heads of value rank (and query/key
        dimension) dh at d."""
        s = _slots(dh)
        if last:
            spaces, forms = last_plan(d, self.head_dim or dh, s, SPACE_OVERSAMPLE, SPACE_VECTORS,
                                      EXTRA_PROBES)
        else:
            m = max(2, (s - 1) // 2)
            spaces = (math.ceil(SPACE_VECTORS * (self.head_dim or dh) / (m - 1))
                      * math.ceil(SPACE_OVERSAMPLE * (d + 1)))
            e = (self.head_dim or dh) + 1
            n_sets = math.ceil(KEY_OVERSAMPLE * e / (s - 1))
            long = long_sets(e, s - 1) if self._form_offset() > SHORT_OFFSET else 0
            forms = (e + EXTRA_PROBES) * (n_sets + long)
        return {"subspaces": spaces, "forms": forms, "verify": int(self.verify)}

    # -- fit ---------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover the layer behind ``oracle``; returns self.

        Raises
        ------
        ConfigError
            A bad parameter (``max_offset`` below ``check_length - 1``,
            ``n_queries`` below the plan), or an oracle that is not a vector oracle (of every
            token's outputs or the last token's), before any query.
        BudgetExceededError
            An oracle budget below the plan (before any query; the split's queries apart), or
            below what is left to ask after the split.
        NotIdentifiableError
            Heads whose output subspaces do not fill d_out, too peaked heads, or row spaces the
            collected vectors do not determine.
        ModelMismatchError
            The answers are not those of such a layer: another number of heads or of key/value
            heads, a causal mask where none was declared or the reverse, soft-capped logits,
            another base, lower precision than float64 (the split's lines, the attention
            weights' residuals, or the fresh check queries beyond :data:`VERIFY_RTOL`), or with
            ``fit_bias=False`` biases read beyond their noise (before the check).
        """
        self._validate_params()
        d, outputs = vector_oracle(oracle)
        rng = self._rng()
        tokens0 = int(oracle.n_tokens)
        self.outputs_ = outputs
        last = outputs == "last"  # one row per answer: the stages of ._rotary_last
        self._check_base(last)
        H = int(self.n_heads)
        d_out = getattr(oracle, "d_out", None) or d  # the heads' rank, if they fill d_out
        self.split_ = self._split_kind(last, H)
        norm = self.input_norm is not None
        first = {"V": d + 1 + (EPS_QUERIES if norm else 0)}
        if self.split_ == "spans":
            first["split"] = spans_queries(d_out, H)
        with self._open_ledger(oracle, STAGES, cap=self.n_queries) as ledger:
            rotary_plan(ledger, self.n_queries, bool(self.fit_bias),
                        {**first, **self._plan(d, max(d_out // H, 2), last)},
                        exact=self.split_ != "saturate")
            try:
                self._stages(ledger, rng, d, H, last)
            finally:
                self.n_queries_ = ledger.total
                self.n_tokens_ = int(oracle.n_tokens) - tokens0
        return self

    def _stages(self, ledger, rng, d: int, H: int, last: bool) -> None:
        """The fit's stages in order: the value maps, the split into heads, the value subspaces,
        the rotary forms and the check (each counted under its name by ``ledger``)."""
        with ledger.stage("V"):
            eps = (measure_eps(ledger, d, bool(self.residual), rng)
                   if self.input_norm is not None else None)
            box = NormedInputs(ledger, eps, bool(self.residual))
            self.norm_eps_, self.norm_scale_ = eps, float(box.scale)
            X = np.concatenate([np.zeros((1, 1, d)), np.eye(d)[:, None, :]])
            y = np.asarray(box(X), dtype=np.float64)
            y = y if last else y[:, 0]
            V_sum, self.output_bias_ = y[1:] - y[0], y[0]
        with ledger.stage("split"):
            if self.split_ == "spans":
                V, E = split_spans(box, V_sum, self.output_bias_, H, rng)
            elif self.split_ == "saturate":
                V, E = split_outputs(box, V_sum, self.output_bias_, H, rng)
            else:
                V, E = V_sum[None], np.eye(V_sum.shape[1])[None]
        self._heads(V, E)
        rest = self._plan(d, self._values.shape[2], last)
        what = ", ".join(f"{k} {v}" for k, v in rest.items() if v)
        ledger.need(sum(rest.values()), f"the rest of the rotary fit ({what})",
                    reserved=True, refusal=lambda n, spent, cap: ConfigError(
                        f"n_queries={cap}: the split asked {spent} queries and the rest "
                        f"of the fit needs {n} more ({what}); give at least "
                        f"{spent + n}"))
        with ledger.stage("subspaces"):
            if last:
                read_spaces_last(self, box, rng, d, SPACE_OVERSAMPLE, SPACE_VECTORS)
            else:
                self._read_spaces(box, rng, d)
        with ledger.stage("forms"):
            if last:
                read_forms_last(self, box, rng, d, EXTRA_PROBES)
            else:
                self._read_forms(box, rng, d)
        if not self.fit_bias:
            drop_biases(self, self.V_)
        with ledger.stage("verify"):
            self._verify(ledger, rng)

    def _heads(self, V: np.ndarray, E: np.ndarray) -> None:
        """Each head's value coordinates, output reading and key/value head from its value map
        V_h (``V_``, ``head_groups_``)."""
        self.V_ = V
        U, s, Wt = np.linalg.svd(V, full_matrices=False)
        ranks = np.count_nonzero(s > 1e-10 * s[:, :1], axis=1)
        if np.any(ranks != ranks[0]):
            raise ModelMismatchError(
                f"the heads' value maps have ranks {sorted(set(ranks.tolist()))}: the box is not "
                "a layer of equal heads", error=float(np.ptp(ranks)), allowed=0.0)
        r = int(ranks[0])
        self._values = np.einsum("hdo,hro->hdr", V, Wt[:, :r])  # x^T V_h in head coordinates
        self._reads = np.einsum("hoe,hre->hor", E, Wt[:, :r])  # (o - beta) -> head coordinates
        groups, reps = np.zeros(V.shape[0], dtype=int), []
        for h in range(V.shape[0]):
            In = U[h, :, :r]
            near = [g for g, R in enumerate(reps) if np.max(np.abs(In - R @ (R.T @ In)))
                    < GROUP_TOL]
            groups[h] = near[0] if near else len(reps)
            if not near:
                reps.append(In)
        self.head_groups_ = groups
        H = V.shape[0]
        G = H if self.n_kv_heads is None else int(self.n_kv_heads)
        sizes = np.bincount(groups)
        if len(reps) != G or np.any(sizes != H // G):
            raise ModelMismatchError(
                f"the heads' value maps read {len(reps)} key/value heads (groups of "
                f"{sorted(sizes.tolist())} heads) where n_kv_heads={G} was declared: the box "
                "has another number of key/value heads", error=float(len(reps)),
                allowed=float(G))

    def _slots(self) -> int:
        """Distinct values a row's weights are read on (:func:`_slots`)."""
        return _slots(self._values.shape[2])

    def _read_forms(self, oracle, rng, d: int) -> None:
        """The forms in the bases (stage 4 of the module's docstring): the key sets of
        queries of ``min(max_offset, SHORT_OFFSET) + 1`` tokens, and where ``max_offset`` is
        longer :func:`long_sets` more of ``max_offset + 1``, their equations in one least
        squares per head."""
        H, r = self.query_bases_.shape[:2]
        if r % 2:
            raise ModelMismatchError(
                f"the heads' query/key dimension {r} is odd: not rotated pairs",
                error=float(r), allowed=float(r - 1))
        L = self._form_offset()
        k = self._slots() - 1  # keys per query; the padding's lumped weight is the last slot
        e = r + 1
        short = min(L, SHORT_OFFSET)
        if short + 1 < 2 * k:
            raise ConfigError(f"max_offset={L} must reach at least twice the {k} keys of a form "
                              "query")
        probes = rng.standard_normal((e + EXTRA_PROBES, d)) / np.sqrt(d)
        groups = [(short + 1, math.ceil(KEY_OVERSAMPLE * e / k))]
        if L > short:
            groups.append((L + 1, long_sets(e, k)))
        eqs = [self._form_equations(oracle, rng, d, probes, N, n_sets) for N, n_sets in groups]
        if self.rope_base is None:  # measured from these answers (no query of its own)
            self.rope_base_, self.base_residual_ = measure_base(
                [(q[0], q[2], n_sets) for q, (_, n_sets) in zip(eqs, groups, strict=True)],
                r, L)
        else:
            self.rope_base_, self.base_residual_ = float(self.rope_base), None
        self.frequencies_ = rope_frequencies(r, self.rope_base_)
        offsets = np.concatenate([q[0] for q in eqs])
        forms, self.forms_rank_ = [None] * H, np.zeros(H, dtype=int)
        P = probes.shape[0]
        for g in np.unique(self.head_groups_):  # one solve per key/value head: shared keys
            heads = np.flatnonzero(self.head_groups_ == g)
            kappa = np.concatenate([q[1][heads[0]] for q in eqs])
            ell = np.concatenate([np.concatenate([q[2][h] for q in eqs], axis=1)
                                  for h in heads])
            T, rank = solve_forms(kappa, offsets, ell, self.frequencies_)
            for i, h in enumerate(heads):
                zeta = np.concatenate([probes @ self.query_bases_[h].T, np.ones((P, 1))], 1)
                forms[h] = T[..., i * P:(i + 1) * P] @ np.linalg.pinv(zeta.T)
                self.forms_rank_[h] = rank
        F = np.stack(forms)  # (H, nb, e, e)
        j = self.frequencies_.size
        self.cos_forms_, self.sin_forms_, self.const_form_ = F[:, :j], F[:, j:2 * j], F[:, -1]

    def _verify(self, oracle, rng) -> None:
        """``verify`` fresh queries up to ``check_length`` tokens
        (:func:`~attnquery.learners.vector._check.verify_fit`)."""
        verify_fit(self, oracle, rng, int(self.verify),
                   check_lengths(self.check_length, CHECK_LENGTHS),
                   "a layer of rotary heads of the declared base, mask and heads")

    # -- the estimate ------------------------------------------------------------------------------
    def _fitted(self, what: str) -> None:
        if not hasattr(self, "const_form_"):
            raise ConfigError(f"{what} needs a fitted learner; call fit(oracle) first")

    def form_layer(self):
        """The recovered layer as a :class:`~attnquery.models.vector.RotaryFormLayer` (what
        :meth:`predict` and :meth:`M` evaluate; ``attnquery extract`` saves its arrays)."""
        from ...models.vector import RotaryFormLayer

        self._fitted("form_layer()")
        return RotaryFormLayer(self.V_, self.output_bias_, self.frequencies_, self.cos_forms_,
                               self.sin_forms_, self.const_form_, query_bases=self.query_bases_,
                               key_bases=self.key_bases_, head_groups=self.head_groups_,
                               causal=bool(self.causal), outputs=self.outputs_,
                               norm_eps=self.norm_eps_, norm_scale=self.norm_scale_,
                               residual=bool(self.residual))

    def M(self, delta: int, head: int = 0) -> np.ndarray:
        """Head ``head``'s form at relative offset ``delta`` (key position minus query
        position), shape (d+1, d+1): the logit of key x_k for query x_q is
        ``[x_k; 1]^T M [x_q; 1]`` up to terms constant over the keys."""
        return self.form_layer().M(delta, head)

    def predict(self, X) -> np.ndarray:
        """The recovered layer's outputs on X (B, N, d), in the oracle's shape: every token's
        (B, N, d_out) or the last token's (B, d_out)."""
        self._fitted("predict()")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3 or X.shape[2] != self.V_.shape[1]:
            raise ConfigError(f"X must have shape (B, N, {self.V_.shape[1]}); got {X.shape}")
        return self.form_layer()(X)
