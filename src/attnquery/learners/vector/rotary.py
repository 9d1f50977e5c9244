"""Extraction from vector answers: a rotary attention head (RoPE, biases, causal mask).

Beyond the paper. A rotary head with biases (Qwen2) has, for key x_k at position k and query
x_q at position q, with ``y = [x; 1]``, the logit ``y_k^T M_(k-q) y_q`` where

    M_delta = sum_j cos(theta_j delta) P_j + sin(theta_j delta) S_j + C

(the (d+1) x (d+1) bilinear form at relative offset delta; C holds the dimensions rotary
positions leave alone). The learner reads it in three steps, every query answered with the
last token's output (every token's output is accepted; only its last row is used):

1. ``V`` and ``beta`` from d + 1 one-token queries (a token at position 0 attends to itself).
2. d + 1 fixed *probe* tokens p; each is asked as the last token of queries of ``max_offset +
   1`` tokens (default ``check_length``: every offset the check asks) holding d / 2 random keys
   at earlier offsets (drawn with probability about ``1 / offset + 4 / max_offset``) and zeros
   elsewhere. The
   answer gives the keys' attention weights (their values ``x V`` are independent; the zeros'
   weights are lumped), and ``log a_k - log a_p = y_k^T M_(k-q) z_p - z_p^T M_0 z_p``: linear
   in the vectors ``P_j z_p``, ``S_j z_p`` and ``C z_p`` once the frequencies are known (the
   probe's own term is a constant of the probe and is absorbed into ``C``'s last row, a
   uniform shift of every logit of a row that the softmax cancels). Every probe is asked with
   the same keys, so one least-squares factorisation serves all probes.
3. The forms: the probes' solutions times ``[p; 1]^-1``.
4. ``verify``: fresh queries of 1 to ``check_length`` tokens
   (:func:`~attnquery.learners.vector._check.verify_fit`).

The queries of every stage are planned before the first: ``n_queries`` or a budget below the
plan is refused before any query.

The frequencies are those of the declared ``rope_base`` (not found from the answers).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ...errors import ConfigError, NotIdentifiableError
from ...models import rope_frequencies
from .._base import (
    CHECK_LENGTH,
    DEFAULT_VERIFY,
    BaseLearner,
    check_lengths,
    check_oracle,
)
from .._params import Interval
from .._registry import LearnerSpec
from ._attention import ATTENTION_TOL  # noqa: F401 (importable from here as before)
from ._check import CHECK_LENGTHS, VERIFY_RTOL, verify_fit  # noqa: F401 (VERIFY_RTOL: importable from here)
from ._rotary_reads import (
    ROTARY_PARAMS,
    ask_blocks,
    drop_biases,
    form_offset,
    head_weights,
    rotary_basis,
    rotary_plan,
    vanishing,
)

__all__ = ["RotaryVectorLearner", "STAGES"]

#: the stages of a fit, as ``n_queries_by_stage_`` counts them
STAGES = ("V", "forms", "verify")
#: key equations asked per unknown of one probe's least-squares system
OVERSAMPLE = 1.5
#: relative singular value below which the form equations' directions are left out
FORMS_RCOND = 1e-10
#: weights below this are left out of the equations (their logarithm is rounding noise)
MIN_WEIGHT = 1e-12


class RotaryVectorLearner(BaseLearner):
    """Recover a rotary attention head from a :class:`~attnquery.oracles.VectorOracle`.

    One head with rotary positions (RoPE of base ``rope_base`` over ``rotary_dim`` dimensions),
    query/key/value/output biases and a causal mask or none, from the last token's outputs or
    every token's (see the module's docstring and ``docs/vector.md``).

    Parameters
    ----------
    rope_base : float
        Base of the rotary frequencies ``rope_base^(-2j/R)``.
    head_dim : int
        The head dimension dh (R = ``rotary_dim`` or dh).
    rotary_dim : int, optional
        R, the rotated dimensions (even, at most dh); default dh.
    causal : bool
        Token n attends to tokens i <= n only (a decoder's mask).
    max_offset : int, optional
        Largest relative offset the form queries ask (their length minus one); default
        ``check_length - 1``. The forms hold at the offsets asked, so a value below
        ``check_length - 1`` is refused (ConfigError): the check never reaches beyond what was
        read.
    n_key_sets : int, optional
        Key sets of the form stage (each asked with every probe: d + 1 queries); default
        ``OVERSAMPLE`` times the unknowns per probe divided by the d / 2 keys of a query.
    verify : int
        Fresh check queries after the fit (default 8), spread over :data:`CHECK_LENGTHS` up to
        ``check_length``; 0 turns the check off.
    check_length : int
        Tokens of the longest check query (default
        :data:`~attnquery.learners._check.CHECK_LENGTH`, 4096), and of the form queries.
    fit_bias : bool
        True (the default): read the query/key biases (part of the forms) and beta. False: the
        box has none; the same queries are asked, the biases read must be noise
        (:data:`~._rotary_reads.BIAS_RTOL`, else ModelMismatchError naming their size)
        and the returned ones are exactly 0, checked so on the fresh queries.
    n_queries : int, optional
        The most queries the fit may ask; below what it plans (d + 1 + (d + 1) ``n_key_sets``
        + ``verify``) it is refused (ConfigError) before any query.
    random_state : int, Generator or None

    Attributes
    ----------
    frequencies_ : ndarray (R/2,)
    cos_forms_, sin_forms_ : ndarray (R/2, d+1, d+1)
        P_j and S_j.
    const_form_ : ndarray (d+1, d+1)
        C (its last row up to a vector the softmax cancels).
    V_ : ndarray (d, d_out)
    output_bias_ : ndarray (d_out,)
    outputs_ : str
    attention_residual_ : float
    forms_rank_ : int
        Numerical rank of the form equations (below ``(R + 1)(d + 1)`` where the slowest
        frequencies barely turn over ``max_offset``).
    n_queries_, n_tokens_ : int
    n_queries_by_stage_ : dict
    verify_error_ : float
    n_verify_queries_ : int
    """

    def __init__(self, *, rope_base=10000.0, head_dim=None, rotary_dim=None, causal=True,
                 max_offset=None, n_key_sets=None, verify=DEFAULT_VERIFY,
                 check_length=CHECK_LENGTH, fit_bias=True, n_queries=None, random_state=None):
        self.rope_base = rope_base
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.causal = causal
        self.max_offset = max_offset
        self.n_key_sets = n_key_sets
        self.verify = verify
        self.check_length = check_length
        self.fit_bias = fit_bias
        self.n_queries = n_queries
        self.random_state = random_state

    _parameter_constraints = {
        **ROTARY_PARAMS,
        "rotary_dim": [Interval(numbers.Integral, 2, None, closed="left"), None],
        "n_key_sets": [Interval(numbers.Integral, 1, None, closed="left"), None],
    }
    spec = LearnerSpec(
        name="vector_rotary", oracle="vector", returns="vector layer", stages=STAGES,
        fits_bias=True, command_line=False,
        description="vector answers of a rotary head with biases (beyond the paper; declared "
        "rope_base)", label="rotary vector answers")

    def _validate_extra(self) -> None:
        R = self.rotary_dim
        if R is not None and R % 2:
            raise ConfigError(f"rotary_dim={R!r} must be even")
        if R is not None and self.head_dim is not None and R > self.head_dim:
            raise ConfigError(f"rotary_dim={R} exceeds head_dim={self.head_dim}")
        form_offset(self.max_offset, self.check_length)

    # -- fit ---------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover the head behind ``oracle``; returns self.

        Raises
        ------
        ConfigError
            A bad parameter (``max_offset`` below ``check_length - 1``,
            ``n_queries`` below the plan), an oracle that is not a vector oracle, or a token
            dimension below 2 (before any query).
        BudgetExceededError
            An oracle budget below the plan (before any query).
        NotIdentifiableError
            V of rank below d (the keys' weights cannot be told apart), or too few usable
            weights.
        ModelMismatchError
            The answers are no attention-weighted sums of the tokens' values, or the fresh
            check queries (1 to ``check_length`` tokens) disagree with the estimate by more than
            ``VERIFY_RTOL`` (another base, several heads, soft-capping, lower precision), or
            with ``fit_bias=False`` biases read beyond their noise (before the check).
        """
        self._validate_params()
        d = check_oracle(oracle, kinds=("vector",))
        outputs = getattr(oracle, "outputs", None)
        if outputs not in ("all", "last"):
            raise ConfigError(f"the oracle's outputs must be 'all' or 'last'; got {outputs!r}")
        if d < 2:
            raise ConfigError(f"the token dimension must be at least 2; got d = {d}")
        dh = d if self.head_dim is None else int(self.head_dim)
        R = dh if self.rotary_dim is None else int(self.rotary_dim)
        if R > dh:
            raise ConfigError(f"rotary_dim={R} exceeds the head dimension {dh}")
        if self.rope_base is None:
            raise ConfigError("rope_base=None (the base measured from the answers) is read by "
                              "the rotary layer route (RotaryLayerVectorLearner, every token's "
                              "outputs); for one head give rope_base")
        self.frequencies_ = rope_frequencies(R, float(self.rope_base))
        rng = self._rng()
        tokens0 = int(getattr(oracle, "n_tokens", 0))
        self.outputs_ = outputs
        with self._open_ledger(oracle, STAGES, cap=self.n_queries) as ledger:
            rotary_plan(ledger, self.n_queries, bool(self.fit_bias),
                        {"V": d + 1, "forms": (d + 1) * self._key_sets(d),
                         "verify": int(self.verify)})
            try:
                with ledger.stage("V"):
                    self._read_values(ledger, d)
                with ledger.stage("forms"):
                    self._read_forms(ledger, rng, d)
                if not self.fit_bias:
                    drop_biases(self, self.V_)
                with ledger.stage("verify"):
                    self._verify(ledger, rng)
            finally:
                self.n_queries_ = ledger.total
                self.n_tokens_ = int(getattr(oracle, "n_tokens", 0)) - tokens0
        return self

    def _read_values(self, oracle, d: int) -> None:
        X = np.concatenate([np.zeros((1, 1, d)), np.eye(d)[:, None, :]])
        y = np.asarray(oracle(X), dtype=np.float64)
        y = y[:, 0] if y.ndim == 3 else y
        self.output_bias_ = y[0]
        self.V_ = y[1:] - y[0]
        s = np.linalg.svd(self.V_, compute_uv=False)
        if s[-1] <= 1e-10 * s[0]:
            raise NotIdentifiableError(
                f"the value map has rank below d = {d}: the keys' attention weights cannot be "
                "told apart from the answers")

    def _basis(self, delta: np.ndarray) -> np.ndarray:
        """[cos(theta_j delta), sin(theta_j delta), 1] per offset: shape (..., R + 1)."""
        return rotary_basis(delta, self.frequencies_)

    def _key_sets(self, d: int) -> int:
        """Key sets of the form stage (``n_key_sets``, or its default); ConfigError where the
        keys' equations are fewer than a probe's unknowns or ``max_offset`` is below the keys
        of a query."""
        L = form_offset(self.max_offset, self.check_length)
        k = max(1, d // 2)  # keys per query (with the probe and the zeros: k + 2 weights)
        if L < k:
            raise ConfigError(f"max_offset={L} must be at least the {k} keys of a query")
        unknowns = (self.frequencies_.size * 2 + 1) * (d + 1)
        n = self.n_key_sets
        if n is None:
            return math.ceil(OVERSAMPLE * unknowns / k)
        if n * k < unknowns:
            raise ConfigError(f"n_key_sets={n} key sets give {n * k} equations per probe for "
                              f"{unknowns} unknowns; at least {math.ceil(unknowns / k)} needed")
        return int(n)

    def _read_forms(self, oracle, rng, d: int) -> None:
        L = form_offset(self.max_offset, self.check_length)
        k = max(1, d // 2)  # keys per query (with the probe and the zeros: k + 2 weights)
        nb = self.frequencies_.size * 2 + 1
        n = self._key_sets(d)
        probes = rng.standard_normal((d + 1, d)) / np.sqrt(d)
        # distinct offsets 1..L per key set, drawn with probability proportional to
        # 1 / offset + 4 / L
        # (Gumbel top-k): the fast frequencies need the short offsets densely, the slow ones
        # the long ones
        offsets = np.arange(1, L + 1)
        gumbel = -np.log(rng.exponential(size=(n, L))) + np.log(1.0 / offsets + 4.0 / L)
        pos = L - offsets[np.argsort(-gumbel, axis=1)[:, :k]]
        keys = rng.standard_normal((n, k, d)) / np.sqrt(d)

        def queries(lo, hi, p):
            X = np.zeros((hi - lo, L + 1, d))
            X[np.arange(hi - lo)[:, None], pos[lo:hi]] = keys[lo:hi]
            X[:, L] = probes[p]
            return X

        # the keys' and the probe's weights: (n_probes, n, k + 1)
        A = np.empty((d + 1, n, k + 1))
        for p in range(d + 1):
            O = ask_blocks(oracle, n, lambda lo, hi, p=p: queries(lo, hi, p),
                           lambda O: O[:, -1] if O.ndim == 3 else O)
            A[p] = self._weights(keys, probes[p], O)
        if not np.all(A > MIN_WEIGHT):  # a window (distant keys vanish), or too peaked
            vanishing(np.any(A[:, :, :k] <= MIN_WEIGHT, axis=0), (pos - L).astype(np.float64))
        rhs = (np.log(A[:, :, :k]) - np.log(A[:, :, k:])).reshape(d + 1, n * k).T
        Yk = np.concatenate([keys, np.ones((n, k, 1))], axis=2).reshape(n * k, d + 1)
        D = (self._basis((pos - L).astype(np.float64)).reshape(n * k, nb)[:, :, None]
             * Yk[:, None, :]).reshape(n * k, nb * (d + 1))
        # the slowest frequencies turn by less than a radian over the offsets asked: their forms
        # are nearly collinear with the constant one, and only the sum M_delta over the offsets
        # asked is determined (the minimum-norm solution of the numerical rank)
        # a weight's absolute error becomes a logit's error divided by the weight: each
        # equation weighted by its weights (the smallest over the probes, so that one
        # factorisation serves every probe)
        w = np.min(1.0 / np.sqrt(1.0 / A[:, :, :k] ** 2 + 1.0 / A[:, :, k:] ** 2),
                   axis=0).reshape(n * k, 1)
        T, _, self.forms_rank_, _ = np.linalg.lstsq(D * w, rhs * w, rcond=FORMS_RCOND)
        Zp = np.concatenate([probes, np.ones((d + 1, 1))], axis=1)
        # T[(b, key side), probe] = form_b[key side] @ z_probe
        forms = np.linalg.solve(Zp, T.reshape(nb, d + 1, d + 1).transpose(0, 2, 1))
        forms = forms.transpose(0, 2, 1)
        h = self.frequencies_.size
        self.cos_forms_, self.sin_forms_, self.const_form_ = forms[:h], forms[h:2 * h], forms[-1]

    def _weights(self, keys, probe, O) -> np.ndarray:
        """The keys' and the probe's attention weights (n, k + 1) in the last rows of the
        answers O, from the values; raise ModelMismatchError when a row is no weighted sum."""
        O = O[:, -1] if O.ndim == 3 else O
        n, k, _ = keys.shape
        d_out = self.V_.shape[1]
        vals = np.concatenate([keys @ self.V_, np.broadcast_to(probe @ self.V_, (n, 1, d_out)),
                               np.zeros((n, 1, d_out))], axis=1)  # (n, k + 2, d_out): zeros last
        a, self.attention_residual_ = head_weights(vals, (O - self.output_bias_)[:, None],
                                                   "one rotary head")
        return a[:, 0, :k + 1]

    def _verify(self, oracle, rng) -> None:
        verify_fit(self, oracle, rng, int(self.verify),
                   check_lengths(self.check_length, CHECK_LENGTHS),
                   "one rotary head of the declared base and mask")

    # -- the estimate ------------------------------------------------------------------------------
    def form_layer(self):
        """The recovered head as a one-head :class:`~attnquery.models.vector.RotaryFormLayer`
        (forms over ``[x; 1]``: identity bases), what :meth:`predict` and :meth:`M`
        evaluate."""
        from ...models.vector import RotaryFormLayer

        if not hasattr(self, "const_form_"):
            raise ConfigError("form_layer() needs a fitted learner; call fit(oracle) first")
        return RotaryFormLayer(self.V_[None], self.output_bias_, self.frequencies_,
                               self.cos_forms_[None], self.sin_forms_[None],
                               self.const_form_[None], causal=bool(self.causal),
                               outputs=self.outputs_)

    def M(self, delta: int) -> np.ndarray:
        """The form at relative offset ``delta`` (key position minus query position), shape
        (d+1, d+1): the logit of key x_k for query x_q is ``[x_k; 1]^T M [x_q; 1]`` up to terms
        constant over the keys."""
        if not hasattr(self, "const_form_"):
            raise ConfigError("M() needs a fitted learner; call fit(oracle) first")
        return self.form_layer().M(delta)

    def predict(self, X) -> np.ndarray:
        """The recovered head's outputs on X (B, N, d), in the oracle's shape."""
        if not hasattr(self, "const_form_"):
            raise ConfigError("predict() needs a fitted learner; call fit(oracle) first")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3 or X.shape[2] != self.V_.shape[0]:
            raise ConfigError(f"X must have shape (B, N, {self.V_.shape[0]}); got {X.shape}")
        return self.form_layer()(X)
