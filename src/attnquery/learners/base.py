"""The plug-in contract: everything a learner written outside attnquery needs, by public name.

A learner subclasses :class:`BaseLearner`, declares what it is in its class attribute
``spec`` (a :class:`LearnerSpec`) and the values its parameters may take in
``_parameter_constraints`` (the vocabulary: :class:`Interval`, :class:`Options`,
:class:`Lengths`, and the shorthands ``"boolean"``, ``"random_state"``, ...). Its ``fit``

1. calls :meth:`BaseLearner.validate_params` (a bad parameter is a
   :class:`~attnquery.errors.ConfigError` before the first query) and :func:`check_oracle`
   (the oracle's dimension);
2. asks its oracle through the :class:`QueryLedger` that :meth:`BaseLearner.open_ledger`
   opens (its stages, its budget ``check_budget`` before the queries are spent), with queries
   drawn from :meth:`BaseLearner.make_rng`;
3. checks its estimate on fresh queries with :meth:`BaseLearner.verify_fit`, with the
   tolerance of its error model (:data:`ROUNDING_RTOL` for answers rounded only by float64).

:func:`check_is_fitted` and :func:`clone` are scikit-learn's; :func:`get_learner`,
:func:`learner_table` and :func:`registry` read the registry a plug-in joins through the
entry-point group :data:`ENTRY_POINT_GROUP`. ``docs/library.md`` ("Adding a learner") walks
through it; ``examples/plugin/`` is a complete plug-in that uses only these names.
"""

from ._base import (
    DEFAULT_VERIFY,
    FITTED_METHODS,
    MAX_VERIFY,
    VERIFY_PARAM,
    BaseLearner,
    QueryLedger,
    check_is_fitted,
    check_verify_param,
    clone,
)
from ._check import CHECK_LENGTHS, ROUNDING_RTOL, check_answers, check_queries
from ._ledger import check_budget, check_oracle
from ._params import Interval, Lengths, Options, check_scalar, describe_constraints
from ._registry import (
    ENTRY_POINT_GROUP,
    ORACLES,
    RETURNS,
    LearnerEntry,
    LearnerSpec,
    get_entry,
    get_learner,
    learner_parameters,
    learner_table,
    registry,
)

__all__ = [
    # the base class and the spec
    "BaseLearner", "LearnerSpec", "ORACLES", "RETURNS",
    # parameters
    "Interval", "Options", "Lengths", "describe_constraints", "check_scalar",
    "VERIFY_PARAM", "DEFAULT_VERIFY", "MAX_VERIFY", "check_verify_param",
    # queries and checks
    "QueryLedger", "check_oracle", "check_budget", "check_queries", "check_answers",
    "CHECK_LENGTHS", "ROUNDING_RTOL",
    # scikit-learn habits
    "check_is_fitted", "clone", "FITTED_METHODS",
    # the registry
    "ENTRY_POINT_GROUP", "LearnerEntry", "registry", "get_entry", "get_learner",
    "learner_parameters", "learner_table",
]
