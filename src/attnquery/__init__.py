"""attnquery: learning attention heads from queries.

The first implementation, and an empirical study, of "Provably Learning Attention with Queries"
(Bhattamishra, Shah, Hahn, Kanade; ICML 2026, arXiv 2601.16873).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attnquery")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

from ._moved import install as _install_old_paths

# modules moved into the folder of their family keep their old import paths (attnquery._moved)
_install_old_paths()

__all__ = ["__version__"]
