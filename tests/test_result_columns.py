"""The result schema is assembled from the columns each experiment declares."""

import pyarrow as pa
import pytest

from attnquery.errors import ConfigError
from attnquery.experiments import Experiment, all_experiments
from attnquery.results import (
    METRIC_COLUMNS,
    PARAM_COLUMNS,
    RESULT_SCHEMA,
    SCHEMA_VERSION,
    SHARED_METRIC_COLUMNS,
    SHARED_PARAM_COLUMNS,
    assemble_columns,
    make_row,
)

# The result schema (version 8): version 4 as the central column lists of results.py wrote it
# before the experiments declared their own columns, the vector experiment's named cases'
# four parameters (version 5), their check_length (version 6) and total_queries, every query
# the oracle counted (version 7), the llm experiment's base_measured (version 8): the stored
# tables change only with the version.
SCHEMA_V8 = [
    ("experiment", "string"), ("cell_id", "string"), ("learner", "string"), ("seed", "int64"),
    ("d", "int64"), ("rank", "int64"), ("n_heads", "int64"), ("width", "int64"),
    ("probes", "string"), ("W_spectral", "double"), ("W_fro", "double"),
    ("logit_scale", "double"), ("W_bound", "double"), ("mu", "double"), ("zero_frac", "double"),
    ("tau", "double"), ("noise", "string"), ("rounding", "string"), ("oversample", "int64"),
    ("queries_per_unknown", "double"), ("eps", "double"), ("v_method", "string"),
    ("c", "double"), ("n_measurements", "int64"), ("solver", "string"),
    ("separation", "double"), ("fd_step", "double"), ("family", "string"),
    ("variant", "string"), ("layer", "int64"), ("head", "int64"), ("checkpoint", "string"),
    ("readout", "string"), ("biases", "bool"), ("rope_base", "double"),
    ("n_kv_heads", "int64"), ("head_dim", "int64"), ("key_dim", "int64"), ("causal", "bool"),
    ("goal", "double"), ("check_length", "int64"), ("base_measured", "bool"),
    ("n_queries", "int64"),
    ("verify_queries", "int64"), ("total_queries", "int64"),
    ("verify_error", "double"), ("verified", "bool"), ("verify_vacuous", "bool"),
    ("n_queries_attention", "int64"), ("n_queries_ffn", "int64"), ("n_queries_v", "int64"),
    ("n_queries_W", "int64"), ("queries_computed", "bool"), ("rel_err_W", "double"),
    ("abs_err_W", "double"), ("rel_err_v", "double"), ("err_v", "double"),
    ("rel_err_c", "double"), ("rel_err_offset", "double"), ("func_err", "double"),
    ("success", "bool"), ("rank_found", "int64"), ("n_heads_found", "int64"),
    ("solver_status", "string"), ("solver_iterations", "int64"), ("required_tau", "double"),
    ("bound_W", "double"), ("bound_v", "double"), ("within_bound", "bool"),
    ("param_distance", "double"), ("output_difference", "double"),
    ("head_separation", "double"), ("func_err_max", "double"), ("func_err_median", "double"),
    ("func_err_ffn", "double"), ("neuron_err", "double"), ("width_found", "int64"),
    ("basis_err", "double"), ("extra", "string"), ("status", "string"), ("message", "string"),
    ("package_version", "string"), ("git_commit", "string"), ("python_version", "string"),
    ("numpy_version", "string"), ("scipy_version", "string"), ("cvxpy_version", "string"),
    ("config_hash", "string"), ("code_version", "string"), ("cell_key", "string"),
    ("schema_version", "int64"),
]


def _exp(name, params=None, metrics=None):
    return Experiment(name=name, cells=lambda cfg: [], run=lambda cell, rng: {},
                      params=params or {}, metrics=metrics or {})


def test_the_assembled_schema_is_the_stored_one():
    assert SCHEMA_VERSION == 8
    assert [(f.name, str(f.type)) for f in RESULT_SCHEMA] == SCHEMA_V8
    assert RESULT_SCHEMA.metadata == {b"attnquery_schema_version": b"8"}
    assert list(PARAM_COLUMNS) == [n for n, _ in SCHEMA_V8[4:42]]
    assert list(METRIC_COLUMNS) == [n for n, _ in SCHEMA_V8[42:79]]


