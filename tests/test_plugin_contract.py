"""The plug-in contract (:mod:`attnquery.learners.base`) and the scikit-learn habits every learner
has: ``NotFittedError`` before ``fit``, :func:`check_is_fitted`, :func:`clone`; a plug-in that
cannot be loaded, whatever its import does, is named and left out, never the end of the host."""

from __future__ import annotations

import ast
import sys

import numpy as np
import pytest

import attnquery.learners as learners
from attnquery.errors import AttnQueryError, ConfigError, NotFittedError
from attnquery.learners import _base, base
from attnquery.learners._registry import REQUIRED
from attnquery.learners.vector.rotary import RotaryVectorLearner
from attnquery.learners.vector.rotary_layer import RotaryLayerVectorLearner
from attnquery.learners.vector.served import ServedVectorLearner
from attnquery.models import AttentionHead, random_head
from attnquery.oracles import ValueOracle

from .fresh import REPO

#: the route learners the docs name beside the registered ones
ROUTES = [ServedVectorLearner, RotaryVectorLearner, RotaryLayerVectorLearner]


def _builtin_classes():
    return [e.load() for e in base.registry().values() if not e.plugin] + ROUTES


def _unfitted(cls):
    """An instance with every required parameter given (1.0, a valid norm bound)."""
    return cls(**{k: 1.0 for k, p in base.learner_parameters(cls).items()
                  if p["default"] is REQUIRED})


# ---------------------------------------------------------------------------------------------
# the public module
# ---------------------------------------------------------------------------------------------
def test_the_base_module_exports_what_a_plugin_needs_and_the_old_names_still_work():
    for name in ("BaseLearner", "LearnerSpec", "QueryLedger", "get_learner", "learner_table",
                 "ROUNDING_RTOL", "check_oracle", "check_is_fitted", "clone", "Interval"):
        assert name in base.__all__ and hasattr(base, name), name
    assert all(not n.startswith("_") for n in base.__all__)
    assert base.BaseLearner is _base.BaseLearner and base.get_learner is learners.get_learner
    # the private names the built-in learners call are the public methods
    for public, private in [("validate_params", "_validate_params"), ("verify_fit", "_verify_fit"),
                            ("make_rng", "_rng"), ("open_ledger", "_open_ledger")]:
        assert getattr(base.BaseLearner, public) is getattr(base.BaseLearner, private)


def test_the_plugin_example_uses_public_names_only():
    path = REPO / "examples" / "plugin" / "attnquery_lsq.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported, private_calls = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnquery"):
            imported += [(node.module, a.name) for a in node.names]
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__") and isinstance(node.value, ast.Name) \
                and node.value.id in ("self", "ledger"):
            private_calls.append(node.attr)
    assert imported and all(not part.startswith("_") for mod, name in imported
                            for part in [*mod.split("."), name]), imported
    assert not private_calls, private_calls


def test_the_plugin_example_learns_a_head_through_the_public_contract(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples" / "plugin"))
    monkeypatch.delitem(sys.modules, "attnquery_lsq", raising=False)
    import attnquery_lsq

    d = 5
    head = random_head(d, np.random.default_rng(4))
    est = attnquery_lsq.LeastSquaresLearner(random_state=0)
    with pytest.raises(NotFittedError):
        est.predict(np.zeros((1, 2, d)))
    est.fit(ValueOracle(head, d))
    assert np.linalg.norm(est.W_ - head.W) <= 1e-8 * np.linalg.norm(head.W)
    assert np.linalg.norm(est.v_ - head.v) <= 1e-10 * np.linalg.norm(head.v)
    assert est.n_queries_ == sum(est.n_queries_by_stage_.values()) == 2 * (d + d * d) + 8
    # its parameters are refused by name before the first query (the one recipe: constraints)
    oracle = ValueOracle(head, d)
    with pytest.raises(ConfigError, match="oversample"):
        attnquery_lsq.LeastSquaresLearner(oversample=1).fit(oracle)
    assert oracle.n_queries == 0
    assert "oversample" in base.learner_parameters(attnquery_lsq.LeastSquaresLearner)


# ---------------------------------------------------------------------------------------------
# scikit-learn habits, on every built-in learner
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", _builtin_classes(), ids=lambda c: c.__name__)
def test_predict_before_fit_is_a_not_fitted_error(cls):
    est = _unfitted(cls)
    for name in base.FITTED_METHODS:
        if hasattr(est, name):
            with pytest.raises(NotFittedError, match=f"this {cls.__name__} is not fitted yet"):
                getattr(est, name)(np.zeros((1, 2, 4)))
    with pytest.raises(NotFittedError):
        base.check_is_fitted(est)


def test_not_fitted_is_the_projects_error_and_scikit_learns_kinds():
    assert issubclass(NotFittedError, AttnQueryError)
    assert issubclass(NotFittedError, AttributeError) and issubclass(NotFittedError, ValueError)
    est = learners.ExactValueQueryLearner()
    assert not hasattr(est, "W_")  # hasattr's AttributeError: still false, not an error
    with pytest.raises(NotFittedError, match="not fitted"):
        base.check_is_fitted(est, "W_")


@pytest.mark.parametrize("cls", _builtin_classes(), ids=lambda c: c.__name__)
def test_clone_is_an_unfitted_copy_with_the_same_parameters(cls):
    est = _unfitted(cls)
    est.set_params(random_state=np.random.default_rng(5))
    twin = base.clone(est)
    assert type(twin) is cls and twin is not est
    assert twin.get_params().keys() == est.get_params().keys()
    rng = twin.random_state
    assert rng is not est.random_state and rng.random() == est.random_state.random()
    with pytest.raises(ConfigError, match="clone\\(\\) takes a learner"):
        base.clone(object())


def test_a_clone_of_a_fitted_learner_is_unfitted_and_refits_bit_identically():
    d = 6
    head = random_head(d, np.random.default_rng(1))
    est = learners.ExactValueQueryLearner(probes="gaussian", random_state=3).fit(
        ValueOracle(head, d))
    base.check_is_fitted(est)
    twin = base.clone(est)
    assert twin.get_params() == est.get_params()
    with pytest.raises(NotFittedError):
        twin.predict(np.zeros((1, 2, d)))
    twin.fit(ValueOracle(head, d))
    assert np.array_equal(twin.W_, est.W_) and np.array_equal(twin.v_, est.v_)


def test_a_failed_fit_leaves_the_learner_unfitted():
    d = 4
    zero = AttentionHead(np.zeros(d), W=np.eye(d))  # v = 0: W is not identifiable
    est = learners.ExactValueQueryLearner()
    with pytest.raises(AttnQueryError):
        est.fit(ValueOracle(zero, d))
    with pytest.raises(NotFittedError):
        est.predict(np.zeros((1, 2, d)))
