"""attnquery: learning attention heads from queries.

The first implementation, and an empirical study, of "Provably Learning Attention with Queries"
(Bhattamishra, Shah, Hahn, Kanade; ICML 2026, arXiv 2601.16873).
"""

from ._moved import install as _install_old_paths
from ._version import __version__

# modules moved into the folder of their family keep their old import paths (attnquery._moved)
_install_old_paths()

__all__ = ["__version__"]
