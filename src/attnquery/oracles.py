"""Oracles: the only view of a black box that a learner gets.

An oracle wraps any callable ``fn`` that maps a float64 array of shape ``(B, N, d)`` to an array of
shape ``(B,)``. It validates every query and every answer, counts queries (a batch of B counts B)
and enforces an optional budget *before* anything is spent.

A learner receives an oracle and reads ``oracle.d``; it never receives the model. The wrapped
callable is kept in a private slot and is not part of the public interface.
"""

from __future__ import annotations

import numpy as np

from .errors import AnswerError, BudgetExceededError, OracleFailure, QueryError

__all__ = ["Oracle", "ValueOracle"]


class Oracle:
    """Base class: query validation, counting and budget.

    Subclasses implement :meth:`_answer`, which receives a validated batch and returns the raw
    answers; the base class validates them and counts the queries.

    Parameters
    ----------
    d : int
        Token dimension of the black box.
    budget : int, optional
        Maximum number of queries; a batch that would exceed it raises
        :class:`~attnquery.errors.BudgetExceededError` and costs nothing.
    """

    #: what the answers are: "value", "approximate value", "membership", ...
    kind = "value"

    __slots__ = ("_d", "_budget", "_n_queries", "_n_calls")

    def __init__(self, d: int, budget: int | None = None):
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1:
            raise QueryError(f"d must be a positive integer; got {d!r}")
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int | np.integer) or budget < 0
        ):
            raise QueryError(f"budget must be a non-negative integer or None; got {budget!r}")
        self._d = int(d)
        self._budget = None if budget is None else int(budget)
        self._n_queries = 0
        self._n_calls = 0

    # -- public interface ---------------------------------------------------------------------
    @property
    def d(self) -> int:
        """Token dimension."""
        return self._d

    @property
    def n_queries(self) -> int:
        """Number of queries answered so far (a batch of B counts B)."""
        return self._n_queries

    @property
    def n_calls(self) -> int:
        """Number of batches answered so far."""
        return self._n_calls

    @property
    def budget(self) -> int | None:
        """The query budget, or None."""
        return self._budget

    @property
    def remaining(self) -> int | None:
        """Queries left in the budget, or None when there is no budget."""
        return None if self._budget is None else self._budget - self._n_queries

    def check_budget(self, n: int, what: str = "this step") -> None:
        """Raise :class:`BudgetExceededError` if ``n`` more queries would exceed the budget.

        Learners call this before a stage so that a budget too small is reported before any
        query of the stage is spent.
        """
        if self._budget is not None and self._n_queries + n > self._budget:
            raise BudgetExceededError(
                f"{what} needs {n} queries but only {self._budget - self._n_queries} of the "
                f"budget of {self._budget} remain ({self._n_queries} spent)"
            )

    def __call__(self, X) -> np.ndarray:
        """Answer a batch of queries ``X`` of shape (B, N, d); returns shape (B,)."""
        X = self._validate_query(X)
        B = X.shape[0]
        self.check_budget(B, what=f"a batch of {B} queries")
        y = self._answer(X)
        y = self._validate_answer(y, B)
        self._n_queries += B
        self._n_calls += 1
        return y

    query = __call__

    def __repr__(self) -> str:
        b = "" if self._budget is None else f", budget={self._budget}"
        return f"{type(self).__name__}(d={self._d}{b}, n_queries={self._n_queries})"

    # -- validation -----------------------------------------------------------------------------
    def _validate_query(self, X) -> np.ndarray:
        if not isinstance(X, np.ndarray):
            raise QueryError(
                f"queries must be a numpy array of shape (B, N, {self._d}) and dtype float64; "
                f"got {type(X).__name__}"
            )
        if X.dtype != np.float64:
            raise QueryError(f"queries must have dtype float64; got {X.dtype}")
        if X.ndim != 3:
            raise QueryError(
                f"queries must have shape (B, N, d) = (B, N, {self._d}); got shape {X.shape}"
            )
        B, N, d = X.shape
        if d != self._d:
            raise QueryError(f"queries must have d = {self._d} columns; got shape {X.shape}")
        if N < 1:
            raise QueryError(f"every query needs at least one row (N >= 1); got shape {X.shape}")
        if B < 1:
            raise QueryError(f"a batch needs at least one query (B >= 1); got shape {X.shape}")
        if not np.all(np.isfinite(X)):
            bad = int(np.count_nonzero(~np.isfinite(X).all(axis=(1, 2))))
            raise QueryError(f"queries must be finite; {bad} of {B} contain NaN or inf")
        return X

    def _validate_answer(self, y, B: int) -> np.ndarray:
        try:
            y = np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise AnswerError(f"the black box returned a non-numeric answer: {exc}") from None
        if y.shape != (B,):
            raise AnswerError(
                f"the black box must return shape ({B},) for a batch of {B}; got {y.shape}"
            )
        if not np.all(np.isfinite(y)):
            bad = int(np.count_nonzero(~np.isfinite(y)))
            raise AnswerError(f"the black box returned {bad} non-finite answers (NaN or inf)")
        return y

    def _answer(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


def _call_black_box(fn, X: np.ndarray) -> np.ndarray:
    """Call a user's black box on a read-only view of the queries, wrapping its failures."""
    view = X.view()
    view.flags.writeable = False
    try:
        return fn(view)
    except Exception as exc:  # the black box is foreign code: report whatever it raised
        raise OracleFailure(
            f"the black box raised {type(exc).__name__} on a batch of shape {X.shape}: {exc}"
        ) from exc


class ValueOracle(Oracle):
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

    __slots__ = ("__fn",)

    def __init__(self, fn, d: int, budget: int | None = None):
        if not callable(fn):
            raise QueryError(f"fn must be callable; got {type(fn).__name__}")
        super().__init__(d, budget)
        self.__fn = fn

    def _answer(self, X: np.ndarray) -> np.ndarray:
        return _call_black_box(self.__fn, X)
