"""Served arithmetic: a forward pass computed in float32, float16 or bfloat16 as an engine does.

Beyond the paper. Deployed models are not evaluated in float64: an inference engine (onnxruntime,
PyTorch, JAX) stores the weights in the serving format and rounds the result of every operation
to it. :class:`Arithmetic` is that arithmetic, for the models of :mod:`attnquery.models` and
:class:`attnquery.realheads.ModuleBlackBox` (their ``precision`` argument):

* ``"float64"``: nothing is rounded (the models then keep their own float64 code path,
  bit-identical to a model built without ``precision``);
* ``"float32"``: every array is a float32 array and every operation is rounded to float32;
* ``"float16"`` and ``"bfloat16"`` (``ml_dtypes.bfloat16``, the type JAX uses): values are held in
  the format; an elementwise operation (bias add, scaling) is computed in float32 and rounded,
  which is the correctly rounded result of the format's own operation (float32 has more than
  twice the format's significant bits plus two).

The answers are the format's values (returned as float64); the inputs are rounded to the format
on entry.

**Matrix products and the softmax's exponential are machine-independent.** A matrix product
(:meth:`Arithmetic.matmul`, :meth:`Arithmetic.einsum`) multiplies the format's values in float64,
where every product is exact (24 + 24 significant bits fit in float64's 53), sums them in
float64 and rounds the sum once to float32 and then (float16, bfloat16) to the format: the model
of an engine that accumulates in higher precision than it stores. The softmax (max shift, exp,
sum, division) is computed in float32 except its exponential, which is float64's rounded to
float32 (correctly rounded but where the value lies within float64's roundoff of the midpoint
of two float32 numbers), and its result is rounded once to the format, as the engines'
half-precision softmax kernels do.
Computing them in float32 instead (BLAS ``sgemm``, numpy's SIMD ``exp``) makes the answers
depend on the CPU: the BLAS kernel sums in another order (OpenBLAS's Haswell and SkylakeX
kernels gave different float32 answers to 91% of the inputs of a MiniLM head, the learner's
error of W then 1.8e-7 on one and 3.4e-7 on the other) and numpy's float32 ``exp`` is computed
differently without FMA (36% of the values). The float64 sum is also summed in a
kernel-dependent order, but its error (about 1e-16 relative) moves the float32 result only when
the sum lies that close to the midpoint of two float32 numbers, which is rare: none of the
answers of that MiniLM head to 2,000 queries, nor of a rotary head to 600, differed between the
two kernels (docs/notes/2026-11-27-cross-machine.md).

A float16 value beyond 65504 is ``inf`` (the cast overflows, as on an accelerator), and the
softmax of a row holding ``inf`` is NaN: a float16 box answers ``inf``/NaN to inputs that are too
large, as a real one does. Nothing is clipped.

Seen from the other side, a learner reads the format of a box's answers
(:func:`answer_format`, :class:`AnswerFormat`) and the relative noise that format's rounding
explains (:func:`rounding_floor`), against which it judges the noise it measures (docs/served.md,
"Noise judged against the format").
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import ModelError
from .theory import relative_rounding_error

__all__ = ["PRECISIONS", "Arithmetic", "check_precision", "storage_dtype", "round_to",
           "largest_finite", "NARROW_FORMATS", "answer_format", "AnswerFormat",
           "rounding_floor"]

#: the compute precisions a model accepts
PRECISIONS = ("float64", "float32", "float16", "bfloat16")

_DTYPES = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32),
           "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def check_precision(precision) -> str:
    """Return ``precision`` as one of :data:`PRECISIONS` or raise :class:`ModelError`."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ModelError(f"precision must be one of {PRECISIONS}; got {precision!r}")
    return precision


def storage_dtype(precision: str) -> np.dtype:
    """The numpy dtype of a precision (``ml_dtypes.bfloat16`` for ``"bfloat16"``)."""
    return _DTYPES[check_precision(precision)]


def largest_finite(precision: str) -> float:
    """The largest finite number of the format (65504 for float16)."""
    return float(ml_dtypes.finfo(storage_dtype(precision)).max)


def round_to(a, precision: str) -> np.ndarray:
    """``a`` rounded to the format (to nearest, ties to even), returned as float64."""
    dt = storage_dtype(precision)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(a, dtype=np.float64).astype(dt).astype(np.float64)


#: the formats narrower than float64 that answers are read in, the fewest significant bits first:
#: a bfloat16 value within float16's normal range is also a float16 value, and both are float32
#: values, so the first format holding every answer is the one of fewest bits that does
NARROW_FORMATS = ("bfloat16", "float16", "float32")


def answer_format(y) -> str:
    """The format of answers ``y``: the first of :data:`NARROW_FORMATS` that holds every finite
    answer exactly, else ``"float64"`` (answers rounded to a few decimal digits, or carrying
    noise of their own, are float64 values). Answers that are not finite (a format's overflow)
    say nothing about it."""
    return AnswerFormat().update(y).format


