"""The attention backward kernels: attention_row_stats and flash_attention_bwd.

Both are FlashAttention-2's: the row statistics kernel is the forward's online softmax without
P V (plus Σ dO·O per row); the backward kernel recomputes P from those statistics tile by tile,
with one block per ROWS keys accumulating dK and dV and one block per ROWS queries accumulating
dQ, so nothing Sq×Sk reaches memory and no atomics are needed. It has two kernels:

- GradientSchedule: mma.sync, sm_80 on (attention_backward_cuda.py);
- WarpgroupGradientSchedule: sm_90's warpgroup MMAs, 64 rows per warpgroup, all seven products
  on wgmma (attention_backward_wgmma_cuda.py). On sm_90 its schedules come first.

Under the `fast` policy the mma.sync kernel has a second form, `dq="atomic"`, FlashAttention-2's
own: key blocks alone, each adding its share of dQ into an fp32 workspace with atomics, which
computes five products per score where the fixed-order form computes seven. It stays second:
on an H200 its atomics cost more than the two products they save (1.7-1.9x the fixed-order
form's time, bench/results/tune-NVIDIA-H200-2026-11-26.md), so the tuner alone picks it.
They take bf16/fp16 q, k, v, dO of one batch shape (a GQA or broadcast K/V arrives repeated),
head_dim 64 or 128 with Dv == D, `causal`, and an explicit bool or float (fp32/fp16/bf16) mask
that broadcasts over batch, heads and rows, read per score as the forward reads it.

>>> from tessera_rw.codegen.arch import arch_named
>>> t = FlashAttentionBwdTemplate()
>>> op = t.samples()[0]
>>> t.schedules(op, arch_named("a100"))[0].describe()
'rows=64 cols=64 warps=4 stages=2 dq=jobs'
>>> t.schedules(op, arch_named("h100"))[0].describe()
'wg rows=128 cols=64 warps=8 stages=2 dq=jobs'
>>> from dataclasses import replace
>>> [s.dq for s in t.schedules(replace(op, numerics=Numerics.FAST), arch_named("a100"))]
['jobs', 'jobs', 'atomic', 'atomic']
"""

from __future__ import annotations

import math
from abc import abstractmethod

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import ArchSpec, MathUnit, WARP_SIZE
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.prelude import ATOM_BYTES, WGMMA_WIDTHS
from tessera_rw.codegen.templates.attention import HIDDEN_SOFTMAX, MMA_SYNC_EFFICIENCY, SFU_PER_SM, WGMMA_EFFICIENCY
from tessera_rw.codegen.templates.attention_backward_atomic_cuda import workspace_bytes
from tessera_rw.codegen.templates.attention_backward_cuda import emit_bwd
from tessera_rw.codegen.templates.attention_problem import (attention_operands, operand_bytes, reads_views,
                                                            resident_heads, round_up, view_refusal)
from tessera_rw.codegen.templates.attention_backward_problem import (WG_ROWS, BackwardSchedule, BackwardShape,
                                                                     GradientSchedule, WarpgroupGradientSchedule,
                                                                     batches_fit, gradient_write_refusal,
                                                                     packed_qkv_backward)
from tessera_rw.codegen.templates.attention_backward_wgmma_cuda import emit_wgmma_bwd
from tessera_rw.codegen.templates.attention_row_stats_cuda import emit_row_stats
from tessera_rw.codegen.templates.attention_cuda import MASK_TYPES
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space

HEAD_DIMS = (64, 128)
HEAD_TENSORS = 4      # q, k, then o and dO (row stats) or v and dO (backward): each [.., S, D]
MMA_M = 16
# The tuning grid: warps per block (16 rows each), columns per streamed tile, cp.async stages.
# Left out where ptxas strays from the register model (checked on sm_80 and sm_90): two-warp
# blocks and unpipelined loads (up to half again the registers), 128-wide tiles (ptxas's choice
# swings by 2x between stage counts), and a third backward stage (8 warps spill).
GRID_WARPS, GRID_COLS = (4, 8), (32, 64)
# sm_90's wgmma backward: warpgroups per block (64 rows each), tile widths, stages
WG_GRID_GROUPS, WG_GRID_COLS, WG_GRID_STAGES = (1, 2), (32, 64, 128), (2, 3)


