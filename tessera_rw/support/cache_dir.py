"""Where tessera_rw keeps what it caches: compiled binaries, emulator programs, tuning records and
the verdicts on plugin rules, each in a folder of `cache_root()`.

>>> cache_root() == Path(os.environ.get("TESSERA_CACHE_DIR", Path.home() / ".tessera")).expanduser()
True
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_VARIABLE = "TESSERA_CACHE_DIR"


def cache_root() -> Path:
    """$TESSERA_CACHE_DIR, else ~/.tessera."""
    override = os.environ.get(CACHE_DIR_VARIABLE)
    return Path(override).expanduser() if override else Path.home() / ".tessera"
