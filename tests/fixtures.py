"""Black boxes used by the command-line tests (``--oracle tests.fixtures:FUNCTION``).

Each is a plain function of a float64 array (B, N, d) returning (B,) (a box that answers vectors,
for ``--answers``, returns (B, N, d_out)); the ground truth is exposed beside it so tests can
check what the extraction recovered.
"""

from attnquery.models import AttentionHead, random_head
from tests.boxes import relative_noise, two_heads

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


# -- black boxes that are not what a learner assumes (command-line failure tests) -------------

#: a dense full-rank head, d = 8
HEAD8: AttentionHead = random_head(8, seed=8)
_TWO_HEADS = two_heads(8, seed=8)
_NOISY8 = relative_noise(HEAD8, 1e-4, seed=8)


def two_heads_box(X):
    """Two heads summed, d = 8."""
    return _TWO_HEADS(X)


def head8(X):
    """A dense full-rank single head, d = 8."""
    return HEAD8(X)


def noisy_head8(X):
    """:data:`HEAD8` with answers carrying 1e-4 relative noise."""
    return _NOISY8(X)


def complex_head8(X):
    """:data:`HEAD8`'s answers as complex numbers."""
    return HEAD8(X) + 0j


def exiting_head(X):
    """A black box that calls ``sys.exit(3)``."""
    raise SystemExit(3)


def interrupted_head(X):
    """A black box interrupted by Ctrl-C."""
    raise KeyboardInterrupt


def cancelled_head(X):
    """A black box whose async client was cancelled (a BaseException, not an Exception)."""
    import asyncio

    raise asyncio.CancelledError("the request was cancelled")


def boolean_head8(X):
    """:data:`HEAD8`'s answers as booleans (``f(X) > 0``), not numbers."""
    return HEAD8(X) > 0


class _Unprintable(Exception):
    def __str__(self):
        raise ValueError("the message itself fails")


def unprintable_head(X):
    """A black box raising an exception whose message cannot be made."""
    raise _Unprintable()


# -- a rotary head (RoPE), for --method rotary --------------------------------------------------
def _rotary_head():
    from attnquery.models import random_rotary_head

    return random_rotary_head(16, 11, head_dim=8, rope_base=1e4)


#: the head behind :func:`rotary_head` (d = 16, head_dim 8, fully rotary, base 1e4)
ROTARY_HEAD = _rotary_head()


def rotary_head(X):
    """A rotary attention head (Llama-style RoPE), d = 16."""
    return ROTARY_HEAD(X)


# -- a rotary GQA layer answering vectors, for --answers all --param positions=rotary -----------
def _rotary_gqa_layer(outputs="all"):
    from attnquery.models.vector import random_vector_layer

    return random_vector_layer(32, 4, seed=3, n_kv_heads=2, bias=0.3, causal=True,
                               rope_base=1e4, outputs=outputs)


#: the layer behind :func:`rotary_gqa_layer` (Qwen2-style: d = 32, 4 query heads over 2
#: key/value heads, RoPE of base 1e4 over each head of 8, every bias, a causal mask)
ROTARY_GQA_LAYER = _rotary_gqa_layer()


def rotary_gqa_layer(X):
    """Every token's output vector (B, N, 32) of a causal rotary GQA layer, d = 32."""
    return ROTARY_GQA_LAYER(X)


#: the same layer answering the last token's output only
ROTARY_GQA_LAYER_LAST = _rotary_gqa_layer(outputs="last")


def rotary_gqa_layer_last(X):
    """The last token's output vector (B, 32) of the same layer."""
    return ROTARY_GQA_LAYER_LAST(X)


# -- a rotary GQA layer read out (one number per query), for --method layer positions=rotary ----
def _rotary_scalar_layer():
    from attnquery.models import random_rotary_layer

    return random_rotary_layer(24, 4, 2, 3, rope_base=1e4)


#: the layer behind :func:`rotary_scalar_layer` (d = 24, 4 query heads over 2 key/value heads
#: of 6, RoPE of base 1e4, no biases, read out along a unit vector)
ROTARY_SCALAR_LAYER = _rotary_scalar_layer()


def rotary_scalar_layer(X):
    """A rotary GQA layer read out along a vector, d = 24: one number per query."""
    return ROTARY_SCALAR_LAYER(X)
