"""Claims the study's figures make, checked against the data.

A :class:`Claim` is a statement with a verdict computed from result rows; figures print them,
tests assert them, and the report's captions say whether the data support them. No evidence, no
success: a claim that rests on no successful run (``n_runs=0``) is "not supported (no data)",
whatever its check says.

A claim also carries the numbers its check computed (:class:`Number`: an exponent with its
interval, a worst error, a count of runs). They are what the findings state: the workflow collects
them into ``results/numbers.json`` and ``results/numbers.tex`` (:mod:`attnquery.study.findings`), so
every number a reader sees comes from the code that checked the claim.

Each claim is one small function named as the claim, registered with its figure module's
:class:`ClaimSet` (``@CLAIMS``): a reader finds a claim by its name, and a test runs one claim on
data of its own (``CLAIMS["exact_count"](data)``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Claim", "ClaimSet", "Number", "ROUNDING_FACTOR", "NOISE_FACTOR", "format_number",
           "format_interval", "fit_number", "number_name", "ok_rows", "no_data", "extra_values",
           "threshold_claim"]

_NAME = re.compile(r"^[a-z][A-Za-z0-9]*$")

#: The factor (:attr:`Number.factor`) the numbers that measure floating-point rounding declare:
#: the errors of the learners on exact (float64) answers, 1e-16 to 1e-9. Their digits depend on
#: the BLAS kernel and the CPU (another summation order moves every rounding error); two
#: OpenBLAS kernels of one machine moved them by up to a factor of 5.8
#: (docs/notes/2026-11-27-cross-machine.md). What a reader can rely on is their order of
#: magnitude, and the bound of the claim that states them.
ROUNDING_FACTOR = 10.0
#: The factor the errors of learners on float32-served answers declare (the served heads'
#: errors, the served rotary heads'). The served box answers alike on every machine
#: (:mod:`attnquery.precision`), but the learner chooses its queries with float64 arithmetic
#: whose last bits depend on the BLAS kernel; the float32 rounding of a few queries then flips,
#: and the error is that of another sample of the rounding noise: two OpenBLAS kernels moved a
#: served MiniLM head's errors by up to 2% and a served rotary head's by a factor of 1.35
#: (docs/notes/2026-11-27-cross-machine.md).
NOISE_FACTOR = 2.0


@dataclass(frozen=True)
class Number:
    """A number a finding states, as the check of its claim computed it.

    Parameters
    ----------
    name : str
        Identifier in camelCase, letters and digits (``exactQueryExponent``); the LaTeX macro is
        this name with digits spelt out (:func:`attnquery.study.findings.macro_name`).
    value : float or int
        The number itself, unrounded.
    unit : str
        What it measures ("exponent", "relative error", "queries", "runs", "s", ...).
    fmt : str
        Format specification of its printed form (``".3f"``, ``".2g"``, ``"d"``).
    lo, hi : float, optional
        Its confidence interval (95% unless ``rows`` says otherwise), printed with ``fmt``.
    rows : str
        Which rows of the figure's tables it is computed from.
    timing : bool
        A wall-clock measurement: not reproducible bit for bit, excluded from the comparison with
        the committed findings (:func:`attnquery.study.findings.compare_numbers`).
    tol : float, optional
        The largest difference from the committed value (in the number's unit, for the value and
        each end of the interval) that still counts as reproduced when the printed digits differ.
        Without it a number is reproduced when it prints the same (or differs by less than half a
        unit of its last printed digit). A count (``fmt`` ``"d"``) must match exactly and takes
        none.
    factor : float, optional
        The largest ratio (at least 1) between the run's value and the committed one, either
        way, that still counts as reproduced when the printed digits differ: ``new / committed``
        within ``[1 / factor, factor]`` for the value and each end of the interval, both of one
        sign. For numbers that measure floating-point rounding (errors of 1e-16 to 1e-9), which
        another BLAS kernel or CPU changes by a factor of a few while their order of magnitude
        holds (docs/reproducibility.md). A count takes none.
    """

    name: str
    value: float
    unit: str = ""
    fmt: str = ".3g"
    lo: float | None = None
    hi: float | None = None
    rows: str = ""
    timing: bool = False
    tol: float | None = None
    factor: float | None = None

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise ValueError(f"number name {self.name!r} is not camelCase letters and digits")
        if self.tol is not None:
            if self.fmt.endswith("d"):
                raise ValueError(f"number {self.name}: a count (fmt {self.fmt!r}) must be "
                                 f"reproduced exactly and takes no tol (got {self.tol!r})")
            if not (isinstance(self.tol, (int, float)) and math.isfinite(self.tol)
                    and self.tol >= 0):
                raise ValueError(f"number {self.name}: tol must be a finite number >= 0, got "
                                 f"{self.tol!r}")
        if self.factor is not None:
            if self.fmt.endswith("d"):
                raise ValueError(f"number {self.name}: a count (fmt {self.fmt!r}) must be "
                                 f"reproduced exactly and takes no factor (got {self.factor!r})")
            if not (isinstance(self.factor, (int, float)) and not isinstance(self.factor, bool)
                    and math.isfinite(self.factor) and self.factor >= 1):
                raise ValueError(f"number {self.name}: factor must be a finite number >= 1, got "
                                 f"{self.factor!r}")

    def format(self, x) -> str:
        """``x`` printed as this number is printed."""
        return format_number(x, self.fmt)

    @property
    def text(self) -> str:
        """The printed value."""
        return self.format(self.value)

    @property
    def interval(self) -> str:
        """The printed interval, ``[lo, hi]`` (empty without one)."""
        return format_interval(self.lo, self.hi, self.fmt)

    def to_dict(self) -> dict:
        """The JSON record of the number (values as Python floats or ints)."""
        def plain(x):
            if x is None:
                return None
            return int(x) if self.fmt.endswith("d") else float(x)
        return {"name": self.name, "value": plain(self.value), "text": self.text,
                "unit": self.unit, "lo": plain(self.lo), "hi": plain(self.hi),
                "interval": self.interval, "rows": self.rows, "timing": self.timing,
                "fmt": self.fmt, "tol": None if self.tol is None else float(self.tol),
                "factor": None if self.factor is None else float(self.factor)}


def format_number(x, fmt: str) -> str:
    """``x`` printed with the format specification ``fmt`` as the findings print numbers: an
    empty string for ``None``, ``nan`` / ``inf`` as such, a ``"d"`` format rounds to an integer."""
    if x is None:
        return ""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if fmt.endswith("d"):
        return format(int(round(x)), fmt)
    return format(float(x), fmt)


def format_interval(lo, hi, fmt: str) -> str:
    """The interval ``[lo, hi]`` printed with :func:`format_number` (empty without one)."""
    if lo is None or hi is None:
        return ""
    return f"[{format_number(lo, fmt)}, {format_number(hi, fmt)}]"


def number_name(*parts) -> str:
    """A :class:`Number` name from ``parts`` (``("lowprecision", "goal", "digits=3")`` gives
    ``lowprecisionGoalDigits3``): words split at anything not a letter or digit, camelCase."""
    words = [w for part in parts for w in re.split(r"[^A-Za-z0-9]+", str(part)) if w]
    if not words:
        raise ValueError("a number name needs at least one word")
    return words[0][0].lower() + words[0][1:] + "".join(w[0].upper() + w[1:] for w in words[1:])


def fit_number(name: str, fit, rows: str = "", unit: str = "exponent", fmt: str = ".3f",
               timing: bool = False, tol: float | None = None,
               factor: float | None = None) -> Number:
    """The slope of a :class:`~attnquery.metrics.PowerLawFit` with its interval (``tol``,
    ``factor``: see :class:`Number`)."""
    return Number(name, float(fit.slope), unit, fmt, float(fit.lo), float(fit.hi),
                  f"{rows}; {round(100 * fit.level)}% interval, n = {fit.n}".lstrip("; "),
                  timing, tol, factor)


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
    numbers: tuple[Number, ...] = field(default=(), compare=False)

    def __post_init__(self):
        if self.n_runs == 0 and self.passed:
            object.__setattr__(self, "passed", False)
        object.__setattr__(self, "numbers", tuple(self.numbers))

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
                    runs: str = "runs", numbers=()) -> Claim:
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
    numbers : sequence of Number
        The numbers the claim's check computed (:attr:`Claim.numbers`).
    """
    passes = [bool(p) for p in passes]
    n, k = len(passes), sum(passes)
    total = n if of is None else int(of)
    detail = f"{k}/{total} {runs}"
    if worst is not None:
        detail += f"; {worst_label} {worst:{fmt}}"
    return Claim(name, statement, bool(k == n == total), detail, n_runs=n,
                 numbers=tuple(numbers))


