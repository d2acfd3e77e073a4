"""The attention backward's problem and schedules as its kernels see them: batch and heads
flattened, the mask if there is one, and the blocks and score pairs a schedule computes.

>>> from tessera_rw.algebra.dtypes import DType
>>> t = TensorType((2, 4, 1000, 64), DType.bfloat16)
>>> op = KernelOp.of("flash_attention_bwd", (t, t, t, t, TensorType((2, 4, 1000, 2), DType.float32)),
...                  TensorType((3 * t.numel,), DType.bfloat16), scale=0.125, causal=True, has_mask=False)
>>> shape = BackwardShape.of(op)
>>> (shape.bh, shape.sq, shape.backward_blocks(64, atomic=False))
(8, 1000, 256)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.attention_backward import STATS
from tessera_rw.algebra.ops.strided_attention_backward import gradient_shapes, gradient_writes
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.attention_problem import (RowLayout, attention_operands, merged_heads,
                                                            packed_qkv_views, reads_views)
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.lower.attention_writes import ROW_ALIGNMENT, rows_fit

# sm_90's wgmma kernel: 64 rows (keys or queries) per warpgroup
WG_ROWS = 64


@dataclass(frozen=True)
class BackwardSchedule(Schedule):
    """`rows` = 16·warps rows a block owns (queries or keys), `cols` per streamed tile, cp.async stages."""
    rows: int = 64
    cols: int = 64
    warps: int = 4
    stages: int = 2


@dataclass(frozen=True)
class GradientSchedule(BackwardSchedule):
    """The backward kernel's schedule: `dq` "jobs" (blocks of ROWS queries of their own recompute S
    and dP for dQ: a fixed order) or "atomic" (the key blocks add dS K into a workspace: `fast` only)."""
    dq: str = "jobs"

    @property
    def atomic(self) -> bool:
        return self.dq == "atomic"


@dataclass(frozen=True)
class WarpgroupGradientSchedule(GradientSchedule):
    """sm_90's wgmma kernel (the fixed-order form): `rows` = 64 per warpgroup of 4 warps, `cols` a
    wgmma's width."""
    tag: ClassVar[str] = "wg"


