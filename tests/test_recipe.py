"""The shared recipe of the experiments' run(cell, rng)."""

import numpy as np
import pytest

from attnquery.errors import UndefinedEstimate
from attnquery.experiments import expand_cells, get_experiment
from attnquery.experiments._recipe import (
    bias_measure,
    fit_and_measure,
    layer_measure,
    relative_bias_measure,
)
from attnquery.learners import ExactValueQueryLearner
from attnquery.metrics import fit_counted, functional_error, head_errors
from attnquery.models import AttentionHead, random_head, random_multihead
from attnquery.oracles import ValueOracle
from attnquery.theory import BIAS_EXACT_TOL, EXACT_TOL


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


def _biased_head(d, rng):
    head = random_head(d, rng)
    return AttentionHead(head.v, W=head.W, key_bias=rng.standard_normal(d) / np.sqrt(d),
                         offset=0.3)


def test_the_bias_measures_recover_a_head_with_its_key_bias_and_offset():
    d = 4
    model_rng, learner_rng = np.random.default_rng(11).spawn(2)
    head = _biased_head(d, model_rng)
    est = ExactValueQueryLearner(fit_bias=True, random_state=learner_rng)
    m = fit_and_measure(est, ValueOracle(head, d), head, measure=bias_measure)
    assert m["n_queries"] == d * d + 2 * d + 1  # W, v, the key bias and the offset
    for k in ("rel_err_W", "abs_err_W", "rel_err_v", "err_v", "rel_err_c", "rel_err_offset"):
        assert m[k] <= BIAS_EXACT_TOL, k
    rel = relative_bias_measure(est, head)
    assert list(rel) == ["rel_err_W", "rel_err_v", "rel_err_c", "rel_err_offset"]
    assert rel == {k: m[k] for k in rel}
    # a wrong offset is measured, relative to the true one
    est.offset_ = 2 * head.offset
    assert relative_bias_measure(est, head)["rel_err_offset"] == pytest.approx(1.0)


class _Estimate:
    """A fitted layer estimate: per-head W, v and key biases."""

    def __init__(self, W, v, c):
        self.W_, self.v_, self.key_bias_ = np.array(W), np.array(v), np.array(c)


def test_layer_measure_matches_heads_up_to_a_permutation():
    layer = random_multihead(4, 3, np.random.default_rng(5))
    W, v = [h.W for h in layer.heads], [h.v for h in layer.heads]
    c = [h.key_bias for h in layer.heads]
    order = [2, 0, 1]  # the estimate lists the heads in another order
    m = layer_measure(_Estimate([W[i] for i in order], [v[i] for i in order],
                                [c[i] for i in order]), layer)
    assert m["rel_err_W"] == m["rel_err_v"] == m["rel_err_c"] == 0.0
    assert m["err_W_heads"] == [0.0, 0.0, 0.0]
    # a head off by 10 % in W: its own entry (the truth's order) and the largest
    W_off = [w.copy() for w in W]
    W_off[1] = 1.1 * W[1]
    m = layer_measure(_Estimate([W_off[i] for i in order], [v[i] for i in order],
                                [c[i] for i in order]), layer)
    assert m["err_W_heads"][1] == pytest.approx(0.1) and m["rel_err_W"] == pytest.approx(0.1)
    assert m["err_W_heads"][0] == m["err_W_heads"][2] == 0.0 and m["rel_err_v"] == 0.0


def test_a_measure_and_a_model_of_the_experiment_replace_the_defaults():
    d = 3
    head, oracle, est = _fitted(d, 2)
    m = fit_and_measure(est, oracle, head, d, np.random.default_rng(0), n_eval=8,
                        measure=lambda est, truth: {"rank_found": int(np.linalg.matrix_rank(
                            est.W_))},
                        model=lambda est: (lambda X: np.zeros(len(X))))
    assert m["rank_found"] == np.linalg.matrix_rank(head.W)
    assert "rel_err_W" not in m  # only what the measure returns
    assert m["func_err"] == pytest.approx(1.0)  # the zero function is 100 % off


def test_a_measure_may_refuse_the_estimate_by_name():
    d = 3
    head, oracle, est = _fitted(d, 4)

    def refuse(est, truth):
        raise UndefinedEstimate("the estimate of W is undefined at 2 of 9 probes")

    with pytest.raises(UndefinedEstimate, match="undefined at 2 of 9 probes"):
        fit_and_measure(est, oracle, head, d, measure=refuse)


def test_no_experiment_fits_a_learner_outside_the_recipe():
    from pathlib import Path

    import attnquery.experiments as experiments

    folder = Path(experiments.__file__).parent
    outside = [f"{path.name}:{i}" for path in sorted(folder.glob("*.py"))
               if path.name != "_recipe.py"
               for i, line in enumerate(path.read_text().splitlines(), 1)
               if "fit_counted(" in line or ".fit(oracle" in line]
    assert not outside, f"fit through experiments._recipe.fit_and_measure: {outside}"
