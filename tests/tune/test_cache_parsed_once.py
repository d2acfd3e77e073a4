"""Lookups in an unchanged cache file cost no parse (the parsed file is remembered under its path,
mtime, size and inode); a changed file is read again; writers always re-read under the lock."""

from __future__ import annotations

import os
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


def test_a_put_re_reads_under_the_lock_and_remembers_what_it_wrote(tmp_path, path, parses):
    cache = TuneCache(root=tmp_path)
    assert get(cache, 7) is not None and len(parses) == 1
    assert cache.put(rec(7, bm=16, time_us=1.0)) and len(parses) == 2      # the writer trusts no memory
    assert get(cache, 7).config == {"bm": 16} and len(cache.records()) == 50
    assert len(parses) == 2                                                # and the reader no parse
