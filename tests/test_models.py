"""Ground-truth models: evaluation against a direct computation, factors, generators."""

import numpy as np
import pytest

from attnquery.errors import ModelError
from attnquery.models import AttentionHead, MultiHeadAttention, OneLayerTransformer, random_head


def direct(W, v, X):
    """Reference: f(X) = softmax(X W x_N)^T (X v), one input at a time."""
    out = []
    for x in X:
        s = x @ W @ x[-1]
        a = np.exp(s - s.max())
        a /= a.sum()
        out.append(a @ (x @ v))
    return np.array(out)


def test_dense_head_matches_direct_computation():
    rng = np.random.default_rng(0)
    d = 6
    W, v = rng.standard_normal((d, d)), rng.standard_normal(d)
    X = rng.standard_normal((5, 4, d))
    np.testing.assert_allclose(AttentionHead(v, W=W)(X), direct(W, v, X), rtol=1e-13, atol=1e-14)


def test_factored_head_equals_dense_and_never_needs_W():
    rng = np.random.default_rng(1)
    d, r = 10, 3
    K, Q, v = rng.standard_normal((r, d)), rng.standard_normal((r, d)), rng.standard_normal(d)
    X = rng.standard_normal((7, 3, d))
    fac = AttentionHead(v, K=K, Q=Q)
    assert fac.is_lowrank and fac.rank == r
    np.testing.assert_allclose(fac(X), AttentionHead(v, W=K.T @ Q)(X), rtol=1e-12)