class ClaimSet:
    """The claims of one figure module: small functions, each named as the claim it checks.

    Register a claim with the set as a decorator (:meth:`named` to give it a name other than its
    function's); the function takes the data the module's
    ``prepare`` makes of the result rows and returns its :class:`Claim` (``None`` when the claim
    is not made on these data, or a list for a claim stated once per group, whose names start
    with the function's name). :meth:`check` runs every claim in the order they were registered.

    Parameters
    ----------
    prepare : callable(DataFrame) -> object, optional
        What the claims read, made once from the result rows (default: the rows themselves);
        ``None`` when the figure states no claim on these rows.

    Examples
    --------
    >>> CLAIMS = ClaimSet(lambda df: ok_rows(df, "exact"))
    >>> @CLAIMS
    ... def exact_ran(ok):
    ...     return Claim("exact_ran", "the experiment ran", len(ok) > 0, f"{len(ok)} runs")
    """

    def __init__(self, prepare: Callable | None = None):
        self.prepare = prepare if prepare is not None else (lambda df: df)
        self._checks: dict[str, Callable] = {}

    def __call__(self, check: Callable) -> Callable:
        return self.named(check.__name__)(check)

    def named(self, name: str) -> Callable:
        """Decorator registering a claim under ``name`` rather than its function's name (where
        the module already uses that name, for example for a figure)."""

        def register(check: Callable) -> Callable:
            if name in self._checks:
                raise ValueError(f"claim {name!r} is registered twice")
            self._checks[name] = check
            return check

        return register

    @property
    def names(self) -> tuple[str, ...]:
        """The claims' names (their functions' names), in order."""
        return tuple(self._checks)

    def __getitem__(self, name: str) -> Callable:
        if name not in self._checks:
            raise KeyError(f"unknown claim {name!r}; known: {list(self._checks)}")
        return self._checks[name]

    def check(self, data) -> list[Claim]:
        """Every claim checked on ``data`` (what ``prepare`` made of the rows), in order."""
        claims = []
        for check in self._checks.values():
            out = check(data)
            if isinstance(out, Claim):
                claims.append(out)
            elif out is not None:
                claims.extend(out)
        return claims

    def of_rows(self, df) -> list[Claim]:
        """Every claim checked on the result rows ``df`` (``check(prepare(df))``; none when
        ``prepare`` gives ``None``)."""
        data = self.prepare(df)
        return [] if data is None else self.check(data)
