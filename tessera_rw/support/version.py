"""tessera_rw's version, as installed (pyproject.toml's): what plugins declare support for and
what tuning records and compiled binaries are keyed by.

>>> package_version() == metadata.version("tessera-rw")
True
"""

from __future__ import annotations

from importlib import metadata


def package_version() -> str:
    """The installed version, or 'unknown' when run from a bare checkout."""
    try:
        return metadata.version("tessera-rw")
    except metadata.PackageNotFoundError:
        return "unknown"
