"""The autotune cache: round trips, merge rules, interpolation, versions, bad files, hostile imports
(its command line: test_cache_cli.py)."""

from __future__ import annotations

import json
import warnings

import pytest
from pydantic import ValidationError

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen.arch import arch_named
from tessera_rw.tune import cache as cache_module
from tessera_rw.tune.cache import TuneCache, TuneCacheError, TuneCacheWarning
from tessera_rw.tune.cache_file import merge_records
from tessera_rw.tune.records import (
    SCHEMA, ChosenBy, TuneDocument, TuneRecord, codegen_source_hash, current_versions)
from tests.tune.cache_records import BF16, CONFIG, MM, files_of, rec

@pytest.fixture
def cache(tmp_path) -> TuneCache:
    return TuneCache(root=tmp_path)


def get(cache: TuneCache, shapes=MM, dtypes=BF16, arch="H100-SXM", signature_hash="9f2c"):
    return cache.get("matmul", signature_hash, shapes, dtypes, arch)


# ---- records ----

def test_record_round_trips_through_json_and_normalises_names():
    r = rec(arch="h100", dtypes=("bf16", "float32"), config={**CONFIG, "tiles": [1, 2], "swizzle": True,
                                                             "split": 0.5, "layout": "row"})
    assert r.arch == "H100-SXM" and r.compute_capability == (9, 0) and r.dtypes == ("bfloat16", "float32")
    back = TuneRecord.model_validate_json(r.model_dump_json())
    assert back == r and back.key == r.key and type(back.config["swizzle"]) is bool
    assert r.versions == current_versions() and r.codegen_version == f"tessera_rw-codegen-1+{codegen_source_hash()}"


def test_key_covers_what_changes_the_winner_and_nothing_else():
    a, b = rec(time_us=5.0), rec(time_us=9.0, config={"bm": 64}, chosen_by="cost_model")
    assert a.key == b.key and json.loads(a.key)[0:2] == ["matmul", "9f2c"]
    for other in (rec(shapes=((256, 64), (64, 256))), rec(dtypes=("f16", "f16")), rec(arch="A100"),
                  rec(signature_hash="77"), rec(versions=current_versions()._replace(nvrtc="12.0"))):
        assert other.key != a.key


