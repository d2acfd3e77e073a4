"""The kernels tessera_rw generates around a cuFFT call (library_kernels.py): the staging copy of
the operand into the buffer cuFFT reads (crop or zero-pad to n, widen 16-bit or real input, clear
the imaginary parts a real inverse ignores, fold in the norm factor, pad rows for alignment), the
copy of padded output rows into the result, and the in-place scale of the output.

Each is a grid-stride loop over the elements, its constants from the FFTCall it serves.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType  # noqa: F401  (doctests)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp  # noqa: F401  (doctests)

if TYPE_CHECKING:
    from tessera_rw.codegen.library_kernels import FFTCall

_THREADS = 256
_MAX_BLOCKS = 1 << 16     # a grid-stride loop covers the rest: many waves on any GPU already
_STRUCTS = ("struct __align__(8) fft_c64 { float re, im; };\n"
            "struct __align__(16) fft_c128 { double re, im; };\n")
_CTYPE = {DType.float32: "float", DType.float64: "double", DType.bfloat16: "bf16_t", DType.float16: "f16_t",
          DType.complex64: "fft_c64", DType.complex128: "fft_c128"}
_WIDEN = {DType.bfloat16: "bf16_to_f32(v)", DType.float16: "f16_to_f32(v)"}


def _literal(value: float, double: bool) -> str:
    """An exact C++17 hexadecimal literal: the factor the kernel multiplies by is the one we chose."""
    return value.hex() if double else float(np.float32(value)).hex() + "f"


def _grid(total: int) -> tuple[int, int, int]:
    return (max(1, min(-(-total // _THREADS), _MAX_BLOCKS)), 1, 1)


def stage_source(call: FFTCall) -> KernelSource:
    """The copy of the operand into the dense buffer cuFFT reads (see FFTCall.staged).

    >>> from tessera_rw.codegen.library_kernels import FFTCall
    >>> spectrum = TensorType((8, 33), DType.complex64)
    >>> op = KernelOp.of("irfft", (spectrum,), TensorType((8, 64), DType.float32), n=64, axis=1, norm="backward")
    >>> stage_source(FFTCall.of(op)).name
    'fft_stage_c64_c64'
    """
    assert call.staged is not None
    src, dst, axis = call.source, call.staged, call.axis
    real = "double" if call.double else "float"
    load = "re = v.re; im = v.im;" if src.dtype.is_complex else f"re = {_WIDEN.get(src.dtype, 'v')};"
    store = (f"{_CTYPE[dst.dtype]} r; r.re = re * S; r.im = im * S; dst[$AT] = r;" if dst.dtype.is_complex
             else "dst[$AT] = re * S;")
    half = call.n // 2 if call.n % 2 == 0 else -1
    clear = "if (k == 0 || k == HALF) im = 0;  // numpy's irfft ignores these\n        " if call.hermitian else ""
    extra = (f"constexpr long long SRC_LEN = {src.shape[axis]}, HALF = {half};\n"
             f"constexpr {real} S = {_literal(call.scale, call.double)};\n")
    body = f"""{real} re = 0, im = 0;
        if (k < SRC_LEN) {{ const {_CTYPE[src.dtype]} v = src[(row * SRC_LEN + k) * INNER + j]; {load} }}
        {clear}{store}"""
    return _row_walk(f"fft_stage_{src.dtype.short}_{dst.dtype.short}",
                     f"// fft staging for {call.op}: {src} -> {dst} along axis {axis}, scaled by {call.scale!r}",
                     call, dst, call.in_pitch, "DST_LEN", extra, (("src", src.dtype), ("dst", dst.dtype)), body)


def unstage_source(call: FFTCall) -> KernelSource:
    """The copy of cuFFT's scratch output (padded rows, or the axis last) into the result (see
    FFTCall.scratch_output).

    >>> from tessera_rw.codegen.library_kernels import FFTCall
    >>> spectrum = TensorType((3, 5, 3), DType.complex64)
    >>> call = FFTCall.of(KernelOp.of("irfft", (spectrum,), TensorType((3, 5, 5), DType.float32), n=5, axis=2,
    ...                              norm="backward"))
    >>> call.scratch_output
    False
    >>> call = FFTCall.of(KernelOp.of("irfft", (spectrum,), TensorType((3, 5, 3), DType.float32), n=5, axis=1,
    ...                              norm="backward"))
    >>> call.scratch_output, call.out_pitch, unstage_source(call).name
    (True, 16, 'fft_unstage_f32')
    """
    assert call.scratch_output
    out, axis = call.result, call.axis
    return _row_walk(f"fft_unstage_{out.dtype.short}", f"// fft unstaging for {call.op}: rows of {call.out_pitch} "
                     f"elements -> {out}, along axis {axis}", call, out, call.out_pitch, "LEN", "",
                     (("src", out.dtype), ("y", out.dtype)), "y[i] = src[$AT];")


def _row_walk(name: str, comment: str, call: FFTCall, walked: TensorType, pitch: int, length: str, extra: str,
              params: tuple[tuple[str, DType], tuple[str, DType]], body: str) -> KernelSource:
    """A kernel `name(const src*, dst*)` walking the elements of `walked` in a grid-stride loop, each
    element i split into (row, k along the axis, j among the inner elements) by the INNER and
    `length` constants, running `body` with `$AT` standing for the element's index in the padded
    buffer: rows `pitch` apart, or each transform contiguous when the axis is moved last.
    `extra` declares the kernel's own constants."""
    (src, src_dtype), (dst, dst_dtype) = params
    total, axis = walked.numel, call.axis
    at = f"(row * INNER + j) * {length} + k" if call.axis_last else "row * ROW_PITCH + k * INNER + j"
    config = f"""{_STRUCTS}namespace {name}_config {{
constexpr long long INNER = {math.prod(walked.shape[axis + 1:])}, {length} = {walked.shape[axis]};
constexpr long long TOTAL = {total}, ROW_PITCH = {pitch}, AXIS_LAST = {int(call.axis_last)};
{extra}}}"""
    body = body.replace("$AT", at)
    source = f"""{comment}
// launch: {name}({src}, {dst}); grid={_grid(total)}, block=({_THREADS})
{config}
extern "C" __global__ void __launch_bounds__({_THREADS}) {name}(const {_CTYPE[src_dtype]}* __restrict__ {src},
                                                          {_CTYPE[dst_dtype]}* __restrict__ {dst}) {{
    using namespace {name}_config;
    for (long long i = (long long)blockIdx.x * {_THREADS} + threadIdx.x; i < TOTAL;
         i += (long long)gridDim.x * {_THREADS}) {{
        const long long j = i % INNER, k = (i / INNER) % {length}, row = i / (INNER * {length});
        {body}
    }}
}}
"""
    return KernelSource(name, source, threads=_THREADS, grid=_grid(total))


def scale_source(call: FFTCall) -> KernelSource:
    """The in-place multiply of the result by the norm factor, when no staging copy took it.

    >>> from tessera_rw.codegen.library_kernels import FFTCall
    >>> x = TensorType((8, 64), DType.complex64)
    >>> call = FFTCall.of(KernelOp.of("fft", (x,), x, n=64, axis=1, norm="ortho"))
    >>> call.scale_output, scale_source(call).grid
    (True, (4, 1, 1))
    """
    real = "double" if call.double else "float"
    count = call.result.numel * (2 if call.result.dtype.is_complex else 1)
    name = f"fft_scale_{call.result.dtype.short}"
    source = f"""// fft scale for {call.op}: {call.result} times {call.scale!r}
// launch: {name}(y); grid={_grid(count)}, block=({_THREADS})
extern "C" __global__ void __launch_bounds__({_THREADS}) {name}({real}* __restrict__ y) {{
    for (long long i = (long long)blockIdx.x * {_THREADS} + threadIdx.x; i < {count}LL;
         i += (long long)gridDim.x * {_THREADS})
        y[i] *= {_literal(call.scale, call.double)};
}}
"""
    return KernelSource(name, source, threads=_THREADS, grid=_grid(count))
