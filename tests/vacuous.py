"""Fits whose check may be vacuous by design, asserted rather than left to warn."""

from __future__ import annotations

import warnings

from attnquery.errors import VacuousCheckWarning


def fit_noting_vacuous(est, oracle):
    """``est.fit(oracle)``, asserting that it warns :class:`VacuousCheckWarning` exactly when it
    sets ``verify_vacuous_`` (and then once). A check cannot fail where the error the learner's
    model allows exceeds the answers themselves: a tau near Theorem 6.1's limit, or a box whose
    answers are 0 on every check query (a transformer with one ReLU neuron, dark there). Other
    warnings pass through; an exception propagates."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            est.fit(oracle)
        finally:
            for w in seen:
                if not issubclass(w.category, VacuousCheckWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    vacuous = [w for w in seen if issubclass(w.category, VacuousCheckWarning)]
    assert len(vacuous) == int(est.verify_vacuous_), [str(w.message) for w in vacuous]
    return est
