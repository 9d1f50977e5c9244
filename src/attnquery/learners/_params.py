"""The vocabulary of the learners' parameter constraints (in the manner of scikit-learn's
``_parameter_constraints``).

Every learner declares, in one class attribute ``_parameter_constraints``, the values each of
its ``__init__`` parameters may take: a mapping from the parameter's name to a list of
constraints, any one of which admits a value. :meth:`~attnquery.learners._base.BaseLearner.
_validate_params` checks them all at the start of ``fit``, before any query, and raises
:class:`~attnquery.errors.ConfigError` naming the parameter, what it may be and the value given.

A constraint is a :class:`Constraint` or one of the shorthands :func:`make_constraint` reads:

========================  =========================================================
``None``                  the value None
``"boolean"``             True or False (``bool`` or ``numpy.bool_``)
``"random_state"``        a seed :func:`attnquery.rng.as_rng` accepts
``"array-like"``          a list, tuple or numpy array
``callable``              any callable
a type (``dict``, ...)    an instance of it
========================  =========================================================

and the classes :class:`Interval` (numbers in a range), :class:`Options` (one of a few
values) and :class:`Lengths` (a non-empty sequence of integers in a range). ``True`` is never
an integer or a number here, nor is a string, and a number must be finite. Every integer
parameter is an int64 (at most ``2**63 - 1``, :data:`INT64_MAX`): a larger Python int is
refused, never passed on to numpy. Each constraint describes itself in words
(:meth:`Constraint.describe`: ``"an integer >= 1"``, ``"one of 'a', 'b'"``), so the
messages, the documentation and a registry of the learners read the same text.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["Constraint", "Interval", "Options", "Lengths", "Hidden", "DEPRECATED", "INT64_MAX",
           "make_constraint", "describe_constraints", "validate_parameter_constraints"]

#: the largest integer parameter (int64); numpy cannot hold a larger one
INT64_MAX = int(np.iinfo(np.int64).max)
#: the default of a parameter kept under its old name for a while (scikit-learn's pattern): the
#: value that says it was not given; its constraint is ``Hidden(Options({DEPRECATED}))``
DEPRECATED = "deprecated"


def _bounds_text(kind: str, left, right, closed: str) -> str:
    """``an integer >= 1``, ``a number in (0, 1]``, ... (``kind`` first)."""
    lo_in, hi_in = closed in ("both", "left"), closed in ("both", "right")
    if left is not None and right is not None:
        return (f"{kind} in {'[' if lo_in else '('}{left:g}, {right:g}"
                f"{']' if hi_in else ')'}")
    if left is not None:
        return f"{kind} {'>=' if lo_in else '>'} {left:g}"
    if right is not None:
        return f"{kind} {'<=' if hi_in else '<'} {right:g}"
    return kind


def _is_integer(x) -> bool:
    """An integer (Python or numpy), never a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool | np.bool_)


