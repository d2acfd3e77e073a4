"""The emulator's programs: kernels compiled together, each with its own helpers; a batch one kernel
breaks, or that clashes only when combined; a program deleted under a built kernel."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from tessera_rw.codegen import emulator
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.emulator import EmulatorError, build

pytestmark = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")


def _scaled(name: str, factor: float) -> KernelSource:
    # two kernels of one name would be one function under C linkage; so would their helpers
    body = f"""
__device__ float scale(float v) {{ return v * {factor}f; }}
extern "C" __global__ void {name}(const float* x, float* y) {{ y[threadIdx.x] = scale(x[threadIdx.x]); }}
"""
    return KernelSource(name, body, threads=32)


def test_kernels_built_together_share_a_program_and_keep_their_own_helpers():
    sources = [_scaled("scaled", 2.0), _scaled("scaled", 3.0), _scaled("tripled", 4.0)]
    kernels = emulator.build_all(sources)
    assert len({k.program for k in kernels}) == 1 and [k.index for k in kernels] == [0, 1, 2]
    x = np.arange(1, 33, dtype=np.float32)
    for kernel, factor in zip(kernels, (2.0, 3.0, 4.0)):
        y = np.full(32, np.nan, np.float32)
        kernel([x, y])
        np.testing.assert_array_equal(y, factor * x)
    assert build(sources[1]) == kernels[1]              # built once in this process


def test_a_program_one_kernel_breaks_is_blamed_on_that_kernel():
    broken = KernelSource("broken_in_a_batch", 'extern "C" __global__ void broken_in_a_batch(float* y) { y[0] = nope; }',
                          threads=32)
    with pytest.raises(EmulatorError, match=r"rejected kernel broken_in_a_batch\b"):
        emulator.build_all([_scaled("fine_before", 5.0), broken, _scaled("fine_after", 6.0)])


def test_kernels_that_clash_in_one_program_are_built_apart():
    # a macro outlives its kernel's namespace: the second kernel compiles alone, not after the first
    macro = KernelSource("with_macro", '#define twice(v) (2.0f * (v))\n'
                         'extern "C" __global__ void with_macro(float* y) { y[threadIdx.x] = twice(1.0f); }', threads=32)
    function = KernelSource("with_function", '__device__ float twice(float v) { return v + v + 1.0f; }\n'
                            'extern "C" __global__ void with_function(float* y) { y[threadIdx.x] = twice(1.0f); }', threads=32)
    kernels = emulator.build_all([macro, function])
    assert kernels[0].program != kernels[1].program
    for kernel, value in zip(kernels, (2.0, 3.0)):
        y = np.zeros(32, np.float32)
        kernel([y])
        np.testing.assert_array_equal(y, np.full(32, value, np.float32))


def test_a_kernel_whose_program_was_deleted_is_built_again():
    source = _scaled("rebuilt", 7.0)
    first = build(source)
    first.program.unlink()
    again = build(source)
    assert again.program.exists()
    y = np.zeros(32, np.float32)
    again([np.ones(32, np.float32), y])
    np.testing.assert_array_equal(y, np.full(32, 7.0, np.float32))


def test_more_kernels_than_the_process_remembers_are_all_returned(monkeypatch):
    monkeypatch.setattr(emulator, "_KEPT", 1)
    built = emulator.build(_scaled("remembered", 8.0))
    kernels = emulator.build_all([built.source, _scaled("beside", 9.0), _scaled("and_beside", 10.0)])
    assert [k.source.name for k in kernels] == ["remembered", "beside", "and_beside"]
    assert len(emulator._built) == 1


def test_a_kernel_built_in_another_process_s_program_is_found_there(monkeypatch):
    """The on-disk index names each kernel's program, so a kernel built in a batch (by another
    process, here a forgotten one) is not compiled again on its own; a program gone from under
    the index is built again."""
    run = uuid.uuid4().hex[:8]             # kernels no earlier run built, so they share one program
    sources = [_scaled(f"indexed_{run}", 11.0), _scaled(f"indexed_beside_{run}", 12.0)]
    kernels = emulator.build_all(sources)
    assert kernels[0].program == kernels[1].program
    monkeypatch.setattr(emulator, "_built", {})
    monkeypatch.setattr(emulator, "_build_batch", lambda batch: pytest.fail(f"{batch} compiled again"))
    again = build(sources[1])
    assert (again.program, again.index) == (kernels[1].program, 1)
    y = np.zeros(32, np.float32)
    again([np.ones(32, np.float32), y])
    np.testing.assert_array_equal(y, np.full(32, 12.0, np.float32))
    monkeypatch.undo()
    monkeypatch.setattr(emulator, "_built", {})
    kernels[0].program.unlink()
    assert build(sources[0]).program.exists()
