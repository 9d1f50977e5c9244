"""Prober(entry_target=...): each probe at its own logit scale, from a rough prediction of its
value (the served layer learner's isolated probes; measured in docs/notes/2026-11-27-served.md,
"each probe at its own scale"), on a float32-served head with a key bias and an offset."""

import numpy as np
import pytest

from attnquery.learners._probes import Prober
from attnquery.models import AttentionHead
from attnquery.oracles import ValueOracle

D, N = 32, 2000


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    v = rng.standard_normal(D)
    W = rng.standard_normal((D, D)) / D
    c = 0.3 * rng.standard_normal(D)
    head = AttentionHead(v, W=W, key_bias=c, offset=0.7, precision="float32")
    U = rng.standard_normal((N, D))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    B = rng.standard_normal((N, D))
    B *= np.exp(rng.uniform(-4, 0, N))[:, None] / np.linalg.norm(B, axis=1, keepdims=True)
    truth = np.einsum("ni,ij,nj->n", U, W, B)
    pred = truth * (1 + 1e-3 * rng.standard_normal(N))  # a rough head's prediction
    return head, v, c, U, B, truth, pred


def _measure(setup, entry_target, with_pred, pred=None):
    head, v, c, U, B, truth, rough = setup
    pred = rough if pred is None else pred
    p = Prober(ValueOracle(head, D), v, initial_logit_scale=1.0, max_logit=8, min_logit=0.01,
               chunk=N, pilot=32, target=3.0, key_bias=c, offset=0.7,
               entry_target=entry_target, entry_cap=10.0)
    make = ((lambda idx: (U[idx], B[idx], pred[idx])) if with_pred
            else (lambda idx: (U[idx], B[idx])))
    return p.measure(make, N, None, return_scale=True)


def test_small_values_are_read_better_at_their_own_scale(setup):
    truth = setup[5]
    shared, _ = _measure(setup, None, False)
    own, _ = _measure(setup, 1.5, True)
    small = np.abs(truth) < np.median(np.abs(truth))
    err_shared = np.sqrt(np.mean((shared - truth)[small] ** 2))
    err_own = np.sqrt(np.mean((own - truth)[small] ** 2))
    # measured: 1.87e-7 at the shared scale, 1.20e-7 each at its own; all: 1.01e-6 either way
    assert err_own <= err_shared / 1.3
    assert np.sqrt(np.mean((own - truth) ** 2)) <= 1.05 * np.sqrt(np.mean((shared - truth) ** 2))


def test_scales_are_raised_within_the_cap(setup):
    _, shared = _measure(setup, None, False)
    _, own = _measure(setup, 1.5, True)
    ratio = own[32:] / shared[32:]  # the pilot's probes are asked at the initial scale
    assert ratio.min() >= 1.0 - 1e-12 and ratio.max() <= 10.0 * (1 + 1e-12)
    assert np.mean(ratio > 1.5) > 0.2  # most small values are asked larger


def test_without_predictions_or_target_nothing_changes(setup):
    plain = _measure(setup, None, False)[0]
    # predictions without a target are unused; a target without usable predictions (NaN)
    # keeps the shared scale
    assert np.array_equal(plain, _measure(setup, None, True)[0])
    assert np.array_equal(plain, _measure(setup, 1.5, True, pred=np.full(N, np.nan))[0])
