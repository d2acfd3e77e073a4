"""An import reads a regular file of at most MAX_IMPORT_BYTES, whatever its size claims: a link to a
device or a pipe is refused without reading, a /proc file that says 0 bytes is cut at the limit."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tessera_rw.tune import cache as cache_module
from tessera_rw.tune.cache import TuneCache, TuneCacheError
from tessera_rw.tune.records import TuneDocument, TuneRecord


def import_error(cache: TuneCache, source: Path, seconds: float = 30.0) -> str:
    """The message of the TuneCacheError importing `source` raises, from a thread, so a reader that
    blocks (a pipe with no writer) fails the test instead of hanging it."""
    said: list[str] = []

    def run() -> None:
        try:
            cache.import_(source)
        except TuneCacheError as e:
            said.append(str(e))
        else:
            said.append("imported")
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"importing {source} did not return"
    return said[0]


def test_a_link_to_a_device_is_refused(tmp_path):
    # /dev/null, not /dev/zero: a reader without the check would fill memory from /dev/zero; the
    # check is the same for every device (fstat of the opened file)
    link = tmp_path / "export.json"
    link.symlink_to("/dev/null")
    said = import_error(TuneCache(root=tmp_path / "cache"), link)
    assert str(link) in said and "not a regular file" in said and "nothing was imported" in said


def test_a_pipe_is_refused_without_waiting_for_a_writer(tmp_path):
    pipe = tmp_path / "export.json"
    os.mkfifo(pipe)
    assert "not a regular file" in import_error(TuneCache(root=tmp_path / "cache"), pipe)


def test_a_file_longer_than_its_size_says_is_cut_at_the_limit(tmp_path, monkeypatch):
    status = Path("/proc/self/status")         # stat says 0 bytes; reading gives ~1 KiB
    if not status.exists() or status.stat().st_size != 0:
        pytest.skip("no /proc file that understates its size here")
    monkeypatch.setattr(cache_module, "MAX_IMPORT_BYTES", 100)
    link = tmp_path / "export.json"
    link.symlink_to(status)
    said = import_error(TuneCache(root=tmp_path / "cache"), link)
    assert str(link) in said and "more than an autotune export can be; nothing was imported" in said


def test_a_link_to_a_regular_export_is_followed(tmp_path):
    record = TuneRecord.create(op_name="matmul", signature_hash="s", shapes=((8, 8), (8, 8)), dtypes=("f32", "f32"),
                               arch="H100-SXM", config={"bm": 64}, time_us=1.0, chosen_by="on_device")
    export = tmp_path / "real.json"
    export.write_text(TuneDocument.of([record]).to_json())
    link = tmp_path / "export.json"
    link.symlink_to(export)
    cache = TuneCache(root=tmp_path / "cache")
    assert cache.import_(link) == 1 and cache.records() == [record]
