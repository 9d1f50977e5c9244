"""LowPrecisionValueQueryLearner, the lowprecision experiment and figure, and the rounding oracle's
formats: recovery from rounded answers against ground truth, the error estimate against the
measured error, the averaging exponent, the refusal of boxes and answers outside the model, and
the figure's claims on contrary data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnquery.errors import (
    AssumptionViolation,
    AttnQueryError,
    BudgetExceededError,
    ConfigError,
    ModelMismatchError,
    NotIdentifiableError,
)
from attnquery.experiments import expand_cells, run_cells
from attnquery.figures.lowprecision import (
    ESTIMATE_RANGE,
    SLOPE_RANGE,
    lowprecision_claims,
    lowprecision_frame,
    queries_needed,
)
from attnquery.figures.rounding import rounding_claims, rounding_costs
from attnquery.learners import LowPrecisionValueQueryLearner
from attnquery.learners.lowprecision import MAX_NOISE_LEVEL, pair_logits
from attnquery.metrics import fit_power_law_within, relative_error
from attnquery.models import AttentionHead, MultiHeadAttention, random_head
from attnquery.oracles import MembershipOracle, RoundingOracle, ValueOracle
from attnquery.results import rows_to_table
from attnquery.theory import precision_digits, precision_relative_tau

SEED = 20260122
MINILM = Path(__file__).resolve().parents[1] / "data" / "minilm" / "model.safetensors"


def _oracle(head, spec, **kw):
    if spec.startswith("digits="):
        return RoundingOracle(head, head.d, digits=int(spec.split("=")[1]), **kw)
    return RoundingOracle(head, head.d, dtype=spec, **kw)


def _fit(head, spec, per_unknown, seed=0, **kw):
    d = head.d
    oracle = _oracle(head, spec)
    est = LowPrecisionValueQueryLearner(n_queries=int(per_unknown * (d * d + d)),
                                        random_state=seed,
                                        **kw).fit(oracle)
    return est, oracle


# ----------------------------------------------------------------------------------------------
# the oracle's formats
# ----------------------------------------------------------------------------------------------
def test_rounding_oracle_float32_and_float64():
    head = random_head(6, seed=1)
    X = np.random.default_rng(0).standard_normal((20, 3, 6))
    f = head(X)
    y32 = RoundingOracle(head, 6, dtype="float32")(X)
    assert np.array_equal(y32, f.astype(np.float32).astype(np.float64))
    assert not np.array_equal(y32, f)
    assert np.array_equal(RoundingOracle(head, 6, dtype="float64")(X), f)
    assert RoundingOracle(head, 6, dtype="float32").relative_tau == 2.0**-24
    assert precision_relative_tau("float64") == 2.0**-53
    assert precision_relative_tau("digits=3") == pytest.approx(5e-3)
    assert precision_digits("digits=4") == pytest.approx(4.0)
    assert 7.8 < precision_digits("float32") < 8.0
    with pytest.raises(AttnQueryError, match="dtype"):
        RoundingOracle(head, 6, dtype="float8")


# ----------------------------------------------------------------------------------------------
# the measurement
# ----------------------------------------------------------------------------------------------
def test_pair_logits_measure_the_logit_and_u_v():
    head = random_head(5, seed=3)
    rng = np.random.default_rng(1)
    u, b = rng.standard_normal(5), rng.standard_normal(5)
    c, s = 2.0, 0.7
    X = np.stack([np.stack([c * u + s * b, s * b]), np.stack([-c * u + s * b, s * b])])
    y = head(X)
    P = pair_logits(y[0], y[1], s * b @ head.v, c)
    assert P[0] == pytest.approx(c * s * u @ head.W @ b, rel=1e-12)
    assert P[1] == pytest.approx(u @ head.v, rel=1e-12)
    assert P[4] == pytest.approx(y[0] ** 2 / (y[0] - s * b @ head.v) ** 2
                                 + y[1] ** 2 / (s * b @ head.v - y[1]) ** 2)
    # a ratio no single head gives is NaN, not a number
    assert np.isnan(pair_logits(1.0, 2.0, 0.0, 1.0)[0])


# ----------------------------------------------------------------------------------------------
# recovery from rounded answers
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, bound", [("float16", 2e-3), ("bfloat16", 1.5e-2),
                                         ("digits=3", 1e-2), ("digits=5", 1e-4),
                                         ("float32", 1e-6)])
def test_recovers_rounded_heads_with_its_error_estimate(spec, bound):
    head = random_head(32, seed=5)
    est, oracle = _fit(head, spec, 3)
    err = relative_error(est.W_, head.W)
    assert err <= bound
    assert ESTIMATE_RANGE[0] <= err / est.W_error_estimate_ <= ESTIMATE_RANGE[1]
    assert relative_error(est.v_, head.v) <= 2 * est.v_error_estimate_ + 1e-12
    # the noise level it reads from its residuals is the format's: between a tenth and all of
    # its largest relative rounding error
    tau = oracle.relative_tau
    assert 0.1 * tau <= est.noise_level_ <= tau
    assert est.n_queries_ == oracle.n_queries <= 3 * (32 * 32 + 32)
    assert est.n_verify_queries_ == 8 and est.verify_error_ < 20 * tau


def test_float64_answers_recovered_to_rounding_level():
    head = random_head(24, seed=2)
    est, _ = _fit(head, "float64", 3)
    assert relative_error(est.W_, head.W) < 1e-13
    assert relative_error(est.v_, head.v) < 1e-13


def test_error_falls_like_one_over_sqrt_queries():
    budgets, errs, units = [], [], []
    for seed in range(2):
        head = random_head(24, seed=10 + seed)
        for q in (6, 12, 24, 48):
            est, oracle = _fit(head, "float16", q, seed=seed)
            budgets.append(oracle.n_queries)
            errs.append(relative_error(est.W_, head.W))
            units.append(seed)
    fit = fit_power_law_within(budgets, errs, units)
    assert SLOPE_RANGE[0] <= fit.slope <= SLOPE_RANGE[1], fit


def test_distinct_probes_average_where_repeated_queries_would_not():
    # the same budget spent twice on one head gives the same answer (determinism), and more
    # passes lower the error: the averaging comes from distinct probes, not repeats
    head = random_head(16, seed=4)
    a, _ = _fit(head, "bfloat16", 4, seed=3)
    b, _ = _fit(head, "bfloat16", 4, seed=3)
    assert np.array_equal(a.W_, b.W_) and np.array_equal(a.v_, b.v_)
    c, _ = _fit(head, "bfloat16", 32, seed=3)
    assert c.n_passes_ > 4 * a.n_passes_
    assert relative_error(c.W_, head.W) < 0.6 * relative_error(a.W_, head.W)


def test_check_queries_do_not_change_the_estimate():
    head = random_head(12, seed=8)
    a, oa = _fit(head, "float16", 4, seed=1, verify=0)
    b, ob = _fit(head, "float16", 4, seed=1, verify=8)
    assert np.array_equal(a.W_, b.W_)
    assert np.isnan(a.verify_error_) and a.n_verify_queries_ == 0
    assert ob.n_queries == oa.n_queries + 8 == b.n_queries_


def test_real_minilm_head_meets_the_goals():
    if not MINILM.exists():
        pytest.skip("the MiniLM checkpoint is fetched by the workflow (data/minilm)")
    from attnquery.realheads import head_from_checkpoint

    head = head_from_checkpoint(MINILM, 3, 5, n_heads=12)
    for spec, goal in (("float16", 1e-3), ("bfloat16", 1e-2), ("digits=3", 1e-2)):
        est, oracle = _fit(head, spec, 2.1)
        assert relative_error(est.W_, head.W) <= goal
        assert oracle.n_queries <= 2.1 * (384 * 384 + 384)
        assert est.rank_ == 32 and est.W_factors_[0].shape == (384, 32)


# ----------------------------------------------------------------------------------------------
# rank and factors
# ----------------------------------------------------------------------------------------------
def test_rank_found_from_the_noise_and_factors_returned():
    head = random_head(24, seed=7, rank=3)
    est, _ = _fit(head, "float16", 4)
    assert est.rank_ == 3
    L, R = est.W_factors_
    assert L.shape == R.shape == (24, 3)
    assert np.allclose(est.W_, L @ R.T)
    full = random_head(24, seed=7)
    est_full, _ = _fit(full, "float16", 4)
    assert est_full.rank_ == 24 and est_full.W_factors_ is None
    # a given rank truncates, and truncation lowers the error of a low-rank head
    given, _ = _fit(head, "float16", 4, rank=3)
    dense = LowPrecisionValueQueryLearner(n_queries=4 * (24 * 24 + 24), rank=24,
                                          random_state=0).fit(
        _oracle(head, "float16"))
    assert relative_error(given.W_, head.W) < 0.7 * relative_error(dense.W_, head.W)
    X = np.random.default_rng(0).standard_normal((5, 3, 24))
    assert np.allclose(given.predict(X), AttentionHead(given.v_, W=given.W_)(X))


# ----------------------------------------------------------------------------------------------
# refusals
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weight", [1.0, 0.01])
def test_two_heads_are_refused(weight):
    # an even second head gives pairs no single head gives; a faint one passes the probes and
    # is caught by the check queries, far beyond the tolerance of rounded answers
    h1, h2 = random_head(12, seed=1), random_head(12, seed=2)
    box = MultiHeadAttention([h1, AttentionHead(weight * h2.v, W=h2.W)])
    oracle = RoundingOracle(box, 12, dtype="float16")
    with pytest.raises(ModelMismatchError) as info:
        LowPrecisionValueQueryLearner(n_queries=4 * (12 * 12 + 12), random_state=0).fit(oracle)
    if weight < 1:
        assert info.value.error > 5 * info.value.allowed


def test_answers_too_coarse_are_refused_with_their_noise():
    head = random_head(16, seed=1)
    with pytest.raises(AssumptionViolation, match="relative noise of 0.1"):
        _fit(head, "digits=1", 16)
    assert MAX_NOISE_LEVEL < 0.05


def test_v_zero_is_not_identifiable():
    head = AttentionHead(np.zeros(4), W=np.eye(4))
    oracle = _oracle(head, "float16")
    with pytest.raises(NotIdentifiableError):
        LowPrecisionValueQueryLearner(
            n_queries=LowPrecisionValueQueryLearner.min_queries(4)).fit(oracle)
    assert oracle.n_queries == 4  # the one-row queries, nothing more


def test_the_budget_is_the_fits_ledger_less_the_check():
    """The passes share ``n_queries`` less the check's queries (the ledger's reserve): a fit
    whose re-asked pairs leave too little refuses the next pass before asking it, naming
    what is left, and the queries it spent are what the oracle counted."""
    oracle = ValueOracle(random_head(8, seed=2), 8)
    n, verify = 4 * (8 * 8 + 8), 8
    with pytest.raises(BudgetExceededError, match=r"128 more queries are needed to measure "
                       r"every entry of W once but only (\d+) of n_queries = 288") as info:
        LowPrecisionValueQueryLearner(n_queries=n, verify=verify, random_state=3).fit(oracle)
    left = int(str(info.value).split("only ")[1].split(" of")[0])
    assert left < 128 and oracle.n_queries + left + verify == n


def test_bad_parameters_and_budgets():
    head = random_head(8, seed=0)
    oracle = _oracle(head, "float16")
    need = LowPrecisionValueQueryLearner.min_queries(8)
    with pytest.raises(ConfigError, match="below"):
        LowPrecisionValueQueryLearner(n_queries=need - 1).fit(oracle)
    assert oracle.n_queries == 0
    with pytest.raises(ConfigError, match="rank"):
        LowPrecisionValueQueryLearner(n_queries=10 * need, rank=9).fit(oracle)
    with pytest.raises(ConfigError, match="max_logit"):
        LowPrecisionValueQueryLearner(n_queries=10 * need, max_logit=20.0).fit(oracle)
    with pytest.raises(ConfigError, match="target_logit"):
        LowPrecisionValueQueryLearner(n_queries=10 * need, target_logit=6.0).fit(oracle)
    with pytest.raises(ConfigError, match="n_queries"):
        LowPrecisionValueQueryLearner(n_queries=2.5).fit(oracle)
    with pytest.raises(ConfigError, match="membership"):
        LowPrecisionValueQueryLearner(n_queries=10 * need).fit(MembershipOracle(head, 8))
    small = RoundingOracle(head, 8, dtype="float16", budget=need)
    with pytest.raises(BudgetExceededError):
        LowPrecisionValueQueryLearner(n_queries=2 * need).fit(small)
    assert small.n_queries == 0
    est, oracle = _fit(head, "float16", 6)
    with pytest.raises(ConfigError, match="rel_error"):
        est.queries_for(0.0)
    assert est.queries_for(est.W_error_estimate_ / 10) > 50 * oracle.n_queries


SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(d=st.integers(1, 7), log_scale=st.floats(-2, 2), zero_frac=st.sampled_from([0.0, 0.5]),
       spec=st.sampled_from(["float64", "float16", "bfloat16", "digits=3"]),
       seed=st.integers(0, 2**32 - 1))
def test_only_documented_errors_and_finite_estimates(d, log_scale, zero_frac, spec, seed):
    head = random_head(d, seed=seed, W_fro=10.0**log_scale, zero_frac=zero_frac)
    n = max(LowPrecisionValueQueryLearner.min_queries(d) + 64, 6 * (d * d + d))
    try:
        est = LowPrecisionValueQueryLearner(n_queries=n, random_state=0).fit(_oracle(head, spec))
    except AttnQueryError:
        return
    assert np.all(np.isfinite(est.W_)) and np.all(np.isfinite(est.v_))
    assert est.n_queries_ <= n


# ----------------------------------------------------------------------------------------------
# the experiment, the figure's claims, and the rounding defence
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def study_rows():
    cells = expand_cells("lowprecision", {
        "seeds": 2, "precisions": ["float64", "float16", "bfloat16", "digits=2", "digits=3"],
        "queries_per_unknown": [3, 6, 12, 24, 48], "random": {"d": [16]}})
    rows, _ = run_cells(cells, SEED)
    return rows_to_table(rows).to_pandas()


def _claims(df):
    return {c.name: c for c in lowprecision_claims(df)}


def test_claims_hold_on_the_experiment(study_rows):
    assert (study_rows["status"] == "ok").all()
    claims = _claims(study_rows)
    for name in ("lowprecision_runs", "lowprecision_slope", "lowprecision_slope_each",
                 "lowprecision_float64", "lowprecision_estimate", "lowprecision_target"):
        assert claims[name].passed, f"{name}: {claims[name].detail}"


def test_slope_claim_fails_when_errors_stop_averaging(study_rows):
    flat = study_rows.copy()
    flat["rel_err_W"] = flat["rel_err_W"] * (flat["queries_per_unknown"] / 3.0) ** 0.35
    assert not _claims(flat)["lowprecision_slope"].passed
    assert not _claims(flat)["lowprecision_slope_each"].passed


def test_estimate_claim_fails_when_the_estimate_is_off(study_rows):
    import json

    off = study_rows.copy()
    off["extra"] = [json.dumps({**json.loads(e), "W_error_estimate":
                                3 * json.loads(e)["W_error_estimate"]}) for e in off["extra"]]
    assert not _claims(off)["lowprecision_estimate"].passed


def test_target_and_run_claims_fail_on_contrary_rows(study_rows):
    worse = study_rows.copy()
    worse.loc[worse["rounding"] == "digits=2", "rel_err_W"] = 0.5
    assert not _claims(worse)["lowprecision_target"].passed
    need = queries_needed(lowprecision_frame(worse), stat="max")
    assert need[("random", "digits=2")][1] == "extrapolated"
    failed = study_rows.copy()
    failed.loc[failed.index[0], "status"] = "error"
    assert not _claims(failed)["lowprecision_runs"].passed


def test_goal_claims_check_real_rows(study_rows):
    real = study_rows[study_rows["rounding"] == "float16"].copy()
    real["family"] = "real"
    real["layer"], real["head"] = 0, 1
    both = pd.concat([study_rows, real], ignore_index=True)
    assert _claims(both)["lowprecision_goal_float16"].passed
    real["rel_err_W"] = 2e-3
    assert not _claims(pd.concat([study_rows, real], ignore_index=True))[
        "lowprecision_goal_float16"].passed


def test_experiment_config_errors():
    with pytest.raises(ConfigError, match="precision"):
        expand_cells("lowprecision", {"seeds": 1, "precisions": ["float8"],
                                      "queries_per_unknown": [3], "random": {"d": [8]}})
    with pytest.raises(ConfigError, match="heads"):
        expand_cells("lowprecision", {"seeds": 1, "precisions": ["float16"],
                                      "queries_per_unknown": [3],
                                      "real": {"checkpoint": "x", "n_heads": 4, "layers": [0],
                                               "heads": [4]}})
    with pytest.raises(ConfigError, match="random and/or real"):
        expand_cells("lowprecision", {"seeds": 1, "precisions": ["float16"],
                                      "queries_per_unknown": [3]})


def test_rounding_defence_counts_the_low_precision_learner():
    cells = expand_cells("rounding", {
        "seeds": 2, "d": [8], "digits": [2, 4, 6], "dtypes": ["float16"],
        "learners": ["exact", "lowprecision"], "rank": 2, "mu": 0.1, "W_bound": 4.0,
        "lowprecision_queries_per_unknown": [4, 16]})
    rows, _ = run_cells(cells, SEED)
    df = rows_to_table(rows).to_pandas()
    assert (df["status"] == "ok").all()
    lp = df[df["learner"] == "lowprecision"]
    assert len(lp) == 2 * 4 * 2 and set(lp["queries_per_unknown"]) == {4.0, 16.0}
    claims = {c.name: c for c in rounding_claims(df)}
    assert claims["rounding_lowprecision_useful"].passed, claims["rounding_lowprecision_useful"]
    cost = rounding_costs(df, 1e-2)
    assert cost["digits=6"][1] == "at most" and cost["digits=6"][0] < 4.5
    # contrary data: the low-precision learner no better than the exact one
    worse = df.copy()
    worse.loc[worse["learner"] == "lowprecision", "rel_err_W"] = 1.0
    assert not {c.name: c for c in rounding_claims(worse)}["rounding_lowprecision_useful"].passed


def test_fit_power_law_within_groups():
    rng = np.random.default_rng(0)
    x = np.tile([1.0, 2, 4, 8, 16], 6)
    g = np.repeat(np.arange(6), 5)
    y = np.exp(rng.normal(size=6))[g] * x**-0.5 * np.exp(0.02 * rng.normal(size=30))
    fit = fit_power_law_within(x, y, g)
    assert fit.lo < -0.5 < fit.hi and fit.hi - fit.lo < 0.05
    with pytest.raises(ConfigError):
        fit_power_law_within([1.0, 2.0], [1.0, 0.5], [0, 1])


def test_real_head_cells_build_from_a_checkpoint(tmp_path):
    from attnquery.realheads import write_test_checkpoint

    path = tmp_path / "model.safetensors"
    write_test_checkpoint(path, n_layers=1, n_heads=2, d=16, seed=0)
    cells = expand_cells("lowprecision", {
        "seeds": 1, "precisions": ["float16"], "queries_per_unknown": [3],
        "real": {"checkpoint": str(path), "n_heads": 2, "layers": [0], "heads": [0, 1]}})
    rows, _ = run_cells(cells, SEED)
    df = rows_to_table(rows).to_pandas()
    assert (df["status"] == "ok").all(), df["message"].tolist()
    assert (df["rel_err_W"] < 2e-3).all() and (df["family"] == "real").all()
