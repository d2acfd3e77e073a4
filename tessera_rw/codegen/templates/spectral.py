"""The kernels of a spectral convolution: the frequency-domain channel contraction we generate, and
the FFTs themselves, which run on cuFFT.

spectral_contract is, per frequency f, a small complex matrix product
y[:, :, f] = X_f · W_fᴴ (N x C/g times C/g x O/g per group): no reuse across frequencies, so a
block takes a run of frequencies (one per thread, coalesced) and a tile of batch items x output
channels, keeps those complex accumulators in registers and streams the input channels.

>>> from tessera_rw.codegen.arch import arch_named
>>> op = spectral_op((16, 64, 1057), (64, 64, 1057))
>>> SpectralContractTemplate().schedules(op, arch_named("h100"))[0].describe()
'threads=128 freq_per_thread=1 out_channels_per_block=8 batch_per_block=4'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import ArchSpec, MathUnit, WARP_SIZE
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space

_COMPLEX_MAC_FLOPS = 8          # (a+bi)·conj(c+di) accumulated: four FMAs
_FLOATS_PER_COMPLEX = 2
# The contraction is four FMAs per complex multiply-add fed by (batch + out channels) loads per input
# channel; the loads hit L1/L2 at best, so the FMA pipe stays partly idle.
_CONTRACT_EFFICIENCY = 0.7
_BLOCKS_IN_FLIGHT_SHARE = 2   # an SM typically holds about half its warp slots' worth of these blocks
_CONTRACT_ADDRESSING = 24       # tile origin, 64-bit x/w/y bases, channel counter, predicates, one w value
_SINGLE_CHANNEL_ADDRESSING = 14  # the same without the channel loop (one input channel per group)
_MAX_INDEX = 2**31 - 1


@dataclass(frozen=True)
class SpectralSchedule(Schedule):
    """A block: threads x freq_per_thread frequencies, out_channels_per_block x batch_per_block
    (output channel, batch item) pairs per frequency, each thread holding all of them."""
    threads: int
    freq_per_thread: int
    out_channels_per_block: int
    batch_per_block: int


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class _Contract:
    n: int
    c: int
    o: int
    f: int
    groups: int

    @classmethod
    def of(cls, op: KernelOp) -> _Contract:
        x, w = op.operands
        return cls(n=x.shape[0], c=x.shape[1], o=w.shape[0], f=math.prod(x.shape[2:]), groups=op.attr_map["groups"])

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups


# (threads, freq_per_thread, out_channels_per_block, batch_per_block), best first
_CANDIDATES = ((128, 1, 8, 4), (256, 1, 4, 4), (128, 2, 8, 2))
# The tuning grid (space()), each field's values; tiles are clipped to the op like the defaults.
# Narrower output-channel tiles leave too few accumulators to hide the loads behind: ptxas then
# allocates a third less than the register model says, and spills at times (sm_90).
_GRID = ((64, 128, 256), (1, 2), (8, 16), (1, 2, 4, 8))


class SpectralContractTemplate(Template):
    kind = "gemm"     # per frequency a complex GEMM: Y_f (N x O) = X_f (N x C) · W_f^H (C x O)
    ops = frozenset({"spectral_contract"})

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops:
            return False
        x, w = op.operands
        # complex128 would need the FP64 pipe and a second code path; the executor covers it
        return (x.dtype == w.dtype == op.result.dtype == DType.complex64
                and max(x.numel, w.numel, op.result.numel) <= _MAX_INDEX)

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return ("complex", "conj", "per_frequency")

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[SpectralSchedule, ...]:
        sc = _Contract.of(op)
        found: list[SpectralSchedule] = []
        for threads, fpt, ob, nb in _CANDIDATES:
            # a tile wider than the op only computes padding: clip it (this may repeat a candidate)
            s = SpectralSchedule(threads, fpt, min(ob, sc.og), min(nb, sc.n))
            if s not in found and self._registers(s, sc) <= arch.register_limit(threads):
                found.append(s)
        return tuple(found[:3])

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[SpectralSchedule, ...]:
        sc = _Contract.of(op)
        grid = (SpectralSchedule(t, fpt, min(ob, sc.og), min(nb, sc.n)) for t in _GRID[0] for fpt in _GRID[1]
                for ob in _GRID[2] for nb in _GRID[3])
        return grid_space(self.schedules(op, arch), grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        s = schedule
        return (isinstance(s, SpectralSchedule) and self.accepts(op) and s.threads % 32 == 0
                and 0 < s.threads <= arch.max_threads_per_block
                and min(s.freq_per_thread, s.out_channels_per_block, s.batch_per_block) >= 1
                and self._registers(s, _Contract.of(op)) <= arch.register_limit(s.threads))

    @staticmethod
    def _registers(s: SpectralSchedule, sc: _Contract) -> int:
        """Complex accumulators + one channel's x values (w values stream through, one at a time).
        With one input channel per group (depthwise) the channel loop runs once and nothing
        accumulates: each product is stored as it is made, and what stays live is the x values
        and the w values of the other output channels."""
        if sc.cg == 1:
            live = s.batch_per_block + 2 * (s.out_channels_per_block - 1)
            return _FLOATS_PER_COMPLEX * s.freq_per_thread * live + _SINGLE_CHANNEL_ADDRESSING
        per_freq = s.batch_per_block * s.out_channels_per_block + s.batch_per_block
        return _FLOATS_PER_COMPLEX * s.freq_per_thread * per_freq + _CONTRACT_ADDRESSING

    def _tiles(self, sc: _Contract, s: SpectralSchedule) -> tuple[int, int, int]:
        """(frequency, output-channel per group, batch) tile counts."""
        return (_cdiv(sc.f, s.threads * s.freq_per_thread), _cdiv(sc.og, s.out_channels_per_block),
                _cdiv(sc.n, s.batch_per_block))

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        assert isinstance(schedule, SpectralSchedule)
        sc, s = _Contract.of(op), schedule
        tf, to, tn = self._tiles(sc, s)
        x_bytes, w_bytes = (t.nbytes for t in op.operands)
        # Batch tiles vary fastest in the grid and frequency tiles slowest, so the blocks sharing a
        # w tile run together and w leaves HBM once, and the blocks in flight read x only at their
        # few frequency tiles: every output-channel tile re-reads x from L2 unless that slab of x
        # exceeds half of it.
        in_flight = arch.sm_count * max(1, arch.max_warps_per_sm * WARP_SIZE // s.threads // _BLOCKS_IN_FLIGHT_SHARE)
        freq_tiles_in_flight = -(-in_flight // (to * tn * sc.groups))
        slab = x_bytes * min(1.0, freq_tiles_in_flight * s.threads * s.freq_per_thread / sc.f)
        x_traffic = x_bytes * (to if slab > arch.l2_bytes // 2 else 1)
        registers = self._registers(s, sc)
        return Resources(
            threads=s.threads, blocks=tf * to * tn * sc.groups, registers=registers, smem_bytes=0,
            hbm_bytes=x_traffic + w_bytes + op.result.nbytes,
            flops=_COMPLEX_MAC_FLOPS * (tn * s.batch_per_block) * (to * s.out_channels_per_block) * sc.groups
            * sc.cg * (tf * s.threads * s.freq_per_thread),
            unit=MathUnit.FP32, efficiency=_CONTRACT_EFFICIENCY,
            spill_bytes=4 * max(0, registers - arch.register_limit(s.threads)))

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        assert isinstance(schedule, SpectralSchedule)
        sc, s = _Contract.of(op), schedule
        tf, to, tn = self._tiles(sc, s)
        name = (f"spectral_contract_{s.threads}t_f{s.freq_per_thread}_o{s.out_channels_per_block}"
                f"_n{s.batch_per_block}")
        consts = (f"constexpr int N = {sc.n}, C = {sc.c}, O = {sc.o}, CG = {sc.cg}, OG = {sc.og}, "
                  f"GROUPS = {sc.groups}, F = {sc.f};\n"
                  f"constexpr int THREADS = {s.threads}, FPT = {s.freq_per_thread}, "
                  f"OB = {s.out_channels_per_block}, NB = {s.batch_per_block}, NT = {tn}, OT = {to};\n")
        header = (f"// {op}\n// schedule: {s.describe()}\n"
                  f"// complex64 operands as interleaved (re, im) float pairs\n"
                  f"// launch: {name}(x, w, y); grid=({tf * to * tn * sc.groups}), block=({s.threads})\n")
        body = (_CONTRACT.replace("NAME(", f"{name}(", 1).replace("THREADS)", f"{s.threads})", 1)
                .replace("CONFIG", f"{name}_config"))
        return KernelSource(name, header + f"namespace {name}_config {{\n{consts}}}\n" + body, threads=s.threads,
                            grid=(tf * to * tn * sc.groups, 1, 1), fast_math=op.numerics is Numerics.FAST)

    def samples(self) -> tuple[KernelOp, ...]:
        return (spectral_op((16, 64, 1057), (64, 64, 1057)),
                spectral_op((8, 64, 94, 48), (128, 16, 94, 48), groups=4),
                spectral_op((4, 96, 1025), (96, 1, 1025), groups=96))       # depthwise, as a long conv


_CONTRACT = r"""
using namespace CONFIG;
struct __align__(8) spectral_cf { float re, im; };

