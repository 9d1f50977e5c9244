"""Cost models shared by several experiments (not an experiment: experiments import this module,
never each other).

Estimated seconds per cell on one core (:mod:`attnquery.study`: the cluster's runtime requests),
from the wall times of the default study on a 2-core machine shared with other work, extrapolated
with the benchmarks to the sizes of config/paper.yaml.
"""

from __future__ import annotations

__all__ = ["exact_learner_seconds"]


def exact_learner_seconds(d: int) -> float:
    """The exact learner (Theorem 4.1) on a head of dimension d: 3.3 s at d = 512 (default
    study), 15 s at d = 1024 (benchmark): d^2.2."""
    return 0.01 + 3.3 * (d / 512) ** 2.2
