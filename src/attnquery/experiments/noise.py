"""Experiments "noise" and "rounding": learning from approximate answers (paper Sec. 6).

"noise": Theorem 6.1's learner (and two baselines: the same learner without clipping, and
Theorem 4.1's exact learner) against :class:`~attnquery.oracles.ApproximateValueOracle` under
uniform and adversarial noise, over tau, mu, W_bound, d and seeds; plus an oversampling grid.
Every cell records Theorem 6.1's guarantee at its tau (``bound_W``, ``bound_v``), the tolerance
the theorem asks for eps_W = eps_v = ``eps`` (``required_tau``) and whether the errors are within
the guarantee (``within_bound``, only where the cell meets the theorem's assumptions; null
elsewhere).

"rounding": the output-rounding defence. The same heads behind a
:class:`~attnquery.oracles.RoundingOracle` (2..12 significant digits, float16, bfloat16), attacked
by the exact, the noisy and the low-rank sketch learner, and by the low-precision learner at
several budgets (``queries_per_unknown`` times ``d^2 + d`` queries).
"""

from __future__ import annotations

import numpy as np

from ..errors import AttnQueryError, ConfigError, ModelError
from ..learners import (
    ExactValueQueryLearner,
    NoisyValueQueryLearner,
    SketchLowRankLearner,
)
from ..metrics import fit_counted, head_errors
from ..models import AttentionHead
from ..oracles import ApproximateValueOracle, RoundingOracle
from ..theory import (
    USEFUL_REL_ERR,
    parse_rounding,
    theorem61_guarantee,
    theorem61_required_tau,
)
from . import Experiment, grid, register

__all__ = ["theorem_head", "assumptions_met", "rounding_oracle", "UndefinedEstimate",
           "NOISE_LEARNERS", "ROUNDING_LEARNERS"]

NOISE_LEARNERS = ("noisy", "unclipped", "exact")
#: float64 slack on the guarantee: adversarial noise meets ||v_hat - v|| <= sqrt(d) tau with
#: equality, up to the rounding of f(X) + tau (about 1e-16 absolute per answer)
BOUND_RTOL, BOUND_ATOL = 1e-9, 1e-14


def within(err: float, bound: float) -> bool:
    """``err <= bound`` up to float64 rounding of the answers."""
    return bool(err <= bound * (1 + BOUND_RTOL) + BOUND_ATOL)
ROUNDING_LEARNERS = ("exact", "noisy", "lowrank", "lowprecision")


def theorem_head(d: int, rng, W_bound: float, mu: float, zero_frac: float = 0.0,
                 W_frac: float = 1.0, rank: int | None = None) -> AttentionHead:
    """A head meeting Theorem 6.1's assumptions (when ``mu <= 1 / sqrt(d)``).

    W is Gaussian (or ``K^T Q`` of rank ``rank``) rescaled to ``||W||_F = W_frac * W_bound``;
    the nonzero ``|v_i|`` are uniform in ``[mu, max(mu, 1/sqrt(d))]`` with one equal to ``mu``
    (so ``||v|| <= 1``), and ``floor(zero_frac * d)`` entries (never all) are exactly 0.
    """
    rng = np.random.default_rng(rng)
    if not 0 < mu <= 1:
        raise ModelError(f"mu must be in (0, 1]; got {mu}")
    if rank is None:
        W = rng.standard_normal((d, d))
    else:
        W = rng.standard_normal((rank, d)).T @ rng.standard_normal((rank, d))
    nrm = np.linalg.norm(W)
    W = W * (W_frac * W_bound / nrm) if nrm > 0 else W
    hi = max(mu, 1.0 / np.sqrt(d))
    v = rng.choice([-1.0, 1.0], size=d) * rng.uniform(mu, hi, size=d)
    n_zero = min(int(np.floor(zero_frac * d)), d - 1)
    v[rng.permutation(d)[:n_zero]] = 0.0
    k = int(rng.choice(np.flatnonzero(v)))
    v[k] = np.sign(v[k]) * mu
    return AttentionHead(v, W=W)


def assumptions_met(head: AttentionHead, tau: float, W_bound: float, mu: float) -> bool:
    """Whether (head, tau) meet Theorem 6.1's assumptions for (W_bound, mu).

    The tolerance must be strictly below ``mu / 2``: at ``tau = mu / 2`` an entry
    ``|v_i| = mu`` can be answered as ``mu / 2``, which the proof's zero test
    (``|v_hat_i| <= mu / 2``) takes for a zero, and the adversarial oracle does exactly that.
    """
    v = head.v
    nz = np.abs(v[v != 0])
    return bool(
        W_bound >= 2
        and np.linalg.norm(head.W) <= W_bound * (1 + 1e-12)
        and np.linalg.norm(v) <= 1 + 1e-12
        and nz.size > 0
        and nz.min() >= mu * (1 - 1e-12)
        and tau < mu / 2
    )


