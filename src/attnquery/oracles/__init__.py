"""Oracles: the only view of a black box that a learner gets.

An oracle wraps any callable ``fn`` that maps a float64 array of shape ``(B, N, d)`` to an array of
shape ``(B,)``. It validates every query and every answer, counts queries (a batch of B counts B)
and enforces an optional budget *before* anything is spent.

:class:`VectorOracle` wraps a box that answers output vectors, (B, N, d_out) or (B, d_out), and
also counts the tokens it was sent.

A learner receives an oracle and reads ``oracle.d``; it never receives the model. The wrapped
callable is kept in a private slot and is not part of the public interface.
"""

from __future__ import annotations

import numpy as np

# the errors the oracles raise are importable from here too (as they were)
from ..errors import (  # noqa: F401
    AnswerError,
    AssumptionViolation,
    BudgetExceededError,
    OracleFailure,
    QueryError,
)
from ..rng import seed_int
from ..theory import FORMAT_BITS, ROUNDING_DTYPES, parse_rounding, relative_rounding_error  # noqa: F401
from ._base import (  # noqa: F401 (the helpers of the oracles' base, importable from here as before)
    CappedOracle,
    ForwardingOracle,
    Oracle,
    _BoxOracle,
    _call_black_box,
    _check_callable,
    _check_finite,
    _is_int,
    _message,
    _real_answers,
)

__all__ = ["Oracle", "ValueOracle", "VectorOracle", "AntisymmetricOracle", "ApproximateValueOracle",
           "RoundingOracle", "MembershipOracle", "ToleranceError", "query_hash",
           "relative_rounding_error", "ROUNDING_DTYPES", "FORMAT_BITS", "ForwardingOracle",
           "CappedOracle"]


class ValueOracle(_BoxOracle):
    """Exact value queries ``VQ(X) = f(X)``.

    Parameters
    ----------
    fn : callable
        Maps a float64 array (B, N, d) to an array (B,). Any callable works: a model from
        :mod:`attnquery.models`, a closure around a network, a remote API client.
    d : int
        Token dimension.
    budget : int, optional
        Maximum number of queries.

    Examples
    --------
    >>> from attnquery.models import random_head
    >>> oracle = ValueOracle(random_head(4, seed=0), 4)
    >>> oracle(np.ones((3, 2, 4))).shape, oracle.n_queries
    ((3,), 3)
    """

    __slots__ = ()

    def __init__(self, fn, d: int, budget: int | None = None):
        _check_callable(fn)
        super().__init__(fn, d, budget)

    def _answer(self, X: np.ndarray) -> np.ndarray:
        return self._ask(X)


class AntisymmetricOracle(Oracle):
    """Antisymmetric queries ``VQ~(X) = VQ(X) - VQ(-X)`` (paper Sec. 4.1).

    For a one-layer transformer ``w_o^T ReLU(alpha^T X A)`` the scores do not change when every
    token is negated, and ``ReLU(u) - ReLU(-u) = u``; so this oracle answers exactly as the
    single-head attention ``alpha(X, W)^T X v`` with ``v = A w_o`` would.

    Each call asks the wrapped oracle for the 2B queries ``[X; -X]`` in one batch, so the
    wrapped oracle counts (and budgets) two underlying queries per antisymmetric query. This
    oracle's own :attr:`n_queries` counts antisymmetric queries.

    Parameters
    ----------
    oracle : Oracle
        A value oracle (anything with ``__call__``, ``d`` and ``n_queries``).
    budget : int, optional
        Maximum number of antisymmetric queries (the wrapped oracle's budget also applies).
    """

    kind = "value"

    __slots__ = ("_inner",)

    def __init__(self, oracle, budget: int | None = None):
        if not callable(oracle) or not hasattr(oracle, "d") or not hasattr(oracle, "n_queries"):
            raise QueryError(
                "AntisymmetricOracle wraps an oracle (an object with __call__, d and "
                f"n_queries); got {type(oracle).__name__}"
            )
        super().__init__(int(oracle.d), budget)
        self._inner = oracle

    @property
    def inner(self) -> Oracle:
        """The wrapped oracle."""
        return self._inner

    @property
    def n_underlying_queries(self) -> int:
        """Queries the wrapped oracle has counted in all (two per antisymmetric query here)."""
        return int(self._inner.n_queries)

    def check_budget(self, n: int, what: str = "this step") -> None:
        """Check this oracle's budget for ``n`` queries and the wrapped one's for ``2 n``."""
        super().check_budget(n, what)
        inner_check = getattr(self._inner, "check_budget", None)
        if inner_check is not None:
            inner_check(2 * n, f"{what} (two underlying queries each)")

    def _answer(self, X: np.ndarray) -> np.ndarray:
        B = X.shape[0]
        self.check_budget(B, what=f"a batch of {B} antisymmetric queries")
        y = np.asarray(self._inner(np.concatenate([X, -X], axis=0)), dtype=np.float64)
        if y.shape != (2 * B,):
            raise AnswerError(
                f"the wrapped oracle must return shape ({2 * B},); got {y.shape}"
            )
        return y[:B] - y[B:]


