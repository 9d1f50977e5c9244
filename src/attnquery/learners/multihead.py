"""Multi-head attention: non-identifiability (Prop. 7.1) and orthogonal-subspace recovery (App. C).

:func:`non_identifiability_demo` builds pairs of distinct multi-head parameter sets that compute
the same function, measures their parameter distance and output difference, and runs the
single-head exact learner on a multi-head oracle to show how far it is from the truth.

:class:`OrthogonalSubspaceLearner` recovers the heads of a model that satisfies Assumption C.1
(each head's ``W_h`` and ``v_h`` live in its own subspace ``U_h``, the subspaces orthogonal):
with the bases given it is Prop. C.2 (each head by the single-head exact learner on queries whose
rows lie in ``U_h``); without them it first discovers the subspaces from finite-difference
Hessians (see the class docstring).
"""

from __future__ import annotations

import numpy as np

from ..errors import AssumptionViolation, ConfigError, NotIdentifiableError
from ..metrics import functional_error, match_heads
from ..models import AttentionHead, MultiHeadAttention, as_rng, random_multihead
from ..oracles import ValueOracle
from ._base import BaseLearner, check_budget, check_oracle
from .exact import ExactValueQueryLearner

__all__ = ["non_identifiability_demo", "CONSTRUCTIONS", "OrthogonalSubspaceLearner"]

#: the non-identifiable constructions :func:`non_identifiability_demo` knows
CONSTRUCTIONS = ("prop71", "shared_w", "dead_head")


def _heads_params(model: MultiHeadAttention):
    return [h.W for h in model.heads], [h.v for h in model.heads]


