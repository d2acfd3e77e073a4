"""The runtime's cuFFT calls against a recording cuFFT (no GPU): staging, executions, scratch rows,
scaling and failures; plans with FFT steps bind when cuFFT loads and are named with the reason when
it does not."""

from __future__ import annotations

import enum
import itertools
from types import SimpleNamespace

import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import library_kernels
from tessera_rw.codegen.device import gpu_available
from tessera_rw.codegen.device_arrays import DeviceTensor
from tessera_rw.codegen.library_kernels import (CuFFTKernel, FFTCall, LibraryCallError, Transform, library_available,
                                                library_call)
from tessera_rw.codegen.plan_binding import bind_plan
from tessera_rw.codegen.templates.spectral import CuFFTSchedule, LibraryKernelError
from tests.codegen.cufft_replay import H100, fft_op, long_conv


# -- the runtime's calls, against a recording cuFFT (no GPU) ---------------------------------------

class RecordingCuFFT:
    """The part of nvmath.bindings.cufft the runtime uses, recording each call."""
    Type = enum.IntEnum("Type", {"C2C": 41, "R2C": 42, "C2R": 44, "Z2Z": 105, "D2Z": 106, "Z2D": 108})
    Result = enum.IntEnum("Result", {"SUCCESS": 0, "INVALID_PLAN": 1, "ALLOC_FAILED": 2, "EXEC_FAILED": 6})

    def __init__(self, fail: str | None = None):
        self.log, self.fail = [], fail

    def __getattr__(self, name):
        def call(*args):
            self.log.append((name, *args))
            if name == self.fail:
                error = RuntimeError("CUFFT_ALLOC_FAILED")
                error.status = 2
                raise error
            return 11 if name == "create" else 0
        return call


class FakeStream:
    """Allocations come at 0x9000, 0xA000, ... in order; their sizes are kept in `allocated`."""
    handle = 0x5

    def __init__(self):
        handles, self.allocated = itertools.count(0x9000, 0x1000), []

        def allocate(nbytes, stream):
            self.allocated.append(nbytes)
            return SimpleNamespace(handle=next(handles))
        self.device = SimpleNamespace(arch="90", allocate=allocate)

    def sync(self):
        pass


@pytest.fixture
def recorded(monkeypatch):
    cufft, launches = RecordingCuFFT(), []
    monkeypatch.setattr(library_kernels, "_runtime", lambda name: (cufft, ""))
    stream = FakeStream()
    cufft.stream = stream
    monkeypatch.setattr(library_kernels, "resolve_stream", lambda s, index: stream)
    monkeypatch.setattr(library_kernels, "bind", lambda source, compiled, args, stream:
                        lambda: launches.append((source.name, [a.ptr for a in args])))
    return cufft, launches


def tensor(t: TensorType, ptr: int) -> DeviceTensor:
    return DeviceTensor(ptr, t.shape, t.dtype, None, "cuda", 0)


def test_an_interleaved_inverse_stages_then_runs_one_execution_per_outer_index(recorded):
    cufft, launches = recorded
    call = FFTCall.of(fft_op("irfft", (3, 9, 40), DType.complex64, 16, 1, "backward"))
    kernel = CuFFTKernel(call, 0)
    assert cufft.log == [("create",), ("make_plan_many64", 11, 1, [16], [9], 40, 1, [16], 40, 1, 44, 40)]
    cufft.log.clear()
    kernel([tensor(call.source, 0x1000), tensor(call.result, 0x2000)], None)
    assert launches == [("fft_stage_c64_c64", [0x1000, 0x9000])]        # the operand is copied, not overwritten
    assert cufft.log == [("set_stream", 11, 0x5)] + [("exec_c2r", 11, 0x9000 + i * 9 * 40 * 8, 0x2000 + i * 16 * 40 * 4)
                                                      for i in range(3)]


def test_padded_rows_are_written_to_scratch_then_copied_into_the_result(recorded):
    cufft, launches = recorded
    call = FFTCall.of(fft_op("irfft", (3, 5, 3), DType.complex64, 5, 1, "backward"))
    kernel = CuFFTKernel(call, 0)
    # the staged spectrum (3 rows of 3x3 complex64) and the padded rows (3 of 16 float32)
    assert cufft.stream.allocated == [3 * 9 * 8, 3 * 16 * 4]
    cufft.log.clear()
    kernel([tensor(call.source, 0x1000), tensor(call.result, 0x2000)], None)
    # the staged spectrum at 0x9000, the padded rows at 0xA000, then copied into the result
    assert launches == [("fft_stage_c64_c64", [0x1000, 0x9000]), ("fft_unstage_f32", [0xA000, 0x2000])]
    assert cufft.log[1:] == [("exec_c2r", 11, 0x9000 + i * 3 * 3 * 8, 0xA000 + i * 16 * 4) for i in range(3)]


