"""Depthwise convolution: a sliding-window SIMT kernel (one input channel per group).

An implicit GEMM would be one output channel wide, so a block takes one (image, output channel,
output tile) instead: the tile and its halo staged in shared memory as fp32, each thread V
consecutive outputs of one row with the window held in registers (conv_cuda.depthwise_source).
DirectConvTemplate (conv.py) offers these schedules for depthwise problems.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_rw.codegen.arch import ArchSpec, MathUnit
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule
from tessera_rw.codegen.templates.conv_cuda import DepthwiseLayout, depthwise_source
from tessera_rw.codegen.templates.conv_epilogue import ConvEpilogue, epilogue_flops, launch_operands
from tessera_rw.codegen.templates.conv_problem import (MAX_GRID_YZ, STATIC_SMEM_LIMIT, TENSOR_CORE_DTYPES,
                                                       ConvProblem, cdiv, pow2)

# FFMA from registers fed by broadcast tap loads and 16-byte window loads; the staging sync and the
# integer work of edge tiles keep it from the FP32 peak.
DEPTHWISE_EFFICIENCY = 0.7


@dataclass(frozen=True)
class DepthwiseSchedule(Schedule):
    """A block computes a tile = (rows, columns) of one output channel's plane with `threads` threads,
    each `outputs_per_thread` consecutive outputs of one row (so rows * columns = threads * that)."""
    threads: int
    outputs_per_thread: int
    tile: tuple[int, int]


# (threads, outputs per thread), best first: 8 per thread reuse each staged input 8 times from
# registers and store 16 bytes of bf16 at once; 4 per thread suit narrow planes.
CANDIDATES = ((128, 8), (256, 4), (64, 8), (128, 4))
# Registers besides the accumulators: x, w and y bases (64-bit), tile origin and thread decode,
# the staging loop's index, the edge tests of the store, and the few window values in flight
# (ptxas consumes each loaded input in its FMAs before the next loads; it keeps no full window).
ADDRESSING = 24


def _layout(cv: ConvProblem, s: DepthwiseSchedule) -> DepthwiseLayout:
    return DepthwiseLayout.of((cv.kh, cv.kw), cv.stride, cv.dilation, s.tile, s.outputs_per_thread)


def depthwise_registers(cv: ConvProblem, s: DepthwiseSchedule) -> int:
    """Accumulators + addressing; when the tap rows are unrolled (taps in registers, more than one
    row) ptxas loads the next row's whole window while the current row's FMAs run."""
    win = _layout(cv, s)
    v = s.outputs_per_thread
    window = (v - 1) * cv.stride[1] + (win.tj - 1) * cv.dilation[1] + 1
    prefetch = window if win.taps_in_registers and cv.kh > 1 else 0
    return v + prefetch + ADDRESSING


def depthwise_smem(cv: ConvProblem, s: DepthwiseSchedule) -> int:
    win = _layout(cv, s)
    taps = 0 if win.taps_in_registers else cv.kh * win.kwp
    return 4 * (win.rows_in * win.srow + taps)              # fp32 staging


def depthwise_fits(cv: ConvProblem, s: DepthwiseSchedule, arch: ArchSpec) -> bool:
    th, tw = s.tile
    # the store packs a thread's outputs into whole 32-bit words
    return (th * tw == s.threads * s.outputs_per_thread and tw % s.outputs_per_thread == 0
            and s.outputs_per_thread * cv.dtype.itemsize % 4 == 0
            and s.threads % 32 == 0 and s.threads <= arch.max_threads_per_block
            and cv.o <= MAX_GRID_YZ and cv.n <= MAX_GRID_YZ
            and depthwise_smem(cv, s) <= min(arch.smem_per_block, STATIC_SMEM_LIMIT)
            and depthwise_registers(cv, s) <= arch.register_limit(s.threads))


def depthwise_grid(cv: ConvProblem, s: DepthwiseSchedule) -> tuple[int, int, int]:
    """(output tiles of a plane, output channels, images)."""
    th, tw = s.tile
    return cdiv(cv.oh, th) * cdiv(cv.ow, tw), cv.o, cv.n


def depthwise_resources(op: KernelOp, s: DepthwiseSchedule, arch: ArchSpec) -> Resources:
    cv = ConvProblem.of(op)
    win = _layout(cv, s)
    tiles, channels, images = depthwise_grid(cv, s)
    blocks = tiles * channels * images
    registers = depthwise_registers(cv, s)
    # Every block's outputs are computed, edge ones included, over the zero-padded kernel rows.
    flops = 2 * blocks * s.threads * s.outputs_per_thread * cv.kh * win.kwp + epilogue_flops(op)
    # x, w and y cross HBM once: a tile's halo overlaps its neighbours' by (kernel - 1) * dilation
    # columns (and rows), re-read by blocks of the same plane that run together, hits in L2; a
    # channel multiplier's extra readers of one input plane are adjacent in blockIdx.y, hits too.
    hbm = op.operand_bytes + op.result.nbytes              # the epilogue's inputs among the operands
    return Resources(threads=s.threads, blocks=blocks, registers=registers, smem_bytes=depthwise_smem(cv, s),
                     hbm_bytes=hbm, flops=flops, unit=MathUnit.FP32, efficiency=DEPTHWISE_EFFICIENCY,
                     spill_bytes=4 * max(0, registers - arch.register_limit(s.threads)))


def depthwise_emit(op: KernelOp, cv: ConvProblem, s: DepthwiseSchedule) -> KernelSource:
    win = _layout(cv, s)
    th, tw = s.tile
    name = f"conv_depthwise_{s.threads}x{s.outputs_per_thread}_{th}x{tw}"
    sizes = dict(C=cv.c, H=cv.h, W=cv.w, O=cv.o, MULT=cv.og, KH=cv.kh, KW=cv.kw, OH=cv.oh, OW=cv.ow,
                 SH=cv.stride[0], SW=cv.stride[1], PH=cv.pad[0], PW=cv.pad[1], DH=cv.dilation[0],
                 DW=cv.dilation[1], TH=th, TW=tw, V=s.outputs_per_thread, THREADS=s.threads)
    suffix = TENSOR_CORE_DTYPES[cv.dtype][1] if cv.dtype in TENSOR_CORE_DTYPES else None
    header = (f"// {op}\n// schedule: {s.describe()}\n"
              f"// depthwise sliding window: {cv.og} output channel(s) per input channel, "
              f"taps in {'registers' if win.taps_in_registers else 'shared memory'}\n"
              f"// launch: {name}({launch_operands(op)}); grid={depthwise_grid(cv, s)}, block=({s.threads})\n")
    source = depthwise_source(name, sizes, suffix, win, ConvEpilogue.of(op))
    return KernelSource(name, header + source, threads=s.threads,
                        grid=depthwise_grid(cv, s), fast_math=op.numerics is Numerics.FAST)


def depthwise_schedules(cv: ConvProblem, arch: ArchSpec) -> tuple[DepthwiseSchedule, ...]:
    """Tiles as wide as the output row (to a power of two) up to a block's worth of outputs, and as
    many rows as that leaves; small planes get fewer threads rather than idle ones, down to a warp."""
    valid = []
    for threads, v in CANDIDATES:
        tw = min(threads * v, max(v, pow2(cv.ow)))
        threads = max(32, tw * min(threads * v // tw, pow2(cv.oh)) // v)
        s = DepthwiseSchedule(threads, v, (threads * v // tw, tw))
        if s not in valid and depthwise_fits(cv, s, arch):
            valid.append(s)
    return tuple(valid[:3])
