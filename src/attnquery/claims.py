"""Claims the study's figures make, checked against the data.

A :class:`Claim` is a statement with a verdict computed from result rows; figures print them,
tests assert them, and the report's captions say whether the data support them. No evidence, no
success: a claim that rests on no successful run (``n_runs=0``) is "not supported (no data)",
whatever its check says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["Claim", "ok_rows", "no_data", "extra_values", "threshold_claim"]


@dataclass(frozen=True)
class Claim:
    """A statement checked against data: ``passed`` is the verdict, ``detail`` the evidence.

    ``n_runs`` is the number of successful runs the verdict rests on, when the claim says; with
    ``n_runs=0`` the claim never passes.
    """

    name: str
    statement: str
    passed: bool
    detail: str
    n_runs: int | None = None

    def __post_init__(self):
        if self.n_runs == 0 and self.passed:
            object.__setattr__(self, "passed", False)

    @property
    def no_data(self) -> bool:
        """True when the verdict rests on no successful run."""
        return self.n_runs == 0

    @property
    def verdict(self) -> str:
        if self.no_data:
            return "not supported (no data)"
        return "supported" if self.passed else "NOT supported"

    def __str__(self) -> str:
        return f"{self.statement}: {self.verdict} ({self.detail})"


def no_data(claim: Claim, why: str = "no successful run") -> Claim:
    """``claim`` with its verdict replaced by "not supported (no data)"."""
    return Claim(claim.name, claim.statement, False, why, n_runs=0)


def ok_rows(df, experiment: str | None = None):
    """Rows with status ok (of one experiment, if given)."""
    if experiment is not None:
        df = df[df["experiment"] == experiment]
    return df[df["status"] == "ok"]


def extra_values(df, key: str, default=None):
    """The ``key`` entry of each row's ``extra`` JSON column (``default`` where it is absent)."""
    return df["extra"].map(lambda s: json.loads(s).get(key, default) if isinstance(s, str)
                           else default)


def threshold_claim(name: str, statement: str, passes, *, of: int | None = None,
                    worst=None, worst_label: str = "worst", fmt: str = ".2e",
                    runs: str = "runs") -> Claim:
    """A claim that every run meets a threshold, with the evidence ``"k/n runs; worst x"``.

    Parameters
    ----------
    name, statement : str
    passes : sequence of bool
        Whether each run the claim rests on meets the threshold (the runs that ran to an
        answer); the claim's :attr:`Claim.n_runs` is their number, so with none it is "not
        supported (no data)".
    of : int, optional
        The runs the claim is about (default: ``len(passes)``); when more runs were asked for
        than ran, the claim fails (a failed run is no evidence for it).
    worst : float, optional
        The worst value seen, printed as ``"; <worst_label> <worst:fmt>"``.
    runs : str
        What the runs are called in the evidence (``"runs with m <= d"``).
    """
    passes = [bool(p) for p in passes]
    n, k = len(passes), sum(passes)
    total = n if of is None else int(of)
    detail = f"{k}/{total} {runs}"
    if worst is not None:
        detail += f"; {worst_label} {worst:{fmt}}"
    return Claim(name, statement, bool(k == n == total), detail, n_runs=n)