@pytest.mark.parametrize("factored", [False, True])
def test_biased_head_matches_the_module_formula(factored):
    # f(X) = sum_i softmax_i(x_i^T (W x_N + c)) x_i^T v + beta, one input at a time; the
    # paper's head is c = 0, beta = 0 (the defaults)
    rng = np.random.default_rng(2)
    d, r = 9, 3
    K, Q, v = rng.standard_normal((r, d)), rng.standard_normal((r, d)), rng.standard_normal(d)
    c, beta = rng.standard_normal(d), 0.7

    def formula(X):
        out = []
        for x in X:
            s = x @ (K.T @ Q @ x[-1] + c)
            a = np.exp(s - s.max())
            out.append(a @ (x @ v) / a.sum() + beta)
        return np.array(out)

    kw = {"K": K, "Q": Q} if factored else {"W": K.T @ Q}
    head = AttentionHead(v, key_bias=c, offset=beta, **kw)
    assert head.has_bias and not AttentionHead(v, **kw).has_bias
    X = rng.standard_normal((16, 4, d))  # distinct last tokens: the whole-batch path
    np.testing.assert_allclose(head(X), formula(X), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(head.scores(X),
                               np.einsum("bnd,bd->bn", X, X[:, -1] @ (K.T @ Q).T + c),
                               rtol=1e-12, atol=1e-12)
    X[:, -1] = X[0, -1]  # one run of a shared last token: the cached path
    np.testing.assert_allclose(head(X), formula(X), rtol=1e-12, atol=1e-13)
    plain = AttentionHead(v, **kw)
    assert np.all(plain.key_bias == 0) and plain.offset == 0


def test_random_head_bias_knobs():
    plain = random_head(12, seed=4, rank=3)
    biased = random_head(12, seed=4, rank=3, key_bias=2.0, offset=-0.5)
    np.testing.assert_array_equal(plain.K, biased.K)  # the knobs draw after everything else
    np.testing.assert_array_equal(plain.v, biased.v)
    assert np.isclose(np.linalg.norm(biased.key_bias), 2.0) and biased.offset == -0.5
    # c lies in the column space of W, where a real module's W_K^T b_Q / sqrt(d_h) lies
    assert np.linalg.matrix_rank(np.c_[biased.W, biased.key_bias], tol=1e-10) == 3
    dense = random_head(6, seed=4, key_bias=1.0)
    assert np.isclose(np.linalg.norm(dense.key_bias), 1.0)
    mh = MultiHeadAttention([biased, plain], offset=0.25)
    X = np.random.default_rng(0).standard_normal((3, 2, 12))
    np.testing.assert_allclose(mh(X), biased(X) + plain(X) + 0.25)
    assert mh.total_offset == -0.25


def test_one_row_query_returns_x_dot_v():
    head = random_head(5, seed=3)
    X = np.eye(5)[:, None, :]
    np.testing.assert_allclose(head(X), head.v, rtol=0, atol=1e-15)


def test_softmax_is_stable_for_huge_logits():
    d = 4
    head = AttentionHead(np.ones(d), W=1e6 * np.eye(d))
    X = np.random.default_rng(2).standard_normal((50, 5, d))
    y = head(X)
    assert np.all(np.isfinite(y))


def test_sparse_query_tokens_give_the_same_answers():
    head = random_head(128, seed=4)
    X = np.zeros((64, 2, 128))
    X[:, 0, :] = np.random.default_rng(5).standard_normal((64, 128))
    X[np.arange(64), 1, np.arange(64)] = 1.0  # one-hot last tokens take the sparse path
    np.testing.assert_allclose(head(X), direct(head.W, head.v, X), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "kw, check",
    [
        ({"W_fro": 3.0}, lambda h: np.isclose(np.linalg.norm(h.W), 3.0)),
        ({"W_spectral": 500.0}, lambda h: np.isclose(np.linalg.norm(h.W, 2), 500.0)),
        ({"logit_scale": 0.5}, lambda h: np.isclose(np.linalg.norm(h.W) / h.d, 0.5)),
        ({"rank": 2}, lambda h: h.rank == 2 and h.is_lowrank),
        ({"rank": 2, "W_spectral": 7.0}, lambda h: np.isclose(np.linalg.norm(h.W, 2), 7.0)),
    ],
)
def test_generator_scale_knobs(kw, check):
    assert check(random_head(8, seed=0, **kw))


def test_generator_margin_and_zero_fraction():
    h = random_head(20, seed=1, mu=0.1, zero_frac=0.25)
    nz = h.v[h.v != 0]
    assert np.sum(h.v == 0) == 5
    assert np.isclose(np.min(np.abs(nz)), 0.1) and np.all(np.abs(nz) <= 1.0)


def test_generators_are_pure_functions_of_the_seed():
    a, b = random_head(6, seed=[1, 2], rank=3), random_head(6, seed=[1, 2], rank=3)
    np.testing.assert_array_equal(a.W, b.W)
    np.testing.assert_array_equal(a.v, b.v)
    assert not np.array_equal(random_head(6, seed=[1, 3]).W, a.W)


@pytest.mark.parametrize(
    "make",
    [
        lambda: AttentionHead(np.ones(3), W=np.ones((3, 4))),
        lambda: AttentionHead(np.ones(3)),
        lambda: AttentionHead(np.ones(3), W=np.eye(3), K=np.eye(3), Q=np.eye(3)),
        lambda: AttentionHead(np.ones(3), K=np.ones((2, 3)), Q=np.ones((1, 3))),
        lambda: AttentionHead(np.array([1.0, np.nan]), W=np.eye(2)),
        lambda: random_head(0),
        lambda: random_head(4, rank=5),
        lambda: random_head(4, W_fro=1.0, W_spectral=1.0),
        lambda: random_head(4, mu=0.0),
        lambda: random_head(4, mu=1.5),
        lambda: MultiHeadAttention([]),
        lambda: AttentionHead(np.ones(3), W=np.eye(3), key_bias=np.ones(2)),
        lambda: AttentionHead(np.ones(3), W=np.eye(3), offset=np.ones(2)),
        lambda: AttentionHead(np.ones(3), W=np.eye(3), offset=np.inf),
        lambda: random_head(4, key_bias=-1.0),
        lambda: OneLayerTransformer(np.eye(3), np.ones((3, 2)), np.ones(3)),
    ],
)
def test_bad_model_parameters_are_rejected(make):
    with pytest.raises(ModelError):
        make()


def test_head_rejects_inputs_of_the_wrong_width():
    with pytest.raises(ModelError, match="shape"):
        random_head(4, seed=0)(np.ones((2, 3, 5)))


def test_multihead_is_the_sum_of_its_heads():
    heads = [random_head(5, seed=i) for i in range(3)]
    X = np.random.default_rng(0).standard_normal((4, 3, 5))
    np.testing.assert_allclose(MultiHeadAttention(heads)(X), sum(h(X) for h in heads))


def test_transformer_on_one_row_is_the_ffn():
    rng = np.random.default_rng(0)
    tf = OneLayerTransformer(rng.standard_normal((4, 4)), rng.standard_normal((4, 6)),
                             rng.standard_normal(6))
    x = rng.standard_normal((9, 4))
    np.testing.assert_allclose(tf(x[:, None, :]), np.maximum(x @ tf.A, 0) @ tf.w_o)


def _shared_last_token_batch(rng, d, n_runs, per_run, N=3):
    """Queries whose last tokens come in runs of identical rows (as the learners' probes do)."""
    X = rng.standard_normal((n_runs * per_run, N, d))
    tokens = rng.standard_normal((n_runs, d))
    X[:, -1, :] = np.repeat(tokens, per_run, axis=0)
    return X


@pytest.mark.parametrize("factored", [False, True])
def test_runs_of_shared_last_tokens_are_evaluated_exactly(factored):
    rng = np.random.default_rng(5)
    d, r = 12, 3
    K, Q, v = rng.standard_normal((r, d)), rng.standard_normal((r, d)), rng.standard_normal(d)
    head = AttentionHead(v, K=K, Q=Q) if factored else AttentionHead(v, W=K.T @ Q)
    X = _shared_last_token_batch(rng, d, n_runs=3, per_run=7)  # run by run, through the cache
    np.testing.assert_allclose(head(X), direct(K.T @ Q, v, X), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(head.scores(X), np.einsum("bnd,de,be->bn", X, K.T @ Q, X[:, -1]),
                               rtol=1e-12, atol=1e-12)
    # many runs: the whole-batch path; more distinct tokens than the cache holds
    X = _shared_last_token_batch(rng, d, n_runs=150, per_run=2)
    np.testing.assert_allclose(head(X), direct(K.T @ Q, v, X), rtol=1e-12, atol=1e-13)
    for start in range(0, 300, 6):  # small batches: cache hits, misses and evictions
        np.testing.assert_allclose(head(X[start:start + 6]), direct(K.T @ Q, v, X[start:start + 6]),
                                   rtol=1e-12, atol=1e-13)


def test_token_cache_returns_identical_answers_and_is_not_pickled():
    import pickle

    rng = np.random.default_rng(6)
    head = random_head(16, rng, rank=2)
    X = _shared_last_token_batch(rng, 16, n_runs=2, per_run=5)
    first = head(X)
    assert np.array_equal(head(X), first)  # same query, same answer, cached or not
    clone = pickle.loads(pickle.dumps(head))
    assert clone._cache == {} and len(head._cache) == 2
    assert np.array_equal(clone(X), first)


def test_run_starts():
    from attnquery.models import run_starts

    rows = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 3.0], [1.0, 2.0], [1.0, 2.0]])
    assert run_starts(rows).tolist() == [0, 2, 3]
    assert run_starts(rows[:1]).tolist() == [0]
    assert run_starts(rows[:0]).tolist() == []
    wide = np.zeros((4, 20))
    wide[2, 15] = 1.0  # differs beyond the leading entries compared first
    assert run_starts(wide).tolist() == [0, 2, 3]
