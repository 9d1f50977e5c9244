"""Learners: each takes an oracle and recovers the parameters behind it.

Every learner follows the scikit-learn convention: parameters in ``__init__``,
``fit(oracle)`` returns self, fitted attributes end in an underscore. Each declares what it is
in its class attribute ``spec`` (a :class:`LearnerSpec`), which the registry reads
(:func:`registry`, :func:`get_learner`, :func:`learner_table`), together with the plug-ins of
the entry-point group ``attnquery.learners``. ``__all__`` lists the learner classes only.
"""

# the registry (not in __all__, which lists the learner classes only)
from ._registry import LearnerSpec as LearnerSpec
from ._registry import get_learner as get_learner
from ._registry import learner_table as learner_table
from ._registry import registry as registry
from .exact import ExactValueQueryLearner
from .ffn import ReLUNetworkLearner
from .lowprecision import LowPrecisionValueQueryLearner
from .lowrank import NuclearNormROPLearner, SketchLowRankLearner
from .membership import MembershipLearner
from .multihead import OrthogonalSubspaceLearner
from .multihead_generic import AttentionLayerLearner, MultiHeadLearner
from .noisy import NoisyValueQueryLearner
from .rotary import RotaryValueQueryLearner
from .transformer import TransformerLearner
from .vector import VectorLayerLearner

__all__ = [
    # the command line's methods first, in its order (attnquery info lists them so)
    "ExactValueQueryLearner",
    "SketchLowRankLearner",
    "NuclearNormROPLearner",
    "NoisyValueQueryLearner",
    "MembershipLearner",
    "AttentionLayerLearner",
    "RotaryValueQueryLearner",
    "LowPrecisionValueQueryLearner",
    "TransformerLearner",
    "ReLUNetworkLearner",
    "OrthogonalSubspaceLearner",
    "MultiHeadLearner",
    "VectorLayerLearner",
]
