"""Shared test set-up: `gpu`-marked tests run only where an NVIDIA GPU answers."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def gpu_available() -> bool:
    try:
        from cuda.core import Device  # type: ignore[import-not-found]
        Device(0)
        return True
    except Exception:  # no driver, no device: the tests that need one are skipped
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found by cuda.core)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
