"""FFT steps as cuFFT calls: every layout an FFTCall describes is replayed here element by element,
the staging copy from its emitted constants, and checked against the op's numpy reference; the
kernels around the call compile for sm_90. On a GPU with nvmath-python: cuFFT against numpy, and the
whole FFT convolution against the numpy executor."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import emulator, library_kernels
from tessera_rw.codegen.compile import compile_cuda
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.library_kernels import (CuFFTKernel, FFTCall, LibraryCallError, Transform, library_available,
                                                scale_source, stage_source, unstage_source)
from tessera_rw.codegen.plan_binding import bind_plan
from tests.codegen.cufft_replay import (LAYOUTS, NORMS, SIGNALS, fft_op, lengths, random, reference,
                                        long_conv, run_on_host, stage_on_host, unstage_on_host)


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
    y, _ = empty_like_kind("cuda", o.result.shape, o.result.dtype, stream)
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
    y, _ = empty_like_kind("cuda", o.result.shape, o.result.dtype, stream)
    CuFFTKernel(FFTCall.of(o), 0)([to_device(x, stream), y], stream)
    np.testing.assert_allclose(to_host(y, stream), np.fft.rfft(x.astype(np.float32)), atol=1e-3, rtol=1e-4)
