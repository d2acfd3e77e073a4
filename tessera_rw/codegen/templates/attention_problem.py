"""What a FlashAttention forward kernel is asked to compute and how it is tiled: the schedules of
its two kernels and the op's sizes as they see them (AttentionShape), shared by the template
(attention.py) and the emitters (attention_cuda.py, attention_wgmma_cuda.py, attention_tma_cuda.py).

>>> from tessera_rw.algebra.dtypes import DType
>>> q = TensorType((2, 8, 1000, 64), DType.bfloat16)
>>> op = KernelOp.of("flash_attention", (q, q, q), q, scale=None, causal=True, has_mask=False)
>>> shape = AttentionShape.of(op)
>>> shape.bh, shape.kind, shape.visited_tiles(AttentionSchedule(bm=128, bn=64))
(16, 'bf16', 72)
>>> WarpgroupAttentionSchedule(producer=True).describe()
'wg bm=128 bn=64 warps=8 stages=2 producer=True'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import ArchSpec, WARP_SIZE
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Schedule

# Head dims: the mma.sync kernel takes any multiple of 16 up to 128 (one k-step of Q Kᵀ is 16 wide);
# at 256 its O accumulator (128 registers a thread) and Q fragments (64) spill. The wgmma kernel
# keeps Q in shared memory and takes 64, 128 and 256 (its tiles are 64-value swizzled column
# blocks); it alone serves 256, on sm_90, two warpgroups over 32-key tiles so up to 5 stages fit.
MMA_SYNC_MAX_HEAD_DIM = 128
WG_HEAD_DIMS = (64, 128, 256)
MMA_M, MMA_K = 16, 16         # mma.sync m16n8k16: rows per warp tile, keys per k-step
WG_ROWS = 64                  # query rows per warpgroup of the wgmma kernel (a wgmma's M)
PRODUCER_THREADS = 128        # the warpgroup whose one thread issues a producer schedule's TMA copies


@dataclass(frozen=True)
class AttentionSchedule(Schedule):
    """bm query rows per block (16·warps·MT), bn keys per K/V tile, warps per block, cp.async stages."""
    bm: int = 128
    bn: int = 64
    warps: int = 8
    stages: int = 2

    @property
    def m_tiles(self) -> int:
        """16-row MMA tiles each warp owns."""
        return self.bm // (MMA_M * self.warps)


    @property
    def threads(self) -> int:
        """Threads per block."""
        return WARP_SIZE * self.warps


@dataclass(frozen=True)
class WarpgroupAttentionSchedule(AttentionSchedule):
    """sm_90's wgmma kernel: bm = 64 query rows per warpgroup of 4 warps, bn keys per K/V tile.
    `producer`: one more warpgroup, whose one thread loads Q, K and V with TMA copies into `stages`
    buffers handed over by mbarriers (attention_tma_cuda.py), instead of every thread copying with
    cp.async between block-wide barriers; `warps` counts the consumers. `pingpong` (a producer
    block's two consumers): they take turns issuing their products, so one's softmax runs while the
    other's MMAs do."""
    tag: ClassVar[str] = "wg"
    producer: bool = False
    pingpong: bool = False
    quiet_defaults: ClassVar[frozenset[str]] = frozenset({"producer", "pingpong"})

    @property
    def consumers(self) -> int:
        """Warpgroups computing: one per 64 query rows."""
        return self.warps // 4

    @property
    def threads(self) -> int:
        return WARP_SIZE * self.warps + PRODUCER_THREADS * self.producer


@dataclass(frozen=True)
class AttentionShape:
    """The op's sizes as the kernel sees them: heads flattened into one batch index."""
    batch: tuple[int, ...]
    bh: int
    sq: int
    sk: int
    d: int
    dtype: DType
    causal: bool
    scale: float
    mask: TensorType | None

    @classmethod
    def of(cls, op: KernelOp) -> AttentionShape:
        q, k = op.operands[0], op.operands[1]
        a = op.attr_map
        batch = output_type(op).shape[:-2]
        scale = a.get("scale")
        return cls(batch, math.prod(batch), q.shape[-2], k.shape[-2], q.shape[-1], q.dtype,
                   bool(a.get("causal")), q.shape[-1] ** -0.5 if scale is None else float(scale),
                   op.operands[3] if a.get("has_mask") else None)

    @property
    def kind(self) -> str:
        """The operands' kind as kernel and helper names spell it: 'bf16' or 'f16'."""
        return "bf16" if self.dtype is DType.bfloat16 else "f16"

    @property
    def mma_sync(self) -> bool:
        """Whether the mma.sync kernel can hold this head dim."""
        return self.d <= MMA_SYNC_MAX_HEAD_DIM

    def warpgroup_mma(self, arch: ArchSpec) -> bool:
        """Whether sm_90's wgmma kernel serves it: sequences short of 64 stay on mma.sync where it
        can take them, whose tiles shrink to them (a wgmma is 64 rows)."""
        return (arch.compute_capability == (9, 0) and self.d in WG_HEAD_DIMS
                and (not self.mma_sync or min(self.sq, self.sk) >= WG_ROWS))

    def key_tiles(self, q0: int, s: AttentionSchedule) -> int:
        """K/V tiles the block starting at query row q0 visits (causal stops at its last row)."""
        tiles = -(-self.sk // s.bn)
        return min(tiles, -(-(q0 + s.bm) // s.bn)) if self.causal else tiles

    def visited_tiles(self, s: AttentionSchedule) -> int:
        """K/V tiles summed over one head's query blocks."""
        return sum(self.key_tiles(q0, s) for q0 in range(0, self.sq, s.bm))


def output_type(op: KernelOp) -> TensorType:
    """The attention output O of a flash_attention or flash_attention_lse op (the latter's result
    holds O flat, then the row statistics)."""
    if op.op == "flash_attention":
        return op.result
    return OPS["flash_attention"].infer(*op.operands, **op.attr_map)


def with_lse(op: KernelOp) -> KernelOp:
    """The flash_attention_lse op of a flash_attention op: the same operands and flags."""
    return KernelOp.of("flash_attention_lse", op.operands, OPS["flash_attention_lse"].infer(*op.operands, **op.attr_map),
                       numerics=op.numerics, **op.attr_map)


def resident_heads(arch: ArchSpec, blocks_per_head: int, threads: int, registers: int, smem: int) -> int:
    """How many (batch·head)s have their blocks running at once: the blocks every SM holds (by
    registers, shared memory and warps) over the blocks of one head. A head's blocks walk the same
    tiles in step, so what they stream is shared through L2 while these heads' tensors fit there."""
    per_sm = max(1, arch.resident_blocks(threads, registers, smem))
    return -(-arch.sm_count * per_sm // max(blocks_per_head, 1))


def round_up(x: int, to: int) -> int:
    return -(-x // to) * to
