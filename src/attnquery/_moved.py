"""Old import paths of modules that moved into the folder of their family.

Each key of :data:`MOVED` is a public module path that users import (``attnquery.vector_models``,
``attnquery.learners.vector_served``, ...); its value is where the module lives now. Importing
an old path gives the new module itself, the same object (``attnquery.vector_models is
attnquery.models.vector``), so every name of it, private ones included, is reached and patched
through either path, and no code is copied.

How: :class:`OldPaths`, a finder on :data:`sys.meta_path` (installed when ``attnquery`` is
imported, after the ordinary finders, which find no file at an old path), answers an old path
with the new module, imported on demand: an old path costs nothing until it is imported, and
the tree holds no stand-in files. ``python -m <old path>`` runs the new module (its ``main``).
This is the one place the old paths are listed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["MOVED", "OldPaths", "install"]

#: ``{old module path: new module path}``
MOVED = {
    "attnquery.vector_models": "attnquery.models.vector",
    "attnquery.rotary_checkpoints": "attnquery.realheads.rotary",
    "attnquery.learners.vector_served": "attnquery.learners.vector.served",
    "attnquery.learners.vector_rotary": "attnquery.learners.vector.rotary",
    "attnquery.learners.vector_rotary_layer": "attnquery.learners.vector.rotary_layer",
    "attnquery.learners.rotary_layer": "attnquery.learners.multihead_generic.rotary_layer",
    # the study's machinery, apart from the library (attnquery.study)
    "attnquery.pipeline": "attnquery.study.pipeline",
    "attnquery.validate": "attnquery.study.validate",
    "attnquery.findings": "attnquery.study.findings",
    "attnquery.appendix": "attnquery.study.appendix",
    "attnquery.reproducible": "attnquery.study.reproducible",
    "attnquery.tables": "attnquery.study.tables",
    "attnquery.provenance": "attnquery.study.provenance",
    "attnquery.bench": "attnquery.study.bench",
    "attnquery.config": "attnquery.study.config",
}


class OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finder and loader of the old paths of :data:`MOVED`: the module an old path names is
    the new one (imported by :func:`importlib.import_module`), registered in ``sys.modules``
    under the old path too."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import sets __spec__; exec_module puts it back
        return module

    def exec_module(self, module):
        # the module was executed when it was imported under its new path: only its own spec
        # (which the import machinery replaced with the old path's) is restored
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname):
        """What ``python -m <old path>`` runs: the new module, as the main module."""
        return compile(f"import runpy\nrunpy.run_module({MOVED[fullname]!r}, "
                       "run_name='__main__', alter_sys=True)\n", f"<{fullname}>", "exec")


def install() -> None:
    """Put :class:`OldPaths` on :data:`sys.meta_path` (once)."""
    if not any(isinstance(f, OldPaths) for f in sys.meta_path):
        sys.meta_path.append(OldPaths())
