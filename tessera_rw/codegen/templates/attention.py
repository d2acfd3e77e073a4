"""FlashAttention-2 forward: softmax(scale · Q Kᵀ [+ mask] [causal]) V in one pass.

One block owns BM query rows of one (batch, head); each warp owns 16·MT of those rows, keeps its O
accumulator (fp32) and its running row max / sum in registers, and streams the head's K/V in
BN-key tiles through shared memory with cp.async (`stages` buffers in flight). Scores never reach
memory; only an explicit mask operand moves an Sq×Sk matrix through HBM. Two kernels:

- AttentionSchedule: mma.sync (sm_80 on), Q's fragments held in registers (attention_cuda.py);
- WarpgroupAttentionSchedule: sm_90's warpgroup MMAs, 64 query rows per warpgroup, Q read from
  shared memory by each Q Kᵀ product (attention_wgmma_cuda.py). On sm_90 its schedules come first.
  Its producer form (`producer=True`, attention_tma_cuda.py) adds a warpgroup that loads Q, K and V
  with TMA copies handed over by mbarriers; the tuning space holds it beside each wgmma schedule
  (a variant the resource model prices alike, so only a measurement picks it).

>>> from tessera_rw.codegen.arch import arch_named
>>> t = FlashAttentionTemplate()
>>> op = t.samples()[0]
>>> [s.describe() for s in t.schedules(op, arch_named("h100"))][:3]
['wg bm=128 bn=64 warps=8 stages=4', 'wg bm=128 bn=128 warps=8 stages=3', 'bm=128 bn=64 warps=8 stages=2']
>>> t.schedules(op, arch_named("a100"))[0].describe()
'bm=128 bn=64 warps=8 stages=2'
"""

from __future__ import annotations

from dataclasses import replace

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.strided import slice_text
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.codegen.arch import ArchSpec, MathUnit
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.prelude import ATOM_BYTES, WGMMA_WIDTHS
from tessera_rw.codegen.templates.attention_cuda import MASK_TYPES, emit_kernel
from tessera_rw.codegen.templates.attention_problem import (FORWARD_OPS, MMA_K, MMA_M, MMA_SYNC_MAX_HEAD_DIM,
                                                            WG_HEAD_DIMS, WG_ROWS, AttentionSchedule, AttentionShape,
                                                            WarpgroupAttentionSchedule, attention_operands,
                                                            o_strides, operand_bytes, operand_views, output_type,
                                                            packed_qkv_attention, packed_qkv_lse, reads_views, resident_heads,
                                                            round_up, view_refusal, with_lse, writes_lse)
from tessera_rw.codegen.templates.attention_tma_cuda import emit_tma_kernel
from tessera_rw.codegen.templates.attention_tma_cuda import smem_bytes as tma_smem_bytes
from tessera_rw.codegen.templates.attention_wgmma_cuda import emit_wgmma_kernel
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.warp_specialization import consumer_room, registers_at_launch
from tessera_rw.lower.attention_writes import ROW_ALIGNMENT, rows_fit

WIDE_HEAD_KEYS, WIDE_HEAD_STAGES = 32, (3, 4, 5)
SFU_PER_SM = 16               # ex2 throughput per SM per clock on sm_80 and sm_90 (4 per partition)
SIMT_OPS_PER_SCORE = 4        # scale-and-subtract FMA, running max, row-sum add, bf16 pack
HIDDEN_SOFTMAX = 0.5          # share of the softmax SIMT time that other warps' MMAs do not hide
MMA_SYNC_EFFICIENCY = {8: 0.7, 9: 0.5}   # mma.sync share of the tensor peak (sm_90's is wgmma's)
# wgmma's share on sm_90: the products wait for each other and the softmax within a warpgroup (a
# guess until timed on a device)
WGMMA_EFFICIENCY = 0.75
# The tuning grid (space()): warps per block, 16-row tiles per warp, keys per tile, cp.async stages
GRID_WARPS, GRID_M_TILES, GRID_KEYS, GRID_STAGES = (2, 4, 8), (1, 2), (32, 64, 128), (1, 2, 3)
CALIBRATED_REGISTERS = 216    # the largest default's estimate (D=128, 64-key tiles, with edges)
# sm_90's wgmma kernel: 64 rows per warpgroup, K/V tiles of 64 or 128 keys (a wgmma's width)
WG_KEYS, WG_GROUPS, WG_STAGES = (128, 64), (1, 2, 3), (3, 4)
WG_ADDRESSING = 32            # its tile pointers, descriptors, smem addresses, loop counters
WG_CALIBRATED_REGISTERS = 216


