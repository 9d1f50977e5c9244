"""The generic multi-head learner: heads in general position, up to a permutation.

Beyond the paper: Prop. 7.1 shows that multi-head attention is not identifiable *in general*
(heads sharing one W), but heads in general position are. :class:`MultiHeadLearner` recovers
``f(X) = sum_h alpha_h(X, W_h)^T (X v_h)`` with no structural assumption between the heads.

Method (beyond the paper: generic multi-head attention, no structural assumption):

1. **v-sum.** The d one-row queries ``[e_i]`` give ``s = sum_h v_h``.
2. **Lines.** For an anchor y and a direction u, the two-row queries ``[y + t u; y]`` give
   ``g(t) = f - y^T s = sum_h t b_h sigma(t a_h)`` with ``a_h = u^T W_h y`` and
   ``b_h = u^T v_h``. Its even part divided by t is
   ``e(t) = sum_h c_h tanh(|a_h| t / 2)``, ``c_h = sign(a_h) b_h / 2``: a sum of tanh terms,
   fitted by variable projection (:mod:`.lines`). The number of terms is the smallest that
   fits to ``fit_tol``. A line is rejected when the fit's Jacobian predicts a parameter error
   above ``line_tol`` (close rates, a tiny term), and more lines are drawn until enough are
   accepted.
3. **First anchor.** Lines ``u_0`` and ``u_0 +- u_i`` (i = 1..d): heads are matched across
   lines by additivity (:func:`.matching.match_additive`), which also fixes each term's sign
   relative to the reference line; least squares then gives ``W_h y`` and ``v_h`` (each term
   up to a common sign, the *gauge*).
4. **Other anchors.** With the v's known, each line's terms are matched to heads by
   ``|c| = |u^T v_h| / 2`` (:func:`.matching.match_by_v`) and their signs follow; least squares
   gives ``W_h y_j``, and ``W_h = [W_h y_j]_j Y^{-1}``.
5. **Signs and hidden heads.** Two-row queries only see each term up to the gauge
   ``(W, v) ~ (-W, -v) + (0, 2 v)`` (because ``sigma(-x) = 1 - sigma(x)``): the sign pattern is
   the one whose heads' v's sum to ``s``. When none does, part of ``s`` is carried by a head
   that two-row queries cannot see: a head with ``W = 0``, or a pair with ``W_2 = -W_1``. The
   candidates (every sign pattern, with a ``W = 0`` head or any visible term split into such a
   pair) are told apart by three-row queries, which have no such symmetry.
6. **Refit.** Levenberg-Marquardt on all parameters against raw random two- and three-row
   queries, with the analytic Jacobian (:func:`.refit.refit_heads`).
7. **Check.** The functional error on held-out random queries of several lengths is measured
   before returning; a result that does not reproduce the oracle is never returned.

Degenerate cases: heads that share W (Prop. 7.1) make the function that of fewer heads, which
raises :class:`~attnquery.errors.NotIdentifiableError` naming the merged heads (the identifiable
part, carried by the exception's ``W`` and ``v`` attributes); nearly coincident heads are
returned with a :class:`UserWarning` and the separation diagnostic ``head_separation_``.
"""

from __future__ import annotations

import itertools
import warnings
from numbers import Integral, Real

import numpy as np

from ...errors import AssumptionViolation, NotIdentifiableError
from .._base import (
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    N_QUERIES_PARAM,
    BaseLearner,
    QueryLedger,
    check_oracle,
)
from .._params import Interval
from .._probes import read_v
from .._registry import LearnerSpec
from ._anchor import ask_lines, first_anchor, fit_lines
from .lines import fit_tanh_sum
from .matching import match_by_v
from .refit import (
    head_separation,
    multihead_eval,
    query_scale,
    random_queries,
    refit_heads,
    relative_rms_error,
)

__all__ = ["MultiHeadLearner"]

#: the stages whose queries ``n_queries_by_stage_`` counts
STAGES = ("v_sum", "lines", "hidden", "refit", "check", "verify")


def _unit(x):
    return x / np.linalg.norm(x)


