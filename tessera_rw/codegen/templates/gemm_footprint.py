"""A GEMM schedule's footprint: shared memory per block, registers per thread (the model checked
against ptxas by tests/codegen/test_template_contract.py and test_schedule_spaces.py) and the
blocks an SM holds with them. GemmTemplate (gemm.py) sizes its schedules and costs with these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from tessera_rw.codegen.arch import WARP_SIZE
from tessera_rw.codegen.templates import gemm_fp8_cuda as fp8
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.codegen.templates.gemm_problem import GemmProblem
from tessera_rw.codegen.templates.gemm_simt_cuda import SIMT_PAD
from tessera_rw.codegen.templates.gemm_tma_cuda import smem_bytes_of as tma_smem_bytes
from tessera_rw.codegen.templates.gemm_wgmma_cuda import smem_bytes_of as wgmma_smem_bytes
from tessera_rw.codegen.templates.warp_specialization import registers_at_launch


@dataclass(frozen=True)
class GemmSchedule(Schedule):
    """Tensor-core tiling: a bm x bn block tile, bk per pipeline stage, warps_m x warps_n warps."""
    bm: int = 128
    bn: int = 128
    bk: int = 32
    warps_m: int = 2
    warps_n: int = 2
    stages: int = 3
    group: int = 0      # tile rows per group of the grid's walk (gemm_tile_order.py); 0: the L2 model's pick
    quiet_defaults: ClassVar[frozenset[str]] = frozenset({"group"})

    @property
    def threads(self) -> int:
        return WARP_SIZE * self.warps_m * self.warps_n


@dataclass(frozen=True)
class WarpgroupTiling(Schedule):
    """Warpgroup-MMA tiling (sm_90): a bm x bn block tile split among wg_m x wg_n warpgroups of 128
    threads that issue the MMAs, bk values per stage (one 128-byte shared row: 64 bf16/fp16, 128
    fp8). Its kinds differ in how the stages are filled."""
    bm: int = 128
    bn: int = 256
    bk: int = 64
    wg_m: int = 2
    wg_n: int = 1
    stages: int = 4
    group: int = 0      # tile rows per group of the grid's walk (gemm_tile_order.py); 0: the L2 model's pick
    quiet_defaults: ClassVar[frozenset[str]] = frozenset({"group"})

    @property
    def consumers(self) -> int:
        """Warpgroups issuing MMAs."""
        return self.wg_m * self.wg_n

    @property
    def accumulators(self) -> int:
        """fp32 accumulators per thread of a consumer warpgroup."""
        return (self.bm // self.wg_m) * (self.bn // self.wg_n) // 128


@dataclass(frozen=True)
class WgmmaSchedule(WarpgroupTiling):
    """Warpgroup-MMA tiling whose threads all fill the stages with cp.async."""
    tag: ClassVar[str] = "wg"

    @property
    def threads(self) -> int:
        return 128 * self.consumers

    @property
    def chunks_per_thread(self) -> int:
        """16-byte chunks each thread copies per stage: 8 per 128-byte row of either tile."""
        return 8 * (self.bm + self.bn) // self.threads


@dataclass(frozen=True)
class TmaSchedule(WarpgroupTiling):
    """Warpgroup-MMA tiling with TMA loads: one more warpgroup produces (one thread issuing the copies).
    A persistent one launches a block per SM slot, each walking tiles a grid apart: its producer
    loads the next tile's stages while the consumers run the last one's epilogue."""
    tag: ClassVar[str] = "tma"
    persistent: bool = False
    quiet_defaults: ClassVar[frozenset[str]] = frozenset({"group", "persistent"})

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)


@dataclass(frozen=True)
class GemmSimtSchedule(Schedule):
    """fp32 SIMT tiling: each thread owns a tm x tn patch of the bm x bn block tile."""
    bm: int = 128
    bn: int = 128
    bk: int = 8
    tm: int = 8
    tn: int = 8
    group: int = 0      # tile rows per group of the grid's walk (gemm_tile_order.py); 0: the L2 model's pick
    quiet_defaults: ClassVar[frozenset[str]] = frozenset({"group"})

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)


def smem_bytes(p: GemmProblem, s: Schedule) -> int:
    """Shared bytes per block: swizzled (unpadded) stages for mma (tf32 included), two padded fp32
    buffers for SIMT."""
    if isinstance(s, GemmSchedule):
        return s.stages * (s.bm * s.bk + s.bk * s.bn) * p.in_dtype.itemsize
    if isinstance(s, WgmmaSchedule):
        return wgmma_smem_bytes(p, s)
    if isinstance(s, TmaSchedule):
        return tma_smem_bytes(p, s)
    return 2 * s.bk * (s.bm + SIMT_PAD + s.bn) * 4


def registers(p: GemmProblem, s: Schedule) -> int:
    """Registers per thread: fp32 accumulators plus the main loop's operands and addressing.

    mma: each warp holds (bm/warps_m)/16 x (bn/warps_n)/8 m16n8 tiles of 4 fp32 accumulators; per
    16-wide k-step, A fragments of 4 registers per m16 tile and B fragments of 2 per n8 tile, which
    ptxas partly double-buffers across the unrolled k-steps (x1.25); and each 16-byte cp.async
    chunk a thread issues per stage keeps its global address, swizzled smem offset and predicate
    live across the loop (~9 registers, ~12 when unaligned rows copy through registers; about two
    thirds of that when K is short enough that the prologue issues every tile and the loop loads
    nothing). The epilogue runs element by element after the operand registers are dead, so it
    adds nothing at the peak. fp8: an operand staged through registers holds 16 per unit of 64
    bytes instead of its chunks, and about 16 more for its addresses and byte transposes; sm_90
    unpacks each fragment word into two fp16 pairs for the fp16 MMAs its mma.sync runs as, so
    fragments take about twice the registers (x2.25). Calibrated on sm_90 only: sm_89 runs fp8
    natively and ptxas allocates differently there (more than this for ragged 128x64 tiles).
    wgmma (sm_90): (bm/wg_m) x (bn/wg_n) / 128 accumulators per thread and no fragment registers
    (both operands are read from shared memory), plus each cp.async chunk's addressing, which
    ptxas keeps leaner here (~5.5 a chunk; ~11 copied element-wise, ~17 byte by byte) and drops
    when the prologue issues every tile. TMA (sm_90): a consumer's accumulators and ~28 more, no
    copies; with two consumer warpgroups the kernel moves registers from the producer to them
    (setmaxnreg), and what ptxas reports is the even share the block launches with. SIMT: tm*tn accumulators, tm+tn operands per k (double-buffered),
    the registers staging the next tile, and a fixed loop overhead.
    """
    if isinstance(s, GemmSchedule):
        mi, ni = s.bm // s.warps_m // 16, s.bn // s.warps_n // 8
        copied = s.bm * s.bk * (not p.stage_a) + s.bk * s.bn * (not p.stage_b)
        chunks = copied * p.in_dtype.itemsize // 16 // s.threads
        # fp32 chunks copied element-wise go straight from 4 loads to one float4 store: no packing
        addressing = (_CHUNK_REGISTERS if p.rows_aligned or p.tf32 else _CHUNK_REGISTERS_COPY8) * chunks
        if -(-p.k // s.bk) <= s.stages - 1:   # every k-tile issued in the prologue: no loads in the loop
            addressing = math.ceil(addressing * _PROLOGUE_ONLY)
        reuse = _FRAG_REUSE_TF32 if p.tf32 else _FRAG_REUSE_FP8 if p.fp8 else _FRAG_REUSE
        staging = sum(_STAGED_UNIT * -(-(rows * s.bk // fp8.UNIT_BYTES) // s.threads) + _STAGED_ADDRESSING
                      for rows, on in ((s.bm, p.stage_a), (s.bn, p.stage_b)) if on)
        return mi * ni * 4 + math.ceil(reuse * (mi * 4 + ni * 2)) + addressing + staging + _TC_OVERHEAD
    if isinstance(s, TmaSchedule):
        if s.consumers == 2:     # setmaxnreg: launched with an even share, the consumers take more
            return registers_at_launch(s.threads)
        return tma_consumer_registers(p, s)
    if isinstance(s, WgmmaSchedule):
        if -(-p.k // s.bk) <= s.stages - 2:   # every k-tile issued in the prologue: no loads in the loop
            return s.accumulators + _WGMMA_PROLOGUE_ONLY
        per_chunk = _WGMMA_CHUNK if p.rows_aligned else _WGMMA_CHUNK_BYTES if p.fp8 else _WGMMA_CHUNK_COPY
        return s.accumulators + math.ceil(per_chunk * s.chunks_per_thread) + _WGMMA_OVERHEAD
    staged = (s.bm * s.bk + s.bk * s.bn) // s.threads
    # A stored transposed and B as is, with bm == bn: both staged loads walk (k = id / bm, id % bm),
    # so one set of coordinates serves the two
    shared = _SIMT_SHARED_STAGING if p.layout == "tn" and s.bm == s.bn else 0
    return s.tm * s.tn + 2 * (s.tm + s.tn) + staged + _SIMT_OVERHEAD - shared


_FRAG_REUSE = 1.25     # fragment registers per fragment value: next k-step's loads overlap this one's mma
_FRAG_REUSE_TF32 = 2.0  # tf32: each loaded fp32 fragment value and its cvt.rna-rounded copy are both live
_CHUNK_REGISTERS = 9   # per cp.async chunk: 64-bit source address, smem offset, bounds predicate, k step
_CHUNK_REGISTERS_COPY8 = 12  # element-wise copy: the chunk's 4 packed words pass through registers too
_PROLOGUE_ONLY = 2 / 3  # share of that addressing still live when no cp.async is issued inside the k-loop
_FRAG_REUSE_FP8 = 2.25  # fp8 on sm_90: mma.sync runs as fp16 MMAs, each fragment word unpacked into two
_STAGED_UNIT = 16      # fp8 staged through registers: a unit's 4 k-rows of 16 bytes, live across the MMAs
_STAGED_ADDRESSING = 16  # a staged operand's row addresses, predicates and byte-transpose temporaries
_TC_OVERHEAD = -8      # the chunk term over-counts shared row/column bases; net of tile origins and counters
_WGMMA_CHUNK = 5.5      # wgmma kernel, per cp.async chunk: no fragments compete, so ptxas keeps less per chunk
_WGMMA_CHUNK_COPY = 11  # wgmma kernel, per chunk copied element-wise through registers
_WGMMA_CHUNK_BYTES = 17  # wgmma kernel, per fp8 chunk copied byte by byte
_WGMMA_OVERHEAD = 20    # wgmma kernel: descriptors, tile origins, loop counters
_WGMMA_PROLOGUE_ONLY = 28  # wgmma kernel whose k-loop issues no loads: descriptors and epilogue addressing
_TMA_OVERHEAD = 28      # TMA kernel: descriptors, barrier addresses, loop counters, epilogue addressing
_SIMT_OVERHEAD = 30    # thread coordinates, global pointers of the staged loads, loop counters
_SIMT_SHARED_STAGING = 8  # a TN product's staged loads share coordinates (64x64 tiles: 47 registers, not 61, on sm_80)


def tma_consumer_registers(p: GemmProblem, s: TmaSchedule) -> int:
    """Registers a TMA kernel's consumer thread needs: its accumulators, descriptors, barrier
    addresses and counters; with a residual, about as many again (ptxas hoists its loads ahead of
    the epilogue's stores, 64x64 to 128x64 tiles: within 10%)."""
    return s.accumulators * (2 if p.residual is not None else 1) + _TMA_OVERHEAD
