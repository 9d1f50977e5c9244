"""``python -m attnquery.cli``: the ``attnquery`` command."""

import sys

from .app import main

sys.exit(main())