def _construct(name: str, d: int, H: int, rng: np.random.Generator):
    """Two multi-head models with different parameters and the same function."""
    if name == "prop71":
        # Prop. 7.1: every head has W = A, v_h = lambda_h b with sum lambda = 1. Two weightings
        # far apart even after permuting heads: all mass on one head vs spread evenly.
        A = rng.standard_normal((d, d)) / np.sqrt(d)
        b = rng.standard_normal(d)
        lam_a = np.zeros(H)
        lam_a[0] = 1.0
        lam_b = np.full(H, 1.0 / H)
        ma = MultiHeadAttention([AttentionHead(lam * b, W=A) for lam in lam_a])
        mb = MultiHeadAttention([AttentionHead(lam * b, W=A) for lam in lam_b])
        return ma, mb
    if name == "shared_w":
        # Heads fall into groups that share a W; within a group only the sum of the v's
        # matters, so any zero-sum perturbation of the group's v's (not along a common
        # direction, unlike Prop. 7.1) leaves the function unchanged.
        n_groups = max(1, H // 2)
        base = random_multihead(d, n_groups, rng)
        group = np.arange(H) % n_groups
        heads_a, heads_b = [], []
        V = rng.standard_normal((H, d))
        C = rng.standard_normal((H, d))
        for g in range(n_groups):
            idx = np.flatnonzero(group == g)
            if idx.size > 1:
                C[idx] -= C[idx].mean(axis=0)  # zero-sum within the group
            else:
                C[idx] = 0.0
        for h in range(H):
            W = base.heads[group[h]].W
            heads_a.append(AttentionHead(V[h], W=W))
            heads_b.append(AttentionHead(V[h] + C[h], W=W))
        return MultiHeadAttention(heads_a), MultiHeadAttention(heads_b)
    if name == "dead_head":
        # A head whose v is 0 contributes nothing, whatever its W: the W of that head can be
        # anything (here two independent draws).
        base = random_multihead(d, H, rng)
        heads = list(base.heads)
        Wa = rng.standard_normal((d, d)) / np.sqrt(d)
        Wb = rng.standard_normal((d, d)) / np.sqrt(d)
        ma = MultiHeadAttention(heads[:-1] + [AttentionHead(np.zeros(d), W=Wa)])
        mb = MultiHeadAttention(heads[:-1] + [AttentionHead(np.zeros(d), W=Wb)])
        return ma, mb
    raise ConfigError(f"unknown construction {name!r}; choose from {CONSTRUCTIONS}")


def non_identifiability_demo(
    d: int,
    H: int,
    seed=None,
    *,
    n_queries: int = 1000,
    lengths=(1, 2, 4, 8),
    constructions=CONSTRUCTIONS,
    single_head: bool = True,
) -> dict:
    """Demonstrate that multi-head attention is not identifiable from its outputs.

    For each construction, two parameter sets are built from ``seed`` and compared:

    - ``"prop71"`` (the paper's Prop. 7.1): all heads share ``W = A`` and ``v_h = lambda_h b``;
      set a puts all weight on one head, set b spreads it evenly.
    - ``"shared_w"``: heads grouped in pairs sharing a W (a generic W per group); set b adds to
      the v's of each group arbitrary vectors summing to zero (not multiples of one direction).
    - ``"dead_head"``: one head has ``v = 0``; its W differs arbitrarily between the sets.

    Both sets are evaluated on the same ``n_queries`` random inputs (tokens ~ N(0, I/d), lengths
    cycling through ``lengths``).

    Finally, when ``single_head`` is true, the single-head exact learner
    (:class:`~attnquery.learners.ExactValueQueryLearner`) is run on a value oracle of a generic
    multi-head model (:func:`~attnquery.models.random_multihead` with the same d, H and a stream
    of ``seed``), and the functional error of the head it returns is measured.

    Parameters
    ----------
    d : int
        Token dimension (>= 2).
    H : int
        Number of heads (>= 2).
    seed : int, sequence of ints or Generator
    n_queries : int
        Number of random inputs on which outputs are compared.
    lengths : sequence of int
        Sequence lengths of the random inputs.
    constructions : sequence of str
        Which constructions to run (subset of :data:`CONSTRUCTIONS`).
    single_head : bool
        Also run the single-head learner on a multi-head oracle.

    Returns
    -------
    dict
        ``"constructions"``: a list with one dict per construction: ``name``, ``model_a`` and
        ``model_b`` (the two :class:`~attnquery.models.MultiHeadAttention` models),
        ``param_distance`` (relative distance of the stacked parameters after the best head
        permutation, :func:`~attnquery.metrics.match_heads`), ``v_distance`` and ``W_distance``
        (the same, for v's and W's alone), ``max_abs_diff`` and ``max_rel_diff``
        (``max |f_a - f_b|`` and that over ``max |f_a|`` on the random inputs).
        ``"single_head"``: ``status`` ("ok" or the error type), ``functional_error`` (relative
        RMS on held-out inputs; NaN when the learner failed), ``n_queries``, ``message`` and
        ``model`` (the multi-head model used).
    """
    if not isinstance(d, int | np.integer) or d < 2:
        raise ConfigError(f"d must be an integer >= 2; got {d!r}")
    if not isinstance(H, int | np.integer) or H < 2:
        raise ConfigError(f"a multi-head demonstration needs H >= 2 heads; got {H!r}")
    if n_queries < 1:
        raise ConfigError(f"n_queries must be >= 1; got {n_queries}")
    lengths = tuple(int(n) for n in lengths)
    if not lengths or min(lengths) < 1:
        raise ConfigError(f"lengths must be positive ints; got {lengths}")
    rng = as_rng(seed)
    r_cons, r_inputs, r_single, r_eval = rng.spawn(4)
    # the same random inputs for every construction
    X_all = []
    for k, N in enumerate(lengths):
        n = n_queries // len(lengths) + (1 if k < n_queries % len(lengths) else 0)
        if n:
            X_all.append(r_inputs.standard_normal((n, N, d)) / np.sqrt(d))
    out = {"constructions": []}
    for name, r in zip(constructions, r_cons.spawn(len(constructions)), strict=True):
        ma, mb = _construct(name, int(d), int(H), r)
        Wa, va = _heads_params(ma)
        Wb, vb = _heads_params(mb)
        m = match_heads(Wb, vb, Wa, va)
        mW = match_heads(Wb, [np.zeros(d)] * len(Wb), Wa, [np.zeros(d)] * len(Wa))
        den_v = np.sqrt(sum(float(np.sum(x**2)) for x in va))
        dv = np.sqrt(sum(m["err_v"] ** 2))
        fa = np.concatenate([ma(X) for X in X_all])
        fb = np.concatenate([mb(X) for X in X_all])
        max_abs = float(np.max(np.abs(fa - fb)))
        scale = float(np.max(np.abs(fa)))
        out["constructions"].append(
            {
                "name": name,
                "model_a": ma,
                "model_b": mb,
                "param_distance": m["param_distance"],
                "v_distance": float(dv / den_v) if den_v > 0 else float(dv),
                "W_distance": mW["param_distance"],
                "max_abs_diff": max_abs,
                "max_rel_diff": max_abs / scale if scale > 0 else max_abs,
                "n_inputs": int(fa.size),
            }
        )
    if single_head:
        model = random_multihead(int(d), int(H), r_single)
        oracle = ValueOracle(model, int(d))
        rec = {"model": model, "status": "ok", "message": "", "functional_error": np.nan}
        try:
            est = ExactValueQueryLearner(random_state=r_single).fit(oracle)
            rec["functional_error"] = functional_error(model, est.predict, int(d), r_eval)
        except (AssumptionViolation, NotIdentifiableError) as exc:
            rec["status"] = type(exc).__name__
            rec["message"] = str(exc)
        rec["n_queries"] = int(oracle.n_queries)
        out["single_head"] = rec
    return out
