"""FFT steps as cuFFT calls: every layout an FFTCall describes is replayed here element by element,
the staging copy from its emitted constants, and checked against the op's numpy reference; the
kernels around the call compile for sm_90; plans with FFT steps bind when cuFFT loads and are named
with the reason when it does not. On a GPU with nvmath-python: cuFFT against numpy, and the whole
FFT convolution against the numpy executor."""

from __future__ import annotations

import enum
import itertools
import re
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen import emulator, library_kernels
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.compile import compile_cuda
from tessera_rw.codegen.device import gpu_available
from tessera_rw.codegen.device_arrays import DeviceTensor
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.library_kernels import (CuFFTKernel, FFTCall, LibraryCallError, Transform, library_available,
                                                library_call, scale_source, stage_source, unstage_source)
from tessera_rw.codegen.plan_binding import bind_plan
from tessera_rw.codegen.templates.spectral import CuFFTSchedule, LibraryKernelError

H100 = arch_named("H100-SXM")
NORMS = ("backward", "ortho", "forward")
# (op, operand dtype): real and complex signals, both precisions, 16-bit signals widened
SIGNALS = [("rfft", DType.float32), ("rfft", DType.float64), ("rfft", DType.bfloat16), ("rfft", DType.float16),
           ("irfft", DType.complex64), ("irfft", DType.complex128), ("irfft", DType.float32),
           ("fft", DType.complex64), ("fft", DType.complex128), ("fft", DType.float32), ("fft", DType.bfloat16),
           ("ifft", DType.complex64), ("ifft", DType.complex128)]
# (shape, axis): last axis (one execution), leading axis (interleaved), middle axis both ways, odd
# rows along a middle axis (real sides padded to start each execution aligned), and more rows than
# MAX_EXECUTIONS (the axis moved last)
LAYOUTS = [((4, 5, 6), 0), ((4, 5, 6), 1), ((4, 5, 6), 2), ((10, 6, 2), 1), ((2, 6, 40), 1), ((3, 5, 3), 1),
           ((12, 5, 40), 1)]


def fft_op(name: str, shape: tuple[int, ...], dtype: DType, n: int, axis: int, norm: str) -> KernelOp:
    x = TensorType(shape, dtype)
    attrs = dict(n=n, axis=axis, norm=norm)
    return KernelOp.of(name, (x,), OPS[name].infer(x, **attrs), **attrs)


def lengths(name: str, length: int) -> dict[str, int]:
    """n for the natural transform, a cropped operand and a zero-padded one."""
    if name == "irfft":
        return {"natural": 2 * (length - 1), "crop": length, "pad": 2 * length + 1}
    return {"natural": length, "crop": max(1, length - 2), "pad": length + 3}


def random(shape, dtype: DType, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if dtype.is_complex:
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype.numpy)


def reference(o: KernelOp, x: np.ndarray) -> np.ndarray:
    widened = x.astype(np.float32) if x.dtype.itemsize == 2 else x
    return np.asarray(OPS[o.op].reference(widened, **o.attr_map)).astype(o.result.dtype.numpy)


# -- replaying a call on the host -------------------------------------------------------------------

def _constants(source: str) -> dict[str, float]:
    found = dict(re.findall(r"\b([A-Z_]+) = (-?\d+)\b", source))
    scale = re.search(r"\bS = (\S+?)f?;", source)[1]
    return {**{k: int(v) for k, v in found.items()}, "S": float.fromhex(scale)}


