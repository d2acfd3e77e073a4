"""Emulated kernels built ahead of the tests that run them.

A module whose tests run kernels in the CPU emulator may define `kernels_checked(item)`, the
KernelSources a selected test of it runs, and use the `module_kernels_built` fixture: before its
first test, every kernel its selected tests run is compiled in programs of many kernels
(emulator.MAX_BATCH), since a program's fixed cost (the prelude, the link) is most of a small one's:
16 kernels build in one program in about the time 3 take in programs of their own. Under
pytest-xdist the first worker to take the lock builds them; the others find them in the emulator's
on-disk index.
"""

from __future__ import annotations

import pytest
from filelock import FileLock

from tessera_rw.algebra.cache_dir import cache_root
from tessera_rw.codegen import emulator


@pytest.fixture(scope="module")
def module_kernels_built(request):
    module = request.module
    if not emulator.available():
        return
    mine = [item for item in request.session.items if getattr(item, "module", None) is module]
    sources = [source for item in mine for source in module.kernels_checked(item)]
    with FileLock(str(cache_root() / f"{module.__name__}.lock")):
        emulator.build_all(sources)
