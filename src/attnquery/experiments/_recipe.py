"""The steps most experiments' ``run(cell, rng)`` share: fit a learner on an oracle, count its
queries, and measure its estimate of one head against the truth."""

from __future__ import annotations

import numpy as np

from ..errors import UndefinedEstimate
from ..metrics import fit_counted, functional_error, head_errors

__all__ = ["fit_and_measure"]


def fit_and_measure(est, oracle, head, d: int, eval_rng: np.random.Generator | None = None,
                    n_eval: int = 64, record_refusal: bool = False,
                    finite_as: str | None = None) -> dict:
    """Fit ``est`` on ``oracle`` and measure its estimate of ``head``.

    Parameters
    ----------
    est : learner
        An unfitted learner with ``W_``, ``v_`` and ``predict`` once fitted.
    oracle : oracle
        The box it queries (wrapping ``head``).
    head : AttentionHead
        The ground truth (``W``, ``v``, callable on inputs).
    d : int
        The input dimension of the functional error's held-out inputs.
    eval_rng : numpy.random.Generator, optional
        Draws the held-out inputs of the functional error; without it there is none.
    n_eval : int
        Held-out inputs per length of the functional error.
    record_refusal : bool
        Passed to :func:`~attnquery.metrics.fit_counted`: a refused estimate is recorded with
        ``verified = False`` instead of raising.
    finite_as : str, optional
        Require finite errors of W and v: a non-finite one raises
        :class:`~attnquery.errors.UndefinedEstimate` naming the learner ``finite_as``.

    Returns
    -------
    dict
        The metrics of :func:`~attnquery.metrics.fit_counted` (queries, check) and of
        :func:`~attnquery.metrics.head_errors` (errors of W and v), and ``func_err`` with
        ``eval_rng``. Only ``eval_rng`` draws random numbers here, after the fit.

    Raises
    ------
    UndefinedEstimate
        With ``finite_as``, when the estimate's errors are not finite.
    """
    m = fit_counted(est, oracle, record_refusal=record_refusal)
    errors = head_errors(est.W_, est.v_, head.W, head.v)
    if finite_as is not None and not all(np.isfinite(list(errors.values()))):
        raise UndefinedEstimate(f"{finite_as}: the estimate has non-finite entries")
    m.update(errors)
    if eval_rng is not None:
        m["func_err"] = functional_error(head, est.predict, d, eval_rng, n=n_eval)
    return m
