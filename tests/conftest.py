"""Shared test set-up: `gpu`-marked tests run only where an NVIDIA GPU answers."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import settings
from threadpoolctl import threadpool_limits

from tessera_rw.codegen.device import gpu_available

# In CI every run draws the same examples, so a red build is reproducible; locally they vary.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_configure(config):
    # Compiled kernels are cached in the temp folder across test runs, never in the user's ~/.tessera.
    os.environ.setdefault("TESSERA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "tessera-test-cache"))
    # Output is checked as it reads piped, at the report's own width: pytest-xdist's workers set
    # COLUMNS=80, which a piped console would take as the width asked for.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    # Each xdist worker already has a core: BLAS threads on top of it only spin against each other.
    config._blas_threads = threadpool_limits(limits=1, user_api="blas")


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found by cuda.core)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
