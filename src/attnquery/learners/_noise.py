"""How a learner judges the relative noise it measures on answers in a narrow format.

Re-exported by :mod:`attnquery.learners._base`, where learners import them from."""

from __future__ import annotations

import warnings

from ..errors import ConfigError, ModelMismatchError, NoiseAboveFormatWarning
from ..precision import rounding_floor

__all__ = ["NOISE_FORMAT_FACTOR", "NOISE_MODES", "check_noise_mode", "judge_noise"]

#: how a learner judges the relative noise it measures on answers in a narrow format (its
#: ``noise`` parameter): "format", against what the format's rounding explains; "measured",
#: as it is, the answers declared noisier than their format
NOISE_MODES = ("format", "measured")
#: the most relative noise answers in a narrow format may carry, in units of the format's
#: rounding floor (:func:`attnquery.precision.rounding_floor`). Measured noise over floor on
#: valid boxes (docs/notes/2026-11-27-noise-format.md): the low-precision learner's
#: ``noise_level_`` on float32 heads 0.29 to 0.54 at d = 16 and 32 (random heads, the served
#: test checkpoint, ours and onnxruntime's), 0.79 to 0.96 at d = 64, 0.55 to 1.03 on six
#: MiniLM heads (d = 384); 0.77 to 1.42 in float16, 0.85 to 1.43 in bfloat16; the layer
#: learner's one-row noise 0.26 to 0.44 on float32 layers (test checkpoint, MiniLM layers 0 to
#: 5), 0.42 to 1.41 in float16, 0.73 to 1.43 in bfloat16. Misfits: a soft-capped float32 head
#: (d = 64) 7e3 to 1.4e4; a soft-capped float32 layer with relative noise 5e-6 (d = 32) 6.5
#: to 9.8
NOISE_FORMAT_FACTOR = 4.0


def check_noise_mode(noise) -> str:
    """The ``noise`` parameter of a learner, one of :data:`NOISE_MODES`."""
    if not isinstance(noise, str) or noise not in NOISE_MODES:
        raise ConfigError(f"noise must be one of {NOISE_MODES}; got {noise!r}")
    return noise


def judge_noise(learner, noise: float, fmt: str, d: int, what: str,
                stacklevel: int = 3) -> None:
    """Judge the answers' measured relative noise against what their format explains.

    Answers in a narrow format (``fmt``, :func:`attnquery.precision.answer_format`) are
    rounded by it, and a box of what the learner assumes answers with noise of at most
    :data:`NOISE_FORMAT_FACTOR` times :func:`~attnquery.precision.rounding_floor`: more is
    a box the learner's model does not fit (its answers' disagreement with that model is
    counted as noise) or noise the box adds. With ``learner.noise == "format"`` that raises
    :class:`~attnquery.errors.ModelMismatchError` (``error``: the noise, ``allowed``: the
    allowance); with ``"measured"`` (noise declared) it warns with
    :class:`~attnquery.errors.NoiseAboveFormatWarning`. Answers in no narrow format
    (``"float64"``) are not judged. Sets ``answer_format_``, ``noise_floor_`` (the floor; None
    for float64) and ``noise_above_format_`` on the learner. ``stacklevel``: the warning's, so
    that it names the line that called ``fit`` (3 where ``fit`` calls this directly).
    """
    learner.answer_format_, learner.noise_floor_ = fmt, None
    learner.noise_above_format_ = False
    if fmt == "float64":
        return
    floor = rounding_floor(fmt, d)
    learner.noise_floor_ = floor
    allowed = NOISE_FORMAT_FACTOR * floor
    if not noise > allowed:
        return
    learner.noise_above_format_ = True
    msg = (f"the answers are {fmt} values, whose rounding explains a relative noise of about "
           f"{floor:.3g} at d = {int(d)} (at most {NOISE_FORMAT_FACTOR:g} times it, "
           f"{allowed:.3g}, is allowed), but they carry {noise:.3g}, {noise / floor:.3g} times "
           "that floor")
    if check_noise_mode(learner.noise) == "format":
        raise ModelMismatchError(
            f"{msg}: the box is not {what} served in {fmt} (what it answers beyond the model "
            "is counted as noise), or it adds noise of its own (declare that with "
            "noise='measured')", error=float(noise), allowed=float(allowed))
    warnings.warn(f"{msg}; noise='measured' declares such answers, so {type(learner).__name__} "
                  "goes on with the noise it measured, which a box that is not "
                  f"{what} inflates too (noise_above_format_ = True)",
                  NoiseAboveFormatWarning, stacklevel=stacklevel)
