"""Multi-head attention with orthogonal subspaces: recovery per head (App. C).

(The non-identifiable constructions of Prop. 7.1 are ground truth:
:func:`attnquery.models.non_identifiable_pair`, demonstrated by
:func:`attnquery.experiments.multihead.non_identifiability_demo`.)

:class:`OrthogonalSubspaceLearner` recovers the heads of a model that satisfies Assumption C.1
(each head's ``W_h`` and ``v_h`` live in its own subspace ``U_h``, the subspaces orthogonal):
with the bases given it is Prop. C.2 (each head by the single-head exact learner on queries whose
rows lie in ``U_h``); without them it first discovers the subspaces from finite-difference
Hessians (see the class docstring).
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np

from ..errors import AssumptionViolation, ConfigError, NotIdentifiableError
from ..models import AttentionHead, MultiHeadAttention
from ._base import (
    CHECK_LENGTH,
    CHECK_LENGTH_PARAM,
    DEFAULT_VERIFY,
    N_QUERIES_PARAM,
    ROUNDING_RTOL,
    BaseLearner,
    ForwardingOracle,
    QueryLedger,
    check_oracle,
    check_scalar,
)
from ._params import Interval, Options
from ._registry import LearnerSpec
from .exact import PROBE_DESIGNS, ExactValueQueryLearner, read_v

__all__ = ["OrthogonalSubspaceLearner"]

#: the stages ``n_queries_by_stage_`` counts: the bases' discovery, the heads, the check
STAGES = ("bases", "heads", "verify")


class _SubspaceOracle(ForwardingOracle):
    """A value oracle in reduced coordinates: ``Z (B, N, d_h) -> oracle(Z E^T)``.

    Every row of a query lies in ``range(E)``; the wrapped oracle counts the queries, and its
    budget is this oracle's (:class:`~attnquery.oracles.ForwardingOracle`).
    """

    def __init__(self, oracle, E):
        self._inner = oracle
        self._E = E

    @property
    def d(self) -> int:
        return int(self._E.shape[1])

    def __call__(self, Z):
        Z = np.asarray(Z, dtype=np.float64)
        return self._inner(np.ascontiguousarray(Z @ self._E.T))


def _check_bases(bases, d: int, H: int) -> list[np.ndarray]:
    if not isinstance(bases, list | tuple) or len(bases) != H:
        raise ConfigError(f"bases must be a list of n_heads={H} arrays (d, d_h); got {bases!r:.80}")
    out = []
    for h, E in enumerate(bases):
        E = np.asarray(E, dtype=np.float64)
        if E.ndim != 2 or E.shape[0] != d or not 1 <= E.shape[1] <= d:
            raise ConfigError(f"bases[{h}] must have shape ({d}, d_h); got {E.shape}")
        out.append(E)
    allE = np.concatenate(out, axis=1)
    if allE.shape[1] > d:
        raise ConfigError(f"the subspace dimensions sum to {allE.shape[1]} > d = {d}")
    G = allE.T @ allE
    err = float(np.max(np.abs(G - np.eye(G.shape[0]))))
    if err > 1e-8:
        raise ConfigError(
            "the bases must be orthonormal and mutually orthogonal (Assumption C.1); "
            f"max |E^T E - I| = {err:.2e}"
        )
    return out


#: relative disagreement of the check queries allowed with discovered bases (finite-difference
#: Hessians: 2e-11..7e-8 for steps 1e-3..1e-1 on d <= 24, H <= 4; up to 1e-6 at 1e-4 and 0.3)
DISCOVERY_VERIFY_RTOL = 1e-6


class OrthogonalSubspaceLearner(BaseLearner):
    """Multi-head attention under the orthogonal-subspace Assumption C.1, from value queries.

    With ``bases`` given (orthonormal ``E_h`` of shape (d, d_h)), this is Prop. C.2: on queries
    whose rows lie in ``U_h = range(E_h)`` only head h answers, and the single-head exact learner
    in reduced coordinates (``d_h + d_h^2`` queries) recovers ``W_h = E_h W~_h E_h^T`` and
    ``v_h = E_h v~_h``.

    With ``bases=None`` the subspaces are discovered first (the paper's conjecture, App. C):

    1. For random unit anchors ``y_k``, the Hessian at ``z = 0`` of
       ``g(z) = f([y + z; y]) - f([y; y])`` is ``M(y) = (1/4) sum_h (W_h y v_h^T + v_h y^T W_h^T)``
       (each term supported on one ``U_h``). It is read from the even part
       ``(g(z) + g(-z)) / 2 = (1/2) z^T M z + O(|z|^4)`` at ``z = h e_i`` and
       ``h (e_i + e_j)``, with two Richardson extrapolation steps (steps h, 2h, 4h).
    2. Each ``M(y)`` has rank <= 2 per block, so no single one separates the blocks; but the
       symmetric matrices X commuting with every ``M(y_k)`` form ``span{P_h}`` (H dimensions).
       The commutant is the null space of the stacked commutator map (SVD); a random element's
       eigenvalues fall in H clusters, whose eigenvectors are the bases.
    3. Each head then as in Prop. C.2 in the discovered bases.

    Parameters
    ----------
    n_heads : int
        Number of heads H.
    bases : None or list of H arrays (d, d_h)
        Known orthonormal bases of the subspaces.
    n_anchors : int or None
        Number of anchors ``y_k`` (Hessians) used to discover the subspaces. The Hessians of
        K anchors restricted to a block span at most ``K + 1`` directions of it, so a block of
        dimension d_h needs ``K >= d_h - 1``; None means ``ceil(d / H) + 2`` (equal blocks).
    fd_step : float
        Finite-difference step h of the Hessians (tokens have unit norm).
    probes : {"basis", "gaussian"}
        Probe design of the per-head exact learner (default: the paper's deterministic set,
        well conditioned in the small reduced dimensions d_h).
    verify : int
        Check queries spent after fitting (0: no check)
        (default 8: 6 fresh random queries of 2 to ``check_length`` tokens and copies of the
        two longest with their first N - 1 tokens permuted, which the box must answer alike;
        :func:`~attnquery.learners._base.check_plan`): the multi-head
        model found must agree
        with the oracle to :data:`ROUNDING_RTOL` with the bases given, or to
        :data:`DISCOVERY_VERIFY_RTOL` with the bases discovered (finite differences), else
        :class:`~attnquery.errors.ModelMismatchError`.
    check_length : int
        Tokens of the longest check queries (default 4096,
        :data:`~attnquery.learners._base.CHECK_LENGTH`; the others have 2 to 64 tokens,
        :func:`~attnquery.learners._base.check_lengths`). A box that is a layer of such heads
        on every input of up to ``check_length`` tokens, such as one with a wider sliding
        window, passes.
    n_queries : int, optional
        The most queries the whole fit asks, its check's included (default None: no cap;
        :class:`~attnquery.learners.base.BaseLearner` says how a cap is kept).
    random_state : int, sequence of ints, Generator or None
        Seed of the anchors, the per-head learners and the check queries.

    Attributes
    ----------
    W_, v_ : lists of H arrays (d, d) and (d,)
        The heads, in the order of the (given or discovered) subspaces.
    bases_ : list of H arrays (d, d_h)
    commutant_gap_ : float
        (Discovery only) ratio of the (H+1)-th smallest to the H-th smallest singular value of
        the commutator map: large when the commutant is cleanly H-dimensional.
    cluster_gap_ : float
        (Discovery only) smallest gap between eigenvalue clusters over the largest spread within
        a cluster, for the chosen commutant element.
    n_queries_, n_queries_bases_ : int
        Queries counted by the oracle during ``fit`` (the check queries included), and those
        spent on discovering the bases.
    n_queries_by_stage_ : dict
        Queries per stage: ``bases``, ``heads`` and ``verify`` (``n_queries_bases_`` reads it).
    n_verify_queries_ : int
        Check queries (``verify``).
    verify_error_ : float
        Largest disagreement on the check queries, relative to the largest answer.
    """

    _parameter_constraints = {
        **BaseLearner._parameter_constraints,
        "check_length": [CHECK_LENGTH_PARAM],
        "n_queries": [N_QUERIES_PARAM, None],
        "n_heads": [Interval(Integral, 1, None, closed="left")],
        "bases": ["array-like", None],
        "n_anchors": [Interval(Integral, 1, None, closed="left"), None],
        "fd_step": [Interval(Real, 0, 1, closed="neither")],
        "probes": [Options(PROBE_DESIGNS)],
    }
    spec = LearnerSpec(
        name="orthogonal", oracle="value", returns="heads", stages=STAGES,
        description="H heads with orthogonal subspaces, head by head (Appendix C)",
        label="orthogonal subspaces (App. C)")

    def __init__(self, *, n_heads: int, bases=None, n_anchors: int | None = None,
                 fd_step: float = 1e-2, probes: str = "basis", verify: int = DEFAULT_VERIFY,
                 check_length: int = CHECK_LENGTH, n_queries: int | None = None, random_state=None):
        self.n_heads = n_heads
        self.bases = bases
        self.n_anchors = n_anchors
        self.fd_step = fd_step
        self.probes = probes
        self.verify = verify
        self.check_length = check_length
        self.n_queries = n_queries
        self.random_state = random_state

    @property
    def n_queries_bases_(self) -> int:
        """Queries spent discovering the bases (``n_queries_by_stage_["bases"]``)."""
        return self._stage_count("bases")

    def fit(self, oracle):
        """Recover every head (up to permutation); returns self.

        Raises
        ------
        NotIdentifiableError
            If a head's value vector is 0 (its W cannot be read).
        ConfigError
            On invalid parameters or bases.
        ModelMismatchError
            The heads found disagree with the check queries (wrong number of heads, subspaces
            that are not orthogonal, a finite-difference step too small or too large).
        """
        self._validate_params()
        d = check_oracle(oracle)
        H = check_scalar(self.n_heads, "n_heads", Integral, min_val=1, max_val=d)
        rng = self._rng()
        r_disc, r_heads = rng.spawn(2)
        self.commutant_gap_ = np.nan
        self.cluster_gap_ = np.nan
        with self._open_ledger(oracle, STAGES) as ledger:
            with ledger.stage("bases"):
                if self.bases is not None:
                    bases = _check_bases(list(self.bases), d, H)
                else:
                    bases = self._discover(ledger, d, H, r_disc)
            with ledger.stage("heads"):
                W, v = self._fit_heads(oracle, bases, r_heads)
            self.W_ = W
            self.v_ = v
            self.bases_ = bases
            rtol = ROUNDING_RTOL if self.bases is not None else DISCOVERY_VERIFY_RTOL
            with ledger.stage("verify"):
                self._verify_fit(oracle, self.predict, rng.spawn(1)[0], rtol=rtol, n0=ledger.n0,
                                 what=f"the {H} heads found",
                                 hint="the box may not satisfy Assumption C.1 (orthogonal "
                                 "subspaces) with this number of heads, or its answers may "
                                 "carry noise", check_length=self.check_length)
        return self

    def _fit_heads(self, oracle, bases, rng):
        """Each head by the exact learner on its subspace; raises when a head's v is 0."""
        W, v = [], []
        for h, (E, r) in enumerate(zip(bases, rng.spawn(len(bases)), strict=True)):
            sub = _SubspaceOracle(oracle, E)
            try:
                est = ExactValueQueryLearner(probes=self.probes, random_state=r,
                                             verify=0).fit(sub)
            except (NotIdentifiableError, AssumptionViolation) as exc:
                # v_h = 0 reads as exact zeros, or as rounding noise from the other heads
                # (their v's are orthogonal to the queries only up to rounding)
                vt = read_v(sub, E.shape[1])
                others = [np.linalg.norm(read_v(_SubspaceOracle(oracle, F), F.shape[1]))
                          for g, F in enumerate(bases) if g != h]
                scale = max([*others, 1e-300])
                if isinstance(exc, NotIdentifiableError) or np.linalg.norm(vt) <= 1e-10 * scale:
                    raise NotIdentifiableError(
                        f"head {h}: its value vector is 0 on its subspace (|v~| = "
                        f"{np.linalg.norm(vt):.1e}), so its W is not identifiable"
                    ) from None
                raise
            W.append(E @ est.W_ @ E.T)
            v.append(E @ est.v_)
        # a dead head can also answer consistently, with v~ at the rounding level of the others
        norms = [float(np.linalg.norm(vh)) for vh in v]
        for h, nh in enumerate(norms):
            scale = max([*(n for g, n in enumerate(norms) if g != h), 1e-300])
            if nh <= 1e-10 * scale:
                raise NotIdentifiableError(
                    f"head {h}: its value vector is 0 on its subspace (|v~| = {nh:.1e}), so its "
                    "W is not identifiable"
                )
        return W, v

    def predict(self, X) -> np.ndarray:
        """Evaluate the recovered multi-head model on inputs X (B, N, d)."""
        return MultiHeadAttention(
            [AttentionHead(v, W=W) for W, v in zip(self.W_, self.v_, strict=True)]
        )(X)

    # ------------------------------------------------------------------------------------------
    def hessians(self, oracle, d: int, Y: np.ndarray) -> np.ndarray:
        """Finite-difference Hessians ``M(y_k)`` at ``z = 0`` for anchors Y (K, d).

        One batch of ``K (1 + 3 d (d + 1))`` queries (3 step sizes, +-z, the
        ``d (d + 1) / 2`` directions ``e_i`` and ``e_i + e_j``), asked through ``oracle`` when
        it is the fit's :class:`~attnquery.learners._base.QueryLedger` (else through a ledger
        of its own), which refuses it before it is asked when the budget cannot pay for it.
        """
        K = Y.shape[0]
        iu, ju = np.triu_indices(d)
        Zdir = np.zeros((iu.size, d))
        Zdir[np.arange(iu.size), iu] += 1.0
        Zdir[np.arange(iu.size), ju] += 1.0
        Zdir[iu == ju] *= 0.5  # e_i itself
        steps = self.fd_step * np.array([1.0, 2.0, 4.0])
        P = Zdir.shape[0]
        # queries: for each anchor, [y; y] and [y +- s z; y]
        n_per = 1 + 2 * steps.size * P
        X = np.empty((K, n_per, 2, d))
        X[:, :, 1, :] = Y[:, None, :]
        X[:, 0, 0, :] = Y
        sz = (steps[:, None, None] * Zdir[None, :, :]).reshape(-1, d)  # (3P, d)
        X[:, 1: 1 + sz.shape[0], 0, :] = Y[:, None, :] + sz[None]
        X[:, 1 + sz.shape[0]:, 0, :] = Y[:, None, :] - sz[None]
        ledger = oracle if isinstance(oracle, QueryLedger) else \
            QueryLedger(oracle, (), type(self).__name__)
        ledger.need(K * n_per, "the Hessians for subspace discovery")
        vals = ledger(X.reshape(K * n_per, 2, d)).reshape(K, n_per)
        f0 = vals[:, :1]
        fp = vals[:, 1: 1 + sz.shape[0]].reshape(K, steps.size, P)
        fm = vals[:, 1 + sz.shape[0]:].reshape(K, steps.size, P)
        # q(s) = 2 * even part / s^2 = z^T M z + c2 s^2 + c4 s^4 + ...
        q = (fp + fm - 2 * f0[:, :, None]) / steps[None, :, None] ** 2
        q1 = (4 * q[:, 0] - q[:, 1]) / 3  # O(s^4)
        q2 = (4 * q[:, 1] - q[:, 2]) / 3
        qz = (16 * q1 - q2) / 15  # O(s^6)
        M = np.zeros((K, d, d))
        diag = iu == ju
        M[:, iu[diag], iu[diag]] = qz[:, diag]
        off = ~diag
        # z = e_i + e_j: q = M_ii + M_jj + 2 M_ij
        mij = 0.5 * (qz[:, off] - M[:, iu[off], iu[off]] - M[:, ju[off], ju[off]])
        M[:, iu[off], ju[off]] = mij
        M[:, ju[off], iu[off]] = mij
        return M

    def _n_anchors(self, d: int, H: int) -> int:
        if self.n_anchors is not None:
            return int(self.n_anchors)
        return -(-d // H) + 2

    def _discover(self, oracle, d, H, rng):
        if H == 1:
            return [np.eye(d)]
        K = self._n_anchors(d, H)
        Y = rng.standard_normal((K, d))
        Y /= np.linalg.norm(Y, axis=1, keepdims=True)
        M = self.hessians(oracle, d, Y)
        # commutator map on symmetric matrices: X -> [M_k, X] for every k
        iu, ju = np.triu_indices(d)
        p = iu.size
        # column (i, j) of the map applied to X = E_ij + E_ji: M X - X M
        rows = []
        for Mk in M:
            C = np.zeros((d, d, p))
            ar = np.arange(p)
            C[:, ju, ar] += Mk[:, iu]
            C[:, iu, ar] += Mk[:, ju]
            C[iu, :, ar] -= Mk[ju, :]
            C[ju, :, ar] -= Mk[iu, :]
            diag = iu == ju
            C[:, :, diag] *= 0.5  # E_ii counted twice above
            rows.append(C.reshape(d * d, p))
        # Gram matrix of the stacked map (p x p): its eigenvectors are L's right singular
        # vectors, its eigenvalues the squared singular values
        G = sum(C.T @ C for C in rows)
        G /= max(np.trace(G), 1e-300)
        ev, Vg = np.linalg.eigh(G)
        sv = np.sqrt(np.maximum(ev[::-1], 1e-32))  # descending, as from an SVD
        Vt = Vg[:, ::-1].T
        null = Vt[-H:]  # the H smallest singular directions
        self.commutant_gap_ = float(sv[-H - 1] / max(sv[-H], 1e-300))
        self.commutant_singular_values_ = sv[-min(sv.size, H + 3):]
        # a random element of the commutant: H eigenvalue clusters
        best = None
        for _ in range(8):
            g = rng.standard_normal(H)
            Xv = g @ null
            Xm = np.zeros((d, d))
            Xm[iu, ju] = Xv
            Xm[ju, iu] = Xv
            lam, V = np.linalg.eigh(Xm)
            gaps = np.diff(lam)
            cut = np.sort(np.argsort(gaps)[-(H - 1):])
            groups = np.split(np.arange(d), cut + 1)
            spread = max(float(np.ptp(lam[gr])) for gr in groups)
            score = float(np.min(gaps[cut])) / max(spread, 1e-300)
            if best is None or score > best[0]:
                best = (score, V, groups)
        self.cluster_gap_ = best[0]
        V, groups = best[1], best[2]
        return [V[:, gr].copy() for gr in groups]