class MultiHeadLearner(BaseLearner):
    """Recover generic multi-head attention from value queries, up to a permutation of heads.

    Parameters
    ----------
    n_heads : int or None
        Number of heads H. ``None``: chosen from the data (see Notes).
    three_row_queries : bool
        Use three-row queries, which see heads that two-row queries cannot separate (a head with
        ``W = 0``, a pair with ``W_2 = -W_1``). With ``False`` the learner asks only one- and
        two-row queries and raises :class:`NotIdentifiableError` on such models.
    max_heads : int
        Largest number of terms tried on a line when ``n_heads`` is None.
    n_t : int or None
        Positive line parameters t per line (each asked at +t and -t). Default ``3 k + 12``
        with k the largest number of terms fitted.
    fit_tol : float
        Relative residual at which a line's fit is accepted (and its number of terms chosen).
    line_tol : float
        Largest relative parameter error (predicted from the fit's Jacobian) of an accepted line.
    match_tol : float
        Largest relative mismatch when heads are matched across lines.
    func_tol : float
        Largest relative functional error on held-out queries of a returned result.
    separation_warn : float
        A :class:`UserWarning` is issued when ``head_separation_`` is below this.
    refit_factor : float
        Refit queries per parameter in the final Levenberg-Marquardt refit.
    max_line_rounds : int
        Rounds of new lines drawn per anchor when lines are rejected.
    verify : int
        Fresh random check queries spent last, after the held-out check (0 turns it off)
        (default 8: 6 fresh random queries of 2 to ``check_length`` tokens and copies of the
        two longest with their first N - 1 tokens permuted, which the box must answer alike;
        :func:`~attnquery.learners._base.check_plan`);
        raises :class:`~attnquery.errors.ModelMismatchError` when the heads disagree with them.
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is a sum of heads on
        every input of up to ``check_length`` tokens, such as one with a wider sliding window,
        passes.
    n_queries : int, optional
        The most queries the whole fit asks, its check's included (default None: no cap;
        :class:`~attnquery.learners.base.BaseLearner` says how a cap is kept).
    random_state : int, sequence of ints, Generator or None
        Seed of the random anchors, directions and refit queries.

    Attributes
    ----------
    W_ : list of ndarray (d, d)
        Recovered score matrices, one per head (any order).
    v_ : list of ndarray (d,)
        Recovered value vectors.
    n_heads_ : int
    n_queries_ : int
        Queries counted by the oracle during ``fit``.
    head_separation_ : float
        Smallest relative distance between recovered W's (:func:`head_separation`).
    func_err_ : float
        Relative functional error on held-out random queries.
    lines_used_, lines_rejected_ : int
        Lines accepted and rejected.
    hidden_ : str
        How the sign/hidden-head step resolved: ``"none"``, ``"zero_head"`` or ``"pair"``.
    n_queries_by_stage_ : dict
        Queries per stage (``v_sum``, ``lines``, ``hidden``, ``refit``, ``check``, ``verify``).
    refit_rel_residual_ : float
        Relative residual of the final refit on its own queries.
    verify_error_ : float
        Largest relative disagreement on the verification queries.
    n_verify_queries_ : int
        Verification queries (counted in ``n_queries_``).

    Notes
    -----
    With ``n_heads=None`` the number of heads is chosen by model selection on the line fits:
    on each candidate reference line of the first anchor (four random directions), the number
    of tanh terms is the smallest that fits the noise-free answers to relative residual
    ``fit_tol`` (each extra term lowers the residual by orders of magnitude until the count is
    right, then nothing is left to fit); the count K is the most common one over those lines
    (at most ``max_heads``). One head is added when the one-row answers carry a component that
    no sign pattern of the K visible heads explains (a head invisible to two-row queries), and
    three-row queries choose which kind it is. With ``n_heads`` given, a smaller K that explains
    every answer means merged heads (:class:`NotIdentifiableError`).

    Limits (measured; see the multihead_generic experiment): the line fits are sums of tanh
    terms, as ill-conditioned as sums of exponentials. Lines on which two rates nearly coincide
    are rejected and more lines are drawn, so the number of lines (and queries) grows quickly
    with H; two heads closer than about ``eps = 1e-3`` (relative) are merged by the line fits,
    and the learner then refuses rather than return wrong heads. Queries grow as about
    ``2 n_t (d^2 + 3 d)`` lines' worth plus ``refit_factor H (d^2 + d)`` refit queries; the
    refit's Jacobian has ``H (d^2 + d)`` columns, which bounds the sizes it can reach.
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        "n_queries": [N_QUERIES_PARAM, None],
        "n_heads": [Interval(Integral, 1, None, closed="left"), None],
        "three_row_queries": ["boolean"],
        "max_heads": [Interval(Integral, 1, None, closed="left")],
        "n_t": [Interval(Integral, 4, None, closed="left"), None],
        **{name: [Interval(Real, 0, 1, closed="neither")]
           for name in ("fit_tol", "line_tol", "match_tol", "func_tol", "separation_warn")},
        "refit_factor": [Interval(Real, 1, None, closed="left")],
        "max_line_rounds": [Interval(Integral, 1, None, closed="left")],
    }
    spec = LearnerSpec(
        name="multihead", oracle="value", returns="heads", stages=STAGES,
        description="H heads in general position, up to a permutation (beyond the paper)",
        label="multi-head, general position")

    def __init__(
        self,
        *,
        n_heads: int | None = None,
        three_row_queries: bool = True,
        max_heads: int = 8,
        n_t: int | None = None,
        fit_tol: float = 1e-8,
        line_tol: float = 1e-4,
        match_tol: float = 1e-4,
        func_tol: float = 1e-6,
        separation_warn: float = 1e-2,
        refit_factor: float = 1.5,
        max_line_rounds: int = 4,
        verify: int = DEFAULT_VERIFY,
        check_length: int = CHECK_LENGTH,
        n_queries: int | None = None,
        random_state=None,
    ):
        self.n_heads = n_heads
        self.three_row_queries = three_row_queries
        self.max_heads = max_heads
        self.n_t = n_t
        self.fit_tol = fit_tol
        self.line_tol = line_tol
        self.match_tol = match_tol
        self.func_tol = func_tol
        self.separation_warn = separation_warn
        self.refit_factor = refit_factor
        self.max_line_rounds = max_line_rounds
        self.verify = verify
        self.check_length = check_length
        self.n_queries = n_queries
        self.random_state = random_state

    # -- queries ---------------------------------------------------------------------------------
    def _tols(self):
        return {"line_tol": self.line_tol, "match_tol": self.match_tol}

    # -- fit -------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover the heads behind ``oracle``; returns self.

        Raises
        ------
        NotIdentifiableError
            If the answers are those of fewer heads than ``n_heads`` (heads sharing W, a head
            with v = 0), or if only two-row queries are allowed and a head is invisible to them.
            The exception's ``W`` and ``v`` attributes hold the identifiable (merged) heads.
        AssumptionViolation
            If the answers need more heads than ``n_heads``, if too few lines can be fitted, or
            if the result does not reproduce the oracle on held-out queries
            (:class:`~attnquery.errors.ModelMismatchError` when it fails the last check).
        """
        self._validate_params()
        d = check_oracle(oracle)
        rng = self._rng()
        H = None if self.n_heads is None else int(self.n_heads)
        kmax = H if H is not None else int(self.max_heads)
        with self._open_ledger(oracle, STAGES) as ledger:
            with ledger.stage("v_sum"):  # 1. v-sum
                vsum = read_v(ledger, d)
            r_anchor, r_dir, r_refit, r_check = rng.spawn(4)
            r_verify = rng.spawn(1)[0]
            Y = r_anchor.standard_normal((d, d))
            Y /= np.linalg.norm(Y, axis=0)
            # 2-3. first anchor: pilot line on a wide t range, then u0 +- u_i
            t = self._pilot_line(ledger, vsum, Y[:, 0], kmax, r_dir)
            wy, V, K, n_acc, n_rej = self._first_anchor_heads(ledger, vsum, Y[:, 0], t, kmax,
                                                              r_dir)
            # 4. other anchors: match terms by |u^T v_k|
            Wk = self._other_anchors(ledger, vsum, Y, t, wy, V, K, n_acc, n_rej, r_dir)
            # 5. signs and hidden heads
            Ws, vs, hidden = self._resolve(ledger, vsum, Wk, V, H, r_check)
            with ledger.stage("refit"):  # 6. refit on raw queries
                refit = refit_heads(oracle, Ws, vs, r_refit, factor=self.refit_factor,
                                    lengths=self._lengths())
            Ws, vs = refit.W, refit.v
            self.refit_rel_residual_ = refit.rel_residual
            ferr = self._check(ledger, Ws, vs, r_check)  # 7. check on held-out queries
            self._accept(Ws, vs, ferr, H, K, hidden)
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, r_verify, rtol=self.func_tol,
                                 what=f"{self.n_heads_} attention heads",
                                 token_scale=float(np.sqrt(d) * query_scale(Ws)),
                                 check_length=self.check_length)
            self.n_queries_ = ledger.total
        return self

    def _pilot_line(self, ledger, vsum, y, kmax, r_dir):
        """The line parameters t: a pilot line asked on a wide range of t sets their scale."""
        n_t = self.n_t or 3 * kmax + 12
        d = y.size
        for _ in range(8):
            u0 = _unit(r_dir.standard_normal(d))
            tp = np.geomspace(1e-3, 1e3, 4 * n_t)
            e0 = ask_lines(ledger, vsum, y, u0[None], tp)[0]
            pilot = fit_tanh_sum(tp, e0, kmax, self.fit_tol)[0]
            if pilot.n_terms:
                return np.geomspace(0.02, 50.0, n_t) / float(np.median(pilot.rates))
        raise AssumptionViolation(
            "no line could be fitted by a sum of at most "
            f"{kmax} attention terms: the oracle does not behave like multi-head attention "
            "with this many heads, or its heads are too close to be resolved"
        )

    def _first_anchor_heads(self, ledger, vsum, y, t, kmax, r_dir):
        """``W_k y`` (d, K) and ``v_k`` (K, d) at the first anchor (up to the gauge), from
        reference lines tried until one gives enough matched lines. Returns
        (wy, V, K, n_accepted, n_rejected)."""
        n_rej = 0
        first = None
        for _ in range(self.max_line_rounds):
            first = first_anchor(ledger, vsum, y, t, kmax, r_dir, fit_tol=self.fit_tol,
                                 line_tol=self.line_tol, match_tol=self.match_tol,
                                 max_line_rounds=self.max_line_rounds)
            n_rej += first[-1]
            if first[0] is not None:
                break
        rows_u, rows_a, rows_b, K, n_acc, _ = first
        if rows_u is None:
            raise AssumptionViolation(
                f"too few of the lines needed at the first anchor could be fitted and matched "
                f"({n_rej} rejected): the heads are too close to be resolved"
            )
        Umat = np.array(rows_u)
        wy = np.linalg.lstsq(Umat, np.array(rows_a), rcond=None)[0]  # (d, K): W_k y
        V = np.linalg.lstsq(Umat, np.array(rows_b), rcond=None)[0].T  # (K, d)
        return wy, V, K, n_acc, n_rej

    def _other_anchors(self, ledger, vsum, Y, t, wy, V, K, n_acc, n_rej, r_dir):
        """``W_k`` (K, d, d) from ``W_k y_j`` at every anchor: lines matched to heads by
        ``|u^T v_k|``; sets ``lines_used_`` and ``lines_rejected_``."""
        d = Y.shape[0]
        cols = [wy.T]
        for j in range(1, d):
            yj = Y[:, j]
            rows_u, rows_a = [], []
            for _ in range(2 * self.max_line_rounds):
                if len(rows_u) >= d + 1:
                    break
                # ask more lines than missing: the rejection rate grows with the heads
                need = max(d + 1 - len(rows_u), 1) + (0 if not rows_u else 2)
                need += n_rej * need // max(n_acc, 1)
                Uj = r_dir.standard_normal((need, d))
                Uj /= np.linalg.norm(Uj, axis=1, keepdims=True)
                fits = fit_lines(ask_lines(ledger, vsum, yj, Uj, t), t, K, self.fit_tol)
                for i in range(need):
                    a = match_by_v(Uj[i] @ V.T, fits[i], K, **self._tols())
                    if a is None:
                        n_rej += 1
                        continue
                    rows_u.append(Uj[i])
                    rows_a.append(a)
                    n_acc += 1
            if len(rows_u) < d:
                raise AssumptionViolation(
                    f"only {len(rows_u)} of the {d} lines needed at anchor {j + 1} could be "
                    "fitted and matched: the heads are too close to be resolved"
                )
            cols.append(np.linalg.lstsq(np.array(rows_u), np.array(rows_a), rcond=None)[0].T)
        WY = np.stack(cols, axis=2)  # (K, d, d): column j = W_k y_j
        self.lines_used_ = int(n_acc + 1)
        self.lines_rejected_ = int(n_rej)
        return WY @ np.linalg.inv(Y)

    def _accept(self, Ws, vs, ferr, H, K, hidden) -> None:
        """Refuse heads that do not reproduce the oracle, or fewer heads than ``n_heads``;
        else set the fitted heads (warning when they nearly coincide)."""
        if ferr > self.func_tol:
            why = ""
            if H is not None and K < H:
                why = (f"; the line fits resolve only {K} of the {H} heads, so some heads are "
                       "too close to be told apart along lines")
            raise AssumptionViolation(
                f"the recovered {Ws.shape[0]} heads do not reproduce the oracle: relative "
                f"functional error {ferr:.2e} on held-out queries (tolerance {self.func_tol:g})"
                + why
            )
        if H is not None and Ws.shape[0] < H:
            err = NotIdentifiableError(
                f"the answers are exactly those of {Ws.shape[0]} heads, not {H} (functional "
                f"error {ferr:.1e} with {Ws.shape[0]}): heads share W (Prop. 7.1) or have "
                "v = 0. Identifiable: the merged heads (each shared W with the sum of its "
                "heads' v's), available as this exception's W and v attributes; the split of "
                "a merged head's v among its heads is not"
            )
            err.W = [w.copy() for w in Ws]
            err.v = [x.copy() for x in vs]
            raise err
        self.W_ = [w.copy() for w in Ws]
        self.v_ = [x.copy() for x in vs]
        self.n_heads_ = int(Ws.shape[0])
        self.hidden_ = hidden
        self.func_err_ = float(ferr)
        self.head_separation_ = head_separation(Ws) if Ws.shape[0] > 1 else float("inf")
        if self.head_separation_ < self.separation_warn:
            warnings.warn(
                f"recovered heads nearly coincide (relative separation "
                f"{self.head_separation_:.1e} < {self.separation_warn:g}): the individual "
                "heads are ill-conditioned even though the function is reproduced "
                f"(functional error {ferr:.1e})",
                UserWarning,
                stacklevel=3,
            )

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered multi-head model on inputs X (B, N, d)."""
        X = np.asarray(X, dtype=np.float64)
        return multihead_eval(np.array(self.W_), np.array(self.v_), X)

    # -- signs and hidden heads ----------------------------------------------------------------
    def _resolve(self, ledger: QueryLedger, vsum, Wk, V, H, rng):
        """Choose each term's sign, and find heads invisible to two-row queries."""
        K, d = V.shape
        S = np.array(list(itertools.product([1.0, -1.0], repeat=K)))  # (2^K, K)
        L = vsum[None, :] - S @ V  # linear residual of each pattern
        scale = max(float(np.abs(V).max()), float(np.abs(vsum).max()), 1e-300)
        resid = np.linalg.norm(L, axis=1) / scale
        best = int(np.argmin(resid))
        tol = 1e-3
        target = K if H is None else H
        if resid[best] <= tol and (H is None or K >= H):
            if H is not None and K > H:
                raise AssumptionViolation(
                    f"the answers need at least {K} heads but n_heads={H}")
            s = S[best]
            return s[:, None, None] * Wk, s[:, None] * V, "none"
        if resid[best] <= tol:
            # fewer visible heads than asked for and nothing hidden: merged heads
            s = S[best]
            return s[:, None, None] * Wk, s[:, None] * V, "merged"
        if H is not None and K >= H:
            raise AssumptionViolation(
                f"the one-row answers carry a component that the {K} heads seen by two-row "
                "queries do not explain, and n_heads allows no further head"
            )
        # One hidden head: a head with W = 0, or one term split into a pair (W, -W).
        if not self.three_row_queries:
            raise NotIdentifiableError(
                "a head is invisible to two-row queries: the one-row answers carry a component "
                "the visible heads do not explain, which is either a head with W = 0 or a pair "
                "of heads with W_2 = -W_1 (sigma(-x) = 1 - sigma(x) makes them alike on two "
                "rows); three-row queries are needed to tell them apart "
                "(three_row_queries=True)"
            )
        if target - K > 1:
            raise AssumptionViolation(
                f"{target - K} heads are invisible to two-row queries; recovering more than one "
                "hidden head is not supported"
            )
        cands = []
        for si in range(S.shape[0]):
            s, Ls = S[si], L[si]
            Wb, vb = s[:, None, None] * Wk, s[:, None] * V
            cands.append((np.concatenate([Wb, np.zeros((1, d, d))]),
                          np.concatenate([vb, Ls[None]]), "zero_head"))
            for k in range(K):
                # (W, v1), (-W, v2) look like (W, v1 - v2) plus a W = 0 head with 2 v2
                v2 = vb.copy()
                v2[k] = vb[k] + 0.5 * Ls
                cands.append((np.concatenate([Wb, -Wb[k][None]]),
                              np.concatenate([v2, 0.5 * Ls[None]]), "pair"))
        X = random_queries(rng, d, 4 * d + 16, (3,), Wk)[0]
        yq = ledger.ask(X, "hidden")
        errs = np.array([np.linalg.norm(multihead_eval(Wc, vc, X) - yq) for Wc, vc, _ in cands])
        errs /= max(float(np.linalg.norm(yq)), 1e-300)
        i = int(np.argmin(errs))
        self.hidden_errors_ = errs
        return cands[i]

    # -- check -----------------------------------------------------------------------------------
    def _lengths(self):
        return (2, 3) if self.three_row_queries else (2,)

    def _check(self, ledger: QueryLedger, W, v, rng) -> float:
        d = W.shape[1]
        lengths = (1, 2, 3, 5) if self.three_row_queries else (1, 2)
        Xs = random_queries(rng, d, 32 * len(lengths), lengths, W)
        ys = [ledger.ask(X, "check") for X in Xs]
        return relative_rms_error(lambda X: multihead_eval(W, v, X), Xs, ys)
