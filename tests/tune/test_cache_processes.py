"""The autotune cache across processes: concurrent writers lose nothing; a writer killed mid-write
leaves the previous file whole."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.records import TuneDocument, TuneRecord

WRITERS, PER_WRITER = 4, 25
SPAWN = multiprocessing.get_context("spawn")   # a fresh interpreter, as separate tuning runs would be


def rec(m: int, time_us: float = 10.0) -> TuneRecord:
    return TuneRecord.create(op_name="matmul", signature_hash="9f2c", shapes=((m, 64), (64, 256)),
                             dtypes=("bf16", "bf16"), arch="H100-SXM", config={"bm": 64, "stages": 3},
                             time_us=time_us, chosen_by="on_device")


def put_many(root: str, writer: int, start) -> None:
    start.wait(60)               # all writers begin together, so their writes interleave
    cache = TuneCache(root=root)
    for i in range(PER_WRITER):
        cache.put(rec(1 + writer * PER_WRITER + i))


def put_and_hang(root: str, step: str, ready: str) -> None:
    """Put one record, but stop for good at `step` of the write ('fsync': the temp file is written but
    not yet on disk; 'replace': it is complete but not yet in place) and wait to be killed there."""
    real = getattr(os, step)

    def hang(*args):
        Path(ready).write_text("at " + step)
        time.sleep(600)
        return real(*args)
    setattr(os, step, hang)
    TuneCache(root=root).put(rec(999, time_us=1.0))


def wait_for(path: Path, process, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.is_alive(), f"the writer exited with {process.exitcode} before reaching its write"
        assert time.monotonic() < deadline, "the writer never reached its write"
        time.sleep(0.02)


def test_concurrent_writers_lose_nothing(tmp_path):
    start = SPAWN.Barrier(WRITERS)
    writers = [SPAWN.Process(target=put_many, args=(str(tmp_path), w, start)) for w in range(WRITERS)]
    for p in writers:
        p.start()
    try:
        for p in writers:
            p.join(120)
    finally:
        for p in writers:
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in writers] == [0] * WRITERS
    cache = TuneCache(root=tmp_path)
    records = cache.records()
    assert len(records) == WRITERS * PER_WRITER
    assert sorted(r.shapes[0][0] for r in records) == list(range(1, WRITERS * PER_WRITER + 1))
    path = cache.path("H100-SXM")
    assert len(TuneDocument.model_validate_json(path.read_bytes()).records) == WRITERS * PER_WRITER
    assert sorted(p.name for p in path.parent.iterdir()) == ["H100-SXM.json", "H100-SXM.json.lock"]


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_a_writer_killed_mid_write_leaves_the_file_whole(tmp_path, step):
    cache = TuneCache(root=tmp_path)
    cache.put(rec(1))
    cache.put(rec(2))
    path = cache.path("H100-SXM")
    before = path.read_bytes()
    ready = tmp_path / "ready"
    writer = SPAWN.Process(target=put_and_hang, args=(str(tmp_path), step, str(ready)))
    writer.start()
    try:
        wait_for(ready, writer)
        temps = list(path.parent.glob(".H100-SXM.json.*.tmp"))
        assert len(temps) == 1                                  # the new document is half-way there
        assert cache.get("matmul", "9f2c", ((1, 64), (64, 256)), ("bf16", "bf16"), "H100-SXM") is not None
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(30)
    assert writer.exitcode == -signal.SIGKILL
    assert path.read_bytes() == before
    assert [r.shapes[0][0] for r in TuneDocument.model_validate_json(before).records] == [1, 2]
    assert [r.shapes[0][0] for r in cache.records()] == [1, 2]
    # The dead writer's lock went with it, and its temp file is swept by the next write.
    assert cache.put(rec(3))
    assert [r.shapes[0][0] for r in cache.records()] == [1, 2, 3]
    assert not list(path.parent.glob("*.tmp"))
