"""Black boxes used by the command-line tests (``--oracle tests.fixtures:FUNCTION``).

Each is a plain function of a float64 array (B, N, d) returning (B,); the ground truth is exposed
beside it so tests can check what the extraction recovered.
"""

from attnquery.models import AttentionHead, random_head

#: the head behind :func:`some_head` (d = 16, dense W, default scale)
SOME_HEAD: AttentionHead = random_head(16, seed=123)

#: the head behind :func:`low_rank_head` (d = 24, rank 3, stored as factors)
LOW_RANK_HEAD: AttentionHead = random_head(24, seed=7, rank=3)


def some_head(X):
    """A dense single attention head, d = 16."""
    return SOME_HEAD(X)


def low_rank_head(X):
    """A rank-3 single attention head, d = 24."""
    return LOW_RANK_HEAD(X)


def failing_head(X):
    """A black box that raises, to test error reporting."""
    raise RuntimeError("the service is unavailable")


NOT_CALLABLE = 3


class NoQueryLearner:
    """A broken learner that answers without asking anything (to test the query count check)."""

    def __init__(self, random_state=None, n_queries_=None):
        self.random_state = random_state
        self._claimed = n_queries_

    def fit(self, oracle):
        d = oracle.d
        self.W_ = SOME_HEAD.W if d == SOME_HEAD.d else None
        self.v_ = SOME_HEAD.v
        if self._claimed is not None:
            oracle(SOME_HEAD.v.reshape(1, 1, -1).copy())
            self.n_queries_ = self._claimed
        return self