def test_every_experiment_column_is_declared_by_an_experiment_or_shared():
    declared = set(SHARED_PARAM_COLUMNS) | set(SHARED_METRIC_COLUMNS)
    for exp in all_experiments():
        assert not set(exp.params) & set(SHARED_PARAM_COLUMNS), exp.name
        assert not set(exp.metrics) & set(SHARED_METRIC_COLUMNS), exp.name
        declared |= set(exp.params) | set(exp.metrics)
    assert declared == set(PARAM_COLUMNS) | set(METRIC_COLUMNS)
    # without the experiments, only the shared columns are left
    params, metrics = assemble_columns([])
    assert params == SHARED_PARAM_COLUMNS and metrics == SHARED_METRIC_COLUMNS


def test_a_column_two_experiment_modules_use_is_shared_and_declared_once():
    # lowrank_phase and lowrank_scale come from one module and declare one set of columns
    declared_by = {}
    for exp in all_experiments():
        module = exp.run.__module__
        for name in [*exp.params, *exp.metrics]:
            declared_by.setdefault(name, set()).add(module)
    twice = {name: sorted(mods) for name, mods in declared_by.items() if len(mods) > 1}
    assert not twice, f"declared by several experiments' modules (share them): {twice}"
    # the columns of a checkpoint's head that realheads and served both write are shared ones
    for name in ("layer", "head", "checkpoint", "readout", "biases", "n_heads"):
        assert name in SHARED_PARAM_COLUMNS
    for name in ("rel_err_c", "rel_err_offset", "rank_found", "n_heads_found"):
        assert name in SHARED_METRIC_COLUMNS


def test_a_new_column_follows_the_stored_ones_in_declaration_order():
    params, metrics = assemble_columns(
        [*all_experiments(), _exp("new", {"zeta": pa.int64(), "alpha": pa.string()},
                                  {"score": pa.float64()})])
    assert list(params) == [*PARAM_COLUMNS, "zeta", "alpha"]
    assert list(metrics) == [*METRIC_COLUMNS, "score"]
    assert params["alpha"] == pa.string() and metrics["score"] == pa.float64()


def test_an_undeclared_column_of_an_experiment_is_refused_by_name():
    exact = {"experiment": "exact", "cell_id": "0", "learner": "exact", "seed": 0, "d": 3}
    row, _ = make_row(exact, {"n_queries": 12, "rel_err_W": 0.0}, "ok")
    assert row["n_queries"] == 12
    with pytest.raises(ConfigError, match="'temperature' of experiment 'exact' is not a result"):
        make_row({**exact, "temperature": 1.0}, {}, "ok")
    with pytest.raises(ConfigError, match="'speedup' of experiment 'exact' is not a result"):
        make_row(exact, {"speedup": 2.0}, "ok")


@pytest.mark.parametrize("bad, match", [
    (_exp("x", {"rank": pa.string()}), "experiment 'x': parameter column 'rank' is string, but"),
    (_exp("x", metrics={"d": pa.int64()}), "'x': metric column 'd' is already"),
    (_exp("x", {"status": pa.string()}), "'x': parameter column 'status' is already"),
    (_exp("x", metrics={"wall_time_s": pa.float64()}), "'wall_time_s' is already"),
    (_exp("x", {"size": int}), "'x': parameter column 'size' needs a pyarrow type"),
])
def test_conflicting_declarations_are_refused_by_name(bad, match):
    with pytest.raises(ConfigError, match=match):
        assemble_columns([*all_experiments(), bad])


def test_total_queries_is_every_query_the_oracle_counted_as_the_learner_counts():
    from attnquery.learners import ExactValueQueryLearner
    from attnquery.metrics import fit_counted
    from attnquery.models import random_head
    from attnquery.oracles import ValueOracle

    d = 4
    oracle = ValueOracle(random_head(d, 0), d)
    est = ExactValueQueryLearner(random_state=0)
    metrics = fit_counted(est, oracle)
    cell = {"experiment": "exact", "cell_id": "c", "learner": "exact", "seed": 0, "d": d}
    row, _ = make_row(cell, metrics, "ok")
    assert row["n_queries"] == d * d + d and row["verify_queries"] == est.n_verify_queries_ > 0
    assert row["total_queries"] == est.n_queries_ == oracle.n_queries == \
        row["n_queries"] + row["verify_queries"]
    # a row without the check's part has no total
    assert make_row(cell, {"n_queries": 12}, "ok")[0].get("total_queries") is None
