"""What a GEMM schedule leaves to measurement: the variants of a default schedule that compute the
same tiles in another order or another launch, which the cost model prices alike (or by an L2
model it cannot check), so a tuner times them beside the default.

- Other walks over the output tiles (`group`, gemm_tile_order.py): where the operands outrun half
  the L2 and the grid has more than one tile row and column.
- The persistent form of a TMA schedule (`persistent`): a block per SM slot, each walking tiles a
  grid apart, its producer loading the next tile while the consumers finish the last; where the
  tiles outnumber a wave.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> from tessera_rw.codegen.arch import arch_named
>>> from tessera_rw.codegen.templates.gemm_footprint import TmaSchedule
>>> t = TensorType((4096, 4096), DType.bfloat16)
>>> op = KernelOp.of("matmul", (t, t), t, accum_dtype=None)
>>> [s.describe() for s in variants(op, TmaSchedule(), arch_named("h100"))][:3]
['tma bm=128 bn=256 bk=64 wg_m=2 wg_n=1 stages=4 group=1', 'tma bm=128 bn=256 bk=64 wg_m=2 wg_n=1 stages=4 group=2', \
'tma bm=128 bn=256 bk=64 wg_m=2 wg_n=1 stages=4 group=4']
>>> persistent_grid(op, TmaSchedule(persistent=True), arch_named("h100"))   # 512 tiles on 132 SMs
132
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.codegen.templates.gemm_footprint import TmaSchedule, registers, smem_bytes
from tessera_rw.codegen.templates.gemm_problem import GemmProblem
from tessera_rw.codegen.templates.gemm_tile_order import other_groups


def walked(op: KernelOp, s: Schedule, arch: ArchSpec) -> tuple[int, int, int, int, int, int]:
    """What a walk over the schedule's output tiles depends on: tile rows and columns, a wave's
    blocks, A's and B's bytes and the L2's."""
    p = GemmProblem.of(op)
    wave = arch.sm_count * max(1, arch.resident_blocks(s.threads, registers(p, s), smem_bytes(p, s)))
    a, b = op.operands[:2]
    return -(-p.m // s.bm), -(-p.n // s.bn), wave, a.nbytes, b.nbytes, arch.l2_bytes


def tiles_of(op: KernelOp, s: Schedule) -> int:
    """The output tiles of the product, over every batch."""
    return GemmProblem.of(op).tiles(s.bm, s.bn)


def persistent_grid(op: KernelOp, s: TmaSchedule, arch: ArchSpec) -> int:
    """The blocks a persistent schedule launches: a wave of them, or one per tile when fewer."""
    return min(tiles_of(op, s), walked(op, s, arch)[2])


def variants(op: KernelOp, s: Schedule, arch: ArchSpec) -> Iterator[Schedule]:
    """The schedule's other walks, then (a TMA schedule with more tiles than a wave) its persistent
    form under each walk; none that would run as the schedule does."""
    walks = [replace(s, group=g) for g in other_groups(*walked(op, s, arch))]
    yield from walks
    if isinstance(s, TmaSchedule) and not s.persistent and tiles_of(op, s) > walked(op, s, arch)[2]:
        for form in (s, *walks):
            yield replace(form, persistent=True)
