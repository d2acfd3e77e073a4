"""Lookups in an unchanged cache file cost no parse (the parsed file is remembered under its path,
mtime, size and inode); a changed file is read again. A writer validates a changed file before it
takes the lock, trusts under the lock only a file still unchanged since, and remembers what it wrote."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.records import TuneDocument, TuneRecord

F32 = ("f32", "f32")


def rec(m: int, bm: int = 64, time_us: float = 10.0) -> TuneRecord:
    return TuneRecord.create(op_name="matmul", signature_hash="9f2c", shapes=((m, 8), (8, 8)), dtypes=F32,
                             arch="H100-SXM", config={"bm": bm}, time_us=time_us, chosen_by="cost_model")


@pytest.fixture
def parses(monkeypatch) -> list[int]:
    """One entry per parse of a cache document."""
    calls: list[int] = []
    real = TuneDocument.model_validate_json

    def counting(data, *args, **kwargs):
        calls.append(len(data))
        return real(data, *args, **kwargs)
    monkeypatch.setattr(TuneDocument, "model_validate_json", counting)
    return calls


def write_behind(path: Path, records, mtime_ns: int | None = None) -> None:
    """Replace the file as another process would (a new inode), optionally with a given mtime."""
    temp = path.with_name("other-writer.tmp")
    temp.write_text(TuneDocument.of(records).to_json())
    if mtime_ns is not None:
        os.utime(temp, ns=(mtime_ns, mtime_ns))
    os.replace(temp, path)


def get(cache: TuneCache, m: int) -> TuneRecord | None:
    return cache.get("matmul", "9f2c", ((m, 8), (8, 8)), F32, "H100-SXM")


@pytest.fixture
def path(tmp_path) -> Path:
    path = TuneCache(root=tmp_path).path("H100-SXM")
    path.parent.mkdir(parents=True)
    write_behind(path, [rec(m) for m in range(1, 51)])
    return path


def test_lookups_in_an_unchanged_file_parse_it_once(tmp_path, path, parses):
    cache = TuneCache(root=tmp_path)
    assert get(cache, 7).config == {"bm": 64} and len(parses) == 1
    for _ in range(3):
        assert get(cache, 7) is not None and get(cache, 999) is None
        assert cache.nearest("matmul", ((6, 8), (8, 8)), F32, "H100-SXM").shapes[0] == (6, 8)
        assert len(cache.records()) == 50
    assert get(TuneCache(root=tmp_path), 7) is not None      # another instance in the same process too
    assert len(parses) == 1


def test_a_replaced_file_is_read_again_even_at_the_same_size_and_mtime(tmp_path, path, parses):
    cache = TuneCache(root=tmp_path)
    assert get(cache, 7).config == {"bm": 64}
    st = path.stat()
    write_behind(path, [rec(m, bm=32 if m == 7 else 64) for m in range(1, 51)], mtime_ns=st.st_mtime_ns)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert get(cache, 7).config == {"bm": 32} and len(parses) == 2


def test_a_file_edited_in_place_is_read_again(tmp_path, path, parses):
    cache = TuneCache(root=tmp_path)
    assert get(cache, 60) is None
    path.write_text(TuneDocument.of([rec(m) for m in range(1, 61)]).to_json())      # same inode, more bytes
    assert get(cache, 60) is not None and len(parses) == 2


def test_a_put_into_an_unchanged_file_parses_nothing_and_remembers_what_it_wrote(tmp_path, path, parses):
    cache = TuneCache(root=tmp_path)
    assert get(cache, 7) is not None and len(parses) == 1
    assert cache.put(rec(7, bm=16, time_us=1.0)) and cache.put(rec(60)) and len(parses) == 1
    assert get(cache, 7).config == {"bm": 16} and len(cache.records()) == 51
    assert len(parses) == 1


@pytest.fixture
def parses_under_lock(monkeypatch, parses) -> list[int]:
    """How many parses had happened each time the file lock was released."""
    seen: list[int] = []
    real = TuneCache._locked

    @contextmanager
    def watched(self, path):
        with real(self, path):
            before = len(parses)
            yield
            seen.append(len(parses) - before)
    monkeypatch.setattr(TuneCache, "_locked", watched)
    return seen


def test_a_put_validates_a_file_another_writer_replaced_before_it_takes_the_lock(tmp_path, path, parses,
                                                                                 parses_under_lock):
    cache = TuneCache(root=tmp_path)
    assert cache.put(rec(7, bm=16, time_us=1.0)) and len(parses) == 1
    st = path.stat()
    # another process adds a record, at the same mtime: the new inode alone tells the files apart
    write_behind(path, [rec(m, bm=16 if m == 7 else 64, time_us=1.0 if m == 7 else 10.0) for m in range(1, 52)],
                 mtime_ns=st.st_mtime_ns)
    assert cache.put(rec(60)) and len(parses) == 2 and parses_under_lock == [0, 0]
    assert get(cache, 51) is not None and get(cache, 60) is not None and len(cache.records()) == 52


def test_a_put_under_the_lock_reads_a_file_replaced_after_it_was_validated(tmp_path, path, parses,
                                                                            monkeypatch):
    cache = TuneCache(root=tmp_path)
    real = TuneCache._locked

    @contextmanager
    def raced(self, path_):       # another writer gets in between the validation and the lock
        write_behind(path, [rec(m) for m in range(1, 53)])
        with real(self, path_):
            yield
    monkeypatch.setattr(TuneCache, "_locked", raced)
    assert cache.put(rec(60)) and len(parses) == 2          # before the lock, then the new file under it
    assert get(cache, 52) is not None and len(cache.records()) == 53
