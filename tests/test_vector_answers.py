"""Gauss-Newton on a layer's answers (learners/vector/_answers.py): exact answers give every
head back from a perturbed start, rank and bias kept; answers with rounding-like noise give a
better W than the log-weight refinement it follows (the reason it runs); bad input is refused."""

import numpy as np
import pytest

from attnquery.learners.vector._answers import refine_on_answers
from attnquery.learners.vector._attention import attention_matrices
from attnquery.learners.vector._refine import refine_head
from attnquery.models.vector import random_vector_layer
from tests.test_vector_refine import rel, tilted


def layer_queries(d=32, H=2, n=400, N=12, seed=0):
    """A layer of H heads of rank d / H with biases, n queries of N tokens (logits spread
    about 2, as the served route aims) and their answers."""
    layer = random_vector_layer(d, H, seed=seed, head_dim=d // H, bias=0.3)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, N, d)) * (2.0 / np.sqrt(d))
    return layer, X, layer(X), rng


def worst(W, Wt):
    return max(rel(w, t) for w, t in zip(W, Wt, strict=True))


@pytest.mark.parametrize("fit_bias", [True, False])
def test_exact_answers_give_every_head_from_a_perturbed_start(fit_bias):
    layer, X, O, rng = layer_queries()
    Wt, ct, V, beta = layer.head_W(), layer.key_bias(), layer.value_maps(), layer.output_bias
    r = Wt.shape[1] // Wt.shape[0]
    W0 = np.stack([tilted(w, r, 1e-4, rng) for w in Wt])
    c0 = ct + 1e-4 * rng.standard_normal(ct.shape) if fit_bias else ct
    W1, c1, iterations = refine_on_answers(X, O, V, beta, W0, c0, [r] * len(Wt),
                                           fit_bias=fit_bias, steps=2)
    assert worst(W0, Wt) > 1e-4
    assert worst(W1, Wt) < 1e-7
    assert all(np.linalg.matrix_rank(w, tol=1e-8 * np.abs(w).max()) == r for w in W1)
    assert worst(c1, ct) < 1e-7 if fit_bias else np.array_equal(c1, c0)
    assert iterations > 0


def test_noisy_answers_give_a_better_w_than_the_log_weight_refinement():
    """Answers with noise alike in every output coordinate (as float32's rounding, relative
    1e-7): the weights read from them by the pseudo-inverse carry it along the few directions
    the values barely span, which the log-weight refinement weighs as any other; fitting the
    answers themselves does not."""
    layer, X, O, rng = layer_queries(n=600)
    Wt, ct, V, beta = layer.head_W(), layer.key_bias(), layer.value_maps(), layer.output_bias
    r = Wt.shape[1] // Wt.shape[0]
    On = O + 1e-7 * np.abs(O).max() * rng.standard_normal(O.shape)
    A, _ = attention_matrices(X, On, V, beta, "all", False, tol=1e-4)
    logw = [refine_head(X, A[h], Wt[h], ct[h], r, 1e-6) for h in range(len(Wt))]
    W1, c1, _ = refine_on_answers(X, On, V, beta, np.stack([f[0] for f in logw]),
                                  np.stack([f[1] for f in logw]), [r] * len(Wt))
    # measured: W 2.8e-7 -> 4.6e-8, c 5.8e-7 -> 1.4e-7
    assert worst(W1, Wt) < 0.3 * worst([f[0] for f in logw], Wt)
    assert worst(c1, ct) < 0.5 * worst([f[1] for f in logw], ct)


def test_bad_input_is_refused_by_name():
    layer, X, O, _ = layer_queries(n=20)
    Wt, ct, V, beta = layer.head_W(), layer.key_bias(), layer.value_maps(), layer.output_bias
    with pytest.raises(ValueError, match="answers"):
        refine_on_answers(X, O[:10], V, beta, Wt, ct, [16, 16])
    with pytest.raises(ValueError, match="ranks"):
        refine_on_answers(X, O, V, beta, Wt, ct, [16])
