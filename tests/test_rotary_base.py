"""``rope_base=None``: the rotary layer route measures the base of a layer's frequencies from its
form queries' answers (no query of its own), to float64 precision, and refuses a box whose
frequencies are of no base (dynamic NTK scaling) by name. The boxes are formula-written
(tests/vector_boxes.py)."""

import numpy as np
import pytest

from attnquery.errors import ConfigError, ModelMismatchError, NotIdentifiableError
from attnquery.learners import VectorLayerLearner
from attnquery.learners.vector.rotary import RotaryVectorLearner
from attnquery.learners.vector.rotary_layer import RotaryLayerVectorLearner
from attnquery.oracles import VectorOracle
from tests.test_vector_lengths import function_error, oracle_of
from tests.vector_boxes import Layer


def fit(box, check_length=512, **params):
    est = VectorLayerLearner(positions="rotary", n_heads=box.H, n_kv_heads=box.G, causal=True,
                             check_length=check_length, random_state=0, **params)
    oracle = oracle_of(box)
    return est.fit(oracle), oracle


@pytest.mark.parametrize("base", [1e5, 50.0, pytest.param(1e4, marks=pytest.mark.slow),
                                  pytest.param(1e6, marks=pytest.mark.slow)])
def test_the_base_is_measured(base):
    box = Layer(32, 2, 1, seed=1, base=base)
    est, oracle = fit(box)
    declared, _ = fit(box, rope_base=base)
    assert est.rope_base_ == pytest.approx(base, rel=1e-10)
    assert est.base_residual_ < 1e-9
    # no query of its own: the declared fit asks the same
    assert est.n_queries_ == declared.n_queries_ == oracle.n_queries
    np.testing.assert_allclose(est.frequencies_, declared.frequencies_, rtol=1e-10)
    assert declared.base_residual_ is None and declared.rope_base_ == base
    assert function_error(est, box, (1, 2, 5, 64, 512)) < 1e-9


@pytest.mark.slow
def test_the_base_is_measured_to_4096_tokens_on_gqa():
    box = Layer(64, 4, 2, seed=2, base=1e5)
    est, _ = fit(box, check_length=4096)
    assert est.rope_base_ == pytest.approx(1e5, rel=1e-11)
    assert function_error(est, box, (1, 5, 64, 512, 4096)) < 1e-9


def test_a_base_the_offsets_read_do_not_tell_is_not_identified():
    """Heads of 32 dimensions, base 1e5, forms read to offset 511: base 316 (whose frequencies
    hold every other one of base 1e5) fits those offsets as well: refused by name, not
    answered with either."""
    box = Layer(64, 2, 1, seed=1, base=1e5)
    with pytest.raises(NotIdentifiableError, match=r"the bases 316\.228 and 100000 fit the "
                       r"form queries to offset 511 alike"):
        fit(box)


def test_frequencies_of_no_base_are_refused_by_name():
    """Dynamic NTK scaling from 256 tokens: the frequencies of long queries are of another
    base than the short ones' (no single base fits)."""
    box = Layer(32, 2, 1, seed=1, base=1e4, ntk_from=256)
    with pytest.raises(ModelMismatchError, match=r"rope_base=None: no base .* fits the form "
                       r"queries \(to offset 1023\)"):
        fit(box, check_length=1024)


def test_where_the_base_is_not_measured_it_is_refused_before_the_first_query():
    last = VectorOracle(Layer(32, 2, 1, seed=1, outputs="last"), 32, "last")
    with pytest.raises(ConfigError, match="rope_base=None .* needs every token's outputs"):
        RotaryLayerVectorLearner(n_heads=2, n_kv_heads=1, rope_base=None).fit(last)
    assert last.n_queries == 0
    head = VectorOracle(Layer(16, 1, seed=1), 16, "all")
    with pytest.raises(ConfigError, match="rope_base=None .* for one head give rope_base"):
        RotaryVectorLearner(rope_base=None).fit(head)
    assert head.n_queries == 0
