"""NoisyValueQueryLearner (Theorem 6.1) and the noise / rounding experiments' claims."""

import numpy as np
import pandas as pd
import pytest

from attnquery.errors import (
    AssumptionViolation,
    ConfigError,
    ModelMismatchError,
    NotIdentifiableError,
    VacuousCheckWarning,
)
from attnquery.experiments import expand_cells, run_cells
from attnquery.experiments.noise import within
from attnquery.figures.noise import noise_claims, oversample_claims
from attnquery.figures.rounding import rounding_claims, useful_digits
from attnquery.learners import NoisyValueQueryLearner
from attnquery.learners.noisy import L_CLIP, TAU_CLIP, theorem61_guarantee
from attnquery.models import AttentionHead, assumptions_met, theorem_head
from attnquery.oracles import ApproximateValueOracle, MembershipOracle, ValueOracle
from attnquery.results import rows_to_table

from .vacuous import fit_noting_vacuous
from .vector_boxes import ScalarHead


def test_clip_constants_match_lemma_a1():
    assert TAU_CLIP == pytest.approx(1 / (1 + np.exp(0.5)))
    assert L_CLIP <= 5 and L_CLIP == pytest.approx(4.2553, abs=1e-3)


def test_exact_answers_give_exact_recovery():
    head = theorem_head(6, 0, 4.0, 0.1, zero_frac=0.34)
    est = NoisyValueQueryLearner(W_bound=4.0, mu=0.1).fit(ValueOracle(head, 6))
    assert np.max(np.abs(est.W_ - head.W)) < 1e-12
    assert np.array_equal(est.v_ == 0, head.v == 0)
    assert est.n_queries_ == 6 + 36 + est.n_verify_queries_ and est.n_verify_queries_ == 8


@pytest.mark.parametrize("noise", ["uniform", "adversarial"])
@pytest.mark.parametrize("d,W_bound,mu", [(3, 2.0, 0.2), (6, 8.0, 0.05), (8, 4.0, 0.1)])
def test_error_within_theorem_guarantee(noise, d, W_bound, mu):
    for seed in range(3):
        head = theorem_head(d, seed, W_bound, mu, zero_frac=0.25)
        for tau in (1e-8, 1e-5, 1e-3, 0.49 * mu):
            assert assumptions_met(head, tau, W_bound, mu)
            o = ApproximateValueOracle(head, d, tau, noise=noise, random_state=seed)
            est = fit_noting_vacuous(
                NoisyValueQueryLearner(W_bound=W_bound, mu=mu, random_state=seed), o)
            # the check is a check at small tau, and cannot fail at the theorem's limit
            assert est.verify_vacuous_ == (tau > 1e-3) or 1e-8 < tau <= 1e-3
            bW, bv = theorem61_guarantee(tau, d, W_bound, mu)
            assert np.linalg.norm(est.W_ - head.W) <= bW
            # adversarial noise meets the v bound with equality (up to float64 rounding)
            assert within(np.linalg.norm(est.v_ - head.v), bv)
            assert o.n_queries == d + d * d + est.n_verify_queries_


def test_error_is_linear_in_tau():
    head = theorem_head(5, 1, 4.0, 0.1, zero_frac=0.2)
    taus = np.geomspace(1e-9, 1e-5, 5)
    errs = [np.linalg.norm(NoisyValueQueryLearner(W_bound=4.0, mu=0.1).fit(
        ApproximateValueOracle(head, 5, t, noise="adversarial", random_state=0)).W_ - head.W)
        for t in taus]
    slope = np.polyfit(np.log(taus), np.log(errs), 1)[0]
    assert 0.95 <= slope <= 1.05


def test_required_tau_is_the_theorems():
    est = NoisyValueQueryLearner(W_bound=4.0, mu=0.1, eps_W=1e-2, eps_v=1e-2).fit(
        ValueOracle(theorem_head(4, 0, 4.0, 0.1), 4))
    assert est.required_tau_ == pytest.approx(min(0.05, 1e-2 / 2, 0.1 * 1e-2 / (160 * 16 * 4)))


