"""The steps every experiment's ``run(cell, rng)`` shares: fit a learner on an oracle, count its
queries, measure its estimate against the truth and, on held-out inputs, its function.

An experiment builds the truth and the oracle, and says how its estimate is measured: a
*measure* ``(est, truth) -> dict`` of metrics. The measures several experiments use are here:
:func:`head_measure` (one head's W and v), :func:`bias_measure` (and its key bias and
offset), :func:`relative_bias_measure` (their relative errors alone) and
:func:`layer_measure` (a layer's heads, matched up to a permutation); an experiment with errors
of its own passes its own function, or adds to these after the fit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import UndefinedEstimate
from ..metrics import fit_counted, functional_error, head_errors, layer_errors, relative_error

__all__ = ["value_measure", "match_heads", "sequence_error",
           "fit_and_measure", "head_measure", "bias_measure", "relative_bias_measure",
           "layer_measure"]


def head_measure(est, head) -> dict:
    """The errors of one head's ``W`` and ``v`` (:func:`~attnquery.metrics.head_errors`)."""
    return head_errors(est.W_, est.v_, head.W, head.v)


def _bias_errors(est, head) -> dict:
    return {"rel_err_c": relative_error(est.key_bias_, head.key_bias),
            "rel_err_offset": relative_error(est.offset_, head.offset)}


def bias_measure(est, head) -> dict:
    """:func:`head_measure` and the relative errors of the key bias (``rel_err_c``) and the
    offset (``rel_err_offset``) of a head with its biases."""
    return {**head_measure(est, head), **_bias_errors(est, head)}


def relative_bias_measure(est, head) -> dict:
    """The relative errors alone of a head with its biases: ``rel_err_W``, ``rel_err_v``,
    ``rel_err_c`` and ``rel_err_offset``."""
    return {"rel_err_W": relative_error(est.W_, head.W),
            "rel_err_v": relative_error(est.v_, head.v), **_bias_errors(est, head)}


def layer_measure(est, layer) -> dict:
    """A layer's heads, matched to the truth's up to a permutation
    (:func:`~attnquery.metrics.layer_errors`): the relative errors of each true head's ``W``,
    ``v`` and key bias, as lists (``err_W_heads``, ``err_v_heads``, ``err_c_heads``), and the
    largest of each (``rel_err_W``, ``rel_err_v``, ``rel_err_c``)."""
    heads = layer.heads
    m = layer_errors(est.W_, est.v_, est.key_bias_, [h.W for h in heads],
                     [h.v for h in heads], [h.key_bias for h in heads])
    out = {}
    for k in ("W", "v", "c"):
        out[f"rel_err_{k}"] = float(m[f"rel_err_{k}"].max())
        out[f"err_{k}_heads"] = m[f"rel_err_{k}"].tolist()
    return out


def fit_and_measure(est, oracle, truth, d: int | None = None,
                    eval_rng: np.random.Generator | None = None, n_eval: int = 64,
                    record_refusal: bool = False, finite_as: str | None = None,
                    measure: Callable[..., dict] = head_measure,
                    model: Callable | None = None) -> dict:
    """Fit ``est`` on ``oracle`` and measure its estimate of ``truth``.

    Parameters
    ----------
    est : learner
        An unfitted learner.
    oracle : oracle
        The box it queries (wrapping ``truth``).
    truth : model
        The ground truth (a head, a layer: what ``measure`` reads, callable on inputs).
    d : int, optional
        The input dimension of the functional error's held-out inputs (default ``truth.d``).
    eval_rng : numpy.random.Generator, optional
        Draws the held-out inputs of the functional error; without it there is none.
    n_eval : int
        Held-out inputs per length of the functional error.
    record_refusal : bool
        Passed to :func:`~attnquery.metrics.fit_counted`: a refused estimate is recorded with
        ``verified = False`` instead of raising.
    finite_as : str, optional
        Require the measured errors (those that are numbers) to be finite: a non-finite one
        raises :class:`~attnquery.errors.UndefinedEstimate` naming the learner ``finite_as``.
    measure : callable(est, truth) -> dict
        The metrics of the fitted estimate (default :func:`head_measure`); it may raise a
        named error of its own where the estimate is undefined.
    model : callable(est) -> callable, optional
        The function of the estimate the functional error compares with ``truth`` (default the
        learner's ``predict``).

    Returns
    -------
    dict
        The metrics of :func:`~attnquery.metrics.fit_counted` (queries, check), those of
        ``measure``, and ``func_err`` with ``eval_rng``. Only ``eval_rng`` draws random numbers
        here, after the fit.

    Raises
    ------
    UndefinedEstimate
        With ``finite_as``, when the estimate's errors are not finite.
    """
    m = fit_counted(est, oracle, record_refusal=record_refusal)
    errors = measure(est, truth)
    if finite_as is not None and not all(
            np.isfinite(v) for v in errors.values() if isinstance(v, float)):
        raise UndefinedEstimate(f"{finite_as}: the estimate has non-finite entries")
    m.update(errors)
    if eval_rng is not None:
        f_hat = est.predict if model is None else model(est)
        m["func_err"] = functional_error(truth, f_hat, truth.d if d is None else d, eval_rng,
                                         n=n_eval)
    return m


def value_measure(est, layer, perm=None) -> dict:
    """A layer's heads, matched by their value maps (or ``perm``): the largest relative error
    of the value maps and of the output bias, and the rank found (a rotary layer's measure: its
    logits are rotary forms, measured by the function alone)."""
    perm = match_heads(est.V_, layer.value_maps()) if perm is None else perm
    V = layer.value_maps()[perm]
    return {"rel_err_v": max(relative_error(est.V_[h], V[h]) for h in range(len(V))),
            "rel_err_offset": relative_error(est.output_bias_, layer.output_bias),
            "rank_found": int(getattr(est, "rank_", 0)) or None}


def match_heads(V_est, V_true) -> np.ndarray:
    """For each learned head, the true head with the nearest value map (a one-to-one
    assignment)."""
    from scipy.optimize import linear_sum_assignment

    cost = np.array([[relative_error(a, b) for b in V_true] for a in V_est])
    rows, cols = linear_sum_assignment(cost)
    return cols[np.argsort(rows)]


def sequence_error(truth, predict, d: int, rng, lengths) -> float:
    """``max |f_hat - f| / max |f|`` over 16 fresh sequences of each of ``lengths`` tokens,
    tokens ~ N(0, I_d / d) (the vector experiments' functional error)."""
    worst, scale = 0.0, 0.0
    for N in lengths:
        X = rng.standard_normal((16, N, d)) / np.sqrt(d)
        y = np.asarray(truth(X), dtype=float)
        worst = max(worst, float(np.max(np.abs(np.asarray(predict(X)) - y))))
        scale = max(scale, float(np.max(np.abs(y))))
    return worst / scale if scale > 0 else worst