def test_odd_rows_of_a_real_input_are_staged_at_an_even_pitch(recorded):
    cufft, launches = recorded
    call = FFTCall.of(fft_op("rfft", (3, 5, 3), DType.float32, 5, 1, "backward"))
    kernel = CuFFTKernel(call, 0)
    assert cufft.stream.allocated == [3 * 16 * 4]            # 3 rows of 15 float32, each padded to 16
    cufft.log.clear()
    kernel([tensor(call.source, 0x1000), tensor(call.result, 0x2000)], None)
    assert launches == [("fft_stage_f32_f32", [0x1000, 0x9000])]
    assert cufft.log[1:] == [("exec_r2c", 11, 0x9000 + i * 16 * 4, 0x2000 + i * 3 * 3 * 8) for i in range(3)]


def test_a_forward_transform_scales_its_result_in_place(recorded):
    cufft, launches = recorded
    call = FFTCall.of(fft_op("fft", (8, 32), DType.complex64, 32, 1, "ortho"))
    kernel = CuFFTKernel(call, 0)
    kernel([tensor(call.source, 0x1000), tensor(call.result, 0x2000)], None)
    assert cufft.log[-1] == ("exec_c2c", 11, 0x1000, 0x2000, -1)          # CUFFT_FORWARD
    assert launches == [("fft_scale_c64", [0x2000])]
    del kernel
    assert cufft.log[-1] == ("destroy", 11)                                # the plan goes with its kernel


def test_cufft_failures_name_the_op_the_shapes_and_the_status(monkeypatch, recorded):
    cufft, _ = recorded
    cufft.fail = "exec_r2c"
    call = FFTCall.of(fft_op("rfft", (8, 32), DType.float32, 32, 1, "backward"))
    kernel = CuFFTKernel(call, 0)
    with pytest.raises(LibraryCallError, match=r"rfft: cufftExecR2C failed with ALLOC_FAILED") as e:
        kernel([tensor(call.source, 0x1000), tensor(call.result, 0x2000)], None)
    assert "f32[8,32] -> c64[8,17]" in str(e.value)
    with pytest.raises(LibraryCallError, match=r"the operand is float32\[8, 31\]"):
        kernel([tensor(TensorType((8, 31), DType.float32), 0x1000), tensor(call.result, 0x2000)], None)
    cufft.fail = "make_plan_many64"
    with pytest.raises(LibraryCallError, match="cufftMakePlanMany64 failed"):
        CuFFTKernel(call, 0)
    assert cufft.log[-1] == ("destroy", 11)


# -- binding plans ----------------------------------------------------------------------------------


def conv_plan():
    return long_conv.program(op.tensor((2, 64, 4096), "float32"), op.tensor((64, 64, 1024), "float32")).plan


def test_without_cufft_the_fft_steps_are_named_with_the_reason():
    assert not library_available("cuBLAS")
    if gpu_available():
        pytest.skip("this machine may have cuFFT")
    assert not library_available("cuFFT")
    o = fft_op("rfft", (4, 16), DType.float32, 16, 1, "backward")
    with pytest.raises(LibraryCallError, match="nvmath") as e:
        library_call(o, "cuFFT")
    assert "nvidia-cufft" in str(e.value)
    with pytest.raises(LibraryCallError, match="cannot run on cuFFT here"):
        CuFFTKernel(FFTCall.of(o), 0)


def test_with_cufft_the_convolution_plan_binds(monkeypatch):
    monkeypatch.setattr(library_kernels, "library_available", lambda name: True)
    bound = bind_plan(conv_plan(), H100)
    assert [b.kind for b in bound] == ["copy", "fft", "fft", "gemm", "ifft", "copy"]
    calls = [b.call for b in bound if b.is_library]
    assert [c.transform for c in calls] == [Transform.R2C, Transform.R2C, Transform.C2R]
    assert calls[1].staged == TensorType((64, 64, 5120), DType.float32)     # the weight, zero-padded to n = 5120
    for b in bound:
        assert b.schedule in b.schedules
        if b.is_library:
            assert b.schedule == CuFFTSchedule()
            with pytest.raises(LibraryKernelError):
                b.compile(H100, "sm_90")
        else:
            source, compiled = b.compile(H100, "sm_90")
            assert compiled.spill_bytes == 0, (b.op, compiled.spill_bytes)