class UndefinedEstimate(AttnQueryError):
    """The unclipped baseline applied sigma^{-1} to a weight estimate outside (0, 1)."""




# ---------------------------------------------------------------------------------------------
# noise
# ---------------------------------------------------------------------------------------------
def noise_cells(cfg) -> list[dict]:
    """Cells of "noise": the tau grid (``variant="tau"``) and the oversampling grid."""
    out = []
    for g in grid(
        learner=list(cfg["learners"]),
        noise=list(cfg["noise"]),
        d=cfg["d"],
        tau=cfg["tau"],
        mu=cfg["mu"],
        W_bound=cfg["W_bound"],
        seed=list(range(cfg["seeds"])),
    ):
        out.append({**g, "oversample": 1, "zero_frac": float(cfg.get("zero_frac", 0.25)),
                    "eps": float(cfg.get("eps", 1e-2)), "variant": "tau"})
    ov = cfg.get("oversample") or []
    if ov:
        for g in grid(
            noise=list(cfg["noise"]),
            oversample=list(ov),
            seed=list(range(cfg.get("oversample_seeds", cfg["seeds"]))),
        ):
            out.append({
                "learner": "noisy", **g, "d": int(cfg["d"][0]),
                "tau": float(cfg["oversample_tau"]), "mu": float(cfg["mu"][0]),
                "W_bound": float(cfg["W_bound"][0]),
                "zero_frac": float(cfg.get("zero_frac", 0.25)),
                "eps": float(cfg.get("eps", 1e-2)), "variant": "oversample",
            })
    return out


def noise_run(cell: dict, rng: np.random.Generator) -> dict:
    """Run one "noise" cell: a head meeting Theorem 6.1's assumptions, an approximate oracle,
    one learner. A learner that fails (the exact learner's AssumptionViolation, the unclipped
    learner's undefined logit) raises, and the cell's row gets status ``error``."""
    model_rng, noise_rng, learner_rng = rng.spawn(3)
    d, tau, mu, Wb = cell["d"], cell["tau"], cell["mu"], cell["W_bound"]
    head = theorem_head(d, model_rng, Wb, mu, zero_frac=cell["zero_frac"])
    oracle = ApproximateValueOracle(head, d, tau, noise=cell["noise"],
                                    random_state=noise_rng)
    met = assumptions_met(head, tau, Wb, mu)
    eps = cell["eps"]
    bound_W, bound_v = theorem61_guarantee(tau, d, Wb, mu)
    m = {
        "required_tau": theorem61_required_tau(d, Wb, mu, eps, eps),
        "bound_W": bound_W if np.isfinite(bound_W) else None,
        "bound_v": bound_v if np.isfinite(bound_v) else None,
    }
    extra = {"assumptions_met": met, "W_fro": float(np.linalg.norm(head.W)),
             "v_norm": float(np.linalg.norm(head.v))}
    learner = cell["learner"]
    if learner == "exact":
        est = ExactValueQueryLearner(probes="basis", random_state=learner_rng)
    else:
        est = NoisyValueQueryLearner(
            W_bound=Wb, mu=mu, eps_W=eps, eps_v=eps, oversample=cell["oversample"],
            random_state=learner_rng, clip=(learner == "noisy"),
            strict=(learner == "noisy"),
        )
    # the exact learner (float64 answers assumed) refuses noisy answers, and so may the noisy
    # learner outside the theorem's assumptions: the row records verified = False and the
    # estimate's errors
    m.update(fit_counted(est, oracle, record_refusal=True))
    if learner != "exact":
        extra["n_clipped"] = est.n_clipped_
        extra["n_out_of_range"] = est.n_out_of_range_
        if est.n_undefined_:
            raise UndefinedEstimate(
                f"sigma^(-1) of an attention-weight estimate outside (0, 1) at "
                f"{est.n_undefined_} of {d * d} probes: the unclipped estimate of W is undefined"
            )
    e = head_errors(est.W_, est.v_, head.W, head.v)
    if not all(np.isfinite(list(e.values()))):
        raise UndefinedEstimate(f"{learner}: the estimate has non-finite entries")
    m.update(e)
    if met:
        m["within_bound"] = bool(within(e["abs_err_W"], bound_W) and within(e["err_v"], bound_v))
    # success: the target (eps_W, eps_v) = (eps, eps) reached
    m["success"] = bool(e["abs_err_W"] <= eps and e["err_v"] <= eps)
    m["extra"] = extra
    return m