@dataclass(frozen=True)
class BackwardShape:
    """The sizes as the kernels see them: batch and heads flattened into bh, and the mask (the last
    operand) if there is one."""
    bh: int
    sq: int
    sk: int
    d: int
    dtype: DType
    causal: bool
    scale: float
    batch: tuple[int, ...] = ()
    mask: TensorType | None = None
    window: int = 0               # causal's band: query i sees keys i - window + 1 .. i (0: every earlier key)

    @classmethod
    def of(cls, op: KernelOp) -> BackwardShape:
        q, k, *_ = attention_operands(op)
        a = op.attr_map
        return cls(math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1], q.dtype, bool(a.get("causal")),
                   float(a["scale"]), q.shape[:-2], op.operands[-1] if a.get("has_mask") else None,
                   int(a.get("window") or 0))

    def warpgroup_mma(self, arch: ArchSpec) -> bool:
        """Whether sm_90's wgmma kernel serves it: on sm_90, for sequences of a warpgroup's 64 rows
        or more (shorter ones stay on mma.sync, whose blocks shrink to them)."""
        return arch.compute_capability == (9, 0) and min(self.sq, self.sk) >= WG_ROWS

    def mask_reads(self, pairs: int, arch: ArchSpec) -> int:
        """HBM bytes of mask read for `pairs` scores: a mask that fits L2 comes in once, a bigger one
        once per score computed."""
        if self.mask is None:
            return 0
        return self.mask.nbytes if self.mask.nbytes <= arch.l2_bytes // 2 else pairs * self.mask.dtype.itemsize

    def backward_blocks(self, rows: int, atomic: bool) -> int:
        """flash_attention_bwd's grid: a block per `rows` keys of every head, and (but for the
        atomic form) one per `rows` queries."""
        key_blocks = self.bh * -(-self.sk // rows)
        return key_blocks if atomic else key_blocks + self.bh * -(-self.sq // rows)

    def pairs(self, rows: int, cols: int, by_keys: bool) -> int:
        """(query, key) pairs computed, padding and the tiles causal (and a window) skip accounted:
        blocks of `rows` keys walking `cols`-query tiles (by_keys) or blocks of `rows` queries
        walking key tiles, as the kernels bound their walks."""
        own, other = (self.sk, self.sq) if by_keys else (self.sq, self.sk)
        every = -(-other // cols)
        total = 0
        for r0 in range(0, own, rows):
            if not self.causal:
                tiles = every
            elif by_keys:         # from the tile of query r0 to past the band of key r0 + rows - 1
                end = min(every, (r0 + rows + self.window - 2) // cols + 1) if self.window else every
                tiles = end - r0 // cols
            else:                 # from the tile the band of query r0 meets to past key r0 + rows - 1
                end = min(every, -(-(r0 + rows) // cols))
                tiles = end - (min(max(0, r0 - self.window + 1) // cols, end - 1) if self.window else 0)
            total += max(tiles, 0) * rows * cols
        return self.bh * total


def packed_qkv_backward(batch: int, heads: int, seq: int, d: int, dtype: DType, causal: bool = False,
                        written: bool = True, kv_heads: int | None = None) -> KernelOp:
    """The strided_attention_bwd of a training step: q, k and v read where one projection holds
    them (packed_qkv_views; `kv_heads` K/V heads, each serving a group of q's), dO where the output
    projection's gradient holds it, heads side by side (merged_heads); dQ, dK and dV written as that
    projection's gradient [batch, seq, 3, heads, d] (`written`) or packed (dK and dV per q head, as
    flash_attention_bwd's); the row statistics dense."""
    qkv, views = packed_qkv_views(batch, heads, seq, d, dtype, kv_heads)
    do = TensorType((batch, seq, heads * d), dtype)
    shape, strides, offset = merged_heads(batch, heads, seq, d)
    attrs = dict(scale=d ** -0.5, causal=causal, has_mask=False, shapes=views["shapes"] + shape,
                 strides=views["strides"] + strides, offsets=views["offsets"] + (offset,))
    if written:
        row = 3 * heads * d
        attrs |= dict(shape=(batch, seq, 3, heads, d), out_strides=(seq * row, d, row, 1) * 3,
                      out_offsets=(0, heads * d, 2 * heads * d))
    operands = (qkv, qkv, qkv, do, TensorType((batch, heads, seq, STATS), DType.float32))
    return KernelOp.of("strided_attention_bwd", operands, OPS["strided_attention_bwd"].infer(*operands, **attrs),
                       **attrs)


def batches_fit(op: KernelOp, heads: tuple[TensorType, ...]) -> bool:
    """Whether the backward kernels take q, k, v (and dO / O) of these batch shapes: all q's, but for
    k and v read through views (whose row layouts find each head's rows), which may have fewer heads,
    each serving a group of q's (GQA), or one."""
    q = heads[0]
    for i, t in enumerate(heads):
        if t.shape[:-2] == q.shape[:-2]:
            continue
        if not (reads_views(op) and i in (1, 2) and q.ndim >= 3 and t.shape[:-3] == q.shape[:-3]
                and q.shape[-3] % t.shape[-3] == 0):
            return False
    return True


def written_gradients(op: KernelOp) -> tuple[tuple[tuple[int, ...], ...], list | None]:
    """A backward op's dQ, dK and dV shapes, and (strides, offset) each where a
    strided_attention_bwd's write attributes put them (None: packed one after another, dense)."""
    a = op.attr_map
    return (gradient_shapes(attention_operands(op)),
            gradient_writes(a.get("shape", ()), a.get("out_strides", ()), a.get("out_offsets", ())))


def gradient_layouts(op: KernelOp, rank: int) -> list[RowLayout]:
    """Where a backward op writes the rows of dQ, dK and dV, batch dims padded to `rank`: packed one
    after another, dense, or where a strided_attention_bwd's write attributes put them."""
    grads, writes = written_gradients(op)
    if writes is None:
        starts = (0, math.prod(grads[0]), math.prod(grads[0]) + math.prod(grads[1]))
        writes = [(contiguous_strides(g), start) for g, start in zip(grads, starts)]
    return [RowLayout.of_view(grad, strides, offset, rank) for grad, (strides, offset) in zip(grads, writes)]


def gradient_write_refusal(op: KernelOp) -> str | None:
    """Why the backward kernels cannot write dQ, dK and dV where a strided_attention_bwd puts them
    (lower/attention_writes.py makes only layouts they can: rows_fit); None when they can."""
    grads, writes = written_gradients(op)
    for name, grad, (strides, offset) in zip(("dQ", "dK", "dV"), grads, writes or ()):
        if not rows_fit(grad, strides, offset, op.result.dtype.itemsize, read=False):
            return (f"the attention backward kernel writes rows of contiguous values starting on {ROW_ALIGNMENT} "
                    f"bytes; {name} is written through strides {strides} from offset {offset}")
    return None
