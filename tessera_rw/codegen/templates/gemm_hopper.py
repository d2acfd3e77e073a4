"""Which GEMMs run on sm_90's warpgroup MMAs, and on which schedules.

Two kernels issue wgmma (both compiled for sm_90a, both reading the operands from the same
128-byte swizzled shared tiles):
- gemm_tma_cuda.py, with TmaSchedule: a producer warpgroup loads the tiles with TMA copies and
  mbarriers hand the stages over; the consumers only issue MMAs. It needs tensor maps of the
  operands (`tma_blocker`: rows 16-byte aligned, no partial batch broadcast).
- gemm_wgmma_cuda.py, with WgmmaSchedule: every thread copies its share with cp.async; it takes
  every product wgmma can run, ragged rows included.
On sm_90 their schedules come first (TMA's where it applies), then the mma.sync ones.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> from tessera_rw.codegen.arch import arch_named
>>> from tessera_rw.codegen.kernel_op import KernelOp
>>> t = TensorType((4096, 4096), DType.bfloat16)
>>> p = GemmProblem.of(KernelOp.of("matmul", (t, t), t, accum_dtype=None))
>>> [s.describe() for s in hopper_defaults(p, arch_named("h100"))][:2]
['tma bm=128 bn=256 bk=64 wg_m=2 wg_n=1 stages=4', 'tma bm=128 bn=128 bk=64 wg_m=2 wg_n=1 stages=6']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.prelude import ROW_BYTES, WGMMA_WIDTHS
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.codegen.templates.gemm_footprint import (TmaSchedule, WarpgroupTiling, WgmmaSchedule, registers,
                                                         smem_bytes, tma_consumer_registers)
from tessera_rw.codegen.templates.gemm_problem import TENSOR_CORE_DTYPES, GemmProblem
from tessera_rw.codegen.templates.gemm_tma_cuda import tma_blocker
from tessera_rw.codegen.templates.warp_specialization import consumer_room

# 128-byte k-steps (64 bf16/fp16 values, 128 fp8); bk is set per problem (wgmma_k)
_TMA_DEFAULTS = (TmaSchedule(128, 256, 64, 2, 1, 4), TmaSchedule(128, 128, 64, 2, 1, 6),
                 TmaSchedule(64, 128, 64, 1, 1, 8))
_WGMMA_DEFAULTS = (WgmmaSchedule(128, 256, 64, 2, 1, 4), WgmmaSchedule(128, 128, 64, 2, 1, 4),
                   WgmmaSchedule(64, 128, 64, 1, 1, 4))
# the tuning grid: tiles, warpgroups per axis, stages (TMA's deeper: nothing per stage in registers)
_TILES, _GROUPS = (64, 128, 256), (1, 2)
_WGMMA_STAGES, _TMA_STAGES = (3, 4, 5), (3, 4, 6, 8)
# a warpgroup's slab of N spans whole 64-value swizzled blocks of B
SLAB_WIDTHS = tuple(n for n in WGMMA_WIDTHS if n % 64 == 0)
MAX_BOX = 256          # a TMA box is at most 256 rows: a K-major tile's bm or bn

# fraction of the bf16/fp8 peak: the cp.async kernel's threads spend issue slots on copies; the
# TMA kernel's consumers only wait and issue MMAs (both guesses until timed on a device)
WGMMA_EFFICIENCY, TMA_EFFICIENCY = 0.8, 0.85


def warpgroup_mma(p: GemmProblem, arch: ArchSpec) -> bool:
    """Whether the product can run on sm_90's warpgroup MMAs: 16-bit operands in any layout (a bias
    gradient's too), fp8 ones with k contiguous in both (A as [M, K], B as [N, K])."""
    if arch.compute_capability != (9, 0) or p.tf32 or p.in_dtype not in TENSOR_CORE_DTYPES:
        return False
    return not p.fp8 or (not p.trans_a and p.trans_b)


def wgmma_k(p: GemmProblem) -> int:
    """The k-depth of a warpgroup-MMA stage: one 128-byte shared row of the problem's operands."""
    return ROW_BYTES // p.in_dtype.itemsize


def hopper_defaults(p: GemmProblem, arch: ArchSpec) -> tuple[Schedule, ...]:
    """The wgmma default schedules (TMA's first where tensor maps apply), valid ones only; empty
    where wgmma does not apply."""
    if not warpgroup_mma(p, arch):
        return ()
    candidates = (*(_TMA_DEFAULTS if tma_blocker(p) is None else ()), *_WGMMA_DEFAULTS)
    return tuple(s for s in (replace(c, bk=wgmma_k(p)) for c in candidates) if hopper_valid(p, s, arch))


def hopper_grid(p: GemmProblem, arch: ArchSpec) -> Iterable[Schedule]:
    """The wgmma points of the tuning grid (to be filtered by hopper_valid)."""
    if not warpgroup_mma(p, arch):
        return ()
    k = wgmma_k(p)
    tma = (TmaSchedule(bm, bn, k, gm, gn, st) for bm in _TILES for bn in _TILES for gm in _GROUPS
           for gn in _GROUPS for st in _TMA_STAGES)
    copies = (WgmmaSchedule(bm, bn, k, gm, gn, st) for bm in _TILES for bn in _TILES for gm in _GROUPS
              for gn in _GROUPS for st in _WGMMA_STAGES)
    return (*(tma if tma_blocker(p) is None else ()), *copies)


def hopper_valid(p: GemmProblem, s: WarpgroupTiling, arch: ArchSpec) -> bool:
    """Whether a wgmma schedule fits the product and the arch: warpgroups tile the block with a
    wgmma width, shared memory and registers fit; cp.async threads copy whole chunks; TMA boxes
    hold a K-major tile."""
    wide = s.bn // s.wg_n
    fits = (warpgroup_mma(p, arch) and s.bk == wgmma_k(p) and s.bm % (64 * s.wg_m) == 0 and s.bn % s.wg_n == 0
            and wide in SLAB_WIDTHS and smem_bytes(p, s) <= arch.smem_per_block
            and s.threads <= arch.max_threads_per_block
            and registers(p, s) <= arch.register_limit(s.threads))
    if isinstance(s, TmaSchedule):
        # two consumer warpgroups run on what setmaxnreg gives them
        room = consumer_room(s.consumers, arch.registers_per_thread)
        # a bias gradient's ones row is written by the one warpgroup reading its slab of A
        return (fits and tma_blocker(p) is None and s.stages >= 2 and max(s.bm, s.bn) <= MAX_BOX
                and tma_consumer_registers(p, s) <= room and (not p.bias_grad or s.wg_n == 1))
    # every thread copies whole 16-byte chunks of both tiles (8 per 128-byte row)
    return fits and s.stages >= 3 and 8 * s.bm % s.threads == 0 and 8 * s.bn % s.threads == 0


def hopper_calibrated(p: GemmProblem, s: WarpgroupTiling) -> bool:
    """Whether the register model was checked against ptxas at `s` (see gemm._calibrated)."""
    if isinstance(s, TmaSchedule):
        # one consumer with more than 64 accumulators: ptxas spends 5-60% more than modelled
        return s.consumers == 2 or (s.consumers == 1 and s.accumulators <= 64)
    # 4 warpgroups allocate a third more than modelled; fp8 rows copied byte by byte crowd
    # 255 registers past 8 chunks a thread or 4 stages
    byte_copies_fit = s.chunks_per_thread <= 8 and s.stages <= 4
    return s.threads <= 256 and (p.rows_aligned or not p.fp8 or byte_copies_fit)