class FlashAttentionTemplate(Template):
    """flash_attention with bf16/fp16 q, k, v of one dtype, a head dim (Dv == D) that is a multiple
    of 16 up to 128, or 256 on sm_90; any broadcast batch, GQA heads, causal (with a sliding window
    or not), and a bool or float (fp32/fp16/bf16) mask.

    >>> t = FlashAttentionTemplate()
    >>> all(t.accepts(op) for op in t.samples()), len(t.samples())
    (True, 15)
    """
    kind = "flash_attention"
    # the lse ops also write each row's logsumexp; the strided ones read views (strided_attention
    # also writes one)
    ops = FORWARD_OPS

    def accepts(self, op: KernelOp) -> bool:
        return op.op in self.ops and self.refusal(op) is None

    def refusal(self, op: KernelOp) -> str | None:
        """bf16/fp16 only: fp32 (and fp64) attention stays unfused, since its products would run on
        the SIMT pipe or tf32, where the unfused GEMM + softmax plan is as fast and keeps fp32's
        accuracy. Head dims are multiples of 16 up to 128, and 256 (on sm_90 only, see WG_HEAD_DIMS)."""
        operands = attention_operands(op)
        if len(operands) < 3 or min(t.ndim for t in operands[:3]) < 2:
            return "the fused attention kernel takes q, k and v of at least 2 dims"
        q, k, v = operands[:3]
        if q.dtype not in (DType.bfloat16, DType.float16):
            return (f"the fused attention kernel computes in bf16/fp16 on tensor cores, and q is {q.dtype}: "
                    f"{q.dtype} attention runs as GEMM + softmax + GEMM (cast q, k and v to bf16 or fp16 to fuse it)")
        if not q.dtype == k.dtype == v.dtype == op.result.dtype:
            return (f"the fused attention kernel takes q, k, v and its result in one dtype, here {q.dtype}, "
                    f"{k.dtype}, {v.dtype} and {op.result.dtype}")
        d = q.shape[-1]
        if not (d % 16 == 0 and 16 <= d <= MMA_SYNC_MAX_HEAD_DIM or d in WG_HEAD_DIMS) or v.shape[-1] != d:
            return (f"the fused attention kernel takes head dims that are multiples of 16 up to "
                    f"{MMA_SYNC_MAX_HEAD_DIM}, or {WG_HEAD_DIMS[-1]}, with v's equal to q's; here q's is {d} and "
                    f"v's {v.shape[-1]}")
        mask = operands[3] if op.attr_map.get("has_mask") else None
        if mask is not None and mask.dtype not in MASK_TYPES:
            return f"the fused attention kernel reads masks of {', '.join(map(str, MASK_TYPES))}, not {mask.dtype}"
        return self._layout_refusal(op) if reads_views(op) else None

    @staticmethod
    def _layout_refusal(op: KernelOp) -> str | None:
        """Why the kernels cannot read or write a strided op's views (lower/attention_views.py makes
        only views they can: rows_fit)."""
        refusal = view_refusal(op, "the fused attention kernel")
        written = o_strides(op)
        if refusal or not written:
            return refusal
        if not rows_fit(output_type(op).shape, written, 0, op.result.dtype.itemsize, read=False):
            return (f"the fused attention kernel writes rows of contiguous values starting on {ROW_ALIGNMENT} "
                    f"bytes; the output's strides are {written}")
        return None

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        a = op.attr_map
        views = ("strided_read",) * any(slice_text(op.operands[i].shape, *view) for i, view in operand_views(op).items())
        if written := o_strides(op):
            out = output_type(op).shape
            views += ("strided_write",) * any(n != 1 and s != c for n, s, c in zip(out, written, contiguous_strides(out)))
        flags = (("mask",) if a.get("has_mask") else ()) + (("causal",) if a.get("causal") else ()) \
            + (("window",) if a.get("window") else ())
        return ("scale",) + flags + ("softmax",) + (("logsumexp",) if writes_lse(op) else ()) + views

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[AttentionSchedule, ...]:
        # 8 warps × 16 rows share each K/V tile among more rows; 4 warps × 16 rows keep more blocks
        # in flight when Sq is short or B·H small. Both hold D=128's O, Q, S fragments in < 245
        # registers. Short sequences shrink the tiles to what they cover instead of computing padding.
        shape = AttentionShape.of(op)
        bn = min(64, round_up(shape.sk, MMA_K))
        found: list[AttentionSchedule] = list(self._warpgroup_defaults(op, shape, arch))
        for warps in (8, 4):
            warps = min(warps, -(-shape.sq // MMA_M))
            s = AttentionSchedule(MMA_M * warps, bn, warps, 2)
            if s not in found and self._valid(op, s, arch):
                found.append(s)
        return tuple(found)

    def _warpgroup_defaults(self, op: KernelOp, shape: AttentionShape, arch: ArchSpec) -> tuple[AttentionSchedule, ...]:
        """sm_90's wgmma schedules: two warpgroups (one where the query has 64 rows or fewer) over
        128-key tiles in 3 stages and over 64-key tiles in 4; for a head dim of 64 the 64-key tiles
        first (on an H200 they ran 1.22x faster at S=2048, tests/data/tuning_logs/, and were the
        faster at S=4096 too; at D=128 the 128-key tiles were the fastest of the space)."""
        if not shape.warpgroup_mma(arch):
            return ()
        if not shape.mma_sync:       # a head dim of 256: two warpgroups even for a short query (one spills)
            picked = (WarpgroupAttentionSchedule(2 * WG_ROWS, WIDE_HEAD_KEYS, 8, 4),
                      WarpgroupAttentionSchedule(2 * WG_ROWS, WIDE_HEAD_KEYS, 8, 3))
        else:
            groups = min(2, -(-shape.sq // WG_ROWS))
            picked = (WarpgroupAttentionSchedule(WG_ROWS * groups, 128, 4 * groups, 3),
                      WarpgroupAttentionSchedule(WG_ROWS * groups, 64, 4 * groups, 4))
            if shape.d <= 64:
                picked = picked[::-1]
        return tuple(s for s in picked if self._valid(op, s, arch))

    def unavailable(self, op: KernelOp, arch: ArchSpec) -> str | None:
        shape = AttentionShape.of(op)
        if not shape.mma_sync and not shape.warpgroup_mma(arch):
            return (f"a head dim of {shape.d} fits only the wgmma kernel of sm_90 (mma.sync's fragments would "
                    f"spill), and {arch.name} is {arch.sm}: on it this attention runs unfused")
        return None

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[AttentionSchedule, ...]:
        # As schedules() does, blocks and key tiles shrink to what a short sequence covers, more
        # 16-row tiles per warp only where the query has the rows, and no stage is left idle.
        shape = AttentionShape.of(op)
        rows, keys = -(-shape.sq // MMA_M), round_up(shape.sk, MMA_K)
        grid = [AttentionSchedule(MMA_M * warps * mt, bn, warps, stages)
                for warps in dict.fromkeys(min(w, rows) for w in GRID_WARPS)
                for mt in GRID_M_TILES if mt == 1 or warps * mt <= rows
                for bn in dict.fromkeys(min(b, keys) for b in GRID_KEYS)
                for stages in GRID_STAGES if stages <= max(2, -(-shape.sk // bn))]
        if shape.warpgroup_mma(arch):
            warpgroup = [WarpgroupAttentionSchedule(WG_ROWS * groups, bn, 4 * groups, stages)
                         for groups in WG_GROUPS if groups == 1 or WG_ROWS * (groups - 1) < shape.sq
                         for bn in (WG_KEYS if shape.mma_sync else (WIDE_HEAD_KEYS,))
                         for stages in (WG_STAGES if shape.mma_sync else WIDE_HEAD_STAGES)]
            defaults = [s for s in self.schedules(op, arch) if isinstance(s, WarpgroupAttentionSchedule)]
            # the producer forms: each wgmma schedule's, and in two stages (cp.async needs three)
            two = [replace(s, stages=2) for s in warpgroup if shape.mma_sync]
            grid += warpgroup + [form for s in defaults + warpgroup + two for form in self._producer_forms(s)]
        return grid_space(self.schedules(op, arch), grid,
                          lambda s: self._valid(op, s, arch) and self._calibrated(shape, s, rows, keys))

    def variants(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> tuple[Schedule, ...]:
        """A wgmma schedule's producer forms: the same tiles and products, loaded by TMA copies of a
        producer warpgroup instead of every thread's cp.async between block-wide barriers, its two
        consumers taking turns at the tensor cores or not. The resource model prices them alike;
        which runs fastest is a measurement."""
        if not isinstance(schedule, WarpgroupAttentionSchedule) or schedule.producer:
            return ()
        space = self.space(op, arch)
        return tuple(form for form in self._producer_forms(schedule) if form in space)

    @staticmethod
    def _producer_forms(s: WarpgroupAttentionSchedule) -> tuple[WarpgroupAttentionSchedule, ...]:
        return tuple(replace(s, producer=True, pingpong=pingpong) for pingpong in (False, True))

    def _calibrated(self, shape: AttentionShape, s: AttentionSchedule, rows: int, keys: int) -> bool:
        """Whether `s` lies where the register model was checked against ptxas (sm_80 and sm_90,
        every sample: no spills, within 25%). Beyond the largest default's estimate ptxas reaches
        255 registers and spills; two-warp blocks meet its 128-register step with spills; with a
        mask, key tiles other than 64 wide move its allocation a third away from the model."""
        if isinstance(s, WarpgroupAttentionSchedule):
            # one warpgroup: ptxas spends up to 45% more than the model where S or O is 64 registers
            return self._registers(shape, s) <= WG_CALIBRATED_REGISTERS and (
                s.warps > 4 or s.bn == shape.d == 64)
        return (s.warps >= min(4, rows) and self._registers(shape, s) <= CALIBRATED_REGISTERS
                and (shape.mask is None or s.bn == min(64, keys)))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        return self.accepts(op) and isinstance(schedule, AttentionSchedule) and self._valid(op, schedule, arch)

    def _valid(self, op: KernelOp, s: AttentionSchedule, arch: ArchSpec) -> bool:
        shape = AttentionShape.of(op)
        if isinstance(s, WarpgroupAttentionSchedule):
            if not (arch.compute_capability == (9, 0) and s.warps % 4 == 0 and s.bm == MMA_M * s.warps
                    and s.bn in WGMMA_WIDTHS and s.stages >= 3 - s.producer and shape.d in WG_HEAD_DIMS):
                return False
            # the producer form: two consumers (setmaxnreg's split; a block of one would hold its
            # producer's registers idle, running fewer blocks an SM than the cp.async kernel), whole
            # boxes within each tensor (a head shorter than a tile keeps cp.async; every wgmma head
            # dim is whole 64-value boxes), two stages or more
            if s.producer and not (s.consumers == 2 and shape.sq >= s.bm and shape.sk >= s.bn
                                   and not reads_views(op)):
                return False
            if s.pingpong and not s.producer:
                return False
        elif not shape.mma_sync:
            return False
        room = consumer_room(s.consumers, arch.registers_per_thread) if self._split(s) else arch.registers_per_thread
        return (s.warps >= 1 and s.threads <= arch.max_threads_per_block and s.m_tiles >= 1
                and s.bm == MMA_M * s.warps * s.m_tiles and s.bn > 0 and s.bn % 16 == 0 and s.stages >= 1
                and self._smem(shape, s) <= arch.smem_per_block
                and self._registers(shape, s) <= room
                and s.threads * self._launch_registers(shape, s) <= arch.registers_per_sm)

    @staticmethod
    def _split(s: AttentionSchedule) -> bool:
        """Whether the block moves registers from its producer to its two consumers (setmaxnreg)."""
        return isinstance(s, WarpgroupAttentionSchedule) and s.producer

    def _launch_registers(self, shape: AttentionShape, s: AttentionSchedule) -> int:
        """Registers per thread the block launches with (what ptxas reports): a split block's even
        share of the file, else what a thread needs."""
        return registers_at_launch(s.threads) if self._split(s) else self._registers(shape, s)

    @staticmethod
    def _smem(shape: AttentionShape, s: AttentionSchedule) -> int:
        if isinstance(s, WarpgroupAttentionSchedule) and s.producer:
            return tma_smem_bytes(shape, s)
        # the wgmma kernel aligns its tiles to the swizzle's atoms
        align = ATOM_BYTES if isinstance(s, WarpgroupAttentionSchedule) else 0
        return (s.bm + 2 * s.stages * s.bn) * shape.d * 2 + align

    @staticmethod
    def _registers(shape: AttentionShape, s: AttentionSchedule) -> int:
        mt, d = s.m_tiles, shape.d
        edges = 12 if shape.causal or shape.sk % s.bn or shape.mask is not None else 0   # per-score predicates
        if isinstance(s, WarpgroupAttentionSchedule):
            # O and S accumulators, P packed to 16-bit pairs; Q stays in shared memory
            return d // 2 + s.bn // 2 + s.bn // 4 + 4 + WG_ADDRESSING + edges
        o_acc = mt * d * MMA_M // 32                 # fp32 O rows of this warp, spread over 32 lanes
        scores = mt * s.bn * MMA_M // 32             # fp32 S (then P) fragment of one K tile
        q_frag = mt * d * MMA_M // 64                # bf16 pairs: two elements per register
        row_stats = 4 * mt                           # running max and sum of 2 rows per lane
        v_frags = d // 4                             # one k-step of V's B fragments: D/8 pairs
        k_frags = s.bn // 4                          # ... and of K's: BN/8 pairs, hoisted ahead of the MMAs
        addressing = 24                              # tile pointers, smem addresses, loop counters
        if -(-shape.sk // s.bn) == 1:
            # one key tile: nothing is carried around the loop, so ptxas streams Q's fragments into
            # S and each O column out to memory; only S and one k-step of V stay live together
            return scores + row_stats + v_frags + addressing + edges
        return o_acc + scores + q_frag + row_stats + v_frags + k_frags + addressing + edges

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        s = schedule
        assert isinstance(s, AttentionSchedule)
        shape = AttentionShape.of(op)
        q = attention_operands(op)[0]
        q_blocks = -(-shape.sq // s.bm)
        tiles = shape.visited_tiles(s)                   # per (batch, head)
        scores = shape.bh * tiles * s.bm * s.bn          # padded score elements computed
        mma_flops = 4 * scores * shape.d                 # Q Kᵀ and P V, a multiply-add is 2
        flops = mma_flops + 5 * scores                   # scale, max, exp, sum, normalize per score
        regs = self._launch_registers(shape, s)
        threads = s.threads
        # Every query block re-reads its head's K/V. The blocks of the heads in flight share them
        # through L2 as long as those heads' K/V fit in half of it; beyond that each block's pass
        # comes from HBM again.
        kv_head = 2 * shape.sk * shape.d * q.dtype.itemsize
        heads_in_flight = resident_heads(arch, q_blocks, threads, regs, self._smem(shape, s))
        q_bytes, k_bytes, v_bytes = operand_bytes(op)
        kv_bytes = k_bytes + v_bytes
        if heads_in_flight * kv_head > arch.l2_bytes // 2:
            kv_bytes = shape.bh * tiles * s.bn * shape.d * 2 * q.dtype.itemsize
        hbm = q_bytes + op.result.nbytes + kv_bytes
        if shape.mask is not None:
            # each (batch, head) reads its Sq×Sk slice once; a broadcast mask is shared through L2
            # only while all of it fits there
            read = shape.bh * min(tiles * s.bm * s.bn, shape.sq * shape.sk) * shape.mask.dtype.itemsize
            hbm += shape.mask.nbytes if shape.mask.nbytes <= arch.l2_bytes // 2 else read
        spill = max(0, regs - arch.registers_per_thread) * 4 * 2
        return Resources(threads=threads, blocks=shape.bh * q_blocks, registers=regs,
                         smem_bytes=self._smem(shape, s), hbm_bytes=hbm, flops=flops, unit=MathUnit.BF16,
                         efficiency=self._efficiency(shape.d, arch, s), spill_bytes=spill)

    @staticmethod
    def _efficiency(d: int, arch: ArchSpec, s: AttentionSchedule) -> float:
        """The share of the bf16 tensor peak reached, per score: the MMA time at mma.sync's (or
        wgmma's) share of the peak plus the softmax's SIMT/SFU time that overlapping warps leave
        exposed."""
        clock = arch.sm_count * arch.clock_mhz * 1e6
        tensor_rate = arch.peak_flops(MathUnit.BF16) / clock          # flops per SM per clock
        lanes = arch.peak_flops(MathUnit.FP32) / clock / 2            # fp32 FMA lanes per SM
        base = (WGMMA_EFFICIENCY if isinstance(s, WarpgroupAttentionSchedule)
                else MMA_SYNC_EFFICIENCY.get(arch.compute_capability[0], 0.5))
        mma = 4 * d / tensor_rate
        softmax = 1 / SFU_PER_SM + SIMT_OPS_PER_SCORE / lanes
        return round((4 * d + 5) / tensor_rate / (mma / base + HIDDEN_SOFTMAX * softmax), 3)

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        s = schedule
        assert isinstance(s, AttentionSchedule)
        if not self.accepts(op):
            raise ValueError(f"flash_attention template cannot implement {op}")
        shape = AttentionShape.of(op)
        if isinstance(s, WarpgroupAttentionSchedule):
            if s.producer and reads_views(op):
                raise ValueError(f"the producer (TMA) attention kernel maps q, k and v dense; {op} reads views")
            emit = emit_tma_kernel if s.producer else emit_wgmma_kernel
            return emit(op, shape, s, self._smem(shape, s))
        return emit_kernel(op, shape, s, self._smem(shape, s))

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f16 = DType.bfloat16, DType.float16

        def attn(b: int, hq: int, hkv: int, s: int, d: int, dtype: DType, causal: bool = False,
                 mask: DType | None = None, mask_batch: tuple[int, ...] = (), window: int = 0) -> KernelOp:
            q = TensorType((b, hq, s, d), dtype)
            kv = TensorType((b, hkv, s, d), dtype)
            operands = (q, kv, kv) + ((TensorType(mask_batch + (s, s), mask),) if mask else ())
            return KernelOp.of("flash_attention", operands, q, scale=d ** -0.5, causal=causal,
                               has_mask=mask is not None, window=window)
        return (attn(4, 16, 16, 4096, 64, bf),
                attn(2, 16, 16, 2048, 128, bf, causal=True),
                attn(2, 8, 8, 1024, 64, f16, mask=f16, mask_batch=(2, 1)),
                attn(2, 16, 4, 2048, 128, bf),
                attn(3, 8, 8, 1000, 64, bf, causal=True),
                attn(1, 2, 2, 16, 128, f16, mask=DType.bool),
                attn(2, 12, 12, 1024, 96, bf, causal=True),
                attn(1, 8, 8, 2048, 256, bf, causal=True),
                attn(1, 8, 8, 512, 256, f16, mask=f16, mask_batch=(1, 1)),
                # the logsumexp part has no row axis, so its check runs the whole reference: sizes
                # whose float64 scores stay near 100 MB, as the backward's samples
                with_lse(attn(2, 4, 4, 1024, 64, bf)),
                with_lse(attn(1, 2, 2, 1000, 128, f16, causal=True, mask=DType.bool, mask_batch=(1, 1))),
                # q, k, v read where a fused projection wrote them, O written with the heads side by side
                packed_qkv_attention(2, 4, 1024, 64, bf, causal=True),
                packed_qkv_attention(1, 8, 1000, 128, f16, kv_heads=2),
                # and a training step's forward: q, k, v read in place, O and the logsumexps dense
                packed_qkv_lse(2, 4, 1024, 64, bf, causal=True),
                # Mistral's sliding window: 32 query heads over 8 K/V heads, each query seeing 4096 keys
                attn(1, 32, 8, 8192, 128, bf, causal=True, window=4096))
