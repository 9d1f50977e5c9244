"""The frozen run objects of one fit of the layer learners: the layer's ledger, V and beta
(:class:`_Layer`), one head as its isolated measurements give it (:class:`_Head`), the circle
scan's result (:class:`Scan`) and the served route's plan (:class:`ServedPlan`); shared by
:mod:`.exact_layer`, :mod:`.served_layer` and :mod:`..rotary_layer`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .._base import QueryLedger


@dataclass(frozen=True)
class _Layer:
    """What every step of one ``fit`` reads: the ledger it asks through, V and beta."""

    ledger: QueryLedger
    V: np.ndarray
    beta: float
    #: with biases, the last token (a random unit vector) from which each missing direction's
    #: key-bias term is read: at x = 0 a head without key bias has a zero query vector and
    #: cannot be silenced
    base: np.ndarray | None = None
    #: served mode (``n_queries`` set): the answers' measured relative noise; None: exact mode
    noise: float | None = None
    #: served mode: passes over every isolated and missing-direction probe
    reps: int = 1
    #: served mode: the missing-direction probes are asked ``reps * missing_reps`` times
    missing_reps: int = 1
    #: served mode's rough pass: a missing-direction probe answered outside (0, 1) is clipped
    #: into it (the scan's v's let the other heads leak into it), not refused
    rough: bool = False
    #: served mode, after the rough pass: every head's rough (K, Q, c), which bound the logits
    #: of the missing-direction probes (:data:`.served.MISSING_MAX_LOGIT`)
    rough_heads: tuple | None = None

    @property
    def d(self) -> int:
        return int(self.V.size)


@dataclass(frozen=True)
class _Head:
    """One head as the isolated measurements give it."""

    B: np.ndarray  # (d, m) orthonormal basis of Delta_g
    L: np.ndarray  # (m, k): B^T W = L R^T
    R: np.ndarray  # (d, k)
    t_c: np.ndarray  # (m,): B^T c
    #: served float32: the relative disagreement of the core ``A^T W Bs`` as the two sketches
    #: read it, a measure of the probes' noise (:func:`.served.share_passes`); 0 elsewhere
    spread: float = 0.0

    def query_vectors(self, X) -> np.ndarray:
        """``B^T a(x) = B^T (W x + c)`` for the rows x of X (n, d): shape (n, m)."""
        return (X @ self.R) @ self.L.T + self.t_c


class Scan(NamedTuple):
    """What the circle scan found: every value vector, and the circle that separated them
    (the fit's ``scan_``)."""

    vs: np.ndarray  # (H, d)
    info: dict


class ServedPlan(NamedTuple):
    """The served route's passes, planned from what its ledger has left
    (:meth:`.served_layer.ServedLayerLearner._plan`)."""

    #: passes over every isolated and missing-direction probe (``n_passes_``)
    reps: int
    #: the missing-direction probes are asked ``reps * missing_reps`` times
    missing_reps: int
    #: the queries of one pass over the isolated probes (every head)
    pass_cost: int
    #: queries kept back for probes asked again (:data:`.served.MARGIN` of what the plan saw)
    margin: float