class VectorOracle(_BoxOracle):
    """Value queries answered with vectors: the output of every token, or of the last one.

    A served attention module returns an output vector per token. This oracle wraps such a box:
    ``outputs="all"`` answers a batch ``(B, N, d)`` with an array ``(B, N, d_out)`` (row n is
    token n's output), ``outputs="last"`` with ``(B, d_out)`` (the last token's output only).
    Queries are validated, counted and budgeted as by :class:`Oracle` (a batch of B counts B
    queries); :attr:`n_tokens` also counts the tokens sent (a query of N tokens counts N).

    Parameters
    ----------
    fn : callable
        Maps a float64 array (B, N, d) to an array (B, N, d_out) (``outputs="all"``) or
        (B, d_out) (``outputs="last"``).
    d : int
        Token dimension.
    outputs : {"all", "last"}
        Which outputs the box returns.
    d_out : int, optional
        Output dimension. Default: read from the first answer; every later answer must have
        the same.
    budget : int, optional
        Maximum number of queries.

    Examples
    --------
    >>> from attnquery.models.vector import random_vector_layer
    >>> oracle = VectorOracle(random_vector_layer(4, 1, seed=0), 4)
    >>> oracle(np.ones((3, 2, 4))).shape, oracle.n_queries, oracle.n_tokens
    ((3, 2, 4), 3, 6)
    """

    kind = "vector"
    OUTPUTS = ("all", "last")

    __slots__ = ("_outputs", "_d_out", "_n_tokens")

    def __init__(self, fn, d: int, outputs: str = "all", d_out: int | None = None,
                 budget: int | None = None):
        _check_callable(fn)
        if outputs not in self.OUTPUTS:
            raise QueryError(f"outputs must be one of {self.OUTPUTS}; got {outputs!r}")
        if d_out is not None and (not _is_int(d_out) or d_out < 1):
            raise QueryError(f"d_out must be a positive integer or None; got {d_out!r}")
        super().__init__(fn, d, budget)
        self._outputs = outputs
        self._d_out = None if d_out is None else int(d_out)
        self._n_tokens = 0

    @property
    def outputs(self) -> str:
        """``"all"`` (every token's output) or ``"last"`` (the last token's)."""
        return self._outputs

    @property
    def d_out(self) -> int | None:
        """Output dimension (None until the first answer when it was not given)."""
        return self._d_out

    @property
    def n_tokens(self) -> int:
        """Tokens in the queries answered so far (a query of N tokens counts N)."""
        return self._n_tokens

    def __repr__(self) -> str:
        b = "" if self._budget is None else f", budget={self._budget}"
        return (f"{type(self).__name__}(d={self._d}, outputs={self._outputs!r}, "
                f"d_out={self._d_out}{b}, n_queries={self._n_queries}, "
                f"n_tokens={self._n_tokens})")

    def __call__(self, X) -> np.ndarray:
        """Answer a batch ``X`` (B, N, d): shape (B, N, d_out) or (B, d_out)."""
        X = self._validate_query(X)
        B, N = X.shape[0], X.shape[1]
        self.check_budget(B, what=f"a batch of {B} queries")
        y = self._validate_vectors(self._ask(X), B, N)
        self._n_queries += B
        self._n_calls += 1
        self._n_tokens += B * N
        return y

    query = __call__

    def _validate_vectors(self, y, B: int, N: int) -> np.ndarray:
        y = _real_answers(y)
        lead = (B, N) if self._outputs == "all" else (B,)
        names = "(B, N, d_out)" if self._outputs == "all" else "(B, d_out)"
        if y.ndim != len(lead) + 1 or y.shape[:-1] != lead or y.shape[-1] < 1:
            want = lead + ("d_out" if self._d_out is None else self._d_out,)
            raise AnswerError(
                f"the black box must return shape {names} = {want} for a batch of shape "
                f"({B}, {N}, {self._d}) with outputs={self._outputs!r}; got {y.shape}"
                .replace("'d_out'", "d_out"))
        if self._d_out is not None and y.shape[-1] != self._d_out:
            raise AnswerError(f"the black box must return d_out = {self._d_out} numbers per "
                              f"output; got shape {y.shape}")
        _check_finite(y)
        self._d_out = int(y.shape[-1])
        return y


