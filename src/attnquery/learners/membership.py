"""Recovery of a single attention head from membership queries (paper Appendix B).

The oracle only says whether ``f(X) > 0``. Only the direction of ``v`` is identifiable (the
answers do not change when v is scaled by a positive number), so the learner returns a unit
``v_`` and is scored against ``v / ||v||``. ``W`` is identifiable: the sign flips below depend on
``v`` only through the ratios ``v_j / v_i``.

**v** (two methods):

* ``"sampling"`` (the paper): ``k`` one-row queries with ``x`` uniform on the sphere, and
  ``v_hat = (1 / (R k)) sum_i (2 MQ(x_i) - 1) x_i`` with ``R = Gamma(d/2) / (sqrt(pi)
  Gamma((d+1)/2))``; Hoeffding gives ``||v_hat - v||_inf <= eps_v`` with probability
  ``1 - delta`` for ``k = ceil(2 / (eps_v^2 R^2) log(2 d / delta))`` (``O(d / eps_v^2)``).
  Theorem B.1 asks ``eps_v = eps mu^3 / (40 W d)``. The count is computed first
  (:meth:`MembershipLearner.sampling_queries`) and the learner refuses, before spending any
  query, when the fit's plan exceeds its budget ``n_queries`` or the oracle's budget, and,
  without ``n_queries``, when the sample exceeds :data:`MAX_SAMPLES`.
* ``"bisection"`` (beyond the paper): the signs of ``v_i`` from ``[e_i]`` (d queries), the
  largest ``|v_p|`` by a knockout tournament on ``[s_i e_i - s_j e_j]`` (d - 1 queries), then
  each ratio ``rho_i = |v_i| / |v_p|`` in ``[0, 1]`` by bisection on the sign of
  ``[s_i e_i - t s_p e_p]``, which is positive exactly when ``t < rho_i``
  (``O(d log(1/eps))`` queries in all).

**W** (the paper): entry by entry over the one-parameter family
``X(a) = [(s/a) e_i + a e_j; a e_j]`` with ``s = -sign(alpha) / (2 W)``, ``alpha = v_j / v_i``.
Its logit is ``s W_ij`` (``|s W_ij| <= 1/2``) and ``f(X(a)) = v_i (a alpha + sigma(s W_ij) s / a)``
changes sign exactly once, at ``a* = sqrt(sigma(s W_ij) / (2 W |alpha|))``. The bisection runs on
the candidate value ``w`` of ``W_ij`` in ``[-W, W]`` and asks ``X(a(w))`` with
``a(w) = sqrt(sigma(s w) / (2 W |alpha_hat|))``, a monotone reparametrisation of ``a``: the answer
says on which side of ``W_ij`` the candidate lies. All d^2 entries are bisected together, one
batch per step, ``ceil(log2(2 W d / eps))`` steps, so that each entry is within
``eps / (2 d)`` of the point where the sign flips; the ratios are read precisely enough
(``eps mu / (24 W d)``) that the error of ``alpha_hat`` moves that point by at most another
``eps / (2 d)``, hence ``||W_hat - W||_F <= eps``.

Query count of the bisection learner: ``d + (d - 1) + (d - 1) n_rho + d^2 n_W``
(:meth:`MembershipLearner.planned_queries`).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import NamedTuple

import numpy as np
import scipy.special

from ..errors import AssumptionViolation, BudgetExceededError, NotIdentifiableError
from ._base import (
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    BaseLearner,
    check_oracle,
    check_verify_param,
    chunk_slices,
    output_error_bound,
    renamed_parameter,
)
from ._params import DEPRECATED, Hidden, Interval, Options
from ._registry import LearnerSpec
from .noisy import TAU_CLIP, AssumptionParameterError

__all__ = ["MembershipLearner", "sphere_constant", "V_METHODS", "MAX_SAMPLES"]

V_METHODS = ("sampling", "bisection")
#: the stages ``n_queries_by_stage_`` counts
STAGES = ("v", "W", "verify")
#: default number of membership check queries
MEMBERSHIP_VERIFY = 64
#: the largest sample the sampling stage draws when the fit has no budget ``n_queries`` (a
#: plan larger than that is refused before any query, as Theorem B.1's sample at small eps
#: would run for days)
MAX_SAMPLES = 10**7


class _VStage(NamedTuple):
    """What the v stage found: the unit direction, the signs, the reference entry and its
    counts."""

    v: np.ndarray
    signs: np.ndarray
    ref_index: int
    n_ratio_steps: int
    n_samples: int
    n_extra: int  # d more when every [e_i] answers 0
    v_unnormalised: np.ndarray | None = None  # the sampling stage's estimate


class _WStage(NamedTuple):
    """What the W stage found: W, the entries whose flip lies beyond the bound, the queries
    that checked the ends."""

    W: np.ndarray
    n_beyond: int
    n_extra: int


def sphere_constant(d: int) -> float:
    """``R = E|x_1|`` for x uniform on the unit sphere of R^d (paper eq. (12))."""
    return float(np.exp(scipy.special.gammaln(d / 2) - scipy.special.gammaln((d + 1) / 2))
                 / np.sqrt(np.pi))


def _ask(oracle, X) -> np.ndarray:
    """The membership answers to X as booleans (an answer above 1/2)."""
    return np.asarray(oracle(X), dtype=float) > 0.5


def _subset_asker(oracle, d, ii, jj, s, abs_alpha, sign_vi, W):
    """``ask(w)``: for each entry (ii, jj), whether W_ij > w (one query per entry)."""
    n = ii.size
    rows = np.arange(n)

    def ask(w):
        a = np.sqrt(scipy.special.expit(s * w) / (2.0 * W * abs_alpha))
        X = np.zeros((n, 2, d))
        X[rows, 0, ii] += s / a
        X[rows, 0, jj] += a
        X[rows, 1, jj] = a
        ans = _ask(oracle, X)
        below = np.where(ans, 1.0, -1.0) * sign_vi == np.sign(s)
        return np.where(s > 0, below, ~below)

    return ask


class MembershipLearner(BaseLearner):
    """Recovery of (W, direction of v) from membership queries (Appendix B).

    Parameters
    ----------
    eps : float in (0, 1)
        Target ``||W_hat - W||_F`` (the paper's eps_W).
    v_method : {"sampling", "bisection"}
        How the direction of v is estimated (see the module docstring).
    W_bound : float >= 2
        Known bound on ``||W||_F``.
    mu : float in (0, 1]
        Margin: ``min_i |v_i| >= mu`` with ``||v|| = 1`` (every entry nonzero, App. B).
    eps_v : float, optional
        Target ``||v_hat - v/||v|| ||_inf`` of the v stage. Default: Theorem B.1's
        ``eps mu^3 / (40 W d)`` for sampling; for bisection, whatever the W stage needs.
        For bisection a given ``eps_v`` can only tighten the ratios' precision.
    delta : float in (0, 1)
        Failure probability of the sampling stage.
    n_queries : int, optional
        The fit's query budget (the cap of its query ledger): a plan that needs more (the v
        and W stages and the check) raises :class:`BudgetExceededError` naming the count,
        before any query. Default: the oracle's budget only, and a sampling stage of at most
        :data:`MAX_SAMPLES` sphere queries.
    sample_budget : int, optional
        Deprecated (a :class:`FutureWarning`; giving it with ``n_queries`` is a
        :class:`~attnquery.errors.ConfigError`): the largest sample the sampling stage will
        draw in place of :data:`MAX_SAMPLES`; pass ``n_queries``, the budget of the whole fit,
        instead.
    verify : int
        Membership check queries spent after fitting (0: no check). Where the estimate's sign
        is certain (its value exceeds the error the estimate can have there,
        :func:`~attnquery.learners._base.output_error_bound` with ``eps / d`` per entry of W
        and the v stage's precision), the oracle must give the same sign, else
        :class:`~attnquery.errors.ModelMismatchError`. An answer carries one bit, so the
        default is :data:`MEMBERSHIP_VERIFY`, more than the value learners' 8: 48 fresh
        random queries of 2 to ``check_length`` tokens (about 7 of each length) and 16 copies of
        the longest with their first N - 1 tokens permuted, whose signs must equal the
        originals' (:func:`~attnquery.learners._base.check_plan`). Where the estimate is
        unsure on every query the check is vacuous: ``verify_vacuous_`` and a
        :class:`~attnquery.errors.VacuousCheckWarning`.
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is a head on every
        input of up to ``check_length`` tokens, such as a wider sliding window, passes.
    random_state : int, Generator or None
        Seed of the sphere samples and of the check queries.

    Attributes
    ----------
    W_ : ndarray (d, d)
    v_ : ndarray (d,)
        Unit vector: the estimated direction of v.
    n_queries_, n_queries_v_, n_queries_W_ : int
        Queries counted by the oracle (in all, v stage, W stage); ``n_queries_`` includes the
        check queries.
    n_queries_by_stage_ : dict
        Queries per stage: ``v``, ``W`` and ``verify`` (``n_queries_v_`` and ``n_queries_W_``
        read it).
    n_verify_queries_ : int
        Check queries (``verify``).
    verify_error_ : float
        Fraction of the check queries whose sign disagrees where the estimate's is certain.
    err_W_, err_v_ : float
        Bounds on the error of each entry of ``W_`` and of ``v_`` (the unit direction).
    n_bisection_steps_ : int
        Steps per W entry.
    n_ratio_steps_ : int
        Bisection steps per ratio (v_method="bisection").
    n_samples_ : int
        Sphere samples (v_method="sampling").
    n_extra_queries_ : int
        Queries beyond :meth:`planned_queries`: d more when every ``[e_i]`` answers 0 (to tell
        ``v < 0`` from ``v = 0``), and one per W entry whose bisection never moved one end
        (to check it against the bound). Usually 0.
    n_beyond_bound_ : int
        Entries whose sign flip lies beyond ``[-W_bound, W_bound]``; they raise
        :class:`AssumptionViolation` unless ``eps_v`` was given (then the v stage may be less
        precise than the W stage needs, the flip's position reflects that error, and the entry
        is left at the bound).
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        "eps": [Interval(Real, 0, 1, closed="neither")],
        "v_method": [Options(V_METHODS)],
        "W_bound": [Interval(Real, 2, None, closed="left", note="App. B")],
        "mu": [Interval(Real, 0, 1, closed="right")],
        "eps_v": [Interval(Real, 0, 1, closed="neither"), None],
        "delta": [Interval(Real, 0, 1, closed="neither")],
        "n_queries": [Interval(Integral, 1, None, closed="left"), None],
        "sample_budget": [Interval(Integral, 1, None, closed="left"),
                          Hidden(Options({DEPRECATED}))],
    }
    #: the appendix's assumptions: a bad value is also an AssumptionViolation
    _parameter_errors = {name: AssumptionParameterError for name in ("W_bound", "mu")}
    spec = LearnerSpec(
        name="membership", oracle="membership", returns="head", stages=STAGES,
        description="membership queries 1[f(X) > 0] (Appendix B)",
        variants={"paper": {"v_method": "sampling"}}, label="membership (App. B)")

    def __init__(self, *, eps: float = 1e-3, v_method: str = "bisection",
                 W_bound: float = 4.0, mu: float = 0.1, eps_v: float | None = None,
                 delta: float = 0.05, n_queries: int | None = None,
                 sample_budget: int | str = DEPRECATED, verify: int = MEMBERSHIP_VERIFY,
                 check_length: int = CHECK_LENGTH, random_state=None):
        self.eps = eps
        self.v_method = v_method
        self.W_bound = W_bound
        self.mu = mu
        self.eps_v = eps_v
        self.delta = delta
        self.n_queries = n_queries
        self.sample_budget = sample_budget
        self.verify = verify
        self.check_length = check_length
        self.random_state = random_state

    @property
    def n_queries_v_(self) -> int:
        """Queries of the v stage (``n_queries_by_stage_["v"]``)."""
        return self._stage_count("v")

    @property
    def n_queries_W_(self) -> int:
        """Queries of the W stage (``n_queries_by_stage_["W"]``)."""
        return self._stage_count("W")

    def _validate_extra(self) -> None:
        """``sample_budget`` (deprecated): a FutureWarning, or a ConfigError beside
        ``n_queries``."""
        renamed_parameter(self, "sample_budget", "n_queries")

    # -- sizes, computable before any query --------------------------------------------------
    def max_samples(self) -> int | None:
        """The largest sample the sampling stage draws: the deprecated ``sample_budget`` when
        given, else :data:`MAX_SAMPLES` without ``n_queries``, else None (the fit's budget
        bounds it)."""
        old = renamed_parameter(self, "sample_budget", "n_queries", warn=False)
        if old is not None:
            return int(old)
        return MAX_SAMPLES if self.n_queries is None else None

    def _sampling_eps_v(self, d: int) -> float:
        if self.eps_v is not None:
            return float(self.eps_v)
        return float(self.eps) * float(self.mu) ** 3 / (40.0 * float(self.W_bound) * d)

    def sampling_queries(self, d: int) -> int:
        """Sphere samples the sampling stage needs at dimension ``d`` (Hoeffding, App. B).

        ``ceil(2 / (eps_v^2 R^2) log(2 d / delta))``, with ``eps_v`` as in the parameters.
        """
        self._validate_params()
        eps_v = self._sampling_eps_v(d)
        R = sphere_constant(d)
        return int(math.ceil(2.0 / (eps_v**2 * R**2) * math.log(2.0 * d / self.delta)))

    def _steps(self, d: int) -> tuple[int, int]:
        """(steps per W entry, steps per ratio) of the bisection stages."""
        W, mu, eps = float(self.W_bound), float(self.mu), float(self.eps)
        eta = eps / d  # per-entry target
        n_W = int(math.ceil(math.log2(2.0 * W / eta)))
        delta_rho = eta * mu / (24.0 * W)
        if self.eps_v is not None:
            delta_rho = min(delta_rho, float(self.eps_v) / (1.0 + math.sqrt(d)))
        n_rho = int(math.ceil(math.log2(1.0 / (2.0 * delta_rho))))
        return n_W, n_rho

    def planned_queries(self, d: int) -> dict:
        """Queries each stage will ask at dimension ``d`` (``n_extra_queries_`` come on top)."""
        self._validate_params()
        n_W, n_rho = self._steps(d)
        if self.v_method == "bisection":
            nv = d + (d - 1) + (d - 1) * n_rho
        else:
            nv = self.sampling_queries(d)
        return {"v": int(nv), "W": int(d * d * n_W), "total": int(nv + d * d * n_W)}

    # -- fit ------------------------------------------------------------------------------------
    def fit(self, oracle):
        """Recover W and the direction of v from a membership oracle; returns self.

        Raises
        ------
        NotIdentifiableError
            The oracle never answers 1 (v = 0): nothing is identifiable.
        BudgetExceededError
            The plan needs more than ``n_queries`` or the oracle's budget, or the sampling
            stage more than :meth:`max_samples` queries (raised before any query, with the
            count needed).
        AssumptionViolation
            An entry of W lies outside ``[-W_bound, W_bound]`` (``||W||_F > W_bound``).
        """
        self._validate_params()
        d = check_oracle(oracle, kinds=("membership",))
        n0 = oracle.n_queries
        plan = self.planned_queries(d)
        self._check_sample(d, plan["v"])
        n_check = check_verify_param(self.verify)
        with self._open_ledger(oracle, STAGES, cap=self.n_queries) as ledger:
            ledger.need(plan["total"] + n_check,
                        f"membership recovery ({plan['v']} queries for v, {plan['W']} for W, "
                        f"{n_check} check queries)")
            with ledger.stage("v"):
                if self.v_method == "bisection":
                    vs = self._v_bisection(ledger, d)
                else:
                    vs = self._v_sampling(ledger, d, plan["v"])
            with ledger.stage("W"):
                ws = self._W_bisection(ledger, d, vs.v, vs.signs)
            self.W_ = ws.W
            self.v_ = vs.v
            self.ref_index_ = vs.ref_index
            self.n_bisection_steps_ = self._steps(d)[0]
            self.n_ratio_steps_ = vs.n_ratio_steps
            self.n_samples_ = vs.n_samples
            if vs.v_unnormalised is not None:
                self.v_unnormalised_ = vs.v_unnormalised
            self.n_extra_queries_ = vs.n_extra + ws.n_extra
            self.n_beyond_bound_ = ws.n_beyond
            self.err_v_ = self._v_error(d, vs.n_ratio_steps)
            self.err_W_ = self._W_error(d, self.err_v_)
            with ledger.stage("verify"):
                self._verify_fit(
                    ledger, self.predict, self._rng().spawn(1)[0], rtol=0.0, n0=n0, signs=True,
                    atol=lambda X: output_error_bound(X, self.v_, self.err_W_, self.err_v_),
                    check_length=self.check_length)
        return self

    def _check_sample(self, d: int, k: int) -> None:
        """Refuse a sampling stage of ``k`` sphere queries larger than :meth:`max_samples`
        (:class:`BudgetExceededError`, before any query)."""
        limit = self.max_samples()
        if self.v_method != "sampling" or limit is None or k <= limit:
            return
        given = renamed_parameter(self, "sample_budget", "n_queries", warn=False)
        raise BudgetExceededError(
            f"the sampling stage for v needs k = {k} sphere queries (eps_v = "
            f"{self._sampling_eps_v(d):.3g}, d = {d}, delta = {self.delta:g}) but "
            + (f"sample_budget = {limit}" if given is not None else
               f"at most MAX_SAMPLES = {limit} are drawn without n_queries")
            + "; no query was spent")

    def _W_error(self, d: int, err_v: float) -> float:
        """Bound on each entry of ``W_``'s error: the bisection's ``eps / (2d)`` plus the shift
        of the sign flip that an error ``err_v`` in the unit ``v_`` causes (the flip solves
        ``sigma(s w) = sigma(s W_ij) |alpha_hat| / |alpha|``, ``|s| = 1 / (2 W)``, and
        ``|alpha_hat / alpha - 1| <= 2 err_v / mu``)."""
        W, mu = float(self.W_bound), float(self.mu)
        return float(self.eps) / (2 * d) + 2.0 * W / TAU_CLIP * 2.0 * err_v / mu

    def _v_error(self, d: int, n_ratio_steps: int) -> float:
        """Bound on each entry of the unit ``v_``'s error: ``2 sqrt(d)`` times the error of the
        unnormalised estimate (the ratios', after ``n_ratio_steps``, or the sampling stage's
        ``eps_v``)."""
        if self.v_method == "bisection":
            per_entry = 0.5 ** (n_ratio_steps + 1)
        else:
            per_entry = self._sampling_eps_v(d)
        return float(2.0 * np.sqrt(d) * per_entry)

    def _signs(self, oracle, d) -> tuple[np.ndarray, int]:
        """The signs of v from ``[e_i]``, and the queries asked beyond the plan (d more when
        every ``[e_i]`` answers 0, to tell ``v < 0`` from ``v = 0``)."""
        pos = _ask(oracle, np.eye(d)[:, None, :].copy())
        extra = 0
        if not pos.any():
            extra = d
            neg = _ask(oracle, -np.eye(d)[:, None, :])
            if not neg.any():
                raise NotIdentifiableError(
                    "the membership oracle never answers 1 (on e_i nor -e_i): v = 0, so "
                    "neither v nor W is identifiable"
                )
        return np.where(pos, 1.0, -1.0), extra

    def _v_bisection(self, oracle, d) -> _VStage:
        sgn, extra = self._signs(oracle, d)
        n_rho = self._steps(d)[1]
        # knockout tournament for p = argmax |v_i|: [s_i e_i - s_j e_j] -> 1 iff |v_i| > |v_j|
        cand = np.arange(d)
        while cand.size > 1:
            m = cand.size // 2
            A, B, rest = cand[0:2 * m:2], cand[1:2 * m:2], cand[2 * m:]
            X = np.zeros((m, 1, d))
            X[np.arange(m), 0, A] = sgn[A]
            X[np.arange(m), 0, B] = -sgn[B]
            win = np.where(_ask(oracle, X), A, B)
            cand = np.concatenate([win, rest])
        p = int(cand[0])
        others = np.array([i for i in range(d) if i != p], dtype=int)
        lo = np.zeros(others.size)
        hi = np.ones(others.size)
        for _ in range(n_rho if others.size else 0):
            t = 0.5 * (lo + hi)
            X = np.zeros((others.size, 1, d))
            X[np.arange(others.size), 0, others] = sgn[others]
            X[np.arange(others.size), 0, p] = -t * sgn[p]
            above = _ask(oracle, X)  # |v_i| > t |v_p|  <=>  t < rho_i
            lo = np.where(above, t, lo)
            hi = np.where(above, hi, t)
        rho = np.ones(d)
        rho[others] = 0.5 * (lo + hi)
        v = sgn * rho
        return _VStage(v / np.linalg.norm(v), sgn, p, n_rho, 0, extra)

    def _v_sampling(self, oracle, d, k) -> _VStage:
        rng = self._rng()
        acc = np.zeros(d)
        n_pos = 0
        for sl in chunk_slices(k, max(1, (16 * 2**20) // (8 * d))):
            G = rng.standard_normal((sl.stop - sl.start, d))
            G /= np.linalg.norm(G, axis=1, keepdims=True)
            ans = _ask(oracle, G[:, None, :])
            n_pos += int(ans.sum())
            acc += np.where(ans, 1.0, -1.0) @ G
        if n_pos == 0:
            raise NotIdentifiableError(
                f"the membership oracle answered 0 to all {k} sphere queries: v = 0 (or "
                "indistinguishable from it), so nothing is identifiable"
            )
        v = acc / (sphere_constant(d) * k)
        nrm = np.linalg.norm(v)
        return _VStage(v / nrm, np.where(v >= 0, 1.0, -1.0), int(np.argmax(np.abs(v))), 0,
                       int(k), 0, v)

    def _W_bisection(self, oracle, d, v_dir, sgn) -> _WStage:
        W = float(self.W_bound)
        n_W = self._steps(d)[0]
        ii, jj = (g.ravel() for g in np.meshgrid(np.arange(d), np.arange(d), indexing="ij"))
        vi, vj = v_dir[ii], v_dir[jj]
        if np.any(vi == 0):
            raise AssumptionViolation("an entry of the estimated v is exactly 0: the margin "
                                      "assumption min |v_i| >= mu > 0 does not hold")
        alpha = vj / vi
        s = -np.where(alpha >= 0, 1.0, -1.0) / (2.0 * W)
        abs_alpha = np.maximum(np.abs(alpha), 1e-300)
        sign_vi = sgn[ii]
        n = ii.size
        ask = _subset_asker(oracle, d, ii, jj, s, abs_alpha, sign_vi, W)
        lo = np.full(n, -W)
        hi = np.full(n, W)
        moved_lo = np.zeros(n, dtype=bool)
        moved_hi = np.zeros(n, dtype=bool)
        n_beyond, n_extra = 0, 0
        for _ in range(n_W):
            w = 0.5 * (lo + hi)
            up = ask(w)
            lo = np.where(up, w, lo)
            hi = np.where(up, hi, w)
            moved_lo |= up
            moved_hi |= ~up
        # an entry whose bisection never moved one end may lie beyond [-W, W]: ask the end
        edge = ~(moved_lo & moved_hi)
        if edge.any():
            idx = np.flatnonzero(edge)
            w_end = np.where(moved_lo[idx], W, -W)
            sub = _subset_asker(oracle, d, ii[idx], jj[idx], s[idx], abs_alpha[idx],
                                sign_vi[idx], W)
            up = sub(w_end)
            n_extra = int(idx.size)
            beyond = np.where(w_end > 0, up, ~up)
            n_beyond = int(beyond.sum())
            # with a v stage less precise than the W stage needs (eps_v given), a flip beyond
            # the range reflects alpha_hat's error, not W: the entry stays at the bound
            if beyond.any() and self.eps_v is None:
                k = idx[np.flatnonzero(beyond)[0]]
                raise AssumptionViolation(
                    f"W[{ii[k]}, {jj[k]}] lies outside [-W_bound, W_bound] = [{-W:g}, {W:g}]: "
                    f"the membership answers imply ||W||_F > W_bound ({int(beyond.sum())} "
                    "entries)"
                )
        return _WStage((0.5 * (lo + hi)).reshape(d, d), n_beyond, n_extra)

    def predict(self, X) -> np.ndarray:
        """Values of the recovered head (unit ``v_``) on inputs X (B, N, d): the true head's
        divided by ``||v||``."""
        from ..models import AttentionHead

        return AttentionHead(self.v_, W=self.W_)(X)

    def predict_sign(self, X) -> np.ndarray:
        """Membership answers (0/1) of the recovered head on inputs X (B, N, d)."""
        return (self.predict(X) > 0).astype(float)
