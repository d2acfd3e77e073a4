"""Files replaced whole and safely: a temp file in the same folder, fsynced, renamed over the old
one (a reader sees the old file or the new, never half of one); temps a killed writer left behind;
bad files set aside under a timestamped name for inspection."""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> os.stat_result:
    """Temp file in the same folder (so `os.replace` is a rename), fsync, replace, fsync the folder.
    The written file's stat (a rename keeps its inode, size and mtime)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)   # mkstemp's 0600 would hide a shared cache from other users
        written = os.stat(temp)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    return written


def fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:   # a folder that cannot be opened cannot be fsynced either; the rename stands
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temps(path: Path) -> None:
    """Temp files a killed writer left behind. Only called under the file's lock, so no live
    writer of this file can own one."""
    for temp in path.parent.glob(f".{path.name}.*.tmp"):
        temp.unlink(missing_ok=True)


def set_aside(path: Path) -> Path:
    """Rename a bad file to `<file>.corrupt-<UTC timestamp>` so it can be inspected, not reused."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.corrupt-{stamp}-{n}"), n + 1
    os.replace(path, aside)
    return aside