# ----------------------------------------------------------------------------------------------
# Noisy, rounding and membership oracles (paper Sec. 6 and App. B)
# ----------------------------------------------------------------------------------------------

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 arrays (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def query_hash(X: np.ndarray, seed: int) -> np.ndarray:
    """A 64-bit hash of each query's bytes (and shape) and ``seed``; shape (B,) uint64.

    Vectorised: every float64 entry is mixed with a hash of its position, the mixed words are
    summed modulo 2^64 and the sum is mixed again with the query's length N. ``-0.0`` and
    ``0.0`` hash alike (the same query, numerically).
    """
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float64) + 0.0)
    B, N, d = X.shape
    words = X.reshape(B, N * d).view(np.uint64)
    salt = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    pos = _splitmix64(np.arange(N * d, dtype=np.uint64) ^ salt)
    with np.errstate(over="ignore"):
        acc = _splitmix64(words ^ pos).sum(axis=1, dtype=np.uint64)
        acc = acc + _splitmix64(np.array([N * 0x100000001B3 + d], dtype=np.uint64))[0]
    return _splitmix64(acc ^ salt)


class ToleranceError(QueryError, AssumptionViolation):
    """An approximate oracle was given a tolerance that is not a positive number.

    Both a :class:`QueryError` (bad oracle parameter) and an :class:`AssumptionViolation`
    (Theorem 6.1 assumes ``tau > 0``), so either can catch it.
    """


