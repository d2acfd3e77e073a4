"""Shared test set-up: `gpu`-marked tests run only where an NVIDIA GPU answers."""

from __future__ import annotations

import os
import tempfile

import pytest
from filelock import FileLock
from hypothesis import settings
from threadpoolctl import threadpool_limits

from tessera_rw.codegen import emulator
from tessera_rw.codegen.device import gpu_available
from tessera_rw.support.cache_dir import cache_root

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


@pytest.fixture(scope="module")
def module_kernels_built(request):
    """Emulated kernels built ahead of the tests that run them. A module whose tests run kernels in
    the CPU emulator defines `kernels_checked(item)`, the KernelSources a selected test of it runs,
    and uses this fixture: before its first test, every kernel its selected tests run is compiled
    in programs of many kernels (emulator.MAX_BATCH), a program's fixed cost (the prelude, the
    link) being most of a small one's. Under pytest-xdist the first worker to take the lock builds
    them; the others find them in the emulator's on-disk index."""
    module = request.module
    if not emulator.available():
        return
    mine = [item for item in request.session.items if getattr(item, "module", None) is module]
    sources = [source for item in mine for source in module.kernels_checked(item)]
    with FileLock(str(cache_root() / f"{module.__name__}.lock")):
        emulator.build_all(sources)
