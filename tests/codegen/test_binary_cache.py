"""The on-disk cubin cache: a hit skips NVRTC, a bad record is a miss, options and archs key apart."""

from __future__ import annotations

import pytest

from tessera_rw.codegen import compile as compile_module
from tessera_rw.codegen.binary_cache import BinaryCache, binary_cache
from tessera_rw.codegen.compile import KernelSource, compile_cuda

SOURCE = 'extern "C" __global__ void cached_{tag}(float* x) {{ x[threadIdx.x] += 1.f; }}'


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TESSERA_BINARY_CACHE", raising=False)
    compile_module._compile.cache_clear()           # the in-process memo would hide the disk
    yield tmp_path
    compile_module._compile.cache_clear()


def _no_nvrtc(monkeypatch):
    import cuda.core

    def refuse(*args, **kwargs):
        raise AssertionError("NVRTC was called for a cached kernel")
    monkeypatch.setattr(cuda.core, "Program", refuse)


def test_a_second_process_gets_the_cubin_and_its_facts_without_compiling(fresh_cache, monkeypatch):
    kernel = KernelSource("cached_a", SOURCE.format(tag="a"))
    first = compile_cuda(kernel, "sm_90")
    compile_module._compile.cache_clear()
    _no_nvrtc(monkeypatch)
    again = compile_cuda(kernel, "sm_90")
    assert again == first and again.registers > 0
    assert (fresh_cache / "binaries").is_dir()


def test_arch_and_fast_math_are_separate_entries(fresh_cache, monkeypatch):
    kernel = KernelSource("cached_b", SOURCE.format(tag="b"))
    compile_cuda(kernel, "sm_90")
    compile_module._compile.cache_clear()
    other_arch = compile_cuda(kernel, "sm_80")
    fast = compile_cuda(kernel, "sm_90", fast_math=True)
    assert other_arch.arch == "sm_80" and fast.arch == "sm_90"
    assert len(list((fresh_cache / "binaries" / "entries").rglob("*"))) >= 6   # 3 cubins + 3 records (+ dirs)


def test_a_corrupt_record_is_a_miss_and_is_rewritten(fresh_cache, monkeypatch):
    import cuda.core
    kernel = KernelSource("cached_c", SOURCE.format(tag="c"))
    first = compile_cuda(kernel, "sm_90")
    records = [r for r in (fresh_cache / "binaries" / "entries").rglob("*")
               if r.is_file() and r.read_bytes().startswith(b"{")]
    for record in records:
        record.write_bytes(b'{"name": "cached_c", "registers": "many"}')
    compiles = []

    class CountedProgram(cuda.core.Program):
        def compile(self, *args, **kwargs):
            compiles.append(args)
            return super().compile(*args, **kwargs)
    monkeypatch.setattr(cuda.core, "Program", CountedProgram)
    compile_module._compile.cache_clear()
    again = compile_cuda(kernel, "sm_90")
    assert len(compiles) == 1                 # the corrupt record was a miss: NVRTC ran again
    assert (again.cubin, again.registers) == (first.cubin, first.registers)
    assert all(b'"many"' not in r.read_bytes() for r in records)      # and the record was rewritten


def test_switched_off_it_writes_nothing(fresh_cache, monkeypatch):
    monkeypatch.setenv("TESSERA_BINARY_CACHE", "off")
    assert binary_cache() is None
    compile_cuda(KernelSource("cached_d", SOURCE.format(tag="d")), "sm_90")
    assert not (fresh_cache / "binaries").exists()


def test_a_record_for_another_kernel_is_not_trusted(tmp_path):
    from tessera_rw.codegen.binary_cache import KernelFacts
    cache = BinaryCache(tmp_path)
    facts = KernelFacts(name="k", arch="sm_90", registers=8, spill_stores=0, spill_loads=0, stack_bytes=0,
                        smem_bytes=0, log="")
    cache.put(b"key", b"cubin", facts)
    assert cache.get(b"key", "k", "sm_90") == (b"cubin", facts)
    assert cache.get(b"key", "other", "sm_90") is None
    assert cache.get(b"key", "k", "sm_80") is None