class ApproximateValueOracle(_BoxOracle):
    """Approximate value queries ``AVQ(X; tau)``: every answer within ``+-tau`` of ``f(X)``.

    The answers are deterministic: the same query always gets the same answer (paper Sec. 6).

    Parameters
    ----------
    fn : callable
        The black box, (B, N, d) -> (B,).
    d : int
        Token dimension.
    tau : float
        Tolerance, > 0.
    noise : {"uniform", "adversarial"}
        ``"uniform"``: ``f(X) + tau (2 u - 1)`` with ``u`` in [0, 1) derived from a 64-bit hash
        of the query's bytes and the seed (:func:`query_hash`), so repeated queries repeat their
        answer and distinct queries get independent-looking noise.

        ``"adversarial"``: ``f(X) + tau * s(X)`` with a sign ``s(X)`` in {-1, +1} chosen, from
        the query alone, to hurt the learners of Theorem 6.1 and Theorem 4.1 most. The
        adversary knows their probe family and reads the black box freely (its own reads are
        not counted):

        * one-row queries ``[x]`` (the learner reads ``v`` from them): ``s = -sign(f(X))``, the
          answer moves towards 0, which shrinks the learner's ``|v_i|`` and so inflates every
          ratio it later divides by ``v_i``;
        * two-row queries ``[x_1; x_2]``: the adversary evaluates ``x_1^T v = f([x_1])`` and
          ``x_2^T v = f([x_2])``, recovers the true weight on the first row
          ``alpha = (f(X) - x_2^T v) / ((x_1 - x_2)^T v)``, and picks ``s`` so that the
          learner's estimate ``(y - x_2^T v) / ((x_1 - x_2)^T v)`` moves by
          ``tau / |(x_1 - x_2)^T v|`` away from 1/2, towards saturation:
          ``s = sign(alpha - 1/2) * sign((x_1 - x_2)^T v)`` (``alpha = 1/2`` counts as above);
          where ``(x_1 - x_2)^T v = 0`` it falls back to ``-sign(f(X))``;
        * longer queries: ``s = -sign(f(X))``.

        ``sign(0)`` is taken as +1, so every answer is exactly ``tau`` away from ``f(X)``.
    random_state : int, Generator, SeedSequence or None
        Seed of the uniform noise (``None``: fresh entropy, fixed for this oracle's lifetime).
    budget : int, optional
        Maximum number of queries.

    Attributes
    ----------
    tau : float
        The tolerance (a learner may read it).
    noise : str
    """

    kind = "approximate value"
    NOISE_MODELS = ("uniform", "adversarial")

    __slots__ = ("_tau", "_noise", "_seed")

    def __init__(self, fn, d: int, tau: float, noise: str = "uniform", random_state=None,
                 budget: int | None = None):
        _check_callable(fn)
        try:
            tau_f = float(tau)
        except (TypeError, ValueError):
            raise ToleranceError(f"tau must be a positive number; got {tau!r}") from None
        if not (np.isfinite(tau_f) and tau_f > 0):
            raise ToleranceError(f"tau must be a positive finite number (tau > 0); got {tau!r}")
        if noise not in self.NOISE_MODELS:
            raise QueryError(f"noise must be one of {self.NOISE_MODELS}; got {noise!r}")
        super().__init__(fn, d, budget)
        self._tau = tau_f
        self._noise = noise
        self._seed = seed_int(random_state)

    @property
    def tau(self) -> float:
        """The tolerance: every answer is within +-tau of f(X)."""
        return self._tau

    @property
    def noise(self) -> str:
        """The noise model."""
        return self._noise

    def __repr__(self) -> str:
        b = "" if self._budget is None else f", budget={self._budget}"
        return (f"{type(self).__name__}(d={self._d}, tau={self._tau:g}, noise={self._noise!r}"
                f"{b}, n_queries={self._n_queries})")

    def _answer(self, X: np.ndarray) -> np.ndarray:
        y = self._validate_answer(self._ask(X), X.shape[0])
        if self._noise == "uniform":
            h = query_hash(X, self._seed)
            u = (h >> np.uint64(11)).astype(np.float64) * 2.0**-53
            return y + self._tau * (2.0 * u - 1.0)
        return y + self._tau * self._adversarial_sign(X, y)

    def _adversarial_sign(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        sgn = np.where(y >= 0, -1.0, 1.0)  # towards 0
        if X.shape[1] == 2:
            B = X.shape[0]
            rows = np.concatenate([X[:, 0:1, :], X[:, 1:2, :]], axis=0)
            r = self._validate_answer(self._ask(rows), 2 * B)
            x1v, x2v = r[:B], r[B:]
            den = x1v - x2v
            ok = den != 0
            with np.errstate(divide="ignore", invalid="ignore"):
                alpha = np.where(ok, (y - x2v) / np.where(ok, den, 1.0), 0.5)
            push = np.where(alpha >= 0.5, 1.0, -1.0) * np.where(den >= 0, 1.0, -1.0)
            sgn = np.where(ok, push, sgn)
        return sgn


def round_significant(y: np.ndarray, digits: int) -> np.ndarray:
    """Round every entry of ``y`` to ``digits`` significant decimal digits (0 stays 0)."""
    y = np.asarray(y, dtype=np.float64)
    out = np.zeros_like(y)
    nz = y != 0
    e = np.floor(np.log10(np.abs(y[nz])))
    q = 10.0 ** (digits - 1 - e)
    out[nz] = np.round(y[nz] * q) / q
    return out


def round_bfloat16(y: np.ndarray) -> np.ndarray:
    """Round float64 values to bfloat16 (round to nearest even, via float32) and back."""
    f = np.asarray(y, dtype=np.float64).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) & np.uint64(0xFFFF0000)
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