extern "C" __global__ void __launch_bounds__(THREADS) NAME(const spectral_cf* __restrict__ x,
                                                           const spectral_cf* __restrict__ w,
                                                           spectral_cf* __restrict__ y) {
    // Batch tiles vary fastest: the NT blocks that read one w tile are scheduled side by side.
    int bid = blockIdx.x;
    const int nt = bid % NT; bid /= NT;
    const int ot = bid % OT; bid /= OT;
    const int g = bid % GROUPS, ft = bid / GROUPS;
    const int n0 = nt * NB, o0 = ot * OB, f0 = ft * THREADS * FPT + threadIdx.x;
    const spectral_cf* xg = x + ((long long)n0 * C + g * CG) * F;
    const spectral_cf* wg = w + ((long long)(g * OG + o0) * CG) * F;

    float acc_re[NB][OB][FPT] = {}, acc_im[NB][OB][FPT] = {};
    #pragma unroll 1
    for (int c = 0; c < CG; ++c) {
        spectral_cf xv[NB][FPT];
        #pragma unroll
        for (int b = 0; b < NB; ++b)
            #pragma unroll
            for (int i = 0; i < FPT; ++i) {
                const int f = f0 + i * THREADS;
                spectral_cf v = {0.f, 0.f};
                if (n0 + b < N && f < F) v = xg[((long long)b * C + c) * F + f];
                xv[b][i] = v;
            }
        #pragma unroll
        for (int o = 0; o < OB; ++o)
            #pragma unroll
            for (int i = 0; i < FPT; ++i) {
                const int f = f0 + i * THREADS;
                spectral_cf v = {0.f, 0.f};
                if (o0 + o < OG && f < F) v = wg[((long long)o * CG + c) * F + f];
                #pragma unroll
                for (int b = 0; b < NB; ++b) {     // x · conj(w)
                    acc_re[b][o][i] = fmaf(xv[b][i].re, v.re, fmaf(xv[b][i].im, v.im, acc_re[b][o][i]));
                    acc_im[b][o][i] = fmaf(xv[b][i].im, v.re, fmaf(-xv[b][i].re, v.im, acc_im[b][o][i]));
                }
            }
    }
    #pragma unroll
    for (int b = 0; b < NB; ++b)
        #pragma unroll
        for (int o = 0; o < OB; ++o)
            #pragma unroll
            for (int i = 0; i < FPT; ++i) {
                const int f = f0 + i * THREADS;
                if (n0 + b < N && o0 + o < OG && f < F) {
                    spectral_cf r = {acc_re[b][o][i], acc_im[b][o][i]};
                    y[((long long)(n0 + b) * O + g * OG + o0 + o) * F + f] = r;
                }
            }
}
"""


def spectral_op(x: tuple[int, ...], w: tuple[int, ...], groups: int = 1) -> KernelOp:
    """A complex64 spectral_contract KernelOp from the two spectra's shapes.

    >>> spectral_op((2, 4, 9), (8, 4, 9)).result.shape
    (2, 8, 9)
    """
    operands = (TensorType(x, DType.complex64), TensorType(w, DType.complex64))
    return KernelOp.of("spectral_contract", operands, OPS["spectral_contract"].infer(*operands, groups=groups),
                       groups=groups)


# ---- FFTs: library kernels ---------------------------------------------------------------

class LibraryKernelError(TesseraError):
    """The kernel is a library call (cuFFT): there is no generated source to emit."""


@dataclass(frozen=True)
class CuFFTSchedule(Schedule):
    """cuFFT plans its own kernels; nothing is tunable from here."""


_INVERSE = frozenset({"ifft", "irfft"})
_CUFFT_DTYPES = frozenset({DType.float32, DType.complex64, DType.float64, DType.complex128})
# 16-bit real signals are widened to float32 first (as torch.fft does for bfloat16): one more pass.
_WIDENED = frozenset({DType.bfloat16, DType.float16})
# cuFFT does a transform in one kernel while it fits a block's shared memory; beyond that it runs a
# four-step FFT (two passes over HBM). Its single-kernel sizes top out around 16K points.
_CUFFT_SINGLE_PASS_POINTS = 16384
_CUFFT_THREADS = 256
_CUFFT_POINTS_PER_BLOCK = 4096   # a block works on about this many points per pass
_CUFFT_REGISTERS = 64            # a typical cuFFT kernel's count; ours to report, not ours to choose
# Of the bandwidth-bound roofline: the FFT passes are streaming reads and writes with twiddle math.
_CUFFT_EFFICIENCY = 0.8


class FFTTemplate(Template):
    """rfft / irfft / fft / ifft along one axis: a cuFFT call, modelled as memory-bound passes.

    >>> from tessera_rw.codegen.arch import arch_named
    >>> x = TensorType((16, 64, 2112), DType.float32)
    >>> op = KernelOp.of("rfft", (x,), TensorType((16, 64, 1057), DType.complex64), n=2112, axis=2, norm="backward")
    >>> FFTTemplate().kind_of(op), FFTTemplate().resources(op, CuFFTSchedule(), arch_named("h100")).hbm_bytes
    ('fft', 17309696)
    """

    kind = "fft"
    ops = frozenset({"rfft", "irfft", "fft", "ifft"})
    library = "cuFFT"

    def accepts(self, op: KernelOp) -> bool:
        return op.op in self.ops and op.operands[0].dtype in _CUFFT_DTYPES | _WIDENED

    def kind_of(self, op: KernelOp) -> str:
        return "ifft" if op.op in _INVERSE else "fft"

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return ()

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[CuFFTSchedule, ...]:
        return (CuFFTSchedule(),)

    @staticmethod
    def passes(op: KernelOp, arch: ArchSpec) -> int:
        """1 when one transform of n complex points fits a block's shared memory, else 2 (four-step)."""
        n = op.attr_map["n"]
        complex_bytes = 16 if op.result.dtype in (DType.float64, DType.complex128) else 8
        return 1 if n <= _CUFFT_SINGLE_PASS_POINTS and n * complex_bytes <= arch.smem_per_block else 2

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        """cuFFT's passes over what it reads and writes, and the copies the runtime makes around the
        call (library_kernels.FFTCall): staging (widening, padding, a C2R input, the axis moved
        last), unstaging a scratch output, scaling in place."""
        from tessera_rw.codegen.library_kernels import FFTCall
        x, result = op.operands[0], op.result
        n, axis = op.attr_map["n"], op.attr_map["axis"]
        batch = x.numel // max(x.shape[axis], 1)          # every axis but the transformed one
        passes = self.passes(op, arch)
        double = x.dtype in (DType.float64, DType.complex128)
        call = FFTCall.of(op)
        read = call.staged_elements * call.planned.dtype.itemsize if call.staged is not None else x.nbytes
        written = call.written_elements * result.dtype.itemsize if call.scratch_output else result.nbytes
        copies = ((x.nbytes + read if call.staged is not None else 0)
                  + (written + result.nbytes if call.scratch_output else 0)
                  + (2 * result.nbytes if call.scale_output else 0))
        return Resources(
            threads=_CUFFT_THREADS, blocks=max(1, _cdiv(batch * n, _CUFFT_POINTS_PER_BLOCK)),
            registers=_CUFFT_REGISTERS, smem_bytes=min(n, _CUFFT_SINGLE_PASS_POINTS) * (16 if double else 8),
            hbm_bytes=copies + passes * (read + written), flops=op.flops,
            unit=MathUnit.FP64 if double else MathUnit.FP32, efficiency=_CUFFT_EFFICIENCY)

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        raise LibraryKernelError("runs as a library call (cuFFT); there is no generated CUDA source",
                                 op=op.op, operands=", ".join(map(str, op.operands)),
                                 hint="launch it through cuFFT (cupy.fft / torch.fft); compile checks skip it")

    def samples(self) -> tuple[KernelOp, ...]:
        return ()  # no generated source, so no register count to compare


__all__ = ["CuFFTSchedule", "FFTTemplate", "LibraryKernelError", "SpectralContractTemplate", "SpectralSchedule",
           "spectral_op"]
