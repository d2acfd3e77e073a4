"""GEMM: matmul, gemm (act(scale · a @ b + bias) + residual, cast), gated_gemm (the same times a gate)
and matmul_bias_grad ([a; 1ᵀ] @ b) as one kernel per product.

Three code paths. On sm_90, bf16/fp16 operands (any layout) and fp8 ones stored with k contiguous
run on warpgroup MMAs (gemm_hopper.py: wgmma reading both operands from 128-byte swizzled shared
memory, loaded by TMA where tensor maps apply, else by cp.async; built for sm_90a); their
schedules come first there, the mma.sync ones after. Everywhere, bf16/fp16 operands run on tensor cores: mma.sync m16n8k16 with fp32
accumulators, fragments read by ldmatrix from XOR-swizzled shared memory, tiles brought in by a cp.async
pipeline of `stages` buffers. fp8 operands (e4m3 or e5m2, both the same; sm_89 and newer) take
the same kernel with mma.sync m16n8k32 and write bf16, fp16 or fp32. float32 operands run a SIMT FFMA kernel (full fp32 products, as
numpy gives), except under the `fast` numerics policy: then they take the tensor-core path in
tf32 (mma.sync m16n8k8, operands rounded by cvt.rna.tf32.f32, fp32 accumulation), about 7x the
FFMA peak for a relative error near 1e-3 of the output's scale. All keep the epilogue in
registers and write the result once.
An operand stored transposed (trans_a: A as [K, M], trans_b: B as [N, K], what a backward pass's
Xᵀ and Wᵀ are) is read in place: its tiles are loaded as they lie and ldmatrix transposes them on
the way to the fragments, so it costs the same as a plain one. Shapes are baked into the source as
constants; the grid is flat (tiles, then the flattened batch: column tiles fastest, or groups of
tile rows walked column by column where that keeps more of the operands in L2, gemm_tile_order.py)
and a broadcast operand gets batch stride 0. matmul_bias_grad is a product
with one more row of A, all ones, that no load reads: its tiles fill that row in shared memory
(predicated like the ragged edges), so the bias gradient comes out as row M of the result.
gemm_pre_act's epilogue stores each element twice: the pre-activation in the result's first half,
the activation of it in the second.

>>> from tessera_rw.algebra.dtypes import DType
>>> t = TensorType((256, 256), DType.bfloat16)
>>> op = KernelOp.of("matmul", (t, t), t, accum_dtype=None)
>>> GemmTemplate().schedules(op, arch_named("h100"))[0].describe()
'tma bm=128 bn=256 bk=64 wg_m=2 wg_n=1 stages=4'
>>> GemmTemplate().schedules(op, arch_named("a100"))[0].describe()
'bm=128 bn=128 bk=32 warps_m=2 warps_n=2 stages=3'
"""

from __future__ import annotations

import math
from typing import ClassVar

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import TensorType  # noqa: F401  (doctest)
from tessera_rw.algebra.ops.fused_gemm import ACTIVATIONS, DERIVATIVES, epilogue_operands
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.gemm_cuda import kernel_name
from tessera_rw.codegen.prelude import HOPPER_TARGET
from tessera_rw.codegen.templates.gemm_footprint import (GemmSchedule, GemmSimtSchedule, TmaSchedule, WarpgroupTiling,
                                                         WgmmaSchedule, registers, smem_bytes)
from tessera_rw.codegen.templates.gemm_hopper import (TMA_EFFICIENCY, WGMMA_EFFICIENCY, hopper_calibrated,
                                                      hopper_defaults, hopper_grid, hopper_valid, warpgroup_mma)