class RoundingOracle(_BoxOracle):
    """Value queries answered as an API that rounds its outputs would answer them.

    Give exactly one of ``digits`` (round to that many significant decimal digits) or
    ``dtype`` (``"float16"``: IEEE half precision, 11 significant bits; ``"bfloat16"``: 8
    significant bits; ``"float32"``: IEEE single precision, 24 significant bits; all round to
    nearest even and are returned as float64; ``"float64"`` leaves the answers as they are).

    Parameters
    ----------
    fn : callable
        The black box, (B, N, d) -> (B,).
    d : int
        Token dimension.
    digits : int, optional
        Significant decimal digits kept, >= 1.
    dtype : {"float16", "bfloat16", "float32", "float64"}, optional
    budget : int, optional

    Attributes
    ----------
    relative_tau : float
        Largest relative rounding error, ``|answer - f(X)| <= relative_tau * |f(X)|`` (up to
        the subnormal ranges): ``0.5 * 10**(1 - digits)``, or ``2**-b`` for a format with b
        significant bits (:func:`relative_rounding_error`).
    effective_digits : float
        ``1 - log10(2 * relative_tau)``: the number of significant decimal digits with the same
        worst-case relative error (``k`` for ``digits=k``; float16 about 4.0, bfloat16 about
        3.1, float32 about 7.9), to place formats on a digits axis.
    """

    kind = "rounded value"

    __slots__ = ("_digits", "_dtype")

    def __init__(self, fn, d: int, digits: int | None = None, dtype: str | None = None,
                 budget: int | None = None):
        _check_callable(fn)
        if (digits is None) == (dtype is None):
            raise QueryError(f"give exactly one of digits=k or dtype in {ROUNDING_DTYPES}")
        if digits is not None and (not _is_int(digits) or digits < 1 or digits > 17):
            raise QueryError(f"digits must be an integer in [1, 17]; got {digits!r}")
        if dtype is not None and dtype not in ROUNDING_DTYPES:
            raise QueryError(f"dtype must be one of {ROUNDING_DTYPES}; got {dtype!r}")
        super().__init__(fn, d, budget)
        self._digits = None if digits is None else int(digits)
        self._dtype = dtype

    @classmethod
    def from_spec(cls, fn, d: int, spec: str, budget: int | None = None) -> RoundingOracle:
        """The rounding oracle a precision string names (``"float16"``, ``"digits=3"``, ...:
        :func:`attnquery.theory.parse_rounding`)."""
        return cls(fn, d, budget=budget, **parse_rounding(spec))

    @property
    def digits(self) -> int | None:
        return self._digits

    @property
    def dtype(self) -> str | None:
        return self._dtype

    @property
    def relative_tau(self) -> float:
        return relative_rounding_error(self._digits, self._dtype)

    @property
    def effective_digits(self) -> float:
        return float(1.0 - np.log10(2.0 * self.relative_tau))

    def __repr__(self) -> str:
        what = f"digits={self._digits}" if self._digits is not None else f"dtype={self._dtype!r}"
        return f"{type(self).__name__}(d={self._d}, {what}, n_queries={self._n_queries})"

    def _answer(self, X: np.ndarray) -> np.ndarray:
        y = self._validate_answer(self._ask(X), X.shape[0])
        if self._digits is not None:
            return round_significant(y, self._digits)
        if self._dtype == "bfloat16":
            return round_bfloat16(y)
        if self._dtype == "float64":
            return y
        with np.errstate(over="ignore"):
            return y.astype(self._dtype).astype(np.float64)


class MembershipOracle(_BoxOracle):
    """Membership queries ``MQ(X) = 1 if f(X) > 0 else 0`` (paper App. B).

    Parameters
    ----------
    fn : callable
        The black box, (B, N, d) -> (B,).
    d : int
        Token dimension.
    budget : int, optional
        Maximum number of queries.
    """

    kind = "membership"

    __slots__ = ()

    def __init__(self, fn, d: int, budget: int | None = None):
        _check_callable(fn)
        super().__init__(fn, d, budget)

    def _answer(self, X: np.ndarray) -> np.ndarray:
        y = self._validate_answer(self._ask(X), X.shape[0])
        return (y > 0).astype(np.float64)