def test_a_value_oracle_around_a_noisy_function_works():
    head = theorem_head(5, 2, 4.0, 0.1, zero_frac=0.2)
    tau = 1e-6
    rng = np.random.default_rng(0)

    def noisy(X):  # a black box that is noisy by itself (not deterministic even)
        return head(X) + tau * rng.uniform(-1, 1, size=X.shape[0])

    est = NoisyValueQueryLearner(W_bound=4.0, mu=0.1, tau=tau).fit(ValueOracle(noisy, 5))
    bW, bv = theorem61_guarantee(tau, 5, 4.0, 0.1)
    assert np.linalg.norm(est.W_ - head.W) <= bW and np.linalg.norm(est.v_ - head.v) <= bv


def test_oversampling_reduces_random_error_and_counts_queries():
    head = theorem_head(4, 3, 2.0, 0.1, zero_frac=0.25)
    med = {}
    for k in (1, 16):
        errs = []
        for s in range(6):
            o = ApproximateValueOracle(head, 4, 1e-4, random_state=s)
            est = fit_noting_vacuous(NoisyValueQueryLearner(W_bound=2.0, mu=0.1, oversample=k,
                                              random_state=s), o)
            assert o.n_queries == k * (4 + 16) + est.n_verify_queries_
            errs.append(np.linalg.norm(est.W_ - head.W))
        med[k] = np.median(errs)
    assert med[16] < med[1] / 2.5  # 1/sqrt(16) = 1/4, with the smaller probes' loss


def test_unclipped_baseline_is_undefined_under_large_noise():
    head = theorem_head(6, 0, 8.0, 0.05, zero_frac=0.0)
    o = ApproximateValueOracle(head, 6, 1e-2, noise="adversarial")
    unc = NoisyValueQueryLearner(W_bound=8.0, mu=0.05, clip=False, strict=False)
    with pytest.raises(AssumptionViolation, match="undefined"):
        unc.fit(o)
    clipped = fit_noting_vacuous(NoisyValueQueryLearner(W_bound=8.0, mu=0.05), o)
    assert unc.n_undefined_ > 0 and np.isnan(unc.W_).any()
    assert np.all(np.isfinite(clipped.W_)) and clipped.n_clipped_ > 0


def test_norm_bound_violation_is_detected():
    head = theorem_head(4, 0, 4.0, 0.1)
    big = AttentionHead(head.v, W=head.W * 6)  # ||W||_F = 24 > W_bound = 4
    with pytest.raises(AssumptionViolation, match="W_bound"):
        NoisyValueQueryLearner(W_bound=4.0, mu=0.1).fit(ApproximateValueOracle(big, 4, 1e-6))
    # non-strict: clipped and counted, and the clipped estimate fails its check (seeded: about
    # 1 draw in 150 of the check's queries leaves the clipped estimate's check vacuous, and the
    # fit returns with a VacuousCheckWarning instead)
    est = NoisyValueQueryLearner(W_bound=4.0, mu=0.1, strict=False, random_state=0)
    with pytest.raises(ModelMismatchError, match="tau = 1e-06"):
        est.fit(ApproximateValueOracle(big, 4, 1e-6))
    assert est.n_out_of_range_ > 0 and est.verify_error_ > 0.01


@pytest.mark.parametrize("kw,match", [
    ({"mu": 0.0}, "mu"), ({"mu": 1.5}, "mu"), ({"W_bound": 1.0}, "W_bound"),
    ({"eps_W": -1.0}, "eps_W"), ({"oversample": 0}, "oversample"),
])
def test_bad_parameters(kw, match):
    params = {"W_bound": 4.0, "mu": 0.1, **kw}
    with pytest.raises(ConfigError, match=match):
        NoisyValueQueryLearner(**params).fit(ValueOracle(theorem_head(3, 0, 4.0, 0.1), 3))


