"""Random streams: the one place where seeds become generators (Scientific Python SPEC 7,
"Seeding pseudo-random number generation").

Every function of the library that draws random numbers takes a ``seed`` (or ``random_state``)
that may be an int, a sequence of ints, a :class:`numpy.random.SeedSequence`, a
:class:`numpy.random.Generator` (used as is, so its stream advances) or None (fresh entropy),
and turns it into a generator with :func:`as_rng`.
"""

from __future__ import annotations

import numpy as np

from .errors import ConfigError

__all__ = ["as_rng", "seed_int", "haar_orthogonal"]

_MASK63 = 0x7FFFFFFFFFFFFFFF


def as_rng(seed) -> np.random.Generator:
    """A ``numpy.random.Generator`` from an int, a sequence of ints, a SeedSequence, None or a
    Generator (returned as is).

    Raises
    ------
    ConfigError
        For anything else (a bool, a float, a string, a negative int).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool | float | str | bytes):
        raise ConfigError(f"a seed must be an int, a sequence of ints, a SeedSequence, a "
                          f"Generator or None; got {seed!r}")
    try:
        return np.random.default_rng(seed)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"a seed must be an int, a sequence of ints, a SeedSequence, a "
                          f"Generator or None; got {seed!r} ({exc})") from None


def seed_int(seed) -> int:
    """A fixed 63-bit integer seed: an int is kept (its low 63 bits), anything else accepted by
    :func:`as_rng` gives one draw of its stream (None: fresh entropy)."""
    if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        return int(seed) & _MASK63
    return int(as_rng(seed).integers(0, _MASK63))


def haar_orthogonal(n: int, seed) -> np.ndarray:
    """A Haar-distributed random orthogonal ``n x n`` matrix (QR of a Gaussian matrix with the
    signs of R's diagonal moved into Q, Mezzadri 2007)."""
    rng = as_rng(seed)
    Qm, R = np.linalg.qr(rng.standard_normal((n, n)))
    return Qm * np.where(np.diag(R) < 0, -1.0, 1.0)