def _refusal(op: KernelOp, operands: int) -> str | None:
    """None when `op` has `operands` operands and the mask if it has one (of a dtype the kernels
    read), the first four bf16/fp16 [.., S, D] tensors of one dtype and batch shape with head_dim 64
    or 128; else what is not so."""
    has_mask = bool(op.attr_map.get("has_mask"))
    if len(op.operands) != operands + has_mask:
        return f"the attention backward kernel takes {operands} operands{' and a mask' if has_mask else ''}"
    if has_mask and op.operands[-1].dtype not in MASK_TYPES:
        return (f"the attention backward kernel reads masks of {', '.join(map(str, MASK_TYPES))}, "
                f"not {op.operands[-1].dtype}")
    heads = attention_operands(op)[:HEAD_TENSORS]
    q = heads[0]
    if q.dtype not in (DType.bfloat16, DType.float16):
        return (f"the attention backward kernel computes in bf16/fp16 on tensor cores, and q is {q.dtype}: "
                f"{q.dtype} attention's backward runs as GEMMs and row kernels (cast q, k and v to bf16 or "
                "fp16 to fuse it)")
    if q.ndim < 2 or q.shape[-1] not in HEAD_DIMS:
        return f"the attention backward kernel takes head dims {' or '.join(map(str, HEAD_DIMS))}, here {q.shape[-1:]}"
    if not all(t.dtype is q.dtype and t.ndim == q.ndim and t.shape[-1] == q.shape[-1] for t in heads) \
            or not batches_fit(op, heads):
        return ("the attention backward kernel takes q, k, v and dO of one dtype and batch shape (k and v "
                "read in place may have fewer heads, a group of q's each), here " + ", ".join(map(str, heads)))
    return view_refusal(op, "the attention backward kernel")


# The atomic form's dQ adds (fp32, into L2, each address from every key block in turn) slow its
# products: fitted to the H200 sweep, where it measured 1.7-1.9x the fixed-order form's time.
ATOMIC_DQ_SLOWDOWN = 2.6


def _efficiency(arch: ArchSpec, d: int, products: float, warpgroup_mma: bool = False) -> float:
    """The share of the bf16 tensor peak reached per score: `products` D-wide MMAs (mma.sync's, or
    sm_90's wgmmas) beside the exp and a few SIMT operations, the latter partly hidden by other
    warps' MMAs."""
    clock = arch.sm_count * arch.clock_mhz * 1e6
    tensor_rate = arch.peak_flops(MathUnit.BF16) / clock
    lanes = arch.peak_flops(MathUnit.FP32) / clock / 2
    base = WGMMA_EFFICIENCY if warpgroup_mma else MMA_SYNC_EFFICIENCY.get(arch.compute_capability[0], 0.5)
    mma = 2 * products * d / tensor_rate
    simt = 1 / SFU_PER_SM + 6 / lanes
    return round(2 * products * d / tensor_rate / (mma / base + HIDDEN_SOFTMAX * simt), 3)


