"""What the subcommands share: exit statuses, option types, one-line messages, reading a
configuration, checking and writing ``--out``."""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from ..errors import AttnQueryError, ConfigError
from ..files import special_file_kind

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPTED", "OutputError",
           "MAX_D", "int_at_least", "positive_float", "readout", "one_line", "say",
           "print_json", "os_reason", "load_config", "check_out", "check_out_untouched",
           "write_model", "model_usage"]

#: exit statuses: success, a failed extraction or check, a usage error, Ctrl-C
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: the largest token dimension ``--d`` takes: W, a d x d float64 matrix, must fit in the
#: largest array numpy can address (beyond it no learner can hold its estimate)
MAX_D = math.isqrt(int(np.iinfo(np.intp).max) // np.dtype(np.float64).itemsize)


class OutputError(AttnQueryError):
    """Writing an output file failed (disk full, file system turned read-only, ...)."""


# -- option types (argparse turns their ArgumentTypeError into a usage error) -----------------


def int_at_least(low: int, high: int | None = None):
    """An argparse type: an integer in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            val = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if val < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}; got {val}")
        if high is not None and val > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}; got {val}")
        return val

    parse.__name__ = f"integer >= {low}"
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (np.isfinite(val) and val > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number; got {text}")
    return val


def readout(text: str) -> tuple[str, int | None]:
    """An argparse type: ``gaussian``, ``ones`` or a coordinate index."""
    if text in ("gaussian", "ones"):
        return text, None
    try:
        return "coordinate", int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--readout must be 'gaussian', 'ones' or a coordinate index; got {text!r}"
        ) from None


# -- messages -----------------------------------------------------------------------------------


def one_line(exc) -> str:
    """An exception's message on one line (a note if its ``__str__`` fails)."""
    try:
        text = str(exc)
    except Exception as err:  # noqa: BLE001 - an error raised by foreign code, to be reported
        text = f"(message unprintable: {type(err).__name__})"
    return " ".join(text.split())


def say(line: str) -> None:
    """Print ``line`` on stderr."""
    print(line, file=sys.stderr)


def print_json(obj) -> None:
    """Print ``obj`` as one JSON object (numpy scalars as numbers, anything else as text)."""
    print(json.dumps(obj, sort_keys=True, default=lambda o: o.item() if hasattr(o, "item")
                     else str(o)))


#: what an OSError means, by errno
_OS_REASONS = {errno.EISDIR: "it is a folder", errno.ENOTDIR: "a parent is not a folder",
               errno.EACCES: "permission denied", errno.EPERM: "permission denied",
               errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on the device",
               errno.ENOENT: "no such file or folder"}


def os_reason(exc: OSError) -> str:
    """An OSError in words: what it means, and where."""
    reason = _OS_REASONS.get(exc.errno, exc.strerror or one_line(exc))
    where = exc.filename
    return f"{reason}: {where}" if where else reason


# -- inputs -------------------------------------------------------------------------------------


def load_config(path):
    """:func:`attnquery.study.config.load_config` (a missing file is a ConfigError), with a
    malformed or unreadable file as a ConfigError too (a usage error)."""
    import yaml

    from ..study.config import load_config as load

    kind = special_file_kind(path)
    if kind is not None:  # reading a FIFO would block
        raise ConfigError(f"config file {path} is not a regular file (it is {kind})")
    try:
        return load(path)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {one_line(exc)}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None


# -- --out --------------------------------------------------------------------------------------

def check_out(path, inputs=(), *, replace: bool = True) -> None:
    """Usage error (before any work) when ``--out`` cannot be written, or is something the
    atomic rename would destroy: a device, a FIFO, a socket (anything that exists and is not a
    regular file), or one of the command's input files ``inputs`` (a link to one, or a path
    through a linked folder to one, included; an input that does not exist yet, such as the
    ``config.json`` a checkpoint may have beside it, by its resolved path); with
    ``replace=False``, any file that exists (``extract`` without ``--force``). Creates nothing:
    a missing folder is created when the result is written (:func:`write_model`)."""
    from ..results import check_writable

    for source in inputs:
        if _same_file(path, source):
            raise ConfigError(f"--out {path} is the input {source}; refusing to replace it: "
                              "give another file name")
    kind = special_file_kind(path)
    if kind is not None:
        raise ConfigError(f"--out {path}: not a regular file (it is {kind}); refusing to "
                          "replace it: give a file name")
    try:
        check_writable(path)
    except OSError as exc:
        raise ConfigError(f"--out {path}: cannot write there ({os_reason(exc)})") from None
    if not replace and os.path.lexists(path):
        raise ConfigError(f"--out {path} already exists; refusing to replace it: give another "
                          "file name, or --force to replace it")


def check_out_untouched(path, touched, what: str) -> None:
    """Usage error when ``--out`` is one of the files ``touched`` (paths), which ``what`` (the
    black box's import) imported, opened or wrote: replacing one would change the box the next
    time it is imported (``--force`` does not lift it)."""
    for file in touched:
        if _same_file(path, file):
            raise ConfigError(f"--out {path} is {file}, which {what} read or wrote when it was "
                              "imported; refusing to replace it, even with --force: give "
                              "another file name")


def _same_file(a, b) -> bool:
    """Whether ``a`` and ``b`` are the same file: both exist and are one file (links, hard
    links included), or one does not exist and both resolve to the same path."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        pass
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def write_model(save, what: str, path, model, /, **meta) -> None:
    """``save`` (:func:`~attnquery.realheads.save_head` or ``save_layer``, atomic) of the
    ``what`` ("head" or "layer"), with a failed write as an :class:`OutputError`; ``path`` is
    checked again first (it may have become a device or a FIFO while the queries ran). The
    folders above ``path`` that do not exist are created here, and removed again (only those,
    and only if empty) when the write fails."""
    kind = special_file_kind(path)
    if kind is not None:
        raise OutputError(f"--out {path}: it became {kind} while the queries ran; nothing was "
                          "written there")
    created = _missing_folders(path)
    try:
        save(path, model, **meta)
    except OSError as exc:
        _remove_empty(created)
        raise OutputError(
            f"--out {path}: writing the {what} failed ({os_reason(exc)}); nothing was written "
            "there (a file already there is unchanged)") from None
    except BaseException:
        _remove_empty(created)
        raise


def _missing_folders(path) -> list[Path]:
    """The folders above ``path`` that do not exist, deepest first."""
    missing = []
    for folder in Path(path).parents:
        if folder.exists() or folder.is_symlink():
            break
        missing.append(folder)
    return missing


def _remove_empty(folders) -> None:
    """Remove each of ``folders`` (deepest first) that exists and is empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except FileNotFoundError:
            continue  # never created: the write failed above it
        except OSError:
            return  # not empty: the folders above it are not empty either


def model_usage(what: str):
    """A context turning a :class:`~attnquery.errors.ModelError` (an input file or checkpoint
    that is not what it should be) into a ConfigError prefixed by ``what`` (unless the message
    already names it)."""
    return _ModelUsage(what)


class _ModelUsage:
    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        from ..errors import ModelError

        if exc_type is not None and issubclass(exc_type, ModelError):
            text = str(exc)
            raise ConfigError(text if self.what in text else f"{self.what}: {text}") from None
        return False