@pytest.mark.parametrize("kw", [{"mu": 0.0}, {"mu": 1.5}, {"W_bound": 1.0}, {"tau": -1.0}])
def test_assumption_parameters_are_also_assumption_violations(kw):
    params = {"W_bound": 4.0, "mu": 0.1, **kw}
    with pytest.raises(AssumptionViolation):
        NoisyValueQueryLearner(**params).fit(ValueOracle(theorem_head(3, 0, 4.0, 0.1), 3))


def test_zero_v_is_not_identifiable_and_membership_oracles_are_refused():
    zero = AttentionHead(np.zeros(3), W=np.eye(3))
    with pytest.raises(NotIdentifiableError, match="v = 0"):
        NoisyValueQueryLearner(W_bound=4.0, mu=0.1).fit(ApproximateValueOracle(zero, 3, 1e-4))
    with pytest.raises(ConfigError, match="membership"):
        NoisyValueQueryLearner(W_bound=4.0, mu=0.1).fit(MembershipOracle(zero, 3))


def _rows(name, cfg):
    rows, _ = run_cells(expand_cells(name, cfg), 20260122)
    return rows_to_table(rows).to_pandas()


def test_noise_experiment_claims_hold():
    # the grid runs tau up to 1e-2, where the check cannot fail (it warns, and the rows say so)
    with pytest.warns(VacuousCheckWarning, match="could not fail"):
        df = _rows("noise", {
            "learners": ["noisy", "unclipped"], "noise": ["uniform", "adversarial"],
            "d": [4, 6], "tau": [1e-9, 1e-7, 1e-5, 1e-3, 1e-2], "mu": [0.05, 0.2],
            "W_bound": [2.0, 8.0], "seeds": 2, "oversample": [1, 4, 16, 64],
            "oversample_tau": 1e-4, "oversample_seeds": 5,
        })
    checked = df[df["status"] == "ok"]
    assert not checked[checked["tau"] <= 1e-7]["verify_vacuous"].any()
    assert checked[checked["tau"] >= 1e-3]["verify_vacuous"].all()
    # the clipped learner never fails; the unclipped one fails (status error) at large tau
    assert (df[df["learner"] == "noisy"]["status"] == "ok").all()
    failed = df[df["status"] != "ok"]
    assert set(failed["learner"]) == {"unclipped"}
    assert failed["message"].str.contains("undefined").all()
    claims = {c.name: c for c in noise_claims(df)}
    for name in ("noise_bound_uniform", "noise_bound_adversarial", "noise_slope_uniform",
                 "noise_slope_adversarial", "noise_unclipped_fails", "noise_checks",
                 "noise_oversample"):
        assert claims[name].passed, claims[name]
    # an exact learner that accepts a noisy oracle, or a noisy learner that refuses one, makes
    # the checks' claim fail
    exact = df[df["learner"] == "noisy"].head(3).assign(learner="exact", verified=False)
    with_exact = pd.concat([df, exact])
    assert {c.name: c for c in noise_claims(with_exact)}["noise_checks"].passed
    exact.loc[exact.index[0], "verified"] = True
    assert not {c.name: c for c in noise_claims(pd.concat([df, exact]))}["noise_checks"].passed
    refused = df.copy()
    refused.loc[refused.index[refused["learner"] == "noisy"][0], "verified"] = False
    assert not {c.name: c for c in noise_claims(refused)}["noise_checks"].passed
    # a broken guarantee makes the claim fail (the claim can fail)
    bad = df.copy()
    bad.loc[bad["learner"] == "noisy", "within_bound"] = False
    assert not {c.name: c for c in noise_claims(bad)}["noise_bound_uniform"].passed


def _oversample_rows(exponent, spread, noise="uniform"):
    """Rows of the oversampling grid whose error falls like ``k^exponent`` (times a seeded
    log-normal scatter of size ``spread``)."""
    import pandas as pd

    rng = np.random.default_rng(0)
    k = np.array([1, 4, 16, 64] * 5)
    seed = np.repeat(np.arange(5), 4)
    err = (1 + seed) * 1e-3 * k**exponent * np.exp(spread * rng.standard_normal(k.size))
    return pd.DataFrame({"experiment": "noise", "status": "ok", "variant": "oversample",
                         "noise": noise, "oversample": k, "seed": seed, "abs_err_W": err})


