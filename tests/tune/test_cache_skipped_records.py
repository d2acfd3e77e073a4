"""A cache file is trusted record by record: a record this version cannot use (one a newer version
wrote, a bad field, another arch) is skipped with one warning and written back unchanged, and the
file's other records stay in use. Only a file that is not JSON or not a cache document at its top
level is set aside (tests/tune/test_cache.py)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from tessera_rw.tune.cache import TuneCache, TuneCacheWarning
from tessera_rw.tune.records import SCHEMA, TuneRecord

F32 = ("f32", "f32")


def rec(m: int, arch: str = "H100-SXM", time_us: float = 10.0) -> TuneRecord:
    return TuneRecord.create(op_name="matmul", signature_hash="s", shapes=((m, 8), (8, 8)), dtypes=F32, arch=arch,
                             config={"bm": 64}, time_us=time_us, chosen_by="on_device")


def _unusable():
    good = rec(500).model_dump(mode="json")
    return {
        "newer dtype": ({**good, "dtypes": ["float4_e2m1", "float4_e2m1"]}, "records.3.dtypes: .*float4_e2m1"),
        "bad field": ({**good, "trials": "many"}, "records.3.trials"),
        "extra field": ({**good, "pickle": "cos\nsystem\n"}, "records.3.pickle"),
        "not an object": (42, "records.3: "),
        "other arch": (rec(500, arch="A100").model_dump(mode="json"), "records.3 is for arch A100-SXM, not H100-SXM"),
    }


def write(path: Path, records: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": SCHEMA, "records": records}))


def records_in(path: Path) -> list:
    return json.loads(path.read_text())["records"]


@pytest.mark.parametrize("kind", list(_unusable()))
def test_an_unusable_record_is_skipped_and_kept(tmp_path, kind):
    odd, says = _unusable()[kind]
    cache = TuneCache(root=tmp_path)
    path = cache.path("H100-SXM")
    write(path, [rec(m).model_dump(mode="json") for m in (1, 2, 3)] + [odd])
    with pytest.warns(TuneCacheWarning, match=f"{path}: 1 record skipped \\({says}") as caught:
        assert [r.shapes[0][0] for r in cache.records()] == [1, 2, 3]
    assert len(caught) == 1 and "keeps them in the file as they are" in str(caught[0].message)
    assert path.exists() and not list(path.parent.glob("*.corrupt-*"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # one warning for these records, even after a rewrite
        assert cache.put(rec(4)) and cache.put(rec(1, time_us=1.0))
        assert cache.get("matmul", "s", ((1, 8), (8, 8)), F32, "H100-SXM").time_us == 1.0
        assert len(TuneCache(root=tmp_path).records()) == 4
    assert records_in(path)[-1] == odd and len(records_in(path)) == 5


def test_the_warning_counts_every_skipped_record(tmp_path):
    cache = TuneCache(root=tmp_path)
    path = cache.path("H100-SXM")
    newer = {**rec(9).model_dump(mode="json"), "dtypes": ["float4_e2m1", "float4_e2m1"]}
    write(path, [newer, rec(1).model_dump(mode="json"), {"op_name": "x"}, newer])
    with pytest.warns(TuneCacheWarning, match=r"3 records skipped \(records\.0\.dtypes: .*; and 2 more\)"):
        assert len(cache.records()) == 1
    assert cache.clear() == 4 and not path.exists()


def test_a_file_of_only_unusable_records_is_kept(tmp_path):
    cache = TuneCache(root=tmp_path)
    path = cache.path("H100-SXM")
    write(path, [{"op_name": "from a newer version"}])
    with pytest.warns(TuneCacheWarning, match="1 record skipped"):
        assert cache.records() == [] and cache.put(r := rec(1))
    assert records_in(path) == [r.model_dump(mode="json"), {"op_name": "from a newer version"}]
