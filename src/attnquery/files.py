"""What a path is, before it is opened or replaced.

Reading a FIFO blocks until something writes to it, and an atomic rename over a device, a FIFO
or a socket replaces it by a regular file; the readers and writers of the package's files ask
:func:`special_file_kind` first and refuse such a path.
"""

from __future__ import annotations

import os
import stat

__all__ = ["special_file_kind"]

#: what a file that is neither a regular file nor a folder is, by its stat type
_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO, a named pipe"), (stat.S_ISSOCK, "a socket"))


def special_file_kind(path) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a folder (a link is
    followed), in words ("a FIFO, a named pipe", "a character device", ...); None when it is a
    regular file, a folder, or absent (a dangling link included)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")
