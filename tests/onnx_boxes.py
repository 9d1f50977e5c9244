"""Attention modules served by a real engine (onnxruntime), as black boxes for the tests.

The builder lives in :mod:`attnquery.engines`; these names stay importable from here for the
tests that import them.
"""

from __future__ import annotations

from attnquery.engines import ELEM, OnnxBox, attention_module_graph, module_box

__all__ = ["attention_module_graph", "OnnxBox", "module_box", "ELEM"]
