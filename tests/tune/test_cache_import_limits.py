"""A large hostile import is refused at once: past MAX_IMPORT_BYTES by its size, with the limit in
bytes and in records; under it at its first invalid record, never after validating every one."""

from __future__ import annotations

import json
import re

import pytest

from tessera_rw.tune import cache as cache_module
from tessera_rw.tune.cache import TuneCache, TuneCacheError
from tessera_rw.tune.records import SCHEMA
from tests.tune.cache_records import rec


def test_an_import_over_the_limit_says_the_limit_in_bytes_and_records(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_module, "MAX_IMPORT_BYTES", 1 << 20)
    src = tmp_path / "junk.json"
    src.write_bytes(b" " * ((1 << 20) + 1))
    with pytest.raises(TuneCacheError) as err:
        TuneCache(root=tmp_path / "cache").import_(src)
    said = str(err.value)
    assert said.startswith(f"{src} (1.0 MiB) is over the import limit of 1 MiB (an export of about 2,097 records)")
    assert "nothing was imported" in said and "tessera-rewrite cache export" in said


def _junk(records: list) -> str:
    return json.dumps({"schema": SCHEMA, "records": records})


GOOD = rec().model_dump(mode="json")
JUNK = {   # the file, and where its first problem is
    "every record wrong": (lambda: _junk([{}] * 5_000), "records.0."),
    "good, then all wrong": (lambda: _junk([GOOD] * 3 + [{**GOOD, "trials": -1}] * 5_000), "records.3.trials"),
    "one long record": (lambda: _junk([{**GOOD, "dtypes": ["!"] * 100_000}]), "records.0.dtypes.0"),
    "one record of long shapes": (lambda: _junk([{**GOOD, "shapes": [["x"]] * 50_000}]), "records.0.shapes.0.0"),
}


@pytest.mark.parametrize("kind", list(JUNK))
def test_a_junk_import_stops_at_its_first_bad_record(tmp_path, kind):
    text, at = JUNK[kind]
    src = tmp_path / "junk.json"
    src.write_text(text())
    cache = TuneCache(root=tmp_path / "cache")
    with pytest.raises(TuneCacheError) as err:
        cache.import_(src)
    said = str(err.value)
    more = re.search(r"\(and (\d+) more problems\)", said)
    assert str(src) in said and at in said and (more is None or int(more[1]) < 20)
    assert cache.records() == []