from tessera_rw.codegen.templates.gemm_mma_cuda import emit_tensor_core
from tessera_rw.codegen.templates.gemm_problem import FP8_DTYPES, TENSOR_CORE_DTYPES, GemmProblem
from tessera_rw.codegen.templates.gemm_samples import gemm_samples
from tessera_rw.codegen.templates.gemm_simt_cuda import emit_simt
from tessera_rw.codegen.templates.gemm_tile_order import TileOrder, tile_order
from tessera_rw.codegen.templates.gemm_variants import persistent_grid, walked
from tessera_rw.codegen.templates.gemm_variants import variants as tile_variants
from tessera_rw.codegen.templates.gemm_tma_cuda import emit_tma, tensor_maps
from tessera_rw.codegen.templates.gemm_wgmma_cuda import emit_wgmma

_OUT_DTYPES = (DType.float32, DType.bfloat16, DType.float16)
# The launch passes no dynamic shared memory, so every schedule lives in the static 48 KiB.
_STATIC_SMEM = 48 * 1024
_MAX_BLOCKS = 2 ** 31 - 1       # the flat grid's blockIdx.x
_INT_INDEX = 2 ** 31            # one matrix is indexed with 32-bit ints
_ACTIVATIONS = (*ACTIVATIONS, *DERIVATIVES)


_TC_DEFAULTS = (GemmSchedule(128, 128, 32, 2, 2, 3), GemmSchedule(128, 64, 32, 2, 2, 3),
                GemmSchedule(64, 64, 32, 2, 2, 3), GemmSchedule(128, 256, 32, 2, 4, 2))
_SIMT_DEFAULTS = (GemmSimtSchedule(128, 128, 8, 8, 8), GemmSimtSchedule(64, 64, 8, 4, 4))
# fp8 tiles hold 1-byte values: twice the k-depth of the 16-bit tiles for the same shared memory
# and, as sm_90 widens fp8 fragments to fp16 pairs, warp tiles of at most 64x32 (wider ones spill)
_FP8_DEFAULTS = (GemmSchedule(128, 128, 64, 2, 4, 3), GemmSchedule(128, 64, 64, 2, 2, 3),
                 GemmSchedule(64, 64, 64, 2, 2, 3))
# tf32 tiles hold 4-byte values: half the k-depth of the 16-bit tiles for the same shared memory
_TF32_DEFAULTS = (GemmSchedule(128, 128, 16, 2, 4, 3), GemmSchedule(128, 64, 16, 2, 2, 3),
                  GemmSchedule(64, 64, 16, 2, 2, 4))
# The tuning grids (space()); _valid keeps the points that fit and that the emitters can write.
_TC_TILES, _TC_WARPS, _TC_STAGES = (64, 128, 256), (1, 2, 4), (2, 3, 4)
_SIMT_TILES, _SIMT_BK, _SIMT_THREAD_TILES = (32, 64, 128), (8, 16), (4, 8)


def _tile_order(op: KernelOp, s: Schedule, arch: ArchSpec) -> TileOrder:
    """The grid's walk over the output tiles (gemm_tile_order.py) for a wave of the blocks the
    schedule keeps resident on every SM."""
    return tile_order(*walked(op, s, arch), group=s.group or None)


