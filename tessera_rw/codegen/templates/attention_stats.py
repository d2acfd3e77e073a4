"""attention_row_stats_from_lse: the backward's row statistics read off flash_attention_lse's result.

One warp per query row: its lanes read the row's O (from the packed forward) and dO two values at
a time, sum O·dO in float32 and reduce across the warp; lane 0 writes (hi + lo, Σ dO·O), the
logsumexp's two parts read from after O. A pass over O and dO, nothing recomputed: where the
forward writes the logsumexp, this takes the place of attention_row_stats's second Q Kᵀ.

>>> from tessera_rw.codegen.arch import arch_named
>>> t = AttentionStatsFromLseTemplate()
>>> [t.accepts(op) for op in t.samples()]
[True, True, True]
>>> t.schedules(t.samples()[0], arch_named("h100"))[0].describe()
'warps=8'
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template as Text

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.attention_backward import STATS, lse_length
from tessera_rw.codegen.arch import ArchSpec, MathUnit, WARP_SIZE
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.attention_cuda import offset_statements
from tessera_rw.codegen.templates.attention_problem import (attention_operands, merged_heads, o_row_layout, o_strides,
                                                            operand_bytes, operand_layout, reads_views, view_refusal)
from tessera_rw.codegen.templates.base import Resources, Schedule, Template
from tessera_rw.lower.attention_writes import rows_fit

WARP_COUNTS = (8, 4, 16, 2)         # the first is the default


@dataclass(frozen=True)
class RowsSchedule(Schedule):
    """`warps` query rows per block, a warp each."""
    warps: int = 8


class AttentionStatsFromLseTemplate(Template):
    kind = "flash_attention"
    # the strided form reads dO through a view (lower/attention_views.py)
    ops = frozenset({"attention_row_stats_from_lse", "strided_attention_row_stats_from_lse"})

    def accepts(self, op: KernelOp) -> bool:
        """bf16/fp16 forward and dO of one dtype (what flash_attention_lse's kernel writes), an even
        head width (the lanes read two values at a time); views of dO, and O where the forward wrote
        it (o_strides), whose rows are contiguous and aligned."""
        if op.op not in self.ops or len(op.operands) != 2:
            return False
        fwd, do = attention_operands(op)
        o = o_strides(op)
        return (do.dtype in (DType.bfloat16, DType.float16) and fwd.dtype is do.dtype and do.ndim >= 2
                and do.shape[-1] % 2 == 0 and fwd.shape == (lse_length(do.shape),)
                and view_refusal(op, "") is None and (not o or rows_fit(do.shape, o, 0, do.dtype.itemsize)))

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return ("row_stats",) + ("strided_read",) * reads_views(op)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[RowsSchedule, ...]:
        return (RowsSchedule(WARP_COUNTS[0]),)

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[RowsSchedule, ...]:
        return tuple(RowsSchedule(w) for w in WARP_COUNTS if WARP_SIZE * w <= arch.max_threads_per_block)

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        return (self.accepts(op) and isinstance(schedule, RowsSchedule) and schedule.warps >= 1
                and WARP_SIZE * schedule.warps <= arch.max_threads_per_block)

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        assert isinstance(schedule, RowsSchedule)
        fwd, do = attention_operands(op)
        rows = do.numel // do.shape[-1]
        # ptxas on sm_80 and sm_90: 14 registers at D=64, 18 at D=128, whatever the warps
        return Resources(threads=WARP_SIZE * schedule.warps, blocks=max(1, -(-rows // schedule.warps)),
                         registers=10 + do.shape[-1] // 16,
                         smem_bytes=0, hbm_bytes=sum(operand_bytes(op, 2)) + op.result.nbytes, flops=2 * do.numel + rows,
                         unit=MathUnit.FP32)

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        assert isinstance(schedule, RowsSchedule)
        if not self.accepts(op):
            raise ValueError(f"attention_row_stats_from_lse template cannot implement {op}")
        do = attention_operands(op)[1]
        rows, d = do.numel // do.shape[-1], do.shape[-1]
        tag = "bf16" if do.dtype is DType.bfloat16 else "f16"
        name = f"{op.op}_{tag}_d{d}_w{schedule.warps}"
        blocks = max(1, -(-rows // schedule.warps))
        header = (f"// {op}\n// schedule: {schedule.describe()}\n"
                  f"// launch: {name}<<<{blocks}, {WARP_SIZE * schedule.warps}>>>(fwd, do, stats); stats [rows][{STATS}] fp32\n")
        source = Text(KERNEL).substitute(NAME=name, ELEM=f"{tag}_t", TO_F32=f"{tag}_to_f32", D=d, ROWS=rows,
                                         WARPS=schedule.warps, ROWS_AT=_rows(op, f"{tag}_t"))
        return KernelSource(name, header + source, threads=WARP_SIZE * schedule.warps, grid=(blocks, 1, 1),
                            fast_math=op.numerics is Numerics.FAST)

    def samples(self) -> tuple[KernelOp, ...]:
        return (self.sample((4, 16, 4096, 64), DType.bfloat16), self.sample((3, 8, 1000, 128), DType.float16),
                self.sample((2, 12, 1000, 64), DType.bfloat16, merged=True))

    @staticmethod
    def sample(shape: tuple[int, ...], dtype: DType, merged: bool = False) -> KernelOp:
        """The op for dO of `shape` [b, h, s, d]; `merged`: dO read where [b, s, h·d] holds it, O where
        the forward wrote it likewise, heads side by side."""
        fwd, result = TensorType((lse_length(shape),), dtype), TensorType(shape[:-1] + (STATS,), DType.float32)
        if not merged:
            return KernelOp.of("attention_row_stats_from_lse", (fwd, TensorType(shape, dtype)), result)
        b, h, s, d = shape
        view, strides, offset = merged_heads(b, h, s, d)
        return KernelOp.of("strided_attention_row_stats_from_lse", (fwd, TensorType((b, s, h * d), dtype)), result,
                           shapes=view, strides=strides, offsets=(offset,), o_strides=strides)


def _rows(op: KernelOp, elem: str) -> str:
    """CUDA pointing `o` and `g` at the row's O and dO: row·D of dense ones, else where the forward
    wrote O (o_strides) and where dO's view puts its row (the head's offset, then the row within
    the head times the row stride)."""
    if not reads_views(op):
        return f"    const {elem}* o = fwd + row * D;\n    const {elem}* g = dout + row * D;"
    do = attention_operands(op)[1]
    batch, seq = do.shape[:-2], do.shape[-2]
    layouts = [("o_off", o_row_layout(op, do.shape)), ("g_off", operand_layout(op, 1, do.ndim - 2))]
    return (f"    const int bh = (int)(row / {seq});\n{offset_statements(batch, layouts)}\n"
            f"    const {elem}* o = fwd + o_off + (row % {seq}) * {layouts[0][1].row}LL;\n"
            f"    const {elem}* g = dout + g_off + (row % {seq}) * {layouts[1][1].row}LL;")


KERNEL = r"""
extern "C" __global__ void __launch_bounds__($WARPS * 32)
$NAME(const $ELEM* __restrict__ fwd, const $ELEM* __restrict__ dout, float* __restrict__ stats) {
    constexpr int D = $D, WARPS = $WARPS;
    constexpr long long ROWS = $ROWS, NO = ROWS * D;     // rows, and where O ends in fwd
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= ROWS)
        return;                                           // the whole warp: its row is past the end
$ROWS_AT
    float acc = 0.f;
    #pragma unroll
    for (int c = 2 * lane; c < D; c += 64) {
        const unsigned ov = *(const unsigned*)(o + c), gv = *(const unsigned*)(g + c);
        acc += $TO_F32(ov & 0xffffu) * $TO_F32(gv & 0xffffu) + $TO_F32(ov >> 16) * $TO_F32(gv >> 16);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        stats[2 * row] = $TO_F32(fwd[NO + row]) + $TO_F32(fwd[NO + ROWS + row]);   // lse: high part + remainder
        stats[2 * row + 1] = acc;
    }
}
"""