class _BackwardTemplate(Template):
    kind = "flash_attention"
    operands: int                         # operand count: the head tensors, then the backward's stats
    stages: tuple[int, ...] = (2,)        # cp.async stage counts the grid tries

    def accepts(self, op: KernelOp) -> bool:
        return op.op in self.ops and self.refusal(op) is None

    def refusal(self, op: KernelOp) -> str | None:
        return _refusal(op, self.operands)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[BackwardSchedule, ...]:
        shape = BackwardShape.of(op)
        cols = min(self.default_cols(shape.d), round_up(max(shape.sq, shape.sk), 16))
        found = []
        for warps in (4, 8):
            warps = min(warps, -(-max(shape.sq, shape.sk) // MMA_M))
            s = BackwardSchedule(MMA_M * warps, cols, warps, 2)
            if s not in found and self._valid(shape, s, arch):
                found.append(s)
        return tuple(found)

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[BackwardSchedule, ...]:
        shape = BackwardShape.of(op)
        grid = [BackwardSchedule(MMA_M * w, c, w, st) for w in GRID_WARPS for c in GRID_COLS
                for st in self.stage_counts(shape)]
        return grid_space(self.schedules(op, arch), grid, lambda s: self._valid(shape, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        return (self.accepts(op) and isinstance(schedule, BackwardSchedule)
                and self._valid(BackwardShape.of(op), schedule, arch))

    def _valid(self, shape: BackwardShape, s: BackwardSchedule, arch: ArchSpec) -> bool:
        regs = self.registers(shape, s)
        return (s.warps >= 1 and s.rows == MMA_M * s.warps and s.cols % 16 == 0 and s.cols > 0 and s.stages >= 1
                and WARP_SIZE * s.warps <= arch.max_threads_per_block and self.smem(shape, s) <= arch.smem_per_block
                and regs <= arch.registers_per_thread and WARP_SIZE * s.warps * regs <= arch.registers_per_sm)

    def default_cols(self, d: int) -> int:
        return 64

    def stage_counts(self, shape: BackwardShape) -> tuple[int, ...]:
        """The cp.async stage counts the tuning grid tries for `shape`."""
        return self.stages

    @abstractmethod
    def smem(self, shape: BackwardShape, s: BackwardSchedule) -> int:
        """Dynamic shared memory per block."""

    @abstractmethod
    def registers(self, shape: BackwardShape, s: BackwardSchedule) -> int:
        """Registers per thread, as ptxas allocates them (the register model)."""

    def samples(self) -> tuple[KernelOp, ...]:
        # sizes whose whole float64 reference (every score at once) stays near 100 MB; masks: a bool
        # one per batch item shared by the heads, a float one shared by all, on ragged tiles
        bf16, f16 = DType.bfloat16, DType.float16
        return tuple(self.sample(*args) for args in ((2, 4, 1024, 64, bf16, False), (1, 4, 1024, 128, bf16, True),
                                                     (3, 2, 1000, 64, f16, True), (1, 2, 200, 128, f16, False))) + (
            self.sample(2, 4, 1024, 64, bf16, False, mask=TensorType((2, 1, 1024, 1024), DType.bool)),
            self.sample(1, 2, 1000, 128, f16, True, mask=TensorType((1000, 1000), f16)))

    def with_flags(self, fused: tuple[str, ...], op: KernelOp) -> tuple[str, ...]:
        """The fused-step names with the mask's, the causal flag's and the window's."""
        a = op.attr_map
        return fused + (("mask",) if a.get("has_mask") else ()) + (("causal",) if a.get("causal") else ()) \
            + (("window",) if a.get("window") else ())

    @abstractmethod
    def sample(self, b: int, h: int, s: int, d: int, dtype: DType, causal: bool,
               mask: TensorType | None = None) -> KernelOp:
        """The template's op for q, k, v of shape (b, h, s, d), with `mask` as its last operand."""


class AttentionRowStatsTemplate(_BackwardTemplate):
    """attention_row_stats: logsumexp per query row (the forward's online softmax without P V) and
    Σ dO·O per row, in one pass over K.

    >>> t = AttentionRowStatsTemplate()
    >>> [t.accepts(op) for op in t.samples()]
    [True, True, True, True, True, True]
    """
    ops = frozenset({"attention_row_stats"})
    operands = 4
    stages = (2, 3)

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return self.with_flags(("row_stats",), op)

    def smem(self, shape: BackwardShape, s: BackwardSchedule) -> int:
        return (s.rows + s.stages * s.cols) * shape.d * 2

    def registers(self, shape: BackwardShape, s: BackwardSchedule) -> int:
        # Fitted (minimax) to ptxas on sm_80 and sm_90 over S = 1000 and 1024, D = 64 and 128, causal
        # or not, a window of 256 or not, no, bool or fp16 mask, every schedule of the space: within
        # 19%. The S fragment and K's B fragments grow with the tile width, Q's fragments with D;
        # causal bounds hold more of both live, a window's yet more; a ragged last tile or a band
        # adds its predicates; reading a mask costs next to nothing.
        edge = shape.sk % s.cols != 0 or shape.window
        bounds = (0.07 if shape.causal else 0.0) + (0.12 if shape.window else 0.0)
        return math.ceil(0.87 * s.cols + 0.38 * shape.d + bounds * (s.cols + shape.d) + (10 if edge else 0))

    def stage_counts(self, shape: BackwardShape) -> tuple[int, ...]:
        return self.stages if shape.d <= 64 else (2,)   # D=128 with 3 stages: ptxas spills a ragged masked tile

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        s = schedule
        assert isinstance(s, BackwardSchedule)
        shape = BackwardShape.of(op)
        q, k, o, do = op.operands[:4]
        pairs = shape.pairs(s.rows, s.cols, by_keys=False)
        blocks = shape.bh * -(-shape.sq // s.rows)
        regs = self.registers(shape, s)
        # each query block re-reads its head's K; heads in flight share it through L2 while it fits
        heads = resident_heads(arch, blocks // shape.bh, WARP_SIZE * s.warps, regs, self.smem(shape, s))
        k_reads = k.nbytes if heads * k.nbytes / shape.bh <= arch.l2_bytes // 2 else \
            pairs // s.rows * shape.d * k.dtype.itemsize
        return Resources(threads=WARP_SIZE * s.warps, blocks=blocks, registers=regs, smem_bytes=self.smem(shape, s),
                         hbm_bytes=q.nbytes + k_reads + o.nbytes + do.nbytes + op.result.nbytes
                         + shape.mask_reads(pairs, arch),
                         flops=pairs * (2 * shape.d + 4) + 2 * o.numel, unit=MathUnit.BF16,
                         efficiency=_efficiency(arch, shape.d, 1), spill_bytes=max(0, regs - arch.registers_per_thread) * 8)

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        assert isinstance(schedule, BackwardSchedule)
        if not self.accepts(op):
            raise ValueError(f"attention_row_stats template cannot implement {op}")
        shape = BackwardShape.of(op)
        return emit_row_stats(op, shape, schedule, self.smem(shape, schedule))

    def sample(self, b: int, h: int, s: int, d: int, dtype: DType, causal: bool,
               mask: TensorType | None = None) -> KernelOp:
        t = TensorType((b, h, s, d), dtype)
        return KernelOp.of("attention_row_stats", (t, t, t, t) + ((mask,) if mask else ()),
                           TensorType((b, h, s, 2), DType.float32), scale=d ** -0.5, causal=causal,
                           has_mask=mask is not None)


class FlashAttentionBwdTemplate(_BackwardTemplate):
    """flash_attention_bwd: dQ, dK, dV from Q, K, V, dO and the row statistics, P recomputed.

    >>> t = FlashAttentionBwdTemplate()
    >>> [t.accepts(op) for op in t.samples()]
    [True, True, True, True, True, True, True]
    """
    # the strided form reads q, k, v and dO through views (lower/attention_views.py)
    ops = frozenset({"flash_attention_bwd", "strided_attention_bwd"})
    operands = 5

    def refusal(self, op: KernelOp) -> str | None:
        if (why := super().refusal(op)) is not None:
            return why
        stats = op.operands[4]
        return gradient_write_refusal(op) if stats.dtype is DType.float32 else \
            f"the row statistics are float32, not {stats.dtype}"

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return self.with_flags(("backward",), op) + ("strided_read",) * reads_views(op) \
            + ("strided_write",) * bool(op.attr_map.get("shape"))

    def samples(self) -> tuple[KernelOp, ...]:
        # and a training step's: q, k, v read from one projection, dO with the heads side by side
        return super().samples() + (packed_qkv_backward(2, 4, 1024, 64, DType.bfloat16, causal=True),)

    def default_cols(self, d: int) -> int:
        return 64 if d <= 64 else 32          # D=128: dK and dV take 128 registers; 32-wide tiles keep S, dP small

    @staticmethod
    def forms(op: KernelOp) -> tuple[str, ...]:
        """The dQ forms `op`'s numerics policy allows, the preferred first."""
        return ("jobs", "atomic") if op.numerics is Numerics.FAST else ("jobs",)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[GradientSchedule, ...]:
        # The atomic form puts its widest blocks first, as FlashAttention-2 does (128 keys): each
        # query tile's dQ share is added once per block, so twice the keys per block halves the
        # atomics per product, and the query tiles streamed per key. Not at D=128, whose 8-warp
        # atomic blocks sit at ptxas's 255 registers and spill on sm_90 for a ragged sequence: they
        # stay in the tuning space only. (The fixed-order form measured its 4-warp blocks faster:
        # bench/results/tune-H200.txt.)
        shape = BackwardShape.of(op)
        base = super().schedules(op, arch)
        widest_first = sorted(base, key=lambda s: -s.warps) if shape.d <= 64 else [s for s in base if s.warps <= 4]
        found = [GradientSchedule(s.rows, s.cols, s.warps, s.stages, form) for form in self.forms(op)
                 for s in (widest_first if form == "atomic" else base)]
        return self._warpgroup_defaults(shape, arch) + tuple(s for s in found if self._valid(shape, s, arch))

    def _warpgroup_defaults(self, shape: BackwardShape, arch: ArchSpec) -> tuple[GradientSchedule, ...]:
        """sm_90's wgmma schedules (the fixed-order form, which every policy allows): two warpgroups
        (one where the longer sequence has 64 rows) over 64-wide tiles, then over 32-wide ones,
        which keep D=128's blocks some 50 registers further from 255; and one warpgroup, twice the
        blocks, for a grid short of the SMs."""
        if not shape.warpgroup_mma(arch):
            return ()
        groups = 1 if max(shape.sq, shape.sk) <= WG_ROWS else 2
        picked = (WarpgroupGradientSchedule(WG_ROWS * groups, 64, 4 * groups, 2),
                  WarpgroupGradientSchedule(WG_ROWS * groups, 32, 4 * groups, 2),
                  WarpgroupGradientSchedule(WG_ROWS, 64, 4, 2))
        picked = tuple(dict.fromkeys(picked))
        return tuple(s for s in picked if self._valid(shape, s, arch))

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[GradientSchedule, ...]:
        shape = BackwardShape.of(op)
        grid = [GradientSchedule(MMA_M * w, c, w, st, form) for form in self.forms(op) for w in GRID_WARPS
                for c in GRID_COLS for st in self.stage_counts(shape)]
        if shape.warpgroup_mma(arch):
            grid += [WarpgroupGradientSchedule(WG_ROWS * groups, c, 4 * groups, st)
                     for groups in WG_GRID_GROUPS for c in WG_GRID_COLS for st in WG_GRID_STAGES]
        return grid_space(self.schedules(op, arch), grid, lambda s: self._valid(shape, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        return (isinstance(schedule, GradientSchedule) and schedule.dq in self.forms(op)
                and super().valid(op, schedule, arch))

    def _valid(self, shape: BackwardShape, s: BackwardSchedule, arch: ArchSpec) -> bool:
        if isinstance(s, WarpgroupGradientSchedule) and not (
                shape.warpgroup_mma(arch) and s.warps % 4 == 0 and s.cols in WGMMA_WIDTHS and s.stages >= 2
                and not s.atomic):
            return False
        return super()._valid(shape, s, arch)

    def smem(self, shape: BackwardShape, s: BackwardSchedule) -> int:
        if isinstance(s, WarpgroupGradientSchedule):       # its tiles start on the swizzle's atoms
            return (2 * s.rows + 2 * s.stages * s.cols) * shape.d * 2 + ATOM_BYTES
        ds_tile = s.rows * s.cols * 2 if isinstance(s, GradientSchedule) and s.atomic else 0
        return (2 * s.rows + 2 * s.stages * s.cols) * shape.d * 2 + ds_tile

    def registers(self, shape: BackwardShape, s: BackwardSchedule) -> int:
        # the dK/dV jobs hold the most: dK and dV (fp32 over 32 lanes: D registers together), Sᵀ and
        # dPᵀ (cols); ptxas spends some 45% more on fragments and addresses in flight,
        # and past 255 it spills (D=128 with 64-wide tiles does). The atomic form's dQ share
        # (16 × 32 per task) lives after Sᵀ, so it adds nothing to the peak.
        if isinstance(s, WarpgroupGradientSchedule):
            # dK and dV (D together), Sᵀ and dPᵀ (cols), Pᵀ and dSᵀ packed (cols / 2), and addresses;
            # fitted to ptxas on sm_90 (S = 128 to 4096, causal or not): within 12%, and past 255
            # where it spills (128-wide tiles at D=128)
            return shape.d + 3 * s.cols // 2 + 30
        live = 2 * shape.d * MMA_M // 32 + 2 * s.cols * MMA_M // 32
        return int(1.45 * live) + 20

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        s = schedule
        assert isinstance(s, GradientSchedule)
        shape = BackwardShape.of(op)
        stats = op.operands[4]
        head_bytes = sum(operand_bytes(op, HEAD_TENSORS))
        kv_pairs = shape.pairs(s.rows, s.cols, by_keys=True)
        q_pairs = 0 if s.atomic else shape.pairs(s.rows, s.cols, by_keys=False)
        # dK/dV blocks: S, dP, dV, dK (4 products), and dQ's share in the atomic form (5); dQ blocks:
        # S, dP, dQ (3)
        flops = kv_pairs * ((10 if s.atomic else 8) * shape.d + 6) + q_pairs * (6 * shape.d + 5)
        blocks = shape.backward_blocks(s.rows, s.atomic)
        per_head = head_bytes / shape.bh
        streamed = head_bytes
        regs = self.registers(shape, s)
        heads = resident_heads(arch, blocks // shape.bh, WARP_SIZE * s.warps, regs, self.smem(shape, s))
        if heads * per_head > arch.l2_bytes // 2:      # each block's walk comes from HBM again
            streamed = (kv_pairs + q_pairs) // s.rows * 2 * shape.d * shape.dtype.itemsize
        # the atomic form's workspace: zeroed, summed into in L2, read back once by the converting blocks
        work = 2 * workspace_bytes(shape, s) if s.atomic else 0
        return Resources(threads=WARP_SIZE * s.warps, blocks=blocks, registers=regs, smem_bytes=self.smem(shape, s),
                         hbm_bytes=streamed + 2 * stats.nbytes + op.result.nbytes + work
                         + shape.mask_reads(kv_pairs + q_pairs, arch), flops=flops, unit=MathUnit.BF16,
                         efficiency=(_efficiency(arch, shape.d, 5) / ATOMIC_DQ_SLOWDOWN if s.atomic
                                     else _efficiency(arch, shape.d, 7 / 2,
                                                      isinstance(s, WarpgroupGradientSchedule))),
                         spill_bytes=max(0, regs - arch.registers_per_thread) * 8)

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        assert isinstance(schedule, GradientSchedule)
        if not self.accepts(op):
            raise ValueError(f"flash_attention_bwd template cannot implement {op}")
        if schedule.dq not in self.forms(op):
            raise ValueError(f"flash_attention_bwd: dq={schedule.dq!r} needs the 'fast' numerics policy "
                             f"(its dQ sum's order depends on timing); {op.numerics.value!r} allows "
                             f"{' or '.join(map(repr, self.forms(op)))}")
        shape = BackwardShape.of(op)
        if isinstance(schedule, WarpgroupGradientSchedule):
            return emit_wgmma_bwd(op, shape, schedule, self.smem(shape, schedule))
        return emit_bwd(op, shape, schedule, self.smem(shape, schedule))

    def sample(self, b: int, h: int, s: int, d: int, dtype: DType, causal: bool,
               mask: TensorType | None = None) -> KernelOp:
        t = TensorType((b, h, s, d), dtype)
        stats = TensorType((b, h, s, 2), DType.float32)
        return KernelOp.of("flash_attention_bwd", (t, t, t, t, stats) + ((mask,) if mask else ()),
                           TensorType((3 * t.numel,), dtype), scale=d ** -0.5, causal=causal,
                           has_mask=mask is not None)
