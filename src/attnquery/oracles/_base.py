"""The oracles' bases: :class:`Oracle` (query validation, counting and budget), the base of
the oracles that wrap a black box, and :class:`ForwardingOracle`, the base of an oracle that
wraps another oracle query for query, with :func:`check_budget`, the one way to an oracle's
budget, and :class:`CappedOracle`, the forwarding oracle that holds a fit's ``n_queries``.
Every public name is importable from :mod:`attnquery.oracles`."""

from __future__ import annotations

import numpy as np

from ..errors import (
    AnswerError,
    BudgetExceededError,
    OracleFailure,
    QueryError,
)

__all__ = ["Oracle", "ForwardingOracle", "CappedOracle", "check_budget"]


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
        if not _is_int(d) or d < 1:
            raise QueryError(f"d must be a positive integer; got {d!r}")
        if budget is not None and (not _is_int(budget) or budget < 0):
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
        # a finite sum proves every entry finite (NaN and inf propagate); only a non-finite sum
        # (or an overflow) needs the entry-wise check
        if not np.isfinite(np.sum(X)) and not np.all(np.isfinite(X)):
            bad = int(np.count_nonzero(~np.isfinite(X).all(axis=(1, 2))))
            raise QueryError(f"queries must be finite; {bad} of {B} contain NaN or inf")
        return X

    def _validate_answer(self, y, B: int) -> np.ndarray:
        y = _real_answers(y)
        if y.shape != (B,):
            raise AnswerError(
                f"the black box must return shape ({B},) for a batch of {B}; got {y.shape}"
            )
        _check_finite(y)
        return y

    def _answer(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


def _is_int(x) -> bool:
    """Whether ``x`` is an integer (a Python or numpy int, not a bool)."""
    return not isinstance(x, bool) and isinstance(x, int | np.integer)


def _check_callable(fn) -> None:
    if not callable(fn):
        raise QueryError(f"fn must be callable; got {type(fn).__name__}")


def _real_answers(y) -> np.ndarray:
    """The black box's answers as a float64 array, or :class:`AnswerError` when they are not
    real numbers (complex, boolean, strings, ragged lists)."""
    try:
        raw = np.asarray(y)
    except (TypeError, ValueError) as exc:
        raise AnswerError(f"the black box returned a non-numeric answer: {exc}") from None
    if raw.dtype.kind == "O":  # Python objects: only real numbers pass
        kinds = {np.asarray(x).dtype.kind for x in raw.ravel()}
        kind = next((k for k in "cb" if k in kinds), "f" if kinds <= set("iuf") else "U")
    else:
        kind = raw.dtype.kind
    if kind == "c":
        raise AnswerError("the black box returned complex answers; answers must be real "
                          "numbers (the imaginary part is not dropped silently)")
    if kind == "b":
        raise AnswerError("the black box returned boolean answers; answers must be real "
                          "numbers (True and False are not taken as 1 and 0)")
    if kind not in "iuf":
        raise AnswerError(f"the black box returned answers that are not real numbers "
                          f"(dtype {raw.dtype})")
    try:
        y = raw.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise AnswerError(f"the black box returned a non-numeric answer: {exc}") from None
    return y


def _check_finite(y: np.ndarray) -> None:
    """Raise :class:`AnswerError` when an answer holds NaN or inf."""
    if not np.all(np.isfinite(y)):
        bad = int(np.count_nonzero(~np.isfinite(y)))
        raise AnswerError(f"the black box returned {bad} non-finite answers (NaN or inf)")


def _call_black_box(fn, X: np.ndarray) -> np.ndarray:
    """Call a user's black box on a read-only view of the queries, wrapping its failures."""
    view = X.view()
    view.flags.writeable = False
    try:
        return fn(view)
    except KeyboardInterrupt:  # an interruption stays one
        raise
    except BaseException as exc:  # noqa: BLE001 - foreign code: report whatever it raised
        # (SystemExit, and BaseExceptions such as asyncio.CancelledError from an async client)
        what = f"SystemExit({exc.code!r})" if isinstance(exc, SystemExit) else \
            f"{type(exc).__name__}"
        raise OracleFailure(
            f"the black box raised {what} on a batch of shape {X.shape}: {_message(exc)}"
        ) from exc


def _message(exc: BaseException) -> str:
    """``str(exc)``, or a note saying why it could not be made (foreign code's ``__str__``
    may itself raise)."""
    try:
        return str(exc)
    except Exception as err:  # noqa: BLE001 - any failure of foreign code is reported
        return f"(message unprintable: {type(err).__name__})"


class _BoxOracle(Oracle):
    """An oracle of a callable black box ``fn``, kept in a private slot (subclasses check
    ``fn`` and their parameters first); :meth:`_ask` calls it."""

    __slots__ = ("__fn",)

    def __init__(self, fn, d: int, budget: int | None = None):
        super().__init__(d, budget)
        self.__fn = fn

    def _ask(self, X: np.ndarray) -> np.ndarray:
        return _call_black_box(self.__fn, X)


class ForwardingOracle:
    """Base of an oracle that wraps another one query for query (one of its queries is one of
    the wrapped oracle's): the kind, the count and the budget are the wrapped oracle's
    (``_inner``).

    ``remaining`` and ``check_budget`` reach the wrapped oracle's budget, which
    :func:`check_budget` (and a :class:`~attnquery.learners._ledger.QueryLedger` around the
    wrapper) reads; the wrapper keeps no budget of its own. The
    :class:`~attnquery.learners._ledger.QueryLedger` is one, whose ``check_budget`` adds the
    fit's own cap (:attr:`own_budget`).
    """

    #: whether ``check_budget`` checks a budget of the wrapper's own besides the wrapped
    #: oracle's: then :func:`check_budget` asks the wrapper itself (the fit's ledger, whose
    #: ``check_budget`` is its ``need(n, what, reserved=True)``); else it reads ``remaining``
    own_budget = False

    @property
    def d(self) -> int:
        return int(self._inner.d)

    @property
    def kind(self) -> str:
        """The wrapped oracle's kind (``"value"`` unless it says otherwise)."""
        return getattr(self._inner, "kind", "value")

    @property
    def n_queries(self) -> int:
        """The wrapped oracle's count now."""
        return int(self._inner.n_queries)

    @property
    def remaining(self):
        """The wrapped oracle's ``remaining`` (None without a budget)."""
        return getattr(self._inner, "remaining", None)

    def check_budget(self, n: int, what: str = "this step") -> None:
        """The wrapped oracle's check (:func:`check_budget`)."""
        check_budget(self._inner, n, what)


class CappedOracle(ForwardingOracle):
    """An oracle that asks ``oracle`` at most ``cap`` queries more than it had answered when
    the wrapper was made: the whole-fit cap ``n_queries`` every learner takes.

    A learner's ``fit`` given ``n_queries`` asks its oracle through one of these
    (:class:`~attnquery.learners.base.BaseLearner` wraps it), so the cap is counted and refused
    in one place: its :attr:`remaining` is the least of what the cap and the wrapped oracle's
    own budget leave, which every planning check of the fit reads (a
    :class:`~attnquery.learners.base.QueryLedger` around it, :func:`check_budget`), and a batch
    the cap does not pay for raises :class:`~attnquery.errors.BudgetExceededError` naming
    ``n_queries`` before it is asked. The count is the wrapped oracle's (check queries
    included); every other attribute (``outputs``, ``n_tokens``, ``tau``, ...) is the wrapped
    oracle's.

    Parameters
    ----------
    oracle : oracle
        The oracle asked (any object with ``__call__``, ``d`` and ``n_queries``).
    cap : int
        The most queries asked through the wrapper (>= 0).
    name : str
        The parameter that set the cap, for messages (default ``"n_queries"``).

    Examples
    --------
    >>> import numpy as np
    >>> from attnquery.oracles import CappedOracle, ValueOracle
    >>> capped = CappedOracle(ValueOracle(lambda X: X[:, -1, 0], 2), 3)
    >>> capped(np.ones((2, 1, 2))).shape, capped.remaining
    ((2,), 1)
    """

    own_budget = True

    def __init__(self, oracle, cap: int, name: str = "n_queries"):
        if not _is_int(cap) or cap < 0:
            raise QueryError(f"{name} must be a non-negative integer; got {cap!r}")
        self.oracle = oracle
        self.cap = int(cap)
        self.name = name
        self.n0 = int(oracle.n_queries)

    @property
    def _inner(self):
        return self.oracle

    def __getattr__(self, attr):
        # only reached for attributes the wrapper lacks: the wrapped oracle's (outputs, ...)
        if attr == "oracle" or attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.oracle, attr)

    @property
    def spent(self) -> int:
        """Queries asked through the wrapper so far (the wrapped oracle's count since)."""
        return int(self.oracle.n_queries) - self.n0

    @property
    def remaining(self) -> int:
        """What the cap leaves, or the wrapped oracle's ``remaining`` where that is less."""
        left = self.cap - self.spent
        inner = getattr(self.oracle, "remaining", None)
        return left if inner is None else min(left, int(inner))

    def check_budget(self, n: int, what: str = "this step") -> None:
        """Raise :class:`~attnquery.errors.BudgetExceededError` when ``n`` more queries exceed
        the cap (naming it) or the wrapped oracle's budget, before any of them is asked."""
        n, spent = int(n), self.spent
        if n > self.cap - spent:
            raise BudgetExceededError(
                f"{what} needs {n} queries but only {max(self.cap - spent, 0)} of "
                f"{self.name}={self.cap} remain ({spent} spent)")
        check_budget(self.oracle, n, what)

    def __call__(self, X) -> np.ndarray:
        """Ask the batch ``X`` after checking that the cap pays for it."""
        shape = getattr(X, "shape", None)
        if shape and len(shape) == 3:  # else the wrapped oracle refuses it by name
            self.check_budget(int(shape[0]), f"a batch of {int(shape[0])} queries")
        return self.oracle(X)

    query = __call__

    def __repr__(self) -> str:
        return f"CappedOracle({self.oracle!r}, {self.name}={self.cap})"


def check_budget(oracle, n: int, what: str) -> None:
    """Ask the oracle whether ``n`` queries fit its budget (if it has one) before spending them.

    The ledger's way to the oracle's budget (:meth:`~attnquery.learners._ledger.QueryLedger.
    need` calls it; given a ledger, a forwarding oracle with a budget of its own, it is the
    ledger's ``need``): a learner plans with its fit's ledger, never with this."""
    if isinstance(oracle, ForwardingOracle) and oracle.own_budget:
        oracle.check_budget(n, what)
        return
    if isinstance(oracle, Oracle):
        oracle.check_budget(n, what)
    else:
        remaining = getattr(oracle, "remaining", None)
        if remaining is not None and n > remaining:
            from ..errors import BudgetExceededError

            raise BudgetExceededError(f"{what} needs {n} queries; {remaining} remain")