# ---------------------------------------------------------------------------------------------
# rounding
# ---------------------------------------------------------------------------------------------
def rounding_oracle(head, d: int, spec: str) -> RoundingOracle:
    """The rounding oracle named by ``spec`` (see :func:`parse_rounding`)."""
    return RoundingOracle(head, d, **parse_rounding(spec))


def rounding_cells(cfg) -> list[dict]:
    """Cells of "rounding": learner x rounding (digits, formats) x d x seed, and for the
    low-precision learner x ``lowprecision_queries_per_unknown``."""
    specs = [f"digits={k}" for k in cfg["digits"]] + list(cfg.get("dtypes", []))
    bad = [d for d in cfg["d"] if 2 * int(cfg["rank"]) > d]
    if "lowrank" in cfg["learners"] and bad:
        raise ConfigError(
            f"experiments.rounding.rank: {cfg['rank']} must be <= d / 2 for the low-rank learner; "
            f"d = {bad} is too small"
        )
    out = []
    for g in grid(
        learner=list(cfg["learners"]),
        rounding=specs,
        d=cfg["d"],
        seed=list(range(cfg["seeds"])),
    ):
        cell = {**g, "rank": int(cfg["rank"]), "mu": float(cfg["mu"]),
                "W_bound": float(cfg["W_bound"])}
        if g["learner"] != "lowprecision":
            out.append(cell)
            continue
        for q in cfg.get("lowprecision_queries_per_unknown", [4.0]):
            out.append({**cell, "queries_per_unknown": float(q)})
    return out


def rounding_run(cell: dict, rng: np.random.Generator) -> dict:
    """Run one "rounding" cell: a rank-``rank`` head behind a rounding oracle, one learner."""
    model_rng, learner_rng = rng.spawn(2)
    d, Wb, mu = cell["d"], cell["W_bound"], cell["mu"]
    head = theorem_head(d, model_rng, Wb, mu, zero_frac=0.0, rank=cell["rank"])
    oracle = rounding_oracle(head, d, cell["rounding"])
    extra = {"effective_digits": oracle.effective_digits, "relative_tau": oracle.relative_tau}
    learner = cell["learner"]
    if learner == "exact":
        est = ExactValueQueryLearner(probes="basis", random_state=learner_rng)
    elif learner == "noisy":
        # rounding error is relative, not a fixed tau: no assumption check
        est = NoisyValueQueryLearner(W_bound=Wb, mu=mu, strict=False, random_state=learner_rng)
    elif learner == "lowrank":
        est = SketchLowRankLearner(rank=cell["rank"], random_state=learner_rng)
    elif learner == "lowprecision":
        # imported here: lowprecision imports this module (rounding_oracle)
        from .lowprecision import budget_learner

        est = budget_learner(cell["queries_per_unknown"], d, learner_rng)
    else:
        raise ModelError(f"unknown rounding learner {learner!r}")
    # rounded answers are not float64 answers: the learners' checks refuse most estimates
    # (verified = False), and the row keeps their errors, which the defence is judged by
    counts = fit_counted(est, oracle, record_refusal=True)
    if learner == "lowprecision":
        extra.update(W_error_estimate=est.W_error_estimate_, noise_level=est.noise_level_,
                     n_passes=est.n_passes_)
    m = head_errors(est.W_, est.v_, head.W, head.v)
    if not all(np.isfinite(list(m.values()))):
        raise UndefinedEstimate(f"{learner}: the estimate has non-finite entries")
    m.update(counts)
    m["success"] = bool(m["rel_err_W"] <= USEFUL_REL_ERR)
    m["extra"] = extra
    return m




# Estimated seconds per cell on one core (attnquery.study: the cluster's runtime requests), from
# the wall times of the default study on a 2-core machine shared with other work, extrapolated
# with the benchmarks (README) to the sizes of config/paper.yaml.
def noise_seconds(cell) -> float:
    """2-3 ms per cell at d <= 16 (default study); d^2 and the oversampling factor."""
    return 0.003 + 2e-5 * cell["d"] ** 2 * cell.get("oversample", 1)


def rounding_seconds(cell) -> float:
    """2-3 ms per cell at d <= 16 (default study), d^2; the low-precision learner costs
    1.2e-8 s per query and dimension (as in the lowprecision experiment)."""
    d = cell["d"]
    q = cell.get("queries_per_unknown") or 0.0
    return 0.003 + 2e-5 * d**2 + 1.2e-8 * q * (d * d + d) * d


NOISE = register(Experiment(
    name="noise", cells=noise_cells, run=noise_run,
    description="Theorem 6.1 under uniform and adversarial noise (error against tau)",
    seconds=noise_seconds,
))
ROUNDING = register(Experiment(
    name="rounding", cells=rounding_cells, run=rounding_run,
    description="Output rounding as a defence (error against digits kept)",
    seconds=rounding_seconds,
))
