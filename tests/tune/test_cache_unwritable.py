"""A cache that cannot be written (a read-only folder or HOME): tuning still returns its result,
with one TuneCacheWarning per cache file; `put` itself still raises."""

from __future__ import annotations

import errno
import os
import warnings

import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.saturate import rewrite
from tessera_rw.tune import cache as cache_module
from tessera_rw.tune.cache import TuneCache, TuneCacheError, TuneCacheWarning
from tessera_rw.tune.candidate_choice import choose_candidate
from tessera_rw.tune.extract import extract_candidates
from tessera_rw.tune.kernel_tuner import tune_kernel
from tessera_rw.tune.plan_tuner import TuneSettings
from tessera_rw.tune.records import ChosenBy, TuneRecord

H100 = arch_named("H100-SXM")


def matmul(m: int) -> KernelOp:
    a, b = TensorType((m, 64), DType.bfloat16), TensorType((64, 128), DType.bfloat16)
    return KernelOp.of("matmul", (a, b), TensorType((m, 128), DType.bfloat16), accum_dtype=None)


def refuse_writes(monkeypatch, when=lambda data: True) -> None:
    """Writing a cache file whose new text `when` picks fails as in a read-only folder (root
    writes anywhere, so chmod cannot show it)."""
    real = cache_module.write_atomically

    def write(path, data: bytes):
        if when(data):
            raise PermissionError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, data)
    monkeypatch.setattr(cache_module, "write_atomically", write)


def unwritable_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, TuneCacheWarning)]


def test_put_still_raises(tmp_path, monkeypatch):
    refuse_writes(monkeypatch)
    with pytest.raises(TuneCacheError, match="cannot write the autotune cache .*Read-only file system"):
        TuneCache(root=tmp_path).put(TuneRecord.create(
            op_name="matmul", signature_hash="9f2c", shapes=((8, 8), (8, 8)), dtypes=("f32", "f32"),
            arch="H100-SXM", config={"bm": 64}, time_us=1.0, chosen_by="cost_model"))


def test_tune_kernel_returns_its_result_and_warns_once_per_file(tmp_path, monkeypatch):
    refuse_writes(monkeypatch)
    cache = TuneCache("ro", tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuned = [tune_kernel(matmul(m), H100, cache=cache, method="cost_model") for m in (64, 128, 256)]
    assert [t.chosen_by for t in tuned] == [ChosenBy.COST_MODEL] * 3 and all(t.record for t in tuned)
    said = unwritable_warnings(caught)
    assert len(said) == 1, said
    assert str(cache.path("H100-SXM")) in said[0] and "used but not kept" in said[0]
    assert "TESSERA_CACHE_DIR" in said[0] and cache.records() == []
    with warnings.catch_warnings(record=True) as caught:     # another file of the same cache: its own warning
        warnings.simplefilter("always")
        tune_kernel(matmul(64), arch_named("A100"), cache=cache, method="cost_model")
    assert len(unwritable_warnings(caught)) == 1


def test_choose_candidate_returns_its_choice_when_its_record_cannot_be_kept(tmp_path, monkeypatch):
    refuse_writes(monkeypatch, when=lambda data: b'"op_name":"program:' in data)
    graph = op.kernel(lambda x, w: op.gelu(x @ w)).trace(op.tensor((64, 32), "bf16"), op.tensor((32, 16), "bf16"))
    candidates = extract_candidates(rewrite(graph, BUILTIN_RULESETS), H100)
    settings = TuneSettings(method="cost_model", cache="ro", cache_root=str(tmp_path))
    with pytest.warns(TuneCacheWarning, match="used but not kept"):
        choice = choose_candidate(graph, candidates, H100, settings)
    assert choice.chosen_by is ChosenBy.COST_MODEL and choice.plan is not None
    kept = TuneCache("ro", tmp_path).records()
    assert kept and not any(r.op_name.startswith("program:") for r in kept)    # its kernels' records were kept


def test_a_chmod_read_only_folder(tmp_path):
    folder = tmp_path / "autotune"
    folder.mkdir(mode=0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user writes into a 0555 folder (root): the patched-write tests cover it")
        with pytest.warns(TuneCacheWarning, match="used but not kept"):
            tuned = tune_kernel(matmul(64), H100, cache=TuneCache("ro", folder), method="cost_model")
        assert tuned.chosen_by is ChosenBy.COST_MODEL
    finally:
        folder.chmod(0o755)
