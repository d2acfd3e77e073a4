"""The codegen version in a record's key names a hash of the sources that decide generated kernel
code, so records timed under other kernel templates are misses, not stale hits."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tessera_rw import codegen
from tessera_rw.tune import records
from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.records import CODEGEN_SOURCES, codegen_source_hash, current_versions, hash_sources

CODEGEN = Path(codegen.__file__).parent
SHAPES, DTYPES = ((8, 8), (8, 8)), ("f32", "f32")


@pytest.fixture
def sources(tmp_path) -> Path:
    """A copy of the sources the hash covers, and one file it does not."""
    root = tmp_path / "codegen"
    shutil.copytree(CODEGEN / "templates", root / "templates", ignore=shutil.ignore_patterns("__pycache__"))
    for name in CODEGEN_SOURCES[1:]:
        shutil.copy(CODEGEN / name, root / name)
    (root / "launch.py").write_text("# host-side launching: not generated code\n")
    return root


def test_the_codegen_version_names_the_source_hash():
    assert current_versions().codegen == f"tessera_rw-codegen-1+{codegen_source_hash()}"
    assert len(codegen_source_hash()) == 12 and int(codegen_source_hash(), 16) >= 0


def test_the_hash_follows_the_template_and_prelude_sources(sources):
    before = hash_sources(sources)
    (sources / "launch.py").write_text("# changed\n")
    assert hash_sources(sources) == before                                        # not a codegen source
    (sources / "templates" / "gemm_cuda.py").touch()
    assert hash_sources(sources) == before                                        # a touch changes nothing
    for change in (lambda: (sources / "templates" / "gemm_cuda.py").write_text("# a new kernel\n"),
                   lambda: (sources / "prelude.py").write_text("# a new prelude\n"),
                   lambda: (sources / "templates" / "new_kernel.py").write_text("")):
        change()
        assert hash_sources(sources) != before
        before = hash_sources(sources)


def test_a_record_of_older_templates_is_a_miss(tmp_path):
    cache = TuneCache(root=tmp_path)
    old = current_versions()._replace(codegen="tessera_rw-codegen-1")          # as written before the hash
    cache.put(records.TuneRecord.create(op_name="matmul", signature_hash="s", shapes=SHAPES, dtypes=DTYPES,
                                        arch="H100-SXM", config={"bm": 64}, time_us=1.0, chosen_by="on_device",
                                        versions=old))
    assert cache.get("matmul", "s", SHAPES, DTYPES, "H100-SXM") is None
    assert cache.nearest("matmul", SHAPES, DTYPES, "H100-SXM") is None and len(cache.records()) == 1


def test_the_hash_is_computed_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(records, "hash_sources", lambda root: calls.append(root) or "0123456789ab")
    codegen_source_hash.cache_clear()
    try:
        assert current_versions().codegen.endswith("+0123456789ab") and current_versions() == current_versions()
        assert calls == [CODEGEN]
    finally:
        codegen_source_hash.cache_clear()
