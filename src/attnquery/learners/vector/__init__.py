"""Extraction from vector answers: an attention head from every token's output vector.

Beyond the paper, whose oracle answers one number per sequence. A served attention module
answers an output vector per token (:class:`attnquery.oracles.VectorOracle`); then a single head

    out_n = sum_i a_{n,i} x_i^T V + beta,   a_n = softmax_i(x_i^T (W x_n + c))

is read in two steps. One-token queries answer ``x^T V + beta``: ``V`` and ``beta`` from d + 1 of
them (one batch). A query of N <= rank(V) + 1 tokens then gives the head's whole attention
matrix, ``A = [O - beta, 1] [X V, 1]^+`` (the weights of a row sum to one), and every row n
gives N - 1 logit differences ``log a_{n,k} - log a_{n,j} = (x_k - x_j)^T (W x_n + c)``, linear in
``(W, c)``: N (N - 1) equations per query when every token's output is answered, N - 1 when the
last token's is, half as many for a causal head. (W, c) is their least-squares solution, each
equation weighted by its attention weights (a weight's absolute error becomes a logit's error
divided by the weight).

A layer of H heads that fill d (``H dh = d``, the summed value map of rank d) first splits the
one-token queries' ``V_sum = sum_h V_h`` into the heads' maps (:mod:`._split`); a row of
a query of N tokens then holds ``H N`` weights against ``d_out`` numbers and H sums to one, so
with ``H N <= d_out`` every query gives every head's attention matrix at once, and each head's
``(W_h, c_h)`` is solved as a single head's. Heads whose (W, c) has more than
:data:`DENSE_UNKNOWNS` unknowns are read, from every token's outputs without a causal mask, by
the shared-token route (:mod:`._heads`), which uses W_h's rank instead of a least
squares of d (d + 1) unknowns (a MiniLM-shaped layer: d = 384, 12 heads of 32).

The package holds :class:`VectorLayerLearner` (here) and every route it picks:
:mod:`.served` (:class:`~attnquery.learners.vector.served.ServedVectorLearner`, answers in a
served format), :mod:`.rotary` (one rotary head), :mod:`.rotary_layer` (a layer of rotary
heads), the float64 route (:mod:`._layer`) and the modules they share (:mod:`._split` and
:mod:`._parts`, :mod:`._heads`, :mod:`._refine`, :mod:`._answers`, :mod:`._attention`,
:mod:`._check`, :mod:`._rotary_reads`, :mod:`._rotary_last`).
"""

from __future__ import annotations

import numbers

import numpy as np

from ...errors import ConfigError
from .._base import CHECK_LENGTH, DEFAULT_VERIFY
from .._params import Interval, Options
from .._registry import LearnerSpec
from ._check import CHECK_LENGTHS, VERIFY_RTOL
from ._layer import (
    DENSE_MAX_UNKNOWNS,
    DENSE_UNKNOWNS,
    MAX_RESCALE,
    OVERSAMPLE,
    PILOT_SHARE,
    POSITIONS,
    SHARED_FILL,
    STAGES,
    TARGET_SPREAD,
    VectorLayerRoute,
)
from ._normed import NORMS

#: the values of ``route``
ROUTES = ("auto", "float64", "served", "rotary")

__all__ = ["VectorLayerLearner", "ROUTES", "STAGES", "POSITIONS", "CHECK_LENGTHS", "VERIFY_RTOL",
           "OVERSAMPLE", "PILOT_SHARE", "TARGET_SPREAD", "MAX_RESCALE", "DENSE_UNKNOWNS",
           "SHARED_FILL", "DENSE_MAX_UNKNOWNS"]


