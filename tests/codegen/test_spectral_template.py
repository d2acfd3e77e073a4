"""The spectral convolution's kernels: the generated frequency-domain contraction (compiles for sm_80
and sm_90 without spills, register estimate within 25% of ptxas, sane resources) and the cuFFT
transforms (a library call: modelled, never emitted). Also the FLOP and byte facts the cost model
builds its direct-versus-FFT choice on."""

from __future__ import annotations

import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import KNOWN_ARCHS, MathUnit, arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.conv import DirectConvTemplate
from tessera_rw.codegen.templates.conv_problem import conv_op
from tessera_rw.codegen.templates.spectral import (CuFFTSchedule, FFTTemplate, LibraryKernelError,
                                                   SpectralContractTemplate, spectral_op)

T = SpectralContractTemplate()
FFT = FFTTemplate()
SAMPLES = T.samples()
ARCHS = (arch_named("A100-SXM"), arch_named("H100-SXM"))
H100 = arch_named("h100")


def fft(name: str, x: TensorType, n: int, axis: int) -> KernelOp:
    attrs = dict(n=n, axis=axis, norm="backward")
    return KernelOp.of(name, (x,), OPS[name].infer(x, **attrs), **attrs)



@pytest.mark.parametrize("op", SAMPLES, ids=str)
def test_contract_resources_cover_the_work(op):
    n, o = op.result.shape[:2]
    freqs = op.result.numel // (n * o)
    for arch in KNOWN_ARCHS:
        schedules = T.schedules(op, arch)
        assert schedules, arch.name
        for s in schedules:
            r = T.resources(op, s, arch)
            assert r.flops >= op.flops and r.unit is MathUnit.FP32 and 0 < r.efficiency <= 1
            assert r.hbm_bytes >= op.operand_bytes + op.result.nbytes
            per_block = s.threads * s.freq_per_thread * s.out_channels_per_block * s.batch_per_block
            assert r.blocks * per_block >= n * o * freqs


def test_contract_accepts_only_complex64():
    assert T.accepts(spectral_op((2, 4, 9), (8, 4, 9)))
    c128 = TensorType((2, 4, 9), DType.complex128)
    assert not T.accepts(KernelOp.of("spectral_contract", (c128, c128), c128, groups=1))


def test_fft_is_a_library_kernel():
    op = fft("rfft", TensorType((16, 64, 2112), DType.float32), 2112, 2)
    assert FFT.kind_of(op) == "fft" and FFT.kind_of(fft("irfft", op.result, 2112, 2)) == "ifft"
    assert FFT.kind_of(fft("ifft", op.result, 1057, 2)) == "ifft" and FFT.samples() == ()
    with pytest.raises(LibraryKernelError, match="cuFFT"):
        FFT.emit(op, FFT.schedules(op, H100)[0], H100)
    r = FFT.resources(op, CuFFTSchedule(), H100)
    assert r.flops == op.flops and r.unit is MathUnit.FP32
    assert r.hbm_bytes == op.operand_bytes + op.result.nbytes     # one pass: 2112 points fit a block


def test_long_transforms_take_two_passes():
    op = fft("fft", TensorType((8, 1 << 20), DType.complex64), 1 << 20, 1)
    assert FFT.passes(op, H100) == 2
    assert FFT.resources(op, CuFFTSchedule(), H100).hbm_bytes == 2 * (op.operand_bytes + op.result.nbytes)
    assert FFT.passes(fft("fft", TensorType((1 << 20, 8), DType.complex64), 1 << 20, 0), H100) == 2


