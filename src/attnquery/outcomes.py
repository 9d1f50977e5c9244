"""What became of a study's cells, in three words: *ok*, *refused as designed*, *failed*.

A cell's row stores its status (:data:`attnquery.results.STATUSES`) and, when it did not run to
an answer, the error's one-line message (``"AssumptionViolation: ..."``). Some cells are meant
to meet a refusal: the exact learner of Theorem 4.1 given noisy answers, a rotary layer on the
refused side of its failure map. An experiment declares them with its
:attr:`~attnquery.experiments.Experiment.refusals` (a tuple of :class:`Refusal`: which cells,
which named errors, and why); every other error or timeout is a failure.

* **ok**: the cell ran to an answer (status ``ok``), or found its parameters not identifiable
  (status ``not_identifiable``: :class:`~attnquery.errors.NotIdentifiableError`, an answer the
  study asks for, e.g. Prop. 7.1's heads sharing ``W``);
* **refused as designed**: status ``error`` with a named error (:mod:`attnquery.errors`) that
  one of the experiment's declared refusals covers for this cell;
* **failed**: any other error, a timeout, or a skipped cell.

The workflow logs a traceback only for failures; a refusal as designed is one line of the
shard's log. :func:`summary_line` is the line the console shows for each experiment, and
``results/validation.txt`` (:func:`attnquery.study.pipeline.validate_study`) uses the same words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from . import errors as _errors

__all__ = ["OK", "REFUSED", "FAILED", "WORDS", "Refusal", "error_type", "find_refusal", "outcome",
           "Outcomes", "count_outcomes", "summary_line"]

OK, REFUSED, FAILED = "ok", "refused as designed", "failed"
#: the three outcomes, in the order they are reported
WORDS = (OK, REFUSED, FAILED)


def _every_cell(cell: Mapping) -> bool:
    return True


@dataclass(frozen=True)
class Refusal:
    """Cells an experiment expects to be refused, by which errors, and why.

    Attributes
    ----------
    reason : str
        Why these cells are refused, for a reader ("the exact learner assumes exact answers").
    errors : tuple of exception types
        The named errors of :mod:`attnquery.errors` the refusal is made with; any other error
        of these cells is a failure.
    where : callable(cell) -> bool
        The cells (their parameters: a cell dict or a result row) that may be refused this way;
        by default every cell of the experiment.
    """

    reason: str
    errors: tuple[type[BaseException], ...] = (_errors.AssumptionViolation,)
    where: Callable[[Mapping], bool] = _every_cell

    def covers(self, cell: Mapping, error: type[BaseException] | None) -> bool:
        """Whether an ``error`` raised by ``cell`` is this refusal."""
        return (error is not None and issubclass(error, self.errors)
                and bool(self.where(cell)))


def error_type(message: str | None) -> type[BaseException] | None:
    """The named error of :mod:`attnquery.errors` that starts a row's message
    (``"AssumptionViolation: ..."``, as :func:`attnquery.experiments.run_cells` writes it),
    or None when the message names no error of the library."""
    name = (message or "").partition(":")[0].strip()
    err = getattr(_errors, name, None)
    if isinstance(err, type) and issubclass(err, _errors.AttnQueryError):
        return err
    return None


def find_refusal(refusals: Iterable[Refusal], cell: Mapping,
                 error: type[BaseException] | None) -> Refusal | None:
    """The first of ``refusals`` that covers an ``error`` (type) raised by ``cell``, or None
    (a failure)."""
    return next((r for r in refusals if r.covers(cell, error)), None)


def outcome(row: Mapping, refusals: Iterable[Refusal] = ()) -> tuple[str, str]:
    """``(word, reason)`` of one result row: its outcome (:data:`WORDS`) and, for a refusal
    as designed, the declared reason (else ``""``)."""
    status = row.get("status")
    if status in ("ok", "not_identifiable"):
        return OK, ""
    if status == "error":
        r = find_refusal(refusals, row, error_type(row.get("message")))
        if r is not None:
            return REFUSED, r.reason
    return FAILED, ""


@dataclass
class Outcomes:
    """The outcomes of one experiment's cells: counts of each word, refusals by reason."""

    name: str
    ok: int = 0
    failed: int = 0
    refused: Counter | None = None

    @property
    def n_refused(self) -> int:
        return sum((self.refused or Counter()).values())

    @property
    def total(self) -> int:
        return self.ok + self.n_refused + self.failed


def count_outcomes(name: str, rows: Iterable[Mapping],
                   refusals: Iterable[Refusal] = ()) -> Outcomes:
    """Count the outcomes of an experiment's rows (dicts with ``status``, ``message`` and the
    cell's parameters)."""
    refusals = tuple(refusals)
    out = Outcomes(name, refused=Counter({r.reason: 0 for r in refusals}))
    for row in rows:
        word, reason = outcome(row, refusals)
        if word == OK:
            out.ok += 1
        elif word == REFUSED:
            out.refused[reason] += 1
        else:
            out.failed += 1
    return out


def summary_line(o: Outcomes) -> str:
    """``"noise: 1,850 ok, 178 refused as designed (...: 135; ...: 43), 0 failed"``."""
    seen = [(reason, n) for reason, n in (o.refused or Counter()).items() if n]
    why = seen[0][0] if len(seen) == 1 else "; ".join(f"{r}: {n:,}" for r, n in seen)
    refused = f"{o.n_refused:,} {REFUSED}" + (f" ({why})" if why else "")
    return f"{o.name}: {o.ok:,} {OK}, {refused}, {o.failed:,} {FAILED}"
