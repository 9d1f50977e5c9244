"""Learners: each takes an oracle and recovers the parameters behind it.

Every learner follows the scikit-learn convention: parameters in ``__init__``,
``fit(oracle)`` returns self, fitted attributes end in an underscore.
"""

from .exact import ExactValueQueryLearner

__all__ = ["ExactValueQueryLearner"]
