"""A user's black box, found and imported: ``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION``.

:func:`load_black_box` imports it and returns the callable (what ``attnquery extract --oracle``
runs); :func:`black_box_files` names the files that import would run, without running them
(what ``--out`` is checked against). Both are also :mod:`attnquery.extraction`'s.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from .errors import ConfigError

__all__ = ["load_black_box", "black_box_files"]


def load_black_box(spec: str):
    """Import ``MODULE:FUNCTION`` (or ``path/to/file.py:FUNCTION``) and return the callable.

    A module is searched in the installed packages first and then in the current directory
    (appended to the end of ``sys.path``), so ``tests.fixtures:some_head`` works from the
    repository root while a file of the user's can never shadow a module the tool imports
    (a ``./tqdm.py`` stays the user's). A module named like an installed one is given by
    path. A path is loaded under a private module name, its folder appended to ``sys.path``
    for its own imports.
    """
    if ":" not in spec:
        raise ConfigError("--oracle must be MODULE:FUNCTION (e.g. "
                          f"examples.black_boxes:some_head); got {spec!r}")
    mod_name, _, attr = spec.rpartition(":")
    if not mod_name or not attr:
        raise ConfigError(f"--oracle must be MODULE:FUNCTION; got {spec!r}")
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        if path.is_dir():
            raise ConfigError(f"--oracle: {path} is a folder, not a Python file")
        if not path.exists():
            raise ConfigError(f"--oracle: file {path} does not exist")
        if not path.is_file():
            raise ConfigError(f"--oracle: {path} is not a regular file")
        _append_path(str(path.resolve().parent))
        mspec = importlib.util.spec_from_file_location(f"_attnquery_box_{path.stem}", path)
        module = importlib.util.module_from_spec(mspec)
        with _guard_import(str(path)):
            mspec.loader.exec_module(module)
    else:
        _append_path(os.getcwd())
        try:
            with _guard_import(repr(mod_name)):
                module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise ConfigError(f"--oracle: cannot import module {mod_name!r}: {exc}") from None
    try:
        fn = getattr(module, attr)
    except AttributeError:
        where = getattr(module, "__file__", None)
        hint = "" if mod_name.endswith(".py") else (
            f"; a module of yours named like an installed one is given by path "
            f"(--oracle ./{mod_name.replace('.', '/')}.py:{attr})")
        raise ConfigError(f"--oracle: module {mod_name!r} ({where}) has no attribute "
                          f"{attr!r}{hint}") from None
    if not callable(fn):
        raise ConfigError(f"--oracle: {spec} is not callable (it is a {type(fn).__name__})")
    return fn


def black_box_files(spec: str) -> list[Path]:
    """The files :func:`load_black_box` would run for ``spec``, found without importing or
    running anything.

    Parameters
    ----------
    spec : str
        ``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION``, as for :func:`load_black_box`.

    Returns
    -------
    list of Path
        For a path, that path. For a module, the file of each module that importing it runs, in
        the order it runs them, searched as :func:`load_black_box` searches (the current
        directory appended to ``sys.path``): ``pkg.box`` gives ``pkg/__init__.py`` and
        ``pkg/box.py``; a module already imported gives the file it was imported from. A module
        that is not found, or has no file (built in, a namespace package), ends the list there
        (:func:`load_black_box` names a module that cannot be imported).

    Notes
    -----
    A package is searched along the folders its spec gives; a package whose ``__init__.py``
    changes its own ``__path__`` when it runs may import its submodules from elsewhere.
    """
    mod_name = spec.rpartition(":")[0]
    if mod_name.endswith(".py"):
        return [Path(mod_name)]
    if not mod_name:
        return []
    _append_path(os.getcwd())
    files, search = [], None
    parts = mod_name.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[:i + 1])
        module = sys.modules.get(name)
        found = getattr(module, "__spec__", None) if module is not None else _find_spec(name,
                                                                                       search)
        if found is None:
            break
        if found.has_location and found.origin:
            files.append(Path(found.origin))
        search = getattr(module, "__path__", None) if module is not None \
            else found.submodule_search_locations
        if search is None:
            break
    return files


def _find_spec(name: str, search):
    """The spec the import system's finders give ``name`` (``search``: its package's folders;
    None for a top-level module), without importing it or its package."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            found = find(name, search)
        except (ImportError, ValueError):
            return None
        if found is not None:
            return found
    return None


def _append_path(folder: str) -> None:
    """Put ``folder`` last on ``sys.path`` (installed packages keep precedence)."""
    if folder not in sys.path:
        sys.path.append(folder)


class _guard_import:
    """Turn whatever importing the user's module raises (SystemExit and other BaseExceptions
    included) into a ConfigError naming it; ImportError passes through, to be named by the
    caller, and KeyboardInterrupt too (an interruption)."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None or issubclass(exc_type, ImportError | KeyboardInterrupt):
            return False
        raise ConfigError(f"--oracle: importing {self.what} failed: {exc_type.__name__}: "
                          f"{exc}") from None
