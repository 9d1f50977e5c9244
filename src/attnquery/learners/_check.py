"""The check of a fitted estimate: fresh check queries (their lengths and plan), the
comparison of the box's answers with the estimate's, and the error bound of a head estimate.

Re-exported by :mod:`attnquery.learners._base`, where learners import them from."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, ModelMismatchError
from ._ledger import check_budget
from ._params import check_scalar

__all__ = ["check_answers", "check_signs", "check_queries", "check_plan", "CHECK_LENGTHS",
           "CHECK_LENGTH", "check_lengths", "ROUNDING_RTOL", "output_error_bound",
           "PERMUTED_SHARE", "MISMATCH_HINT", "check_length_param", "PAIR_LOGIT",
           "pair_token_scale"]

CHECK_LENGTHS = (2, 4, 8, 16, 32, 64, 128)
"""Sequence lengths of the fresh check queries (:func:`check_plan` spreads them over these, the
shortest and the longest always included): long sequences are where a windowed or
position-dependent box differs from a head (a 4-token window is exact on 2 and 4 tokens)."""
#: the longest check query of the position-free learners, unless their ``check_length`` says
#: otherwise (:func:`check_lengths`): a box that behaves like a head on every input of up to
#: this many tokens (a sliding window this wide or wider, a logit scaling that starts beyond
#: it) passes the check
CHECK_LENGTH = 4096
#: one check query in PERMUTED_SHARE is a copy of a fresh one with its first N - 1 tokens
#: permuted, which a position-free box must answer alike
PERMUTED_SHARE = 4
#: the standard deviation of the estimate's logits on the prefix-permuted pairs of
#: :func:`pair_token_scale`: a head whose logits are small on unit tokens (``||W||_F`` well below d)
#: attends almost uniformly there, so that a rotary or other position-dependent box changes its
#: answers by less than a noisy learner's tolerance when the tokens are permuted (a rotary head
#: with ``||M||_F = 0.08`` at d = 8: by 1e-3 on 64 tokens); on tokens scaled to logits of this
#: size it changes them by 0.1 to 1 of its answers' scale (docs/notes/2026-12-05-noisy-checks.md)
PAIR_LOGIT = 64.0
#: the largest token scale of the permuted pairs (an estimate with W = 0)
PAIR_SCALE_MAX = 1e3
ROUNDING_RTOL = 1e-9
"""Relative disagreement of the check queries that float64 rounding explains, for the learners
that are exact in float64 (exact, sketch, polished nuclear-norm): the default study's exact grid
and the 72 MiniLM heads stay below 1.1e-11 (Gaussian probes at d = 512; 6e-14 with the default
basis probes), answers rounded to float32 (relative error 6e-8) give more than 2e-7
(``python -m attnquery.study.bench probes``)."""
#: what a failed check may mean, unless a learner says better
MISMATCH_HINT = ("the box may have several heads, biases, noise or lower precision than "
                 "float64")



def check_length_param(n) -> int:
    """The ``check_length`` parameter of the position-free learners (an integer >= 1): the
    tokens of their longest check queries (:func:`check_lengths`)."""
    return check_scalar(n, "check_length", numbers.Integral, min_val=1)


def output_error_bound(X: np.ndarray, v_hat: np.ndarray, err_W, err_v) -> np.ndarray:
    """Largest ``|f_hat(X) - f(X)|`` for a head estimate with entrywise errors at most ``err_W``
    in W and ``err_v`` in v (arrays (d, d) and (d,), or numbers), per query of X (B, N, d).

    With ``delta_i = x_i^T (W_hat - W) x_N``, bounded by ``b_i = |x_i|^T err_W |x_N|``:
    ``f_hat - f = sum_i alpha_hat_i x_i^T (v_hat - v) + sum_i (alpha_hat_i - alpha_i) x_i^T v``,
    and ``||alpha_hat - alpha||_1 <= min(2, max_i delta_i - min_i delta_i)`` (the softmax's
    Jacobian ``diag(alpha) - alpha alpha^T``), where the range is at most the sum of the two
    largest ``b_i`` (0 for one token). So the bound is ``max_i |x_i|^T err_v + min(2, b_(1) +
    b_(2)) max_i (|x_i^T v_hat| + |x_i|^T err_v)``.
    """
    d = X.shape[-1]
    A = np.abs(X)
    ev = np.broadcast_to(np.asarray(err_v, dtype=float), (d,))
    eW = np.broadcast_to(np.asarray(err_W, dtype=float), (d, d))
    xv_err = A @ ev  # (B, N)
    b = np.einsum("bnd,bd->bn", A, A[:, -1, :] @ eW.T)
    top = -np.sort(-b, axis=1)[:, :2]
    spread = top.sum(axis=1) if X.shape[1] > 1 else np.zeros(X.shape[0])
    xv = np.abs(X @ v_hat) + xv_err
    return xv_err.max(axis=1) + np.minimum(2.0, spread) * xv.max(axis=1)


def pair_token_scale(W_hat: np.ndarray, W_bound: float | None = None) -> float:
    """The token scale of the prefix-permuted check pairs of a head estimate ``W_hat`` (d, d):
    ``c = sqrt(PAIR_LOGIT d / n)`` with ``n = ||W_hat||_F``, or ``W_bound`` when that is
    smaller (a known bound on ``||W||_F``: a loose estimate's norm is its error's), at least 1
    and at most :data:`PAIR_SCALE_MAX` (1 for an undefined estimate).

    On Gaussian tokens of norm about c the logits ``x_i^T W x_N`` of a head with
    ``||W||_F = n`` have standard deviation about ``c^2 n / d``, :data:`PAIR_LOGIT` at this c:
    a position-free head answers a query and its permuted copy alike at any scale, while a
    position-dependent box shows its dependence once its attention is far from uniform (its
    answers' change grows like ``c^3`` while its logits are small). A head with logits that
    large on unit tokens already (``n >= PAIR_LOGIT d``) keeps unit tokens (``c = 1``).
    """
    W_hat = np.asarray(W_hat, dtype=float)
    nrm = float(np.linalg.norm(W_hat))
    if not np.isfinite(nrm):  # an undefined estimate: unit tokens
        return 1.0
    if W_bound is not None:
        nrm = min(nrm, float(W_bound))
    c = np.sqrt(PAIR_LOGIT * W_hat.shape[-1] / nrm) if nrm > 0 else PAIR_SCALE_MAX
    return float(min(max(c, 1.0), PAIR_SCALE_MAX))


def check_lengths(check_length: int = CHECK_LENGTH, lengths=CHECK_LENGTHS) -> tuple[int, ...]:
    """The lengths a position-free learner's check queries are spread over: ``lengths`` with
    its longest replaced by ``check_length`` (and those not below ``check_length`` dropped).

    ``check_length`` is then the longest, always asked, with its prefix-permuted copy
    (:func:`check_plan`), while the short end of the plan is that of ``lengths``: with
    :data:`DEFAULT_VERIFY` queries, the same lengths as before but for the longest (the short
    queries are where a loose error model still tests the estimate: the noisy learner's at
    tau = 1e-4, d = 6, on 2-token queries only). ``check_length = 128`` gives
    :data:`CHECK_LENGTHS` itself.

    Examples: ``check_lengths()`` is (2, 4, 8, 16, 32, 64, 4096), ``check_lengths(100)`` is
    (2, 4, 8, 16, 32, 64, 100), ``check_lengths(16)`` is (2, 4, 8, 16), ``check_lengths(1)``
    is (1,).
    """
    n = check_length_param(check_length)
    base = sorted({int(m) for m in lengths})
    return (*[m for m in base[:-1] if m < n], n)


def check_plan(n_checks: int, lengths=CHECK_LENGTHS,
               permuted: bool = True) -> tuple[list[int], int]:
    """How ``n_checks`` check queries are spent: the lengths of the fresh random queries and the
    number of prefix-permuted copies.

    One query in :data:`PERMUTED_SHARE` (rounded down) is a copy of one of the longest fresh
    queries with its first N - 1 tokens permuted (only queries of N >= 3 tokens have a prefix
    to permute; without any, or with ``permuted=False``, every query is fresh). The fresh
    queries' lengths are spread over ``lengths``: with fewer queries than lengths, the
    shortest, the longest and evenly spaced ones between; with more, every length about
    equally often.

    Examples: 8 queries with :data:`CHECK_LENGTHS` are 6 fresh of 2, 4, 8, 32, 64 and 128
    tokens and copies of the 128- and 64-token ones; 64 are 48 fresh (about 7 of each
    length) and 16 copies.
    """
    lengths = sorted(int(n) for n in lengths)
    if not lengths or lengths[0] < 1:
        raise ConfigError(f"check lengths must be positive integers; got {lengths!r}")

    def spread(m):
        L = len(lengths)
        if m <= L:
            idx = np.round(np.linspace(0, L - 1, m)).astype(int) if m > 1 else [L - 1][:m]
        else:
            idx = (np.arange(m) * L) // m
        return [lengths[i] for i in idx]

    n_perm = n_checks // PERMUTED_SHARE if permuted else 0
    fresh = spread(n_checks - n_perm)
    n_perm = min(n_perm, sum(n >= 3 for n in fresh))
    if n_perm == 0:
        fresh = spread(n_checks)
    return fresh, n_perm


def _permute_prefix(rng: np.random.Generator, X: np.ndarray) -> np.ndarray:
    """``X`` (B, N, d) with each query's first N - 1 tokens in a random order other than the
    given one (N >= 3)."""
    B, N, _ = X.shape
    perm = np.argsort(rng.random((B, N - 1)), axis=1)
    same = np.all(perm == np.arange(N - 1), axis=1)
    perm[same] = np.arange(N - 1)[::-1]
    out = X.copy()
    out[:, : N - 1] = np.take_along_axis(X[:, : N - 1], perm[:, :, None], axis=1)
    return out


def check_queries(rng: np.random.Generator, d: int, n_checks: int, token_scale: float = 1.0,
                  lengths=CHECK_LENGTHS, return_pairs: bool = False, permuted: bool = True,
                  pair_scale: float = 1.0):
    """Fresh random check queries: i.i.d. Gaussian tokens of norm about ``token_scale``, their
    lengths and the prefix-permuted copies as :func:`check_plan` says, one batch per length
    (the copies in batches of their own, after the fresh ones). The fresh queries that are
    copied, and so their copies, have tokens ``pair_scale`` times larger (:func:`pair_token_scale`;
    1: the same draws as without it).

    With ``return_pairs``, also an (n_perm, 2) array of the positions, in the concatenated
    answers, of each fresh query and its permuted copy.
    """
    fresh, n_perm = check_plan(n_checks, lengths, permuted)
    sizes = {n: fresh.count(n) for n in sorted(set(fresh))}
    batches = [rng.standard_normal((size, n_tok, d)) * (token_scale / np.sqrt(d))
               for n_tok, size in sizes.items()]
    starts = np.cumsum([0] + [b.shape[0] for b in batches])
    pairs = []
    if n_perm:
        # copies of the n_perm longest fresh queries: the last rows of the last batches
        chosen = []  # (batch, row)
        for k in range(len(batches) - 1, -1, -1):
            for row in range(batches[k].shape[0] - 1, -1, -1):
                if len(chosen) < n_perm:
                    chosen.append((k, row))
        pos = int(starts[-1])
        for k in sorted({k for k, _ in chosen}):
            rows = sorted(r for kk, r in chosen if kk == k)
            if pair_scale != 1.0:
                batches[k][rows] *= float(pair_scale)
            batches.append(_permute_prefix(rng, batches[k][rows]))
            for r in rows:
                pairs.append((int(starts[k] + r), pos))
                pos += 1
    if return_pairs:
        return batches, np.array(pairs, dtype=int).reshape(-1, 2)
    return batches


def _allowance(atol, X: np.ndarray) -> np.ndarray:
    """Absolute allowance per query: ``atol`` itself, or ``atol(X)`` when it is callable."""
    if callable(atol):
        return np.asarray(atol(X), dtype=float).reshape(X.shape[0])
    return np.full(X.shape[0], float(atol))


@dataclass
class _CheckResult:
    error: float
    n_queries: int
    n_informative: int
    allowed_rel: float


def _ask_checks(oracle, predict, rng, n_checks, atol, token_scale, lengths, permuted=True,
                pair_scale=1.0):
    d = int(oracle.d)
    check_budget(oracle, n_checks, "the check of the estimate")
    n0 = oracle.n_queries
    ys, yhats, allow, ns = [], [], [], []
    batches, pairs = check_queries(rng, d, n_checks, token_scale, lengths, return_pairs=True,
                                   permuted=permuted, pair_scale=pair_scale)
    for X in batches:
        ys.append(np.asarray(oracle(X), dtype=float))
        yhats.append(np.asarray(predict(X), dtype=float))
        allow.append(_allowance(atol, X))
        ns.append(np.full(X.shape[0], X.shape[1]))
    return (np.concatenate(ys), np.concatenate(yhats), np.concatenate(allow),
            np.concatenate(ns), pairs, int(oracle.n_queries - n0))


_POSITION_HINT = ("the box's answer depends on the order of the tokens (a sliding window, ALiBi, "
                  "rotary or other positions), which {what} cannot; or {hint}")


def _run_check(oracle, predict, rng, n_checks, rtol, atol=0.0, what="a single attention head",
               token_scale=1.0, lengths=CHECK_LENGTHS, hint=None, signs=False,
               pair_atol=None, permuted=True, pair_scale=1.0) -> _CheckResult:
    """The check of :func:`check_answers` (or, with ``signs``, :func:`check_signs`), with the
    number of informative queries: those whose allowed disagreement is below the estimate's
    own answer, counting one-token queries only when there are no longer ones (they test v
    alone). The permuted pairs are not counted: they test the order of the tokens only."""
    if n_checks == 0:
        return _CheckResult(float("nan"), 0, 0, float("nan"))
    y, yhat, allow, ns, pairs, n_used = _ask_checks(oracle, predict, rng, n_checks, atol,
                                                    token_scale, lengths, permuted, pair_scale)
    a, b = pairs[:, 0], pairs[:, 1]
    if signs:
        return _signs_verdict(y, yhat, allow, pairs, rtol, what, hint, n_checks, n_used)
    diffs = np.abs(y - yhat)
    diff = float(np.max(diffs))
    scale = float(np.max(np.abs(y)))
    error = diff / scale if scale > 0 else diff
    unit = scale if scale > 0 else 1.0
    allowed = allow + rtol * scale
    # a permuted copy: a position-free box answers both alike, to within its answers' error
    pdiff = np.abs(y[a] - y[b])
    # (with pair_atol, float64 rounding on top: the two sums run in different orders)
    pallowed = (allowed[a] + allowed[b]) if pair_atol is None else \
        np.full(a.size, float(pair_atol) + 2 * max(rtol, ROUNDING_RTOL) * scale)
    pbad = ~(pdiff <= pallowed)
    if pbad.any():
        k = int(np.argmax(np.where(pbad, pdiff - pallowed, -np.inf)))
        raise ModelMismatchError(
            f"answers change by {pdiff[k] / unit:.3g} (relative) when the first "
            f"{int(ns[a[k]]) - 1} tokens of a {int(ns[a[k]])}-token check query are permuted, "
            f"where at most {pallowed[k] / unit:.3g} is expected; "
            + _POSITION_HINT.format(what=what, hint=hint or MISMATCH_HINT),
            error=max(error, float(pdiff[k] / unit)), allowed=float(pallowed[k] / unit),
            n_checks=n_used)
    bad = ~(diffs <= allowed)  # NaN included
    if bad.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            k = int(np.argmax(np.where(bad, np.nan_to_num(diffs / allowed, nan=np.inf), -1.0)))
        seen, allowed_rel = float(diffs[k] / unit), float(allowed[k] / unit)
        longest = int(ns.max())
        raise ModelMismatchError(
            f"answers differ from {what} by {error:.3g} (relative) on {n_checks} check "
            f"queries of {int(ns.min())} to {longest} tokens, {int(bad.sum())} of them by more "
            f"than expected (the farthest, of {int(ns[k])} tokens, by {seen:.3g} where at most "
            f"{allowed_rel:.3g} is expected); {hint or MISMATCH_HINT}",
            error=error, allowed=allowed_rel, n_checks=n_used)
    # one-token answers x^T v test v alone: the check of the rest (W, the positions) rests on
    # the longer queries, when there are any
    multi = ns >= 2 if np.any(ns >= 2) else np.ones(ns.size, dtype=bool)
    informative = int(np.count_nonzero((allowed < np.abs(yhat)) & multi))
    return _CheckResult(error, n_used, informative, float(np.min((allowed / unit)[multi])))


def check_answers(oracle, predict, rng: np.random.Generator, n_checks: int, rtol: float,
                  atol=0.0, what: str = "a single attention head",
                  token_scale: float = 1.0, lengths=CHECK_LENGTHS,
                  hint: str | None = None, pair_atol: float | None = None) -> tuple[float, int]:
    """Compare the oracle with an estimate on ``n_checks`` fresh random queries.

    The check queries come from :func:`check_queries` (lengths spread over ``lengths``, and
    prefix-permuted copies of the longest, :func:`check_plan`). The estimate passes when
    ``|y - y_hat| <= atol + rtol * max |y|`` on every query, where ``y`` are the oracle's
    answers and ``y_hat = predict(X)``; ``atol`` is a number or a function of the queries
    ``X (B, N, d)`` giving each query's own allowance (B,). The box's answers on a query and on
    its prefix-permuted copy must also agree, to within ``pair_atol + 2 max(rtol,
    ROUNDING_RTOL) max |y|`` (the answers' own error, when known, and rounding) or else the
    sum of the two queries' allowances: a position-free estimate answers both alike, so this
    catches position-dependent boxes even where the estimate's allowance is loose. ``hint``
    (what the disagreement may mean) ends the error message.

    Returns
    -------
    error : float
        ``max |y - y_hat| / max |y|`` (NaN when ``n_checks`` is 0; the absolute disagreement
        when every answer is 0).
    n_queries : int
        Check queries counted by the oracle.

    Raises
    ------
    ModelMismatchError
        When the estimate fails the test, or the answers change under a permutation of a
        query's first N - 1 tokens.
    """
    res = _run_check(oracle, predict, rng, n_checks, rtol, atol=atol, what=what,
                     token_scale=token_scale, lengths=lengths, hint=hint, pair_atol=pair_atol)
    return res.error, res.n_queries


def check_signs(oracle, predict, rng: np.random.Generator, n_checks: int, rtol: float = 0.0,
                atol=0.0, what: str = "a single attention head", token_scale: float = 1.0,
                lengths=CHECK_LENGTHS, hint: str | None = None) -> tuple[float, int]:
    """Compare a membership oracle's signs with an estimate's on ``n_checks`` fresh queries.

    ``predict(X)`` gives the estimate's values; a query where the estimate says
    ``f(X) > 0`` and the oracle answers 0 (or the reverse) is a disagreement unless
    ``|predict(X)| <= atol + rtol * max |predict(X)|`` (the estimate's own uncertainty there;
    ``atol`` a number or a function of the queries, as in :func:`check_answers`). The queries
    are :func:`check_queries`'s; the box must answer a query and its prefix-permuted copy
    with the same sign (a position-free head does, whatever the estimate's uncertainty).

    Returns
    -------
    error : float
        The fraction of check queries whose signs disagree beyond the estimate's uncertainty.
    n_queries : int
        Check queries counted by the oracle.

    Raises
    ------
    ModelMismatchError
        When any sign disagrees beyond the estimate's uncertainty, or the box's sign changes
        under a permutation of a query's first N - 1 tokens.
    """
    res = _run_check(oracle, predict, rng, n_checks, rtol, atol=atol, what=what,
                     token_scale=token_scale, lengths=lengths, hint=hint, signs=True)
    return res.error, res.n_queries


def _signs_verdict(ans, yhat, allow, pairs, rtol, what, hint, n_checks, n_used):
    a, b = pairs[:, 0], pairs[:, 1]
    flipped = (ans[a] > 0.5) != (ans[b] > 0.5)
    if flipped.any():
        raise ModelMismatchError(
            f"membership answers change sign on {int(flipped.sum())} of {a.size} check queries "
            "when their first N - 1 tokens are permuted; "
            + _POSITION_HINT.format(what=what, hint=hint or MISMATCH_HINT),
            error=float(np.mean(flipped)), allowed=0.0, n_checks=n_used)
    bound = allow + rtol * float(np.max(np.abs(yhat)))
    sure = ~(np.abs(yhat) <= bound)  # NaN: never sure
    wrong = sure & ((ans > 0.5) != (yhat > 0))
    error = float(np.mean(wrong))
    if wrong.any():
        raise ModelMismatchError(
            f"membership answers differ from {what} on {int(wrong.sum())} of {n_checks} check "
            f"queries where the estimate's sign is certain; {hint or MISMATCH_HINT}",
            error=error, allowed=0.0, n_checks=n_used)
    informative = int(np.count_nonzero(sure))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = float(np.min(bound / np.max(np.abs(yhat)))) if np.any(yhat) else float("nan")
    return _CheckResult(error, n_used, informative, rel)
