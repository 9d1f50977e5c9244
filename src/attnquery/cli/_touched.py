"""What importing a user's black box touches: the files of the modules it imported and the
files it opened, so that ``extract --out`` never replaces one of them."""

from __future__ import annotations

import os
import sys

__all__ = ["ImportTrace"]

#: the paths opened while an :class:`ImportTrace` is active (None when none is): an audit hook
#: cannot be removed, so one hook, added once per process, records only while this is a list
_OPENED: list[str] | None = None
_HOOKED = False


def _audit(event: str, args) -> None:
    """The audit hook: record the path of each ``open`` event while a trace is active (never
    raises, since it runs inside every open of the process)."""
    opened = _OPENED
    if opened is None or event != "open" or not args:
        return
    path = args[0]
    if isinstance(path, str | bytes | os.PathLike):
        try:
            opened.append(os.path.abspath(os.fsdecode(path)))
        except Exception:  # noqa: BLE001, S110 - a path that cannot be decoded is not a file
            pass


class ImportTrace:
    """A context recording what the code run inside it imports and opens.

    On exit, :attr:`files` holds the ``__file__`` and ``__cached__`` of every module imported
    inside it, and every path opened inside it (``open``, ``os.open``, ``io.open_code``, and
    what calls them, such as ``numpy.load``), as absolute paths in the order they came. A module
    imported before the trace began is not listed (it was not run again), nor is a file its
    code opens later, when it is called.
    """

    def __init__(self):
        self.files: list[str] = []

    def __enter__(self):
        global _OPENED, _HOOKED
        if not _HOOKED:
            sys.addaudithook(_audit)
            _HOOKED = True
        self._before = set(sys.modules)
        self._opened = []
        _OPENED = self._opened
        return self

    def __exit__(self, exc_type, exc, tb):
        global _OPENED
        _OPENED = None
        files = []
        for name in set(sys.modules) - self._before:
            module = sys.modules.get(name)
            for attr in ("__file__", "__cached__"):
                where = getattr(module, attr, None)
                if isinstance(where, str):
                    files.append(os.path.abspath(where))
        self.files = list(dict.fromkeys(sorted(files) + self._opened))
        return False
