"""Learners: each takes an oracle and recovers the parameters behind it.

Every learner follows the scikit-learn convention: parameters in ``__init__``,
``fit(oracle)`` returns self, fitted attributes end in an underscore.
"""

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
    "ExactValueQueryLearner",
    "NuclearNormROPLearner",
    "SketchLowRankLearner",
    "NoisyValueQueryLearner",
    "LowPrecisionValueQueryLearner",
    "MembershipLearner",
    "TransformerLearner",
    "ReLUNetworkLearner",
    "OrthogonalSubspaceLearner",
    "MultiHeadLearner",
    "AttentionLayerLearner",
    "RotaryValueQueryLearner",
    "VectorLayerLearner",
]