class AnswerFormat:
    """The format of every answer seen so far (:func:`answer_format` of all of them), updated
    batch by batch: each batch is tested against the formats that held every earlier answer
    only, so float64 answers cost one test of each format, once."""

    def __init__(self):
        self._left = NARROW_FORMATS

    def update(self, y) -> AnswerFormat:
        """Take a batch of answers into account; returns self."""
        if self._left:
            y = np.asarray(y, dtype=np.float64).ravel()
            y = y[np.isfinite(y)]
            self._left = tuple(f for f in self._left if np.array_equal(round_to(y, f), y))
        return self

    @property
    def format(self) -> str:
        """The narrowest format holding every answer seen (``"float64"`` where none does)."""
        return self._left[0] if self._left else "float64"


def rounding_floor(precision: str, d: int) -> float:
    """The relative noise that rounding alone explains in the answers of a model of token
    dimension ``d`` served in ``precision`` (one of :data:`NARROW_FORMATS`): the format's unit
    roundoff ``u`` (``2^-b`` for b significant bits), or float32's ``u sqrt(d)`` where that is
    larger, since an engine accumulates its d-term sums in float32 and their rounding adds up
    like ``sqrt(d)`` roundings (in float32 itself; a narrow format's own rounding of the result
    is the larger below d = 2^26). The noise the learners measure on served boxes is a small
    multiple of it (``NOISE_FORMAT_FACTOR`` in :mod:`attnquery.learners._base`)."""
    if precision not in NARROW_FORMATS:
        raise ModelError(f"precision must be one of {NARROW_FORMATS}; got {precision!r}")
    return float(max(relative_rounding_error(dtype=precision),
                     relative_rounding_error(dtype="float32") * np.sqrt(int(d))))


class Arithmetic:
    """The operations of a forward pass in one precision (see the module's docstring).

    Arrays are held as float32 arrays whose values lie in the format (float64 arrays for
    ``"float64"``); :meth:`rnd` rounds a computed array to the format.

    Parameters
    ----------
    precision : {"float64", "float32", "float16", "bfloat16"}
    """

    def __init__(self, precision: str = "float64"):
        self.precision = check_precision(precision)
        self.dtype = storage_dtype(precision)
        self.compute = np.dtype(np.float64) if precision == "float64" else np.dtype(np.float32)
        self._narrow = precision in ("float16", "bfloat16")

    def rnd(self, a) -> np.ndarray:
        """Round an array to the format (held in the compute type)."""
        a = np.asarray(a)
        if not self._narrow:
            return a.astype(self.compute, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype(self.dtype).astype(self.compute)

    def store(self, a) -> np.ndarray:
        """Weights (or inputs) as the engine holds them: float64 values rounded to the format."""
        if not self._narrow:  # float32 (one conversion) or float64
            return np.asarray(a, dtype=self.compute)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(a, dtype=np.float64).astype(self.dtype).astype(self.compute)

    def _wide(self, a) -> np.ndarray:
        """``a`` as float64 (exact: the format's values are float64 values)."""
        return np.asarray(a, dtype=np.float64)

    def _round(self, a) -> np.ndarray:
        """A float64 result rounded to float32 and then to the format (the compute type)."""
        return self.rnd(np.asarray(a).astype(np.float32))

    def matmul(self, a, b) -> np.ndarray:
        """``a @ b``: the products exact and summed in float64, the sum rounded once to float32
        and then to the format (see the module's docstring: the result does not depend on the
        BLAS kernel); in float64 numpy's ``a @ b``."""
        with np.errstate(over="ignore", invalid="ignore"):
            if self.precision == "float64":
                return self.rnd(np.matmul(a, b))
            return self._round(np.matmul(self._wide(a), self._wide(b)))

    def einsum(self, spec: str, *operands) -> np.ndarray:
        """``np.einsum(spec, *operands)``, a batched contraction (the scores or the weighted
        values of many heads at once), summed in float64 and rounded once, as :meth:`matmul`."""
        with np.errstate(over="ignore", invalid="ignore"):
            if self.precision == "float64":
                return self.rnd(np.einsum(spec, *operands))
            return self._round(np.einsum(spec, *map(self._wide, operands)))

    def add(self, a, b) -> np.ndarray:
        """Elementwise ``a + b``, rounded."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self.rnd(np.add(a, b))

    def mul(self, a, b) -> np.ndarray:
        """Elementwise ``a * b``, rounded."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self.rnd(np.multiply(a, b))

    def div(self, a, b) -> np.ndarray:
        """Elementwise ``a / b``, rounded."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self.rnd(np.divide(a, b))

    def softmax(self, s) -> np.ndarray:
        """Softmax over the last axis in the compute type (max shift, exp, sum, division),
        rounded once; the exponential is float64's rounded to float32 (see the module's
        docstring). A row holding ``inf`` gives NaN, as an engine's kernel does."""
        s = np.asarray(s, dtype=self.compute)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            shifted = s - s.max(axis=-1, keepdims=True)
            e = (np.exp(shifted) if self.precision == "float64"
                 else np.exp(self._wide(shifted)).astype(np.float32))
            return self.rnd(e / e.sum(axis=-1, keepdims=True))

    def answers(self, y) -> np.ndarray:
        """The answers, as float64 (their values are the format's)."""
        return np.asarray(y, dtype=np.float64)