class GemmTemplate(Template):
    """matmul / gemm of rank >= 2 float32, float16, bfloat16 or fp8 operands (both the same dtype),
    and matmul_bias_grad of 2-d ones (not fp8).

    The tensor-core path streams tiles with cp.async when rows of A and B start 16-byte aligned
    (K*itemsize and N*itemsize multiples of 16); other shapes copy element-wise through registers
    (predicated, slower loads, same math).
    """
    kind: ClassVar[str] = "gemm"
    ops: ClassVar[frozenset[str]] = frozenset({"matmul", "gemm", "gemm_pre_act", "gated_gemm", "matmul_bias_grad"})

    def accepts(self, op: KernelOp) -> bool:
        return op.op in self.ops and self.refusal(op) is None

    def refusal(self, op: KernelOp) -> str | None:
        """Why no GEMM kernel takes `op` (None when one does), as an explain report tells it."""
        if op.op not in self.ops or len(op.operands) < 2:
            return f"the gemm kernel implements {', '.join(sorted(self.ops))} of two operands or more"
        a, b = op.operands[:2]
        if a.ndim < 2 or b.ndim < 2:
            return f"the gemm kernel multiplies matrices (2 dims or more), here {a} and {b}"
        if a.dtype is not b.dtype:
            return (f"the gemm kernel takes two operands of one dtype, here {a.dtype.short} and {b.dtype.short} "
                    "(cast one)")
        if a.dtype not in (*TENSOR_CORE_DTYPES, DType.float32):
            return f"the gemm kernel multiplies f32, bf16, fp16 or fp8, not {a.dtype.short}"
        if a.dtype in FP8_DTYPES and op.op == "matmul_bias_grad":
            return "the gemm kernel sums no bias gradient from fp8 operands"
        at = op.attr_map
        if at.get("accum_dtype") is not None and DType.parse(at["accum_dtype"]) is not DType.float32:
            return f"the gemm kernel accumulates in f32, not {at['accum_dtype']}"
        if len(op.operands) != 2 + len(epilogue_operands(at.get("has_bias"), at.get("activation", "none"),
                                                         at.get("has_residual") or op.op == "gated_gemm")):
            return f"the gemm kernel's epilogue operands do not match its attributes: {op}"
        p = GemmProblem.of(op)
        if p.out_dtype not in _OUT_DTYPES or any(t.dtype not in _OUT_DTYPES for t in (p.bias, p.aux, p.residual)
                                                 if t is not None):
            return "the gemm kernel writes, and reads its epilogue's operands, in f32, bf16 or fp16"
        if p.activation not in _ACTIVATIONS:
            return f"the gemm kernel's epilogue has no activation {p.activation!r}"
        if not math.isfinite(p.scale):
            return f"the gemm kernel's epilogue takes a finite scale, not {p.scale}"
        if min(p.m, p.n, p.k) < 1:
            return f"the gemm kernel computes no empty product (M={p.m}, N={p.n}, K={p.k})"
        largest = max((p.m * p.k, "a"), (p.k * p.n, "b"), (p.m * p.n, "the result"))
        if largest[0] >= _INT_INDEX:
            return (f"the gemm kernel indexes each matrix with 32-bit ints, and {largest[1]} holds {largest[0]:,} "
                    f"elements (M={p.m}, N={p.n}, K={p.k}): split the product along M or N (op.split, "
                    f"op.concatenate) into pieces of fewer than 2**31 elements")
        if (blocks := p.nbatch * -(-p.m // 16) * -(-p.n // 16)) > _MAX_BLOCKS:
            return (f"the gemm kernel's grid would need {blocks:,} blocks for {p.nbatch:,} products, over "
                    f"{_MAX_BLOCKS:,}: split the batch")
        return None

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        p = GemmProblem.of(op)
        product = DType.float32 if not p.tensor_core else p.in_dtype
        # a "bias" of the output's own shape, added last, is a residual (x + A B)
        added = p.bias is not None and p.activation == "none" and p.residual is None \
            and p.bias.numel == op.result.numel
        steps = (("bias_grad", p.bias_grad), ("scale", p.scale != 1.0), ("bias", p.bias is not None and not added),
                 ("pre", p.keep_pre), (p.activation, p.activation != "none"),
                 ("gate" if p.gate else "residual", p.residual is not None or added),
                 ("cast", p.out_dtype is not product))
        return tuple(name for name, on in steps if on)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        p = GemmProblem.of(op)
        defaults = (_TF32_DEFAULTS if p.tf32 else _FP8_DEFAULTS if p.fp8 else _TC_DEFAULTS if p.tensor_core
                    else _SIMT_DEFAULTS)
        return hopper_defaults(p, arch) + tuple(s for s in defaults if self._valid(p, s, arch))

    def unavailable(self, op: KernelOp, arch: ArchSpec) -> str | None:
        p = GemmProblem.of(op)
        if _lacks_unit(p, arch):
            return (f"{p.in_dtype} products need fp8 tensor cores (sm_89 and newer), {arch.name} is {arch.sm}: "
                    f"cast the operands to bfloat16")
        return None

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        p = GemmProblem.of(op)
        if p.tensor_core:
            grid = (GemmSchedule(bm, bn, bk, wm, wn, st) for bm in _TC_TILES for bn in _TC_TILES
                    for bk in _k_depths(p) for wm in _TC_WARPS for wn in _TC_WARPS for st in _TC_STAGES)
            grid = (*hopper_grid(p, arch), *grid)
        else:
            grid = (GemmSimtSchedule(bm, bn, bk, tm, tn) for bm in _SIMT_TILES for bn in _SIMT_TILES
                    for bk in _SIMT_BK for tm in _SIMT_THREAD_TILES for tn in _SIMT_THREAD_TILES)
        # the variants of the defaults of the first default's kernel, ahead of the grid: what the
        # cost model cannot rank, a tuner times
        defaults = self.schedules(op, arch)
        forms = (v for s in defaults if type(s) is type(defaults[0]) for v in tile_variants(op, s, arch))
        # a tile past the problem's next power of two only multiplies padding
        return grid_space(defaults, (*forms, *grid),
                          lambda s: self._valid(p, s, arch) and _calibrated(p, s)
                          and s.bm <= max(64, _pow2(p.m)) and s.bn <= max(64, _pow2(p.n)))

    def variants(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> tuple[Schedule, ...]:
        space = self.space(op, arch)
        return tuple(v for v in tile_variants(op, schedule, arch) if v in space)

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        if not self.accepts(op):
            return False
        p = GemmProblem.of(op)
        return isinstance(schedule, _schedule_kinds(p)) and self._valid(p, schedule, arch)

    def _valid(self, p: GemmProblem, s: Schedule, arch: ArchSpec) -> bool:
        if _lacks_unit(p, arch) or s.group < 0:
            return False
        if isinstance(s, WarpgroupTiling):
            return hopper_valid(p, s, arch)
        smem = smem_bytes(p, s)
        if smem > min(_STATIC_SMEM, arch.smem_per_block) or s.threads > arch.max_threads_per_block:
            return False
        # __launch_bounds__(threads) lets ptxas use at most the file split over one block
        if registers(p, s) > arch.register_limit(s.threads):
            return False
        if isinstance(s, GemmSchedule):
            el = 16 // p.in_dtype.itemsize     # elements per 16-byte chunk
            # fp8 on sm_90 runs as fp16 MMAs on unpacked fragments: a 64x64 warp tile spills
            if p.fp8 and (s.bm // s.warps_m) * (s.bn // s.warps_n) > 64 * 32:
                return False
            return (s.bm % (16 * s.warps_m) == 0 and s.bn % (16 * s.warps_n) == 0
                    and s.bk in _k_depths(p) and (not p.tf32 or s.bn % 32 == 0)
                    and s.bn >= 64 and s.stages >= 2 and (s.bm * s.bk // el) % s.threads == 0
                    and (s.bk * s.bn // el) % s.threads == 0)
        return (s.tm % 4 == 0 and s.tn % 4 == 0 and s.bm % s.tm == 0 and s.bn % s.tn == 0 and s.threads % 32 == 0
                and (s.bm * s.bk) % s.threads == 0 and (s.bk * s.bn) % s.threads == 0)

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        p = GemmProblem.of(op)
        s = schedule
        tiles_m, tiles_n, tiles_k = -(-p.m // s.bm), -(-p.n // s.bn), -(-p.k // s.bk)
        blocks = tiles_m * tiles_n * p.nbatch
        regs = registers(p, s)
        smem = smem_bytes(p, s)
        a, b = op.operands[:2]
        extra = sum(t.nbytes for t in op.operands[2:])
        hbm = _tile_order(op, s, arch).hbm_bytes(a.nbytes, b.nbytes) + extra + op.result.nbytes
        # the ones row of a bias-gradient product runs through the MMAs like any row of A
        epilogue = max(0, op.flops - 2 * p.nbatch * p.m * p.n * p.k)
        flops = 2 * p.nbatch * tiles_m * s.bm * tiles_n * s.bn * tiles_k * s.bk + epilogue
        if p.tf32:
            # tf32 mma.sync issues half the k per instruction plus a cvt per fragment element
            unit, eff = MathUnit.TF32, (0.7 if arch.compute_capability[0] < 9 else 0.55)
        elif isinstance(s, WarpgroupTiling):
            # warpgroup MMAs keep the tensor cores fed from shared memory, no fragment loads between
            unit = MathUnit.FP8 if p.fp8 else MathUnit.BF16
            eff = TMA_EFFICIENCY if isinstance(s, TmaSchedule) else WGMMA_EFFICIENCY
        elif p.fp8:
            # sm_89 runs mma.sync on fp8 natively; sm_90 as fp16 MMAs (half the fp8 peak, less the
            # unpacking). An operand staged through registers costs shared stores and byte transposes
            # (its loads overlap the MMAs); two staged ones also wait for their loads
            staged = {0: 1.0, 1: 0.85, 2: 0.7}[p.stage_a + p.stage_b]
            unit, eff = MathUnit.FP8, (0.7 if arch.compute_capability[0] < 9 else 0.3) * staged
        elif p.tensor_core:
            unit, eff = MathUnit.BF16, (0.8 if arch.compute_capability[0] < 9 else 0.65)
        else:
            unit, eff = MathUnit.FP32, 0.7
        spill = max(0, regs - arch.registers_per_thread) * 4
        # each block streams its A and B tiles through the L2 once per k step: small tiles re-read more
        feed = blocks * tiles_k * (s.bm + s.bn) * s.bk * (4 if p.tf32 else p.in_dtype.itemsize)
        return Resources(threads=s.threads, blocks=blocks, registers=min(regs, arch.registers_per_thread),
                         smem_bytes=smem, hbm_bytes=hbm, flops=flops, unit=unit, efficiency=eff,
                         spill_bytes=spill, l2_feed_bytes=feed)

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        if not self.accepts(op):
            raise TesseraError("the gemm template cannot implement this op", op=op.op, operands=str(op),
                               hint="it takes rank >= 2 operands of one dtype in (bfloat16, float16, float32, "
                                    "float8_e4m3, float8_e5m2), fp32 accumulation, and bias/aux/residual in "
                                    "bfloat16, float16 or float32")
        if reason := self.unavailable(op, arch):
            raise TesseraError(f"no gemm kernel for {op} on {arch.name}", op=op.op, hint=reason)
        p = GemmProblem.of(op)
        wanted = _schedule_kinds(p)
        if not isinstance(schedule, wanted):
            raise TesseraError(f"{'tf32' if p.tf32 else p.in_dtype} operands take a "
                               f"{' or '.join(w.__name__ for w in wanted)}, got {schedule!r}", op=op.op)
        if isinstance(schedule, WarpgroupTiling) and not warpgroup_mma(p, arch):
            raise TesseraError(f"{schedule!r} needs sm_90 warpgroup MMAs, which {op} cannot use on {arch.name}",
                               op=op.op, hint="warpgroup MMAs take bf16/fp16 operands, or fp8 ones stored with k "
                                              "contiguous, on sm_90; use a GemmSchedule")
        name = kernel_name(p, schedule)
        header = (f"// {op}\n// kernel kind gemm, fused {list(self.fused(op))}, schedule {schedule.describe()}, "
                  f"{arch.name}\n")
        grid = (self.resources(op, schedule, arch).blocks, 1, 1)
        group = _tile_order(op, schedule, arch).group
        fast = op.numerics is Numerics.FAST
        if isinstance(schedule, TmaSchedule):
            if not self._valid(p, schedule, arch):
                raise TesseraError(f"{schedule!r} does not fit {op} on {arch.name}", op=op.op,
                                   hint="TMA loads need rows 16-byte aligned (and a bias gradient one "
                                        "warpgroup across N); use a WgmmaSchedule")
            if schedule.persistent:
                grid = (persistent_grid(op, schedule, arch), 1, 1)
            return KernelSource(name, header + emit_tma(p, schedule, name, group, grid[0]), schedule.threads, grid=grid,
                                dynamic_smem=smem_bytes(p, schedule), fast_math=fast, target=HOPPER_TARGET,
                                tensor_maps=tensor_maps(p, schedule))
        if isinstance(schedule, WgmmaSchedule):
            return KernelSource(name, header + emit_wgmma(p, schedule, name, group), schedule.threads, grid=grid,
                                dynamic_smem=smem_bytes(p, schedule), fast_math=fast, target=HOPPER_TARGET)
        body = (emit_tensor_core(p, schedule, name, group) if p.tensor_core else
                emit_simt(p, schedule, name, group))
        return KernelSource(name, header + body, schedule.threads, grid=grid, fast_math=fast)

    def samples(self) -> tuple[KernelOp, ...]:
        return gemm_samples()

def _schedule_kinds(p: GemmProblem) -> tuple[type[Schedule], ...]:
    """The schedule classes the product's kernels take: tensor-core ones (mma.sync, wgmma) or SIMT."""
    return (GemmSchedule, WgmmaSchedule, TmaSchedule) if p.tensor_core else (GemmSimtSchedule,)


def _lacks_unit(p: GemmProblem, arch: ArchSpec) -> bool:
    """Whether `arch` has no tensor cores for the product's operands (fp8 before sm_89)."""
    return p.fp8 and not arch.has(MathUnit.FP8)


def _k_depths(p: GemmProblem) -> tuple[int, ...]:
    """The bk the mma kernel is written for: 4 or 8 16-byte chunks per shared row of A, the widths
    its XOR swizzle spreads over distinct bank groups (tf32 values are twice as wide: half the k;
    fp8 ones half as wide: twice the k)."""
    return (16, 32) if p.tf32 else (64, 128) if p.fp8 else (32, 64)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _calibrated(p: GemmProblem, s: Schedule) -> bool:
    """Whether `s` lies where the register model was checked against ptxas (sm_80 and sm_90, every
    sample: no spills, within about 25%): at least 4 warps, block tiles at most twice as wide as
    tall or tall as wide; mma: 32- or 64-square warp tiles, no more warps along M than along N, the
    shallower k-depth; SIMT: square thread tiles, bk=16 only with 256 threads or more. Outside it
    ptxas trades a few spilled registers for occupancy where the model sees room (one or two warps,
    a 4x1 warp grid, deep k-tiles of 128-thread blocks, 4x8 thread tiles) or allocates a third more
    or less than modelled (16-wide warp tiles, deep k-tiles, 128-thread SIMT blocks with bk=16), so
    a tuner would time spilling kernels or trust a wrong occupancy."""
    if isinstance(s, WarpgroupTiling):
        return hopper_calibrated(p, s)
    square = s.bn <= 2 * s.bm and s.bm <= 2 * s.bn
    if isinstance(s, GemmSchedule):
        warp_m, warp_n = s.bm // s.warps_m, s.bn // s.warps_n
        # fp8 on sm_90 (fragments unpacked to fp16 pairs): at most 256 threads, whose 255 registers
        # hold any fp8 warp tile _valid allows; an operand staged through registers with 3 stages
        # (at 2 or 4 stages ptxas allocates a 128x64 tile past the model's count and spills)
        fp8_fits = not p.fp8 or (s.threads <= 256 and (s.stages == 3 or not (p.stage_a or p.stage_b)))
        return (square and s.threads >= 128 and s.warps_m <= s.warps_n and s.bk == _k_depths(p)[0]
                and warp_m in (32, 64) and warp_n in (32, 64) and fp8_fits)
    return square and s.threads >= 128 and s.tm == s.tn and (s.bk == _SIMT_BK[0] or s.threads >= 256)