def _as_finite_float(x) -> float | None:
    """``x`` as a finite float, or None (an int too large for a float, inf, NaN)."""
    try:
        f = float(x)
    except (OverflowError, TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class Constraint:
    """One set of values a parameter may take: :meth:`is_satisfied_by` and :meth:`describe`."""

    def is_satisfied_by(self, value) -> bool:
        """Whether ``value`` belongs to the set."""
        raise NotImplementedError

    def describe(self) -> str:
        """The set in words, as the messages and the documentation print it."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.describe()}>"


class Interval(Constraint):
    """Numbers of a type within a range.

    Parameters
    ----------
    type : numbers.Integral or numbers.Real
        ``numbers.Integral``: integers (at most :data:`INT64_MAX`); ``numbers.Real``: finite
        numbers, integers included (as long as a float holds them). ``bool`` is neither.
    left, right : float or None
        The bounds (None: unbounded on that side).
    closed : {"both", "left", "right", "neither"}
        Which bounds are allowed values.
    note : str, optional
        What a value means, appended to the description in parentheses
        (``"0 turns the check off"``).
    """

    def __init__(self, type, left, right, *, closed: str, note: str | None = None):
        if type not in (numbers.Integral, numbers.Real):
            raise TypeError(f"Interval's type must be numbers.Integral or numbers.Real; got "
                            f"{type!r}")
        if closed not in ("both", "left", "right", "neither"):
            raise ValueError(f"closed must be 'both', 'left', 'right' or 'neither'; got "
                             f"{closed!r}")
        self.type, self.left, self.right, self.closed, self.note = type, left, right, closed, note

    @property
    def integral(self) -> bool:
        return self.type is numbers.Integral

    def is_satisfied_by(self, value) -> bool:
        if self.integral:
            if not _is_integer(value) or abs(int(value)) > INT64_MAX:
                return False
            x = int(value)
        else:
            if not isinstance(value, numbers.Real) or isinstance(value, bool | np.bool_):
                return False
            x = _as_finite_float(value)  # an int too large for a float is refused too
            if x is None:
                return False
        lo_in, hi_in = self.closed in ("both", "left"), self.closed in ("both", "right")
        if self.left is not None and not (x >= self.left if lo_in else x > self.left):
            return False
        return self.right is None or (x <= self.right if hi_in else x < self.right)

    def describe(self) -> str:
        text = _bounds_text("an integer" if self.integral else "a number", self.left,
                            self.right, self.closed)
        return f"{text} ({self.note})" if self.note else text


class Options(Constraint):
    """One of a few given values (strings, usually): ``Options({"basis", "gaussian"})``."""

    def __init__(self, options):
        self.options = frozenset(options)

    def is_satisfied_by(self, value) -> bool:
        try:
            return value in self.options and not isinstance(value, bool | np.bool_)
        except TypeError:  # an unhashable value
            return False

    def describe(self) -> str:
        names = ", ".join(repr(o) for o in sorted(self.options, key=str))
        return f"one of {names}" if len(self.options) > 1 else names


class Lengths(Constraint):
    """A non-empty sequence (list, tuple, 1-d array) of integers, each within
    ``[low, INT64_MAX]``: token counts such as ``verify_lengths``."""

    def __init__(self, low: int = 1):
        self.low = int(low)

    def is_satisfied_by(self, value) -> bool:
        if isinstance(value, str | bytes | Mapping):
            return False
        if isinstance(value, np.ndarray):
            if value.ndim != 1:
                return False
            value = value.tolist()
        if not isinstance(value, Sequence) or len(value) == 0:
            return False
        return all(_is_integer(n) and self.low <= int(n) <= INT64_MAX for n in value)

    def describe(self) -> str:
        return f"a non-empty sequence of integers >= {self.low}"


class Hidden(Constraint):
    """A constraint that admits what ``constraint`` admits but is not described: the
    ``"deprecated"`` default of a renamed parameter (:data:`DEPRECATED`), which a user never
    passes, stays out of the messages and the documentation."""

    def __init__(self, constraint):
        self.constraint = make_constraint(constraint)

    def is_satisfied_by(self, value) -> bool:
        return self.constraint.is_satisfied_by(value)

    def describe(self) -> str:
        return self.constraint.describe()


class _NoneConstraint(Constraint):
    def is_satisfied_by(self, value) -> bool:
        return value is None

    def describe(self) -> str:
        return "None"


class _Booleans(Constraint):
    def is_satisfied_by(self, value) -> bool:
        return isinstance(value, bool | np.bool_)

    def describe(self) -> str:
        return "True or False"


class _RandomStates(Constraint):
    """What :func:`attnquery.rng.as_rng` accepts; checked without drawing from a Generator."""

    def is_satisfied_by(self, value) -> bool:
        if value is None or isinstance(value, np.random.Generator | np.random.SeedSequence |
                                       np.random.BitGenerator):
            return True
        if isinstance(value, bool | np.bool_ | float | str | bytes):
            return False
        try:
            np.random.SeedSequence(value)
        except (TypeError, ValueError):
            return False
        return True

    def describe(self) -> str:
        return "an int >= 0, a sequence of ints, a SeedSequence, a Generator or None"


class _ArrayLikes(Constraint):
    def is_satisfied_by(self, value) -> bool:
        return isinstance(value, list | tuple | np.ndarray)

    def describe(self) -> str:
        return "an array-like (a list, tuple or numpy array)"


class _Callables(Constraint):
    def is_satisfied_by(self, value) -> bool:
        return callable(value)

    def describe(self) -> str:
        return "a callable"


class _InstancesOf(Constraint):
    def __init__(self, type_):
        self.type = type_

    def is_satisfied_by(self, value) -> bool:
        return isinstance(value, self.type)

    def describe(self) -> str:
        return f"a {self.type.__name__}"


_SHORTHANDS = {"boolean": _Booleans, "random_state": _RandomStates, "array-like": _ArrayLikes}


def make_constraint(c) -> Constraint:
    """The :class:`Constraint` a declaration names (a Constraint, ``None``, ``"boolean"``,
    ``"random_state"``, ``"array-like"``, ``callable`` or a type)."""
    if isinstance(c, Constraint):
        return c
    if c is None:
        return _NoneConstraint()
    if c is callable:
        return _Callables()
    if isinstance(c, str) and c in _SHORTHANDS:
        return _SHORTHANDS[c]()
    if isinstance(c, type):
        return _InstancesOf(c)
    raise TypeError(f"unknown parameter constraint {c!r}")


def describe_constraints(constraints) -> str:
    """A parameter's constraints in words, joined by "or": ``"an integer >= 1 or None"``
    (:class:`Hidden` ones left out)."""
    shown = [make_constraint(c) for c in constraints]
    texts = [c.describe() for c in shown if not isinstance(c, Hidden)] or \
        [c.describe() for c in shown]
    return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + " or " + texts[-1]


def validate_parameter_constraints(constraints: Mapping, params: Mapping,
                                   errors: Mapping | None = None) -> None:
    """Check each of ``params`` that ``constraints`` declares; raise on the first bad value.

    Parameters
    ----------
    constraints : mapping
        Parameter name -> list of constraints (any one admits a value).
    params : mapping
        Parameter name -> value. Names without a declaration are not checked here (the test
        suite requires every learner to declare all of its parameters).
    errors : mapping, optional
        Parameter name -> the exception type its bad value raises (a subclass of
        :class:`~attnquery.errors.ConfigError`; default ConfigError).

    Raises
    ------
    ConfigError
        ``"{name} must be {constraints in words}; got {value!r}"``.
    """
    for name, value in params.items():
        if name not in constraints:
            continue
        allowed = [make_constraint(c) for c in constraints[name]]
        if any(c.is_satisfied_by(value) for c in allowed):
            continue
        beyond = " (beyond int64)" if _is_integer(value) and abs(int(value)) > INT64_MAX else ""
        exc = (errors or {}).get(name, ConfigError)
        raise exc(f"{name} must be {describe_constraints(allowed)}; got {value!r}{beyond}")


def check_scalar(x, name: str, target_type: type | tuple = numbers.Real, *, min_val=None,
                 max_val=None, include_boundaries: str = "both", allow_none: bool = False,
                 exc: type[Exception] = ConfigError, what: str | None = None):
    """Check one scalar parameter and return it (``int`` or ``float``; ``None`` if allowed).

    One value checked against one :class:`~attnquery.learners._params.Interval` (in the
    manner of scikit-learn's ``check_scalar``), for the checks that need more than a learner's
    declared constraints (a bound that depends on d) and for functions outside the learners:
    ``x`` must be an instance of ``target_type`` (``numbers.Integral`` or ``numbers.Real``;
    ``bool`` is never a number), finite (an integer at most int64, a number a float holds),
    and within ``[min_val, max_val]``, whose ends are included as ``include_boundaries``
    says.

    Parameters
    ----------
    x : object
        The value to check.
    name : str
        The parameter's name, first word of the error message.
    target_type : type or tuple of types
        ``numbers.Integral`` for a count, ``numbers.Real`` (the default) for a number.
    min_val, max_val : float, optional
        Bounds (``None``: unbounded on that side).
    include_boundaries : {"both", "left", "right", "neither"}
        Which of the bounds are allowed values.
    allow_none : bool
        Accept ``None`` (returned as is).
    exc : Exception type
        Raised on a bad value (default :class:`ConfigError`; a theorem's assumption parameter
        raises :class:`~attnquery.learners.noisy.AssumptionParameterError`).
    what : str, optional
        What the value must be, in place of the description built from the bounds (the
        message is ``"{name} must be {what}; got {x!r}"``).

    Returns
    -------
    int, float or None

    Raises
    ------
    ConfigError (or ``exc``)
        The message names the parameter, what it must be, and the value given.
    """
    if x is None and allow_none:
        return None
    if isinstance(target_type, tuple):
        integral = all(t is numbers.Integral for t in target_type)
        target_type = numbers.Integral if integral else numbers.Real
    integral = target_type is numbers.Integral
    allowed = [Interval(target_type, min_val, max_val, closed=include_boundaries)]
    if allow_none:
        allowed.append(None)
    if what is not None:
        if not any(make_constraint(c).is_satisfied_by(x) for c in allowed):
            raise exc(f"{name} must be {what}; got {x!r}")
    else:
        validate_parameter_constraints({name: allowed}, {name: x}, errors={name: exc})
    return int(x) if integral else float(x)