@pytest.mark.parametrize("exponent, spread, passed", [
    (-0.44, 0.05, True),  # least squares' rate with probes of scale in [1/2, 1]
    (-0.5, 0.05, True),   # plain averaging
    (-0.2, 0.05, False),  # falls, but slower than least squares allows
    (-0.8, 0.05, False),  # faster than averaging: not independent noise
    (0.0, 0.05, False),   # does not fall
    (-0.44, 1.0, False),  # an interval that does not exclude 0 says nothing
])
def test_the_oversampling_claim_is_checked_by_its_interval(exponent, spread, passed):
    claims = oversample_claims(_oversample_rows(exponent, spread))
    assert [c.name for c in claims] == ["noise_oversample"]
    assert claims[0].passed is passed, claims[0]
    # adversarial rows are not the claim's, and one factor gives no claim
    assert oversample_claims(_oversample_rows(exponent, spread, "adversarial")) == []
    one = _oversample_rows(exponent, spread)
    assert oversample_claims(one[one["oversample"] == 4]) == []


def test_the_oversampling_range_is_least_squares_on_the_grid():
    from attnquery.theory import oversample_exponent_range

    steep, shallow = oversample_exponent_range([1, 2, 4, 8, 16, 32, 64])
    assert steep == -0.5 and shallow == pytest.approx(-0.3438, abs=1e-4)
    # every extra probe at half scale: k probes weigh 1 + (k - 1) / 4, so from k = 1 to 13 the
    # standard deviation halves and the two-point slope is log(1/2) / log(5)
    assert oversample_exponent_range([1, 13])[1] == pytest.approx(np.log(0.5) / np.log(13))
    with pytest.raises(ConfigError):
        oversample_exponent_range([4, 4])
    with pytest.raises(ConfigError):
        oversample_exponent_range([0, 1])


def test_rounding_experiment_claims_hold():
    df = _rows("rounding", {
        "learners": ["exact", "noisy", "lowrank"], "digits": [2, 4, 6, 8, 10, 12],
        "dtypes": ["float16", "bfloat16"], "d": [8], "seeds": 2, "rank": 2, "mu": 0.1,
        "W_bound": 4.0,
    })
    assert (df["status"] == "ok").all()
    for c in rounding_claims(df):
        assert c.passed, c
    useful = useful_digits(df)
    assert set(useful) == {"exact", "noisy", "lowrank"}
    assert all(k is not None and 3 <= k <= 8 for k in useful.values())
    # 12 digits: every learner essentially exact
    twelve = df[df["rounding"] == "digits=12"]
    assert (twelve["rel_err_W"] < 1e-6).all()


@pytest.mark.parametrize("tau", [1e-2, 3e-3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rotary_head_is_refused_where_the_estimates_check_is_vacuous(seed, tau):
    # a rotary head with small logits on unit tokens: at this tau the estimate's own check
    # cannot fail (verify_vacuous_), and the order test on unit tokens saw answers change by
    # less than 2 tau, so the learner returned an estimate off by 7 times the answers' scale
    # with a warning; the permuted pairs on scaled tokens show the positions
    d = 8
    box = ScalarHead(d, seed=seed, scale=0.1)
    est = NoisyValueQueryLearner(W_bound=8.0, mu=0.01, random_state=seed)
    with pytest.raises(ModelMismatchError, match="are permuted") as err:
        est.fit(ApproximateValueOracle(box, d, tau, random_state=seed))
    assert err.value.error > 2 * tau and est.n_verify_queries_ == 8
    # the same box without positions is a head: no order to find, the fit returns (its check
    # vacuous at this tau, as the theorem's loose bound says)
    flat = ScalarHead(d, seed=seed, scale=0.1, base=None)
    est = fit_noting_vacuous(NoisyValueQueryLearner(W_bound=8.0, mu=0.01, random_state=seed),
                             ApproximateValueOracle(flat, d, tau, random_state=seed))
    assert est.verify_vacuous_