def test_fft_traffic_counts_the_copies_around_the_call():
    h100 = arch_named("h100")

    def traffic(name, shape, dtype, n, axis):
        x = TensorType(shape, dtype)
        attrs = dict(n=n, axis=axis, norm="backward")
        op = KernelOp.of(name, (x,), OPS[name].infer(x, **attrs), **attrs)
        return op, FFTTemplate().resources(op, CuFFTSchedule(), h100).hbm_bytes

    # read as it is: one pass over the operand and the result
    op, plain = traffic("rfft", (8, 4096), DType.float32, 4096, 1)
    assert plain == op.operands[0].nbytes + op.result.nbytes
    # zero-padded to n: the copy writes the padded float32 rows, cuFFT reads them
    op, padded = traffic("rfft", (8, 64), DType.bfloat16, 4096, 1)
    staged = 8 * 4096 * 4
    assert padded == (op.operands[0].nbytes + staged) + (staged + op.result.nbytes)
    # a C2R input is copied first (cuFFT overwrites it)
    op, inverse = traffic("irfft", (8, 2049), DType.complex64, 4096, 1)
    x, y = op.operands[0].nbytes, op.result.nbytes
    assert inverse == (x + x) + (x + y)
    # the axis moved last: the result comes back through a scratch copy
    op, moved = traffic("fft", (16, 64, 40), DType.complex64, 64, 1)
    x, y = op.operands[0].nbytes, op.result.nbytes
    assert moved == (x + x) + (x + y) + (y + y)


def test_fft_accepts_real_and_complex_floats_but_not_fp8():
    assert FFT.accepts(fft("rfft", TensorType((4, 64), DType.bfloat16), 64, 1))
    assert FFT.accepts(fft("fft", TensorType((4, 64), DType.complex128), 64, 1))
    assert not FFT.accepts(fft("rfft", TensorType((4, 64), DType.float8_e4m3), 64, 1))


# ---- the facts behind "direct for 3-tap kernels, FFT for long ones" --------------------------

def _cost(template, op) -> tuple[int, float]:
    """(executed FLOPs, seconds at the unit's reachable peak) under the first default schedule."""
    r = template.resources(op, template.schedules(op, H100)[0], H100)
    return r.flops, r.flops / (H100.peak_flops(r.unit) * r.efficiency)


def _conv1d_fft_path(b, c, length, o, k, lo, hi, dtype) -> list[tuple[object, KernelOp]]:
    padded = length + lo + hi
    xf = fft("rfft", TensorType((b, c, padded), dtype), padded, 2)
    wf = fft("rfft", TensorType((o, c, k), dtype), padded, 2)
    yf = spectral_op(xf.result.shape, wf.result.shape)
    return [(FFT, xf), (FFT, wf), (T, yf), (FFT, fft("irfft", yf.result, padded, 2))]


def test_a_three_tap_conv1d_is_cheaper_direct():
    direct_flops, direct_s = _cost(DirectConvTemplate(), conv_op((16, 64, 2048), (64, 64, 3), DType.bfloat16,
                                                                 padding=((1, 1),)))
    path = [_cost(t, op) for t, op in _conv1d_fft_path(16, 64, 2048, 64, 3, 1, 1, DType.bfloat16)]
    # In FLOPs the two are close (the contraction alone is 2/3 of the direct count at k=3); the
    # direct conv's FLOPs run on tensor cores, the FFT path's on the FP32 pipe.
    assert direct_flops < sum(f for f, _ in path)
    assert 5 * direct_s < sum(s for _, s in path)


def test_a_long_conv1d_kernel_contracts_far_fewer_flops_in_the_spectrum():
    conv = conv_op((16, 64, 2048), (64, 64, 64), DType.bfloat16, padding=((32, 32),))
    contract = _conv1d_fft_path(16, 64, 2048, 64, 64, 32, 32, DType.bfloat16)[2][1]
    assert contract.operands[0].shape == (16, 64, 1057)
    assert DirectConvTemplate().resources(conv, DirectConvTemplate().schedules(conv, H100)[0], H100).flops \
        > 10 * _cost(T, contract)[0]


def test_a_31x31_conv2d_contracts_far_fewer_flops_in_the_spectrum():
    conv = conv_op((8, 64, 64, 64), (64, 64, 31, 31), DType.bfloat16, padding=((15, 15), (15, 15)))
    contract = spectral_op((8, 64, 94, 48), (64, 64, 94, 48))         # rfft over width, fft over height
    assert _cost(DirectConvTemplate(), conv)[0] > 100 * _cost(T, contract)[0]
