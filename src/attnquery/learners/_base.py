"""Shared pieces of every learner: scikit-learn style parameters and oracle checks."""

from __future__ import annotations

import inspect

import numpy as np

from ..errors import ConfigError
from ..oracles import Oracle

__all__ = ["BaseLearner", "check_oracle", "check_budget", "chunk_slices"]


class BaseLearner:
    """Parameters live in ``__init__``; ``fit(oracle)`` returns self; fitted attributes end in _."""

    def get_params(self) -> dict:
        """The constructor parameters, as given."""
        names = [
            p for p in inspect.signature(type(self).__init__).parameters if p != "self"
        ]
        return {n: getattr(self, n) for n in names}

    def set_params(self, **params):
        """Set constructor parameters (scikit-learn convention); returns self."""
        valid = self.get_params()
        for k, val in params.items():
            if k not in valid:
                raise ConfigError(
                    f"{type(self).__name__} has no parameter {k!r}; valid: {sorted(valid)}"
                )
            setattr(self, k, val)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def _rng(self) -> np.random.Generator:
        rs = getattr(self, "random_state", None)
        if isinstance(rs, np.random.Generator):
            return rs
        return np.random.default_rng(rs)


def check_oracle(oracle, kinds: tuple[str, ...] | None = None) -> int:
    """Check that ``oracle`` has the oracle interface (callable, ``d``, ``n_queries``).

    Any object with that interface is accepted, so a user's own oracle class works too.
    Returns ``d``.
    """
    if not callable(oracle) or not hasattr(oracle, "d") or not hasattr(oracle, "n_queries"):
        raise ConfigError(
            "fit() needs an oracle (an object with __call__, d and n_queries, such as "
            f"attnquery.oracles.ValueOracle); got {type(oracle).__name__}"
        )
    kind = getattr(oracle, "kind", "value")
    if kinds is not None and kind not in kinds:
        raise ConfigError(f"this learner needs a {' or '.join(kinds)} oracle; got a {kind} oracle")
    d = oracle.d
    if not isinstance(d, int | np.integer) or d < 1:
        raise ConfigError(f"oracle.d must be a positive integer; got {d!r}")
    return int(d)


def check_budget(oracle, n: int, what: str) -> None:
    """Ask the oracle whether ``n`` queries fit its budget (if it has one) before spending them."""
    if isinstance(oracle, Oracle):
        oracle.check_budget(n, what)
    else:
        remaining = getattr(oracle, "remaining", None)
        if remaining is not None and n > remaining:
            from ..errors import BudgetExceededError

            raise BudgetExceededError(f"{what} needs {n} queries; {remaining} remain")


def chunk_slices(n: int, size: int):
    """Yield slices covering range(n) in chunks of at most ``size`` (size >= 1)."""
    size = max(int(size), 1)
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))