def stage_on_host(call: FFTCall, x: np.ndarray) -> np.ndarray:
    """The staging kernel's index arithmetic, from the constants it was emitted with: the flat
    buffer cuFFT reads, its padding (never written) NaN."""
    c = _constants(stage_source(call).source)
    i = np.arange(c["TOTAL"])
    j, k, row = i % c["INNER"], (i // c["INNER"]) % c["DST_LEN"], i // (c["INNER"] * c["DST_LEN"])
    src = x.reshape(-1).astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    inside = k < c["SRC_LEN"]
    value = np.where(inside, src[np.where(inside, (row * c["SRC_LEN"] + k) * c["INNER"] + j, 0)], 0).astype(complex)
    if call.hermitian:
        value = np.where((k == 0) | (k == c["HALF"]), value.real, value)
    value = value * c["S"]
    flat = np.full(call.rows * c["ROW_PITCH"], np.nan, complex)
    at = (row * c["INNER"] + j) * c["DST_LEN"] + k if c["AXIS_LAST"] else row * c["ROW_PITCH"] + k * c["INNER"] + j
    flat[at] = value
    return flat if call.staged.dtype.is_complex else flat.real


def unstage_on_host(call: FFTCall, written: np.ndarray) -> np.ndarray:
    """The unstaging kernel's index arithmetic, from its constants: the result's elements."""
    c = _constants(unstage_source(call).source + "S = 0x1p+0;")
    i = np.arange(c["TOTAL"])
    j, k, row = i % c["INNER"], (i // c["INNER"]) % c["LEN"], i // (c["INNER"] * c["LEN"])
    at = (row * c["INNER"] + j) * c["LEN"] + k if c["AXIS_LAST"] else row * c["ROW_PITCH"] + k * c["INNER"] + j
    return written[at]


def _real(t: TensorType) -> bool:
    return not t.dtype.is_complex


def run_on_host(call: FFTCall, x: np.ndarray) -> np.ndarray:
    """What cuFFT computes for `call`: each transform read and written through the described strides,
    each execution starting aligned to a complex element (cuFFT refuses others)."""
    flat = x.reshape(-1) if call.staged is None else stage_on_host(call, x)
    assert flat.size == (x.size if call.staged is None else call.rows * call.in_pitch)
    reads = call.n // 2 + 1 if call.hermitian else call.n
    if call.hermitian:      # what numpy ignores, cuFFT is given as zero (its C2R does not ignore it)
        ignored = [0] + ([call.n // 2] if call.n % 2 == 0 else [])
        if call.axis_last:                                   # rows, inner elements, the axis
            taken = flat.reshape(call.rows, -1, reads)[..., ignored]
        else:                                                # complex rows are never padded
            taken = np.take(flat.reshape(call.staged.shape), ignored, axis=call.axis)
        assert not taken.imag.any()
    writes = call.result.shape[call.axis]
    size = call.rows * call.out_pitch if call.scratch_output else call.result.numel
    out = np.zeros(size, np.complex128)
    written = np.zeros(size, int)
    for loop in range(call.loops):
        if call.loops > 1:
            assert not (_real(call.planned) and loop * call.in_step % 2), f"execution {loop} reads a misaligned start"
            assert not (_real(call.result) and loop * call.out_step % 2), f"execution {loop} writes a misaligned start"
        for b in range(call.batch):
            src = loop * call.in_step + b * call.idist + np.arange(reads) * call.istride
            dst = loop * call.out_step + b * call.odist + np.arange(writes) * call.ostride
            assert src.max() < flat.size and dst.max() < out.size
            v = flat[src]
            assert not np.isnan(v).any(), "a transform reads padding"
            if call.transform in (Transform.R2C, Transform.D2Z):
                y = np.fft.rfft(v)
            elif call.hermitian:
                y = np.fft.irfft(v, call.n) * call.n       # cuFFT's transforms are unnormalized
            else:
                y = np.fft.ifft(v) * call.n if call.inverse else np.fft.fft(v)
            out[dst] = y
            written[dst] += 1
    if call.scratch_output:
        out, written = unstage_on_host(call, out), unstage_on_host(call, written)
    assert (written == 1).all(), "every result element is written exactly once"
    if call.scale_output:
        out *= _constants_scale(call)
    out = out if call.result.dtype.is_complex else out.real
    return out.astype(call.result.dtype.numpy).reshape(call.result.shape)


def _constants_scale(call: FFTCall) -> float:
    literal = re.search(r"\*= (\S+?)f?;", scale_source(call).source)[1]
    return float.fromhex(literal)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("name, dtype, shape, n", [
    ("rfft", DType.float32, (3, 5, 3), 5), ("rfft", DType.bfloat16, (3, 5, 3), 7), ("rfft", DType.float64, (3, 5, 3), 4),
    ("irfft", DType.complex64, (3, 5, 3), 5), ("irfft", DType.complex128, (3, 5, 3), 11),
    ("rfft", DType.float16, (4, 6), 10), ("irfft", DType.complex64, (10, 6, 2), 10),
    ("fft", DType.complex64, (12, 5, 40), 4), ("rfft", DType.bfloat16, (12, 5, 3), 7),
], ids=str)
def test_the_generated_copies_do_what_the_replay_says(name, dtype, shape, n):
    """The staging and unstaging kernels, run by the CPU emulator on buffers of exactly the size the
    runtime allocates (padding poisoned with NaN), against stage_on_host / unstage_on_host, which
    the replay of every call above builds on."""
    call = FFTCall.of(fft_op(name, shape, dtype, n, 1, "ortho"))
    x = random(shape, dtype, seed=3)
    staged = np.full(call.rows * call.in_pitch, np.nan, call.staged.dtype.numpy)
    emulator.build(stage_source(call))([x, staged])
    tol = 1e-15 if call.double else 1e-6
    np.testing.assert_allclose(staged, stage_on_host(call, x).astype(staged.dtype), rtol=tol, atol=tol,
                               equal_nan=True)
    if call.scratch_output:
        written = random((call.rows * call.out_pitch,), call.result.dtype, seed=4)
        out = np.full(call.result.shape, np.nan, call.result.dtype.numpy)
        emulator.build(unstage_source(call))([written, out])
        assert out.tobytes() == unstage_on_host(call, written).reshape(call.result.shape).tobytes()


@pytest.mark.parametrize("name, dtype", SIGNALS, ids=lambda v: str(v))
@pytest.mark.parametrize("shape, axis", LAYOUTS, ids=str)
@pytest.mark.parametrize("case", ["natural", "crop", "pad"])
def test_every_call_computes_the_numpy_transform(name, dtype, shape, axis, case):
    x = random(shape, dtype, seed=axis)
    n = lengths(name, shape[axis])[case]
    for norm in NORMS:
        o = fft_op(name, shape, dtype, n, axis, norm)
        call = FFTCall.of(o)
        want = reference(o, x)
        got = run_on_host(call, x)
        tol = 1e-12 if call.double else 2e-6
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=f"{o}: {call}")


def test_copies_are_made_only_where_cufft_cannot_read_the_operand():
    natural = FFTCall.of(fft_op("rfft", (4, 64), DType.float32, 64, 1, "backward"))
    cropped = FFTCall.of(fft_op("fft", (4, 64), DType.complex64, 48, 1, "backward"))
    assert natural.staged is None and cropped.staged is None and cropped.idist == 64
    padded = FFTCall.of(fft_op("rfft", (4, 64), DType.float32, 100, 1, "backward"))
    assert padded.staged == TensorType((4, 100), DType.float32)
    widened = FFTCall.of(fft_op("rfft", (4, 64), DType.bfloat16, 64, 1, "backward"))
    assert widened.staged == TensorType((4, 64), DType.float32)
    # cuFFT's C2R overwrites what it reads, and the plan may read the spectrum again later
    inverse = FFTCall.of(fft_op("irfft", (4, 33), DType.complex64, 64, 1, "backward"))
    assert inverse.staged == TensorType((4, 33), DType.complex64) and inverse.hermitian


def test_norm_factors_follow_numpy():
    def scale(name, norm):
        return FFTCall.of(fft_op(name, (2, 16), DType.complex64, 16, 1, norm)).scale
    assert [scale("fft", n) for n in NORMS] == [1.0, 0.25, 1 / 16]
    assert [scale("ifft", n) for n in NORMS] == [1 / 16, 0.25, 1.0]
    assert FFTCall.of(fft_op("fft", (2, 16), DType.complex64, 16, 1, "ortho")).scale_output
    assert not FFTCall.of(fft_op("irfft", (2, 9), DType.complex64, 16, 1, "backward")).scale_output  # folded


def test_layouts():
    last = FFTCall.of(fft_op("rfft", (8, 3, 100), DType.float32, 100, 2, "backward"))
    assert (last.batch, last.loops, last.istride, last.idist, last.odist) == (24, 1, 1, 100, 51)
    interleaved = FFTCall.of(fft_op("fft", (4, 16, 64), DType.complex64, 16, 1, "backward"))
    assert (interleaved.batch, interleaved.loops, interleaved.istride, interleaved.idist) == (64, 4, 64, 1)
    assert interleaved.in_step == 16 * 64
    few_inner = FFTCall.of(fft_op("fft", (100, 16, 2), DType.complex64, 16, 1, "backward"))
    assert (few_inner.batch, few_inner.loops, few_inner.idist, few_inner.in_step) == (100, 2, 32, 1)
    double = FFTCall.of(fft_op("irfft", (4, 9), DType.complex128, 16, 1, "backward"))
    assert double.transform is Transform.Z2D and double.double


def test_many_rows_move_the_axis_last_and_run_one_execution():
    assert library_kernels.MAX_EXECUTIONS == 8
    real = FFTCall.of(fft_op("rfft", (10, 6, 2), DType.float32, 6, 1, "backward"))
    assert real.axis_last and real.scratch_output and real.staged == TensorType((10, 6, 2), DType.float32)
    assert (real.batch, real.loops, real.istride, real.idist, real.ostride, real.odist) == (20, 1, 1, 6, 1, 4)
    inverse = FFTCall.of(fft_op("irfft", (12, 5, 40), DType.complex64, 8, 1, "forward"))
    assert inverse.axis_last and (inverse.batch, inverse.idist, inverse.odist) == (480, 5, 8)
    # a complex transform over 40 columns runs interleaved up to 8 rows, then moves the axis last
    assert not FFTCall.of(fft_op("fft", (8, 5, 40), DType.complex64, 5, 1, "backward")).axis_last
    many = FFTCall.of(fft_op("fft", (9, 5, 40), DType.complex64, 5, 1, "ortho"))
    assert many.axis_last and many.loops == 1 and not many.scale_output      # the scale folds into the copy


def test_real_sides_start_every_execution_at_a_complex_element():
    # along a middle axis a real transform runs interleaved, one execution per row, even for few
    # inner columns: one per column would start every other one half a complex element in
    few_inner = FFTCall.of(fft_op("rfft", (8, 6, 2), DType.float32, 6, 1, "backward"))
    assert (few_inner.batch, few_inner.loops, few_inner.in_step, few_inner.staged) == (2, 8, 12, None)
    # rows of odd length are padded by one: the input in its staging copy, the output in a scratch buffer
    odd_in = FFTCall.of(fft_op("rfft", (3, 5, 3), DType.float32, 5, 1, "backward"))
    assert odd_in.staged == TensorType((3, 5, 3), DType.float32) and odd_in.in_step == odd_in.in_pitch == 16
    assert not odd_in.scratch_output and odd_in.out_step == 9
    odd_out = FFTCall.of(fft_op("irfft", (3, 5, 3), DType.complex64, 5, 1, "backward"))
    assert odd_out.in_pitch == 9 and odd_out.scratch_output and odd_out.out_step == odd_out.out_pitch == 16
    # one row needs no padding, and complex transforms never do
    assert FFTCall.of(fft_op("rfft", (1, 5, 3), DType.float32, 5, 1, "backward")).staged is None
    complex_rows = FFTCall.of(fft_op("fft", (3, 5, 3), DType.complex64, 5, 1, "backward"))
    assert (complex_rows.in_step, complex_rows.out_step, complex_rows.staged) == (15, 15, None)


def test_unsupported_calls_say_why():
    fp8 = TensorType((4, 16), DType.float8_e4m3)
    o = KernelOp.of("rfft", (fp8,), TensorType((4, 9), DType.complex64), n=16, axis=1, norm="backward")
    with pytest.raises(LibraryCallError, match="float8_e4m3") as e:
        FFTCall.of(o)
    assert "cast to float32" in str(e.value)
    t = TensorType((4,), DType.float32)
    with pytest.raises(LibraryCallError, match="not a cuFFT transform"):
        FFTCall.of(KernelOp.of("exp", (t,), t))


@pytest.mark.parametrize("name, dtype, shape, n, axis", [
    ("rfft", DType.bfloat16, (3, 8, 5), 10, 1), ("rfft", DType.float16, (2, 40), 64, 1),
    ("fft", DType.float32, (6, 7), 7, 0), ("irfft", DType.complex64, (2, 64, 2560), 5119, 2),
    ("irfft", DType.complex128, (4, 6), 10, 1), ("rfft", DType.float64, (4, 6), 12, 1),
    ("irfft", DType.complex128, (3, 5, 3), 5, 1), ("fft", DType.complex128, (12, 5, 40), 5, 1),
])
def test_the_kernels_around_the_call_compile_for_sm_90(name, dtype, shape, n, axis):
    call = FFTCall.of(fft_op(name, shape, dtype, n, axis, "ortho"))
    sources = [stage_source(call)] if call.staged is not None else []
    sources += [scale_source(call)] if call.scale_output else []
    sources += [unstage_source(call)] if call.scratch_output else []
    assert sources
    for source in sources:
        assert source.source.startswith("// fft ")
        compiled = compile_cuda(source, "sm_90")
        assert compiled.registers > 0 and compiled.spill_bytes == 0


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

@op.kernel
def long_conv(x, w):
    return op.conv1d(x, w, padding="same")


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


# -- on a GPU ---------------------------------------------------------------------------------------

def _cufft_or_skip():
    pytest.importorskip("nvmath")
    if not library_available("cuFFT"):
        pytest.skip(library_kernels._runtime("cuFFT")[1])


@pytest.mark.gpu
@pytest.mark.parametrize("name, dtype", SIGNALS, ids=lambda v: str(v))
@pytest.mark.parametrize("shape, axis", [((4, 5, 6), 0), ((4, 5, 6), 2), ((10, 6, 2), 1), ((3, 5, 3), 1), ((3, 2049), 1),
                                         ((12, 5, 40), 1)], ids=str)
@pytest.mark.parametrize("case, norm", [("natural", "backward"), ("crop", "ortho"), ("pad", "forward")])
def test_cufft_matches_numpy(name, dtype, shape, axis, case, norm):
    from tessera_rw.codegen.device import resolve_stream
    from tessera_rw.codegen.device_arrays import empty_like_kind, to_device, to_host
    _cufft_or_skip()
    stream = resolve_stream(None, 0)
    x = random(shape, dtype, seed=7)       # irfft's spectra have imaginary parts at 0 and n/2 too
    o = fft_op(name, shape, dtype, lengths(name, shape[axis])[case], axis, norm)
    xd = to_device(x, stream)
    y, _ = empty_like_kind("cuda", o.result.shape, o.result.dtype, None, stream)
    CuFFTKernel(FFTCall.of(o), 0)([xd, y], stream)
    got, after = to_host(y, stream), to_host(xd, stream)
    want = reference(o, x)
    tol = 1e-10 if o.result.dtype in (DType.float64, DType.complex128) else 1e-4
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=str(o))
    assert np.array_equal(after.view(np.uint8), x.view(np.uint8)), "the operand is left as it was"


@pytest.mark.gpu
def test_the_fft_convolution_runs_on_cufft_and_matches_the_numpy_executor(monkeypatch):
    from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
    _cufft_or_skip()
    monkeypatch.setenv("TESSERA_DEVICE", "gpu")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 64, 4096)).astype(np.float32)
    w = rng.standard_normal((64, 64, 1024)).astype(np.float32)
    program = long_conv.program(x, w)
    assert any(b.is_library for b in bind_plan(program.plan, program.arch)), "the FFT path was chosen"
    got = long_conv(x, w)
    again = long_conv(x, w)
    want = run_plan_on_cpu(program.plan, dict(zip(program.graph.input_names, (x, w))))[0]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, atol=2e-4 * scale, rtol=1e-3)
    assert np.array_equal(got, again)


@pytest.mark.gpu
def test_bfloat16_signals_are_widened_on_the_device():
    from tessera_rw.codegen.device import resolve_stream
    from tessera_rw.codegen.device_arrays import empty_like_kind, to_device, to_host
    _cufft_or_skip()
    stream = resolve_stream(None, 0)
    x = random((4, 1000), DType.float32).astype(ml_dtypes.bfloat16)
    o = fft_op("rfft", x.shape, DType.bfloat16, 1000, 1, "backward")
    y, _ = empty_like_kind("cuda", o.result.shape, o.result.dtype, None, stream)
    CuFFTKernel(FFTCall.of(o), 0)([to_device(x, stream), y], stream)
    np.testing.assert_allclose(to_host(y, stream), np.fft.rfft(x.astype(np.float32)), atol=1e-3, rtol=1e-4)
