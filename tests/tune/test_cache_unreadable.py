"""A cache file that exists but cannot be read (EACCES, EIO): writers refuse to replace it, so its
records survive; readers skip it with a warning."""

from __future__ import annotations

import builtins
import errno
import io
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

from tessera_rw.tune.cache import TuneCache, TuneCacheError, TuneCacheWarning
from tessera_rw.tune.records import TuneDocument, TuneRecord

ERRORS = [errno.EACCES, errno.EIO]


def rec(m: int, time_us: float = 10.0) -> TuneRecord:
    return TuneRecord.create(op_name="matmul", signature_hash="9f2c", shapes=((m, 64), (64, 256)),
                             dtypes=("bf16", "bf16"), arch="H100-SXM", config={"bm": 64}, time_us=time_us,
                             chosen_by="on_device")


@pytest.fixture
def filled(tmp_path) -> tuple[TuneCache, Path, bytes]:
    """A cache of 20 records, its file and the file's bytes."""
    cache = TuneCache(root=tmp_path)
    for m in range(1, 21):
        cache.put(rec(m))
    path = cache.path("H100-SXM")
    return cache, path, path.read_bytes()


@contextmanager
def unreadable(path: Path, code: int):
    """Within: opening `path` fails with `code`, as for another user's 0600 file or a failing disk.
    Both open()s are patched (pathlib opens through io.open); chmod cannot show it to root."""
    real = builtins.open

    def guarded(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file) == path:
            raise OSError(code, os.strerror(code), str(file))
        return real(file, *args, **kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(builtins, "open", guarded)
        patch.setattr(io, "open", guarded)
        yield


@pytest.mark.parametrize("code", ERRORS)
def test_a_put_refuses_to_replace_a_file_it_cannot_read(filled, code):
    cache, path, before = filled
    with unreadable(path, code), pytest.raises(TuneCacheError) as err:
        cache.put(rec(999))
    message = str(err.value)
    assert str(path) in message and os.strerror(code) in message and "left as it is" in message
    assert "hint: make the file readable" in message
    assert path.read_bytes() == before and len(cache.records()) == 20


@pytest.mark.parametrize("code", ERRORS)
def test_an_import_refuses_to_replace_a_file_it_cannot_read(filled, tmp_path, code):
    cache, path, before = filled
    export = tmp_path / "export.json"
    export.write_text(TuneDocument.of([rec(999)]).to_json())
    with unreadable(path, code), pytest.raises(TuneCacheError, match="left as it is"):
        cache.import_(export)
    assert path.read_bytes() == before


def test_clear_refuses_to_delete_a_file_it_cannot_read(filled):
    cache, path, before = filled
    with unreadable(path, errno.EACCES), pytest.raises(TuneCacheError, match="left as it is"):
        cache.clear()
    assert path.read_bytes() == before


@pytest.mark.parametrize("code", ERRORS)
def test_a_reader_skips_a_file_it_cannot_read(filled, code):
    cache, path, before = filled
    fresh = TuneCache(root=cache.root)
    with unreadable(path, code), pytest.warns(TuneCacheWarning, match=f"{path} cannot be read .*ignored"):
        assert fresh.get("matmul", "9f2c", ((1, 64), (64, 256)), ("bf16", "bf16"), "H100-SXM") is None
    assert path.read_bytes() == before and len(fresh.records()) == 20


def test_an_unreadable_file_is_warned_about_once(filled):
    cache, path, _ = filled
    fresh = TuneCache(root=cache.root)
    with unreadable(path, errno.EIO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):       # a tuning run looks a file up once per kernel
            fresh.get("matmul", "9f2c", ((1, 64), (64, 256)), ("bf16", "bf16"), "H100-SXM")
    assert [str(w.message).count("cannot be read") for w in caught] == [1]


def test_a_put_refuses_a_file_chmod_made_unreadable(filled):
    cache, path, before = filled
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("this user reads a mode-0 file (root): the patched-open tests cover it")
        with pytest.raises(TuneCacheError, match="Permission denied"):
            cache.put(rec(999))
    finally:
        path.chmod(0o644)
    assert path.read_bytes() == before


def test_a_missing_file_is_still_just_empty(tmp_path):
    cache = TuneCache(root=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.records() == [] and cache.put(rec(1)) and len(cache.records()) == 1
