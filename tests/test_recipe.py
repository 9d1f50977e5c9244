"""The shared recipe of the experiments' run(cell, rng)."""

import numpy as np
import pytest

from attnquery.errors import UndefinedEstimate
from attnquery.experiments import expand_cells, get_experiment
from attnquery.experiments._recipe import fit_and_measure
from attnquery.learners import ExactValueQueryLearner
from attnquery.metrics import fit_counted, functional_error, head_errors
from attnquery.models import random_head
from attnquery.oracles import ValueOracle
from attnquery.theory import EXACT_TOL


def _fitted(d, seed):
    model_rng, learner_rng = np.random.default_rng(seed).spawn(2)
    head = random_head(d, model_rng)
    return head, ValueOracle(head, d), ExactValueQueryLearner(random_state=learner_rng)


def test_fit_and_measure_counts_the_queries_and_recovers_the_head():
    d = 5
    head, oracle, est = _fitted(d, 3)
    m = fit_and_measure(est, oracle, head, d, np.random.default_rng(1), n_eval=8)
    assert m["n_queries"] == d * d + d  # Theorem 4.1's count
    assert m["rel_err_W"] <= EXACT_TOL and m["rel_err_v"] <= EXACT_TOL
    assert 0 <= m["func_err"] <= EXACT_TOL
    # without a generator, no functional error is measured
    head, oracle, est = _fitted(d, 3)
    assert "func_err" not in fit_and_measure(est, oracle, head, d)


def test_fit_and_measure_is_the_steps_it_replaces():
    d = 4
    head, oracle, est = _fitted(d, 7)
    m = fit_and_measure(est, oracle, head, d, np.random.default_rng(2), n_eval=16)
    head, oracle, est = _fitted(d, 7)
    ref = fit_counted(est, oracle)
    ref.update(head_errors(est.W_, est.v_, head.W, head.v))
    ref["func_err"] = functional_error(head, est.predict, d, np.random.default_rng(2), n=16)
    assert m == ref


def test_an_exact_cell_gives_the_same_row_twice():
    cell = expand_cells("exact", {"d": [3], "probes": ["basis"], "seeds": 1})[0]
    run = get_experiment("exact").run
    a = run(dict(cell), np.random.default_rng(5))
    b = run(dict(cell), np.random.default_rng(5))
    assert a == b and a["success"] and a["n_queries"] == 3 * 3 + 3


class _NaNLearner:
    """A learner whose estimate of W is not finite."""

    def fit(self, oracle):
        d = oracle.d
        oracle(np.zeros((1, 1, d)))  # one query, counted
        self.W_, self.v_ = np.full((d, d), np.nan), np.zeros(d)
        return self


def test_a_non_finite_estimate_is_refused_by_the_learner_name():
    d = 3
    head, oracle, _ = _fitted(d, 1)
    with pytest.raises(UndefinedEstimate, match="nan-learner: the estimate has non-finite"):
        fit_and_measure(_NaNLearner(), oracle, head, d, finite_as="nan-learner")
    head, oracle, _ = _fitted(d, 1)
    m = fit_and_measure(_NaNLearner(), oracle, head, d)  # without finite_as it is measured
    assert np.isnan(m["rel_err_W"]) and m["n_queries"] == 1