class VectorLayerLearner(VectorLayerRoute):
    """Recover an attention head from a :class:`~attnquery.oracles.VectorOracle`.

    Works for a single head (``n_heads`` None or 1) and for layers of heads that fill d, without
    positions, with or without biases and a causal mask, from every token's outputs or the last
    token's (the oracle's ``outputs``). See the module's docstring for the method and
    ``docs/vector.md`` for measured query counts and errors. Answers in a narrow format
    (float32, float16, bfloat16, read from the first one-token answers) are handed to the
    served route, :class:`~attnquery.learners.vector.served.ServedVectorLearner` (``served_``;
    None for float64 answers), whose fitted attributes become this learner's.

    Parameters
    ----------
    n_heads : int, optional
        Number H of heads of the box (default None: one). With H > 1 the heads must fill d
        (H dividing d, the summed value map of rank d).
    n_kv_heads : int, optional
        Number of key/value heads (dividing ``n_heads``); None or equal to ``n_heads`` but
        with ``positions="rotary"``.
    causal : bool
        Token n attends to tokens i <= n only (a decoder's mask).
    positions : {"none", "rotary"}
        Position model. ``"rotary"`` fits one rotary head (RoPE of base ``rope_base`` over the
        whole head, biases as Qwen2 has) by :class:`~attnquery.learners.vector.rotary.
        RotaryVectorLearner`, whose fitted attributes (``frequencies_``, ``cos_forms_``,
        ``sin_forms_``, ``const_form_``, ``V_``, ``output_bias_``) this learner takes, and
        ``rotary_`` the fitted route. Layers of several rotary heads (``n_heads`` > 1, or
        ``n_kv_heads`` given: grouped-query attention) go to :class:`~attnquery.learners.
        vector.rotary_layer.RotaryLayerVectorLearner` (every token's outputs or the last
        token's, heads whose output subspaces fill d_out), whose fitted attributes (``V_``,
        ``head_groups_``, ``query_bases_``, ``key_bases_``, the forms per head) this learner
        takes likewise. The rotary routes read their forms at every offset the check asks (up
        to ``check_length - 1``) and plan their queries before the first.
    rope_base : float, optional
        Base of the rotary frequencies ``rope_base^(-2j/dh)`` with ``positions="rotary"``
        (10000 in Llama 2 and Qwen2 0.5B's config family, 1e5 in SmolLM2, 1e6 in later Qwen2);
        given without rotary positions it is refused (ConfigError). None (the default): a
        layer from every token's outputs has its base measured from the form queries' answers
        (``rope_base_``, ``base_residual_``; no query of its own; a box whose frequencies are of
        no base is refused by name); the other rotary routes (one head, the last token's
        outputs) assume 10000 and their check refuses a box of another base.
    fit_bias : bool
        Fit the key bias c and the output offset beta (default True); False assumes both 0 and
        saves one query and d unknowns. The rotary routes read the biases as part of their
        forms and ask the same queries either way: with False the biases read must be noise
        (else ModelMismatchError naming their size) and are returned as exactly 0.
    input_norm : {None, "rms"}
        None (default): the box is the attention module. "rms": it reads its inputs through an
        RMS norm of unknown gain and eps (a decoder layer's ``input_layernorm``), read by the
        rotary layer route without saturating a head (``positions="rotary"``, every token's
        outputs; see :class:`~attnquery.learners.vector.rotary_layer.
        RotaryLayerVectorLearner`): ``norm_eps_`` is the measured eps and the gain is folded
        into the fitted maps.
    residual : bool
        The box adds each token's input to its output (``x + attn(RMSNorm(x))``, the attention
        half of a decoder layer; ``positions="rotary"``): subtracted from the answers and added
        back by ``predict``.
    n_attention_queries : int, optional
        Queries of the attention stage (the float64 and served routes); default
        ``OVERSAMPLE`` times the unknowns of (W, c) divided by the logit differences a query
        gives (and at least d + 1 for last-token answers; the served route
        ``SERVED_OVERSAMPLE`` times that). On the shared-token route, the most that stage may
        ask (it adds groups of queries until the heads' row spaces stop growing). Too few for
        the unknowns: ConfigError before any query. The rotary routes plan their own stages
        (given with ``positions="rotary"``: ConfigError).
    n_queries : int, optional
        The most queries the whole fit asks, its check's included (default None: no cap), on
        every route. The fit plans its queries before the first (the float64 route: exactly;
        the rotary routes: exactly; the shared-token and served routes: their least), so a
        cap below the plan is refused then (BudgetExceededError or ConfigError naming it);
        no batch beyond it is asked.
    route : {"auto", "float64", "served", "rotary"}
        The route the fit takes (``route_`` says which ran). "auto" (default): "rotary" with
        ``positions="rotary"``; else the float64 route, which hands answers in a narrow
        format (read from its first one-token answers) to the served route. "float64": the
        float64 route only (answers in a narrow format are read as float64 ones, and its check
        refuses them). "served": the served route from the first query
        (:class:`~attnquery.learners.vector.served.ServedVectorLearner`, as "auto" hands it
        over, without the float64 route's one-token queries first). "rotary": the rotary
        routes, with ``positions="rotary"``. A route that does not apply to ``positions`` is a
        ConfigError naming it, before any query.
    verify : int
        Fresh check queries after the fit (default 8: one of each of 1, 2, 3, 8, 64, 256,
        1024 and ``check_length`` tokens, :data:`CHECK_LENGTHS`; more are spread over these
        lengths, fewer take the shortest, the longest and evenly spaced ones between); 0 turns
        the check off.
    check_length : int
        Tokens of the longest check query (default
        :data:`~attnquery.learners._base.CHECK_LENGTH`, 4096; the lengths of
        :data:`CHECK_LENGTHS` not below it are dropped), on every route (the served and
        rotary ones included; the rotary forms are read up to offset ``check_length - 1``). A
        box that is such a layer on every input of up to ``check_length`` tokens, such as a
        wider sliding window, passes.
    random_state : int, Generator or None
        Seed of the query tokens.

    Attributes
    ----------
    W_ : ndarray (H, d, d)
        Per head: the logit of key x_k for query x_q is ``x_k^T W_h x_q + x_k^T c_h`` plus terms
        constant in k.
    key_bias_ : ndarray (H, d)
        Per head c_h (zeros without ``fit_bias``).
    V_ : ndarray (H, d, d_out)
        Per head the value-output map (the heads in the order the split found them).
    output_bias_ : ndarray (d_out,)
        beta, added to every output (zeros without ``fit_bias``).
    head_groups_ : ndarray (H,)
        The key/value head each head reads.
    frequencies_ : ndarray (0,)
        Rotary frequencies (none without positions).
    outputs_ : str
        The oracle's ``outputs``; :meth:`predict` answers in its shape.
    rank_ : int
        Numerical rank of the summed value map.
    tokens_per_query_ : int
        N, the length of the attention stage's queries.
    token_scale_ : float
        The factor on the attention stage's tokens after the pilot (below 1 for a peaked
        head, above 1 for a flat one).
    attention_residual_ : float
        Largest disagreement of the attention stage's answers with the attention matrices
        read from them, relative to the largest answer.
    logit_residual_ : float
        Largest weighted residual of the logit equations, relative to their largest right-hand
        side.
    route_ : str
        The route that ran: ``"float64"``, ``"served"`` or ``"rotary"`` (see ``route``).
    attention_route_ : str
        The float64 and served routes: how (W, c) was read, ``"dense"`` (one least squares of
        d (d + 1) unknowns per head) or ``"shared"`` (the shared-token route, :mod:`._heads`).
    head_ranks_ : ndarray (H,)
        Rank of each head's W (measured by the shared-token route; of the estimate on the
        dense one).
    n_groups_ : int
        Groups of shared-token queries (0 on the dense route).
    refine_iterations_ : int
        Shared-token route: conjugate-gradient iterations of the refinements of every head's
        (W, c) under rounding (served answers; 0 for float64 answers, which need none): the
        weighted least squares over every row of the groups' attention matrices
        (:mod:`._refine`), then the Gauss-Newton step on the groups' answers
        (:mod:`._answers`).
    n_queries_, n_tokens_ : int
        Queries and tokens the fit asked, the check included.
    n_queries_by_stage_ : dict
        Queries per stage (:data:`STAGES`).
    verify_error_ : float
        ``max |O - O_hat| / max |O|`` on the check queries (NaN with ``verify=0``).
    n_verify_queries_ : int
        Check queries asked (``verify``).
    """

    spec = LearnerSpec(
        name="vector", oracle="vector", returns="vector layer", stages=STAGES, fits_bias=True,
        description="vector answers, every token's output or the last token's (beyond the "
        "paper; --answers all|last, --param n_heads=H for a layer of heads that fill d, "
        "--param positions=rotary for a rotary head or a rotary GQA layer)",
        label="vector answers")

    def __init__(self, *, n_heads=None, n_kv_heads=None, causal=False, positions="none",
                 rope_base=None, fit_bias=True, n_attention_queries=None, n_queries=None,
                 verify=DEFAULT_VERIFY, check_length=CHECK_LENGTH, route="auto",
                 input_norm=None, residual=False, random_state=None):
        super().__init__(n_heads=n_heads, n_kv_heads=n_kv_heads, causal=causal,
                         positions=positions, fit_bias=fit_bias,
                         n_attention_queries=n_attention_queries, n_queries=n_queries,
                         verify=verify, check_length=check_length, random_state=random_state)
        self.rope_base = rope_base
        self.route = route
        self.input_norm = input_norm
        self.residual = residual

    _parameter_constraints = {**VectorLayerRoute._parameter_constraints,
                              "rope_base": [Interval(numbers.Real, 1, None, closed="neither"),
                                            None],
                              "route": [Options(ROUTES)],
                              "input_norm": [Options(NORMS)],
                              "residual": ["boolean"]}

    def _validate_extra(self) -> None:
        super()._validate_extra()
        if self.rope_base is not None and self.positions != "rotary":
            raise ConfigError(f"rope_base={self.rope_base!r} applies to positions='rotary' only "
                              f"(positions={self.positions!r})")
        rotary = self.positions == "rotary"
        if self.route != "auto" and (self.route == "rotary") != rotary:
            raise ConfigError(f"route={self.route!r} does not apply with positions="
                              f"{self.positions!r}: the rotary route reads positions='rotary' "
                              "heads, the float64 and served routes positions='none' ones")
        if (self.input_norm is not None or self.residual) and not rotary:
            raise ConfigError(
                f"input_norm={self.input_norm!r} and residual={self.residual!r} apply to "
                "positions='rotary' layers (the rotary layer route reads them; the float64 and "
                "served routes saturate heads, which no token does through a norm)")
        if rotary and self.n_attention_queries is not None:
            raise ConfigError(f"n_attention_queries={self.n_attention_queries!r} applies to the "
                              "float64 and served routes only: the rotary routes plan their "
                              "own stages (n_queries caps the whole fit)")

    def fit(self, oracle):
        """Recover the head behind ``oracle``; returns self.

        Raises
        ------
        ConfigError
            A bad parameter, an oracle that is not a vector oracle, ``n_queries`` too few
            for the unknowns, or heads beyond the dense least squares (more than
            :data:`DENSE_MAX_UNKNOWNS` unknowns) from the last token's outputs or with a
            causal mask (before any query).
        NotIdentifiableError
            V = 0: every answer is the offset, so W is not identifiable; or, with H > 1, heads
            that do not fill d.
        ModelMismatchError
            The answers are not those of the layer the parameters describe (another number of
            heads, a causal mask where none was declared or the reverse, soft-capped logits,
            positions): the split's lines cross another number of heads, the answers are no
            attention-weighted sums of the heads' value maps, or the fresh check queries (1 to
            4096 tokens) disagree with the estimate by more than :data:`VERIFY_RTOL` (the
            served route: multiples of the answers' format's floor, and noise beyond it).
        """
        self._validate_params()
        if self.route == "served":
            return self._fit_served(oracle)
        if self.positions != "rotary":  # the float64 route, or the served one
            try:
                return super().fit(oracle)
            finally:
                self.route_ = "float64" if getattr(self, "served_", None) is None else "served"
        self.route_ = "rotary"
        from .rotary import RotaryVectorLearner  # routes of their own: rotary forms
        from .rotary_layer import RotaryLayerVectorLearner

        H = self.n_heads or 1
        normed = self.input_norm is not None or bool(self.residual)
        layer = normed or not (H == 1 and (self.n_kv_heads or 1) == 1)
        measured = layer and getattr(oracle, "outputs", None) == "all"
        base = self.rope_base if self.rope_base is not None or measured else 10000.0
        shared = dict(causal=self.causal, rope_base=base, verify=self.verify,
                      check_length=self.check_length,
                      fit_bias=self.fit_bias, n_queries=self.n_queries,
                      random_state=self.random_state)
        route = (RotaryLayerVectorLearner(n_heads=H, n_kv_heads=self.n_kv_heads,
                                          input_norm=self.input_norm,
                                          residual=bool(self.residual), **shared)
                 if layer else RotaryVectorLearner(**shared))
        self.rotary_ = route.fit(oracle)
        for k, v in vars(self.rotary_).items():
            if k.endswith("_"):
                setattr(self, k, v)
        return self

    def _served_route(self):
        """:class:`~attnquery.learners.vector.served.ServedVectorLearner` with this learner's
        parameters (None with ``route="float64"``: that route reads every answer as float64)."""
        if self.route == "float64":
            return None
        from .served import ServedVectorLearner

        params = self.get_params()
        params.pop("rope_base")  # refused without rotary positions, which have their routes
        params.pop("route")
        params.pop("input_norm")  # the rotary layer route's (refused here without positions)
        params.pop("residual")
        return ServedVectorLearner(**params)

    def _fit_served(self, oracle):
        """``route="served"``: the served route fitted from the first query; its fitted
        attributes become this learner's (``served_`` the fitted route)."""
        self.rotary_, self.route_ = None, "served"
        served = self._served_route()
        try:
            served.fit(oracle)
        finally:
            for k, v in vars(served).items():
                if k.endswith("_") and not k.startswith("_"):
                    setattr(self, k, v)
            self.served_, self.route_ = served, "served"
        return self

    def predict(self, X) -> np.ndarray:
        """The recovered layer's outputs on X (B, N, d), in the oracle's shape: (B, N, d_out)
        for every token's outputs, (B, d_out) for the last token's."""
        return super().predict(X)