@pytest.mark.parametrize("change, says", [
    ({"dtypes": ("bf16",)}, "2 shapes but 1 dtypes"),
    ({"dtypes": ("bf16", "float13")}, "float13"),
    ({"compute_capability": (8, 0)}, "compute capability"),
    ({"time_us": float("inf")}, "finite"),
    ({"time_us": -1.0}, "greater than or equal"),
    ({"config": {"bm": "128 or so"}}, "config.bm"),
    ({"config": {"bm": [[1]]}}, "config.bm"),
    ({"op_name": "__reduce__"}, "op_name"),
    ({"arch": "../etc"}, "arch"),
    ({"chosen_by": "guess"}, "chosen_by"),
    ({"shapes": ((128, "64"), (64, 256))}, "shapes"),
])
def test_record_rejects_bad_fields(change, says):
    with pytest.raises(ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        TuneRecord.model_validate({**rec().model_dump(), **change})


# ---- store ----

def test_round_trip_between_instances(cache, tmp_path):
    r = rec()
    assert cache.put(r) is True
    again = TuneCache(root=tmp_path)
    assert get(again) == r and again.records() == [r] and again.archs() == ["H100-SXM"]
    assert get(again, arch=arch_named("h100")) == r          # an ArchSpec or an alias names the same file
    path = tmp_path / "default" / "H100-SXM.json"
    doc = TuneDocument.model_validate_json(path.read_bytes())
    assert doc.records == (r,) and json.loads(path.read_text())["schema"] == SCHEMA


def test_location_follows_tessera_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    TuneCache("mine").put(rec())
    assert (tmp_path / "autotune" / "mine" / "H100-SXM.json").is_file()


@pytest.mark.parametrize("miss", [
    {"shapes": ((128, 64), (64, 128))}, {"dtypes": ("f16", "f16")}, {"arch": "A100"}, {"signature_hash": "other"},
])
def test_get_is_exact(cache, miss):
    cache.put(rec())
    assert get(cache, **miss) is None


def test_an_arch_spec_must_agree_on_compute_capability(cache):
    cache.put(rec())
    odd = arch_named("H100-SXM").model_copy(update={"compute_capability": (9, 1)})
    with pytest.raises(TuneCacheError, match="compute_capability"):
        get(cache, arch=odd)


@pytest.mark.parametrize("old, new, winner", [
    (dict(time_us=10.0), dict(time_us=8.0), "new"),                                   # faster measurement
    (dict(time_us=8.0), dict(time_us=10.0), "old"),
    (dict(time_us=8.0), dict(time_us=8.0), "old"),                                    # a tie keeps what is there
    (dict(time_us=5.0, chosen_by="cost_model"), dict(time_us=9.0), "new"),            # measured beats estimated
    (dict(time_us=9.0), dict(time_us=5.0, chosen_by="cost_model"), "old"),
    (dict(time_us=5.0, interpolated=True), dict(time_us=9.0), "new"),                 # real beats interpolated
])
def test_merge_rules(cache, old, new, winner):
    a, b = rec(**old), rec(config={"bm": 64}, **new)
    cache.put(a)
    assert cache.put(b) is (winner == "new")
    assert get(cache) == (b if winner == "new" else a)
    assert merge_records([a, b]) == [b if winner == "new" else a]


@pytest.mark.parametrize("name", ["H100-SXM", "h100", "A100-SXM"])
def test_a_described_gpu_named_like_a_known_one_is_refused_before_its_records_mix(cache, name):
    described = arch_named("H100-SXM").model_copy(update={"name": name, "sm_count": 66})
    with pytest.raises(TuneCacheError, match=f"ArchSpec '{name}' differs from the known .*sm_count"):
        cache.get("matmul", "9f2c", MM, BF16, described)
    own = described.model_copy(update={"name": "H100-PCIe-like"})
    assert cache.get("matmul", "9f2c", MM, BF16, own) is None and cache.put(rec(arch=own))
    assert get(cache, arch=arch_named("H100-SXM")) is None


def test_merge_never_loses_other_records(cache):
    shapes = [((m, 64), (64, 256)) for m in (16, 32, 64, 128)]
    for s in shapes:
        cache.put(rec(shapes=s))
    cache.put(rec(shapes=shapes[0], time_us=1.0))
    cache.put(rec(arch="A100", time_us=3.0))
    assert len(cache.records()) == 5 and len(cache.records("H100-SXM")) == 4
    assert get(cache, shapes=shapes[0]).time_us == 1.0


def test_nearest_shape_is_interpolated(cache):
    for m, t in ((64, 1.0), (1024, 9.0), (4096, 30.0)):
        cache.put(rec(shapes=((m, 64), (64, m)), time_us=t))
    cache.put(rec(shapes=((100, 64), (64, 100)), dtypes=("f16", "f16")))       # other dtypes
    cache.put(rec(shapes=((100, 64), (64, 100)), op_name="gemm"))              # other op
    cache.put(rec(shapes=((100, 64), (64, 100)), interpolated=True))           # never a source
    near = cache.nearest("matmul", ((100, 64), (64, 100)), BF16, "H100-SXM")
    assert near.interpolated and near.shapes == ((64, 64), (64, 64)) and near.config == CONFIG
    assert get(cache, shapes=((64, 64), (64, 64))).interpolated is False       # the stored one is untouched
    assert cache.nearest("matmul", ((3000, 64), (64, 3000)), BF16, "H100-SXM").shapes[0] == (4096, 64)
    assert cache.nearest("matmul", ((8, 64), (64, 8)), BF16, "H100-SXM").shapes[0] == (64, 64)      # 8x off
    assert cache.nearest("matmul", ((7, 64), (64, 7)), BF16, "H100-SXM") is None      # more: says little
    assert cache.nearest("matmul", ((100, 600), (600, 100)), BF16, "H100-SXM") is None
    assert cache.nearest("matmul", ((100, 64, 1), (64, 100)), BF16, "H100-SXM") is None     # another rank
    assert cache.nearest("matmul", ((100, 64),), BF16, "H100-SXM") is None                  # another arity
    assert cache.nearest("matmul", ((100, 64), (64, 100)), ("f32", "f32"), "H100-SXM") is None
    assert cache.nearest("matmul", ((100, 64), (64, 100)), BF16, "A100") is None
    assert cache.nearest("matmul", ((100, 64), (64, 100)), BF16, "H100-SXM", signature_hash="nope") is None


def test_nearest_prefers_measurements_at_equal_distance(cache):
    cache.put(rec(shapes=((64, 64), (64, 64)), time_us=1.0, chosen_by="cost_model"))
    cache.put(rec(shapes=((256, 64), (64, 256)), time_us=5.0))
    near = cache.nearest("matmul", ((128, 64), (64, 128)), BF16, "H100-SXM")
    assert near.chosen_by is ChosenBy.ON_DEVICE and near.shapes[0] == (256, 64)


@pytest.mark.parametrize("field", ["tessera", "codegen", "nvrtc", "driver"])
def test_another_version_is_not_a_hit(cache, field):
    cache.put(rec(versions=current_versions()._replace(**{field: "0.0.0"})))
    assert get(cache) is None
    assert cache.nearest("matmul", MM, BF16, "H100-SXM") is None
    assert len(cache.records()) == 1          # kept, just not used


@pytest.mark.parametrize("field", ["nvrtc", "driver"])
def test_a_cost_model_record_holds_under_any_compiler_and_driver(cache, field):
    """An estimate involves neither: a cache ranked where there is no GPU serves a GPU machine."""
    elsewhere = current_versions()._replace(**{field: "550.54.15"})
    cache.put(rec(chosen_by="cost_model", versions=elsewhere))
    assert get(cache) is not None
    assert cache.nearest("matmul", ((128, 64), (64, 512)), BF16, "H100-SXM") is not None
    cache.put(rec(time_us=50.0))
    assert get(cache).chosen_by is ChosenBy.ON_DEVICE       # a measurement here beats the estimate
    assert not rec(chosen_by="cost_model", versions=current_versions()._replace(codegen="x")).holds_under(
        current_versions())


# ---- bad files are set aside, never used, never fatal (bad records: test_cache_skipped_records.py) ----

def _bad_files():
    good = rec().model_dump(mode="json")
    doc = lambda records, schema=SCHEMA: json.dumps({"schema": schema, "records": records})
    return {
        "truncated": (doc([good])[:-20], "does not validate"),
        "not json": ("\x00\xff garbage", "does not validate"),
        "empty": ("", "does not validate"),
        "schema": (doc([good], "another.tool/1"), "schema"),
        "bare list": (json.dumps([good]), "does not validate"),
        "records not a list": (json.dumps({"schema": SCHEMA, "records": {"0": good}}), "records"),
        "extra top-level": (json.dumps({"schema": SCHEMA, "records": [good], "code": "x"}), "code"),
    }


@pytest.mark.parametrize("kind", list(_bad_files()))
def test_bad_file_is_moved_aside_with_a_warning(cache, kind):
    text, says = _bad_files()[kind]
    path = cache.path("H100-SXM")
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("latin-1"))
    with pytest.warns(TuneCacheWarning, match=says) as caught:
        assert get(cache) is None
    assert str(path) in str(caught[0].message)
    aside = list(path.parent.glob("H100-SXM.json.corrupt-*"))
    assert not path.exists() and len(aside) == 1 and aside[0].read_bytes() == text.encode("latin-1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # set aside once: no second warning
        assert cache.records() == []
        assert cache.put(rec()) and get(cache).config == CONFIG


def test_a_reader_skips_a_bad_file_it_cannot_lock_to_move_aside(cache, monkeypatch):
    from filelock import FileLock

    from tessera_rw.tune import cache as cache_module
    path = cache.path("H100-SXM")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    monkeypatch.setattr(cache_module, "LOCK_TIMEOUT_S", 0.05)
    holder = FileLock(str(path) + ".lock")      # another process writing, for longer than the timeout
    holder.acquire()
    try:
        with pytest.warns(TuneCacheWarning, match="could not move it aside: .*stayed locked"):
            assert get(cache) is None
    finally:
        holder.release()
    assert path.exists()


def test_a_write_over_a_bad_file_keeps_the_bad_one_for_inspection(cache):
    path = cache.path("H100-SXM")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.warns(TuneCacheWarning, match="moved aside") as warned:
        cache.put(rec())
    assert len(cache.records()) == 1 and len(list(path.parent.glob("*.corrupt-*"))) == 1
    assert warned[0].filename == __file__         # the warning names the user's line, not the cache's


def test_a_file_a_newer_version_wrote_is_left_as_it_is_unread_and_unwritten(cache):
    path = cache.path("H100-SXM")
    path.parent.mkdir(parents=True)
    newer = json.dumps({"schema": "tessera_rw.autotune/2", "records": [{"shape": "of things to come"}]})
    path.write_text(newer)
    with pytest.warns(TuneCacheWarning, match="format tessera_rw.autotune/2, newer than .* leaves it as it is"):
        assert get(cache) is None
    with pytest.raises(TuneCacheError, match="newer than .* not rewritten"):
        cache.put(rec())
    assert path.read_text() == newer and not list(path.parent.glob("*.corrupt-*"))
    cache.put(rec(arch="A100"))
    with pytest.warns(TuneCacheWarning, match="autotune/2, newer than .*: left as it is, not rewritten, nor cleared"):
        assert cache.clear() == 1           # the other arch's record, and says which file it left
    assert path.read_text() == newer and cache.archs() == ["H100-SXM"]
    with pytest.raises(TuneCacheError, match=r"export in the format tessera_rw.autotune/2, newer .* nothing was "
                                             r"imported\n.*upgrade tessera_rw"):
        cache.import_(path)


def test_invalid_cache_names_are_refused(tmp_path):
    for name in ("../up", "", ".hidden", "a/b", "x\n"):
        with pytest.raises(TuneCacheError, match="not a plain file name"):
            TuneCache(name, root=tmp_path)


# ---- export / import ----

def test_export_import_merges_between_roots(tmp_path):
    a, b = TuneCache(root=tmp_path / "a"), TuneCache(root=tmp_path / "b")
    a.put(rec(time_us=10.0))
    a.put(rec(shapes=((8, 8), (8, 8))))
    a.put(rec(arch="A100"))
    b.put(rec(time_us=8.0, config={"bm": 64}))            # same key, better: stays
    b.put(rec(op_name="softmax", shapes=((4, 4),), dtypes=("f32",)))
    assert a.export(tmp_path / "a.json") == 3
    assert json.loads((tmp_path / "a.json").read_text())["name"] == "default"
    assert b.import_(tmp_path / "a.json") == 2
    assert len(b.records()) == 4 and get(b).config == {"bm": 64}
    assert b.import_(tmp_path / "a.json") == 0           # idempotent
    b.export(tmp_path / "b.json")
    assert a.import_(tmp_path / "b.json") == 2 and get(a).time_us == 8.0 and len(a.records()) == 4


def _hostile():
    good = rec().model_dump(mode="json")
    doc = lambda *records, **top: json.dumps({"schema": SCHEMA, "records": list(records), **top})
    return {
        "wrong type": (doc({**good, "time_us": "fast"}), "records.0.time_us"),
        "wrong shape type": (doc({**good, "shapes": "128x64"}), "records.0.shapes"),
        "extra field": (doc({**good, "exec": "import os"}), "records.0.exec"),
        "extra top-level": (doc(good, code="x"), "code"),
        "nested": ('{"schema": "' + SCHEMA + '", "records": ' + "[" * 50_000 + "]" * 50_000 + "}", "recursion"),
        "huge config": (doc({**good, "config": {f"k{i}": i for i in range(10_000)}}), "records.0.config"),
        "long list": (doc({**good, "config": {"bm": list(range(100_000))}}), "records.0.config.bm"),
        "long string": (doc({**good, "op_name": "m" * 100_000}), "records.0.op_name"),
        "big int": (doc({**good, "trials": 10 ** 400}), "records.0.trials"),
        "reduce key": (doc({**good, "config": {"__reduce__": ["os.system", "echo owned"]}}), "config.__reduce__"),
        "reduce op": (doc({**good, "op_name": "__reduce__"}), "records.0.op_name"),
        "pickle string": (doc({**good, "config": {"bm": "cos\nsystem\n(S'echo owned'\ntR."}}), "config.bm"),
        "path arch": (doc({**good, "arch": "../../etc/passwd"}), "records.0.arch"),
        "one bad among good": (doc(good, rec(shapes=((8, 8), (8, 8))).model_dump(mode="json"),
                                   {**good, "chosen_by": "eval"}), "records.2.chosen_by"),
        "not an export": ('{"hello": "world"}', "schema"),
        "not json": ("cos\nsystem\n(S'echo owned'\ntR.", "Invalid JSON"),
    }


@pytest.mark.parametrize("kind", list(_hostile()))
def test_hostile_import_changes_nothing(cache, tmp_path, kind):
    cache.put(rec(time_us=50.0))
    before = files_of(tmp_path)
    text, says = _hostile()[kind]
    src = tmp_path.parent / f"{tmp_path.name}-import.json"
    src.write_text(text)
    with pytest.raises(TuneCacheError) as err:
        cache.import_(src)
    message = str(err.value)
    assert str(src) in message and says in message and len(message) < 1000
    assert isinstance(err.value, TesseraError) and files_of(tmp_path) == before


def test_oversized_import_is_refused_before_reading(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(cache_module, "MAX_IMPORT_BYTES", 100)
    src = tmp_path / "big.json"
    src.write_text(TuneDocument.of([rec()]).to_json())
    with pytest.raises(TuneCacheError, match="nothing was imported"):
        cache.import_(src)
    assert cache.records() == []


def test_clear(cache):
    cache.put(rec())
    cache.put(rec(shapes=((8, 8), (8, 8))))
    cache.put(rec(arch="A100"))
    assert cache.clear("a100") == 1 and cache.archs() == ["H100-SXM"]
    assert cache.clear() == 2 and cache.records() == [] and cache.clear() == 0


@pytest.mark.parametrize("by", ["cache", "interpolated", "pinned", "replay"])
def test_a_record_holds_only_a_timed_or_ranked_config(by):
    with pytest.raises(ValueError, match="timed on the device or ranked by the cost model"):
        rec(chosen_by=by)
    assert rec(chosen_by=ChosenBy.COST_MODEL).chosen_by is ChosenBy.COST_MODEL
