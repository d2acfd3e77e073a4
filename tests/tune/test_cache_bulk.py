"""A cache file is validated and written whole, in one pydantic-core call each way, never one call
per record; the file still holds one record per line and reads back to the same records."""

from __future__ import annotations

import pytest

from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.cache_file import merge_records
from tessera_rw.tune.cache_file import parse_arch_file
from tessera_rw.tune.records import TuneDocument, TuneRecord
from tests.tune.cache_records import rec

RECORDS = [rec(shapes=((m, 64), (64, 256))) for m in range(1, 41)]


@pytest.fixture
def per_record_calls(monkeypatch) -> list[str]:
    """One entry per record validated or serialised on its own."""
    calls: list[str] = []
    validate, dump = TuneRecord.model_validate_json, TuneRecord.model_dump_json

    def validating(*args, **kwargs):
        calls.append("validate")
        return validate(*args, **kwargs)

    def dumping(self, *args, **kwargs):
        calls.append("dump")
        return dump(self, *args, **kwargs)
    monkeypatch.setattr(TuneRecord, "model_validate_json", validating)
    monkeypatch.setattr(TuneRecord, "model_dump_json", dumping)
    return calls


def test_a_file_is_read_and_written_without_a_call_per_record(tmp_path, per_record_calls):
    cache = TuneCache(root=tmp_path)
    path = cache.path("H100-SXM")
    path.parent.mkdir(parents=True)
    path.write_text(TuneDocument.of(RECORDS).to_json())
    assert cache.records() == RECORDS                                  # read: one bulk validation
    assert cache.put(rec(shapes=((99, 64), (64, 256)))) and cache.export(tmp_path / "out.json") == 41
    assert per_record_calls == []


def test_the_file_holds_one_record_per_line_as_each_record_serialises():
    kept = ['{"op_name": "from a newer version"}']
    lines = TuneDocument.of(RECORDS[:3], name="team").to_json(kept).splitlines()
    assert lines == ['{"schema": "tessera_rw.autotune/1", "name": "team", "records": [',
                     *(r.model_dump_json() + "," for r in RECORDS[:3]), kept[0], "]}"]
    assert TuneDocument.model_validate_json(TuneDocument.of([]).to_json()).records == ()


def test_a_merge_keeps_the_best_record_of_each_key_in_record_order():
    slow, fast = rec(time_us=9.0), rec(time_us=3.0)
    found = parse_arch_file(TuneDocument.of([RECORDS[5], slow, RECORDS[2]]).to_json().encode(), "H100-SXM")
    merged, changed = found.merged([fast, RECORDS[5]])
    assert changed == 1 and merged.records == tuple(merge_records([*RECORDS[2:6:3], slow, fast]))
    assert found.merged([slow]) == (found, 0)
    assert found.merged([slow], supersede=True)[1] == 1
