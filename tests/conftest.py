"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (derandomize), so the suite is reproducible
# like the study; `HYPOTHESIS_PROFILE=explore` draws fresh ones.
settings.register_profile("default", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parents[1]

# Single-threaded BLAS in tests: deterministic and fair to parallel test workers.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def layer_ckpt(tmp_path_factory) -> Path:
    """A one-layer safetensors checkpoint of 4 heads, d = 32 (seed 7), written once for the
    layer and served-learner tests."""
    from attnquery.realheads import write_test_checkpoint

    return write_test_checkpoint(tmp_path_factory.mktemp("layer_ckpt") / "model.safetensors",
                                 n_layers=1, n_heads=4, d=32, seed=7)
