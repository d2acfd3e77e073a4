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
from tessera_rw.algebra.ops.strided_attention import View, attention_views
from tessera_rw.algebra.ops.strided_attention_backward import base_op, form_attrs, viewed_operands
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.codegen.arch import ArchSpec, WARP_SIZE
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.lower.attention_writes import MAX_ROW_STRIDE, ROW_ALIGNMENT, rows_fit

# Head dims: the mma.sync kernel takes any multiple of 16 up to 128 (one k-step of Q Kᵀ is 16 wide);
# at 256 its O accumulator (128 registers a thread) and Q fragments (64) spill. The wgmma kernel
# keeps Q in shared memory and takes 64, 128 and 256 (its tiles are 64-value swizzled column
# blocks); it alone serves 256, on sm_90, two warpgroups over 32-key tiles so up to 5 stages fit.
MMA_SYNC_MAX_HEAD_DIM = 128
WG_HEAD_DIMS = (64, 128, 256)
MMA_M, MMA_K = 16, 16         # mma.sync m16n8k16: rows per warp tile, keys per k-step
WG_ROWS = 64                  # query rows per warpgroup of the wgmma kernel (a wgmma's M)
FORWARD_OPS = frozenset({"flash_attention", "flash_attention_lse", "strided_attention", "strided_attention_lse"})
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
    window: int = 0               # causal's band: row i keeps keys i - window + 1 .. i (0: every earlier key)

    @classmethod
    def of(cls, op: KernelOp) -> AttentionShape:
        q, k, *rest = attention_operands(op)
        a = op.attr_map
        batch = output_type(op).shape[:-2]
        scale = a.get("scale")
        return cls(batch, math.prod(batch), q.shape[-2], k.shape[-2], q.shape[-1], q.dtype,
                   bool(a.get("causal")), q.shape[-1] ** -0.5 if scale is None else float(scale),
                   rest[1] if a.get("has_mask") else None, int(a.get("window") or 0))

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
        """K/V tiles the block starting at query row q0 visits (causal stops at its last row, a
        window starts at its first row's band), as the kernel walks them."""
        tiles = -(-self.sk // s.bn)
        end = min(tiles, -(-(q0 + s.bm) // s.bn)) if self.causal else tiles
        first = min(max(0, q0 - self.window + 1) // s.bn, end - 1) if self.window else 0
        return end - first

    def visited_tiles(self, s: AttentionSchedule) -> int:
        """K/V tiles summed over one head's query blocks."""
        return sum(self.key_tiles(q0, s) for q0 in range(0, self.sq, s.bm))


def operand_views(op: KernelOp) -> dict[int, View]:
    """The (shape, strides, offset) views a strided attention op reads operands through, by operand
    index; none for the dense ops."""
    if op.op == "strided_attention":
        indices: tuple[int, ...] = (0, 1, 2)
    elif base_op(op.op):
        indices = viewed_operands(op.op)
    else:
        return {}
    a = op.attr_map
    return dict(zip(indices, attention_views(a["shapes"], a["strides"], a["offsets"])))


def reads_views(op: KernelOp) -> bool:
    """Whether `op` reads some operands through strided views (lower/attention_views.py)."""
    return op.op == "strided_attention" or base_op(op.op) is not None


def writes_lse(op: KernelOp) -> bool:
    """Whether a forward op also writes each row's logsumexp after O."""
    return op.op in ("flash_attention_lse", "strided_attention_lse")


def view_refusal(op: KernelOp, kernel: str) -> str | None:
    """Why `kernel` cannot read the views of the strided op `op` in place (lower/attention_views.py
    makes only views it can: rows_fit); None when it can."""
    names = OPS[base_op(op.op) or "flash_attention"].operands
    for i, view in operand_views(op).items():
        if not rows_fit(*view, op.operands[i].dtype.itemsize):
            return (f"{kernel} reads rows of contiguous values starting on {ROW_ALIGNMENT} bytes, at most "
                    f"{MAX_ROW_STRIDE} elements apart; {names[i]}'s view has strides {view[1]} and offset {view[2]}")
    return None


def attention_operands(op: KernelOp) -> tuple[TensorType, ...]:
    """The operands as the attention reads them: a strided op's views where it reads views."""
    views = operand_views(op)
    return tuple(TensorType(views[i][0], t.dtype) if i in views else t for i, t in enumerate(op.operands))


def dense_op(op: KernelOp) -> KernelOp:
    """A strided attention backward op as the dense op it computes over its views' types, its
    result as that op's (a strided_attention_bwd's gradients packed again, O dense again); itself
    for any other op: what sizes, flops and references are of."""
    base = base_op(op.op)
    if base is None:
        return op
    attrs = {k: v for k, v in op.attr_map.items() if k not in form_attrs(op.op)}
    operands = attention_operands(op)
    return KernelOp.of(base, operands, OPS[base].infer(*operands, **attrs), numerics=op.numerics, **attrs)


def operand_bytes(op: KernelOp, count: int = 3) -> tuple[int, ...]:
    """The bytes of the first `count` operands (q, k, v, ...) the attention reads: a view's distinct
    elements (a stride of 0 repeats one), a dense operand's all."""
    views = operand_views(op)
    return tuple(t.dtype.itemsize * math.prod(n for n, st in zip(views[i][0], views[i][1]) if st) if i in views
                 else t.nbytes for i, t in enumerate(op.operands[:count]))


def output_type(op: KernelOp) -> TensorType:
    """The attention output O of a flash_attention, flash_attention_lse or strided_attention op, or
    of their strided forms (the lse ops' results hold O flat, then the row statistics;
    strided_attention's, O in another layout)."""
    if op.op == "flash_attention":
        return op.result
    a = op.attr_map
    return OPS["flash_attention"].infer(*attention_operands(op), scale=a["scale"], causal=a["causal"],
                                        has_mask=a["has_mask"])


@dataclass(frozen=True)
class RowLayout:
    """Where an operand's rows lie, in elements: `offset`, plus each batch index times its stride
    (along the output's batch dims `batch`, 1 where the operand broadcasts, fewer heads where it is
    shared by several: GQA), plus the row index times `row`; a row's values are contiguous."""
    batch: tuple[int, ...]
    strides: tuple[int, ...]
    row: int
    offset: int = 0

    @classmethod
    def of_view(cls, shape: tuple[int, ...], strides: tuple[int, ...], offset: int, rank: int) -> RowLayout:
        """The rows of the view (shape, strides, offset), its batch dims padded to `rank` with ones."""
        lead = rank - (len(shape) - 2)
        return cls((1,) * lead + tuple(shape[:-2]), (0,) * lead + tuple(strides[:-2]), strides[-2], offset)

    @classmethod
    def dense(cls, shape: tuple[int, ...], rank: int) -> RowLayout:
        """A dense operand's of `shape`, its batch dims padded to `rank` with ones."""
        return cls.of_view(shape, contiguous_strides(shape), 0, rank)


def operand_layout(op: KernelOp, i: int, rank: int) -> RowLayout:
    """Where operand i's rows lie (its view's, for an operand a strided op reads through one), its
    batch dims padded to `rank`."""
    views = operand_views(op)
    return RowLayout.of_view(*views[i], rank) if i in views else RowLayout.dense(op.operands[i].shape, rank)


def o_strides(op: KernelOp) -> tuple[int, ...]:
    """How a strided op writes the attention output O: strided_attention's out_strides,
    strided_attention_lse's (and the row statistics reading it) o_strides; () where dense."""
    return tuple(op.attr_map.get("out_strides" if op.op == "strided_attention" else "o_strides") or ())


def o_row_layout(op: KernelOp, shape: tuple[int, ...]) -> RowLayout:
    """Where the rows of O (of `shape`) lie as `op` writes or reads it: through o_strides (or a
    strided_attention's out_strides), else dense."""
    return RowLayout.of_view(shape, o_strides(op) or contiguous_strides(shape), 0, len(shape) - 2)


def row_layouts(op: KernelOp) -> tuple[RowLayout, RowLayout, RowLayout, RowLayout]:
    """A forward op's q, k, v and O row layouts (O as the attention output, before any logsumexps;
    a strided_attention's through its out_strides, a strided_attention_lse's through o_strides),
    batch dims padded to the output's."""
    out = output_type(op)
    return (*(operand_layout(op, i, out.ndim - 2) for i in range(3)), o_row_layout(op, out.shape))


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


def packed_qkv_views(batch: int, heads: int, seq: int, d: int, dtype: DType,
                     kv_heads: int | None = None) -> tuple[TensorType, dict[str, tuple[int, ...]]]:
    """A [batch, seq, (heads + 2·kv_heads)·d] projection (each token's q heads, then its k heads,
    then its v heads) and the views of q, k and v in it, as a strided op's attributes."""
    kv_heads = kv_heads or heads
    row = (heads + 2 * kv_heads) * d
    views = dict(shapes=(batch, heads, seq, d) + (batch, kv_heads, seq, d) * 2, strides=(seq * row, d, row, 1) * 3,
                 offsets=(0, heads * d, (heads + kv_heads) * d))
    return TensorType((batch, seq, row), dtype), views


def merged_heads(batch: int, heads: int, seq: int, d: int) -> View:
    """The [batch, heads, seq, d] view of a [batch, seq, heads·d] value: heads side by side."""
    return (batch, heads, seq, d), (seq * heads * d, d, heads * d, 1), 0


def packed_qkv_attention(batch: int, heads: int, seq: int, d: int, dtype: DType, causal: bool = False,
                         kv_heads: int | None = None) -> KernelOp:
    """The strided_attention of multi-head attention cut from one projection: q, k and v read where
    the projection holds them (packed_qkv_views), the output written as [batch, seq, heads, d],
    heads side by side."""
    qkv, views = packed_qkv_views(batch, heads, seq, d, dtype, kv_heads)
    attrs = dict(scale=d ** -0.5, causal=causal, has_mask=False, shape=(batch, seq, heads, d),
                 out_strides=merged_heads(batch, heads, seq, d)[1], **views)
    return KernelOp.of("strided_attention", (qkv,) * 3, OPS["strided_attention"].infer(qkv, qkv, qkv, **attrs), **attrs)


def packed_qkv_lse(batch: int, heads: int, seq: int, d: int, dtype: DType, causal: bool = False,
                   merged: bool = True) -> KernelOp:
    """The strided_attention_lse of a training step's forward: q, k and v read where the
    projection holds them (packed_qkv_views), O written with the heads side by side where the
    output projection reads it (`merged`: o_strides) or dense, the logsumexps after it."""
    qkv, views = packed_qkv_views(batch, heads, seq, d, dtype)
    attrs = dict(scale=d ** -0.5, causal=causal, has_mask=False, **views)
    if merged:
        attrs["o_strides"] = merged_heads(batch, heads, seq, d)[1]
    return KernelOp.of("strided_attention_lse", (qkv,) * 3, OPS["strided_attention_lse"].infer(qkv, qkv, qkv, **attrs),
                       **attrs)


def round_up(x: int, to: int) -> int:
    return -(-x // to) * to
