"""Claims the study's figures make, checked against the data.

A :class:`Claim` is a statement with a verdict computed from result rows; figures print them,
tests assert them, and the report's captions say whether the data support them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["Claim", "ok_rows", "extra_values"]


@dataclass(frozen=True)
class Claim:
    """A statement checked against data: ``passed`` is the verdict, ``detail`` the evidence."""

    name: str
    statement: str
    passed: bool
    detail: str

    def __str__(self) -> str:
        verdict = "supported" if self.passed else "NOT supported"
        return f"{self.statement}: {verdict} ({self.detail})"


def ok_rows(df, experiment: str | None = None):
    """Rows with status ok (of one experiment, if given)."""
    if experiment is not None:
        df = df[df["experiment"] == experiment]
    return df[df["status"] == "ok"]


def extra_values(df, key: str, default=None):
    """The ``key`` entry of each row's ``extra`` JSON column (``default`` where it is absent)."""
    return df["extra"].map(lambda s: json.loads(s).get(key, default) if isinstance(s, str)
                           else default)
