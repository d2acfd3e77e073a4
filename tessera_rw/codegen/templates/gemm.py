"""GEMM: matmul, gemm (act(scale · a @ b + bias) + residual, cast) and matmul_bias_grad ([a; 1ᵀ] @ b)
as one kernel per product.

Two code paths. bf16/fp16 operands run on tensor cores: mma.sync m16n8k16 with fp32 accumulators,
fragments read by ldmatrix from XOR-swizzled shared memory, tiles brought in by a cp.async
pipeline of `stages` buffers. float32 operands run a SIMT FFMA kernel (full fp32 products, as
numpy gives), except under the `fast` numerics policy: then they take the tensor-core path in
tf32 (mma.sync m16n8k8, operands rounded by cvt.rna.tf32.f32, fp32 accumulation), about 7x the
FFMA peak for a relative error near 1e-3 of the output's scale. Both keep the epilogue in
registers and write the result once.
An operand stored transposed (trans_a: A as [K, M], trans_b: B as [N, K], what a backward pass's
Xᵀ and Wᵀ are) is read in place: its tiles are loaded as they lie and ldmatrix transposes them on
the way to the fragments, so it costs the same as a plain one. Shapes are baked into the source as
constants; the grid is flat (column tiles, row tiles, then the flattened batch) and a broadcast
operand gets batch stride 0. matmul_bias_grad is a product
with one more row of A, all ones, that no load reads: its tiles fill that row in shared memory
(predicated like the ragged edges), so the bias gradient comes out as row M of the result.

>>> from tessera_rw.algebra.dtypes import DType
>>> t = TensorType((256, 256), DType.bfloat16)
>>> op = KernelOp.of("matmul", (t, t), t, accum_dtype=None)
>>> GemmTemplate().schedules(op, arch_named("h100"))[0].describe()
'bm=128 bn=128 bk=32 warps_m=2 warps_n=2 stages=3'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.fused import ACTIVATIONS, DERIVATIVES, epilogue_operands
from tessera_rw.algebra.ops.linalg import matmul_dims, read_as
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.gemm_cuda import kernel_name
from tessera_rw.codegen.templates.gemm_mma_cuda import emit_tensor_core
from tessera_rw.codegen.templates.gemm_problem import TENSOR_CORE_DTYPES, GemmProblem
from tessera_rw.codegen.templates.gemm_simt_cuda import SIMT_PAD, emit_simt

_OUT_DTYPES = (DType.float32, DType.bfloat16, DType.float16)
# The launch passes no dynamic shared memory, so every schedule lives in the static 48 KiB.
_STATIC_SMEM = 48 * 1024
_MAX_BLOCKS = 2 ** 31 - 1       # the flat grid's blockIdx.x
_INT_INDEX = 2 ** 31            # one matrix is indexed with 32-bit ints
_ACTIVATIONS = (*ACTIVATIONS, *DERIVATIVES)


@dataclass(frozen=True)
class GemmSchedule(Schedule):
    """Tensor-core tiling: a bm x bn block tile, bk per pipeline stage, warps_m x warps_n warps."""
    bm: int = 128
    bn: int = 128
    bk: int = 32
    warps_m: int = 2
    warps_n: int = 2
    stages: int = 3

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


@dataclass(frozen=True)
class GemmSimtSchedule(Schedule):
    """fp32 SIMT tiling: each thread owns a tm x tn patch of the bm x bn block tile."""
    bm: int = 128
    bn: int = 128
    bk: int = 8
    tm: int = 8
    tn: int = 8

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)


_TC_DEFAULTS = (GemmSchedule(128, 128, 32, 2, 2, 3), GemmSchedule(128, 64, 32, 2, 2, 3),
                GemmSchedule(64, 64, 32, 2, 2, 3), GemmSchedule(128, 256, 32, 2, 4, 2))
_SIMT_DEFAULTS = (GemmSimtSchedule(128, 128, 8, 8, 8), GemmSimtSchedule(64, 64, 8, 4, 4))
# tf32 tiles hold 4-byte values: half the k-depth of the 16-bit tiles for the same shared memory
_TF32_DEFAULTS = (GemmSchedule(128, 128, 16, 2, 4, 3), GemmSchedule(128, 64, 16, 2, 2, 3),
                  GemmSchedule(64, 64, 16, 2, 2, 4))
# The tuning grids (space()); _valid keeps the points that fit and that the emitters can write.
_TC_TILES, _TC_WARPS, _TC_STAGES = (64, 128, 256), (1, 2, 4), (2, 3, 4)
_SIMT_TILES, _SIMT_BK, _SIMT_THREAD_TILES = (32, 64, 128), (8, 16), (4, 8)


class GemmTemplate(Template):
    """matmul / gemm of rank >= 2 float32, float16 or bfloat16 operands (both the same dtype), and
    matmul_bias_grad of 2-d ones.

    The tensor-core path streams tiles with cp.async when rows of A and B start 16-byte aligned
    (K*itemsize and N*itemsize multiples of 16); other shapes copy element-wise through registers
    (predicated, slower loads, same math).
    """
    kind: ClassVar[str] = "gemm"
    ops: ClassVar[frozenset[str]] = frozenset({"matmul", "gemm", "matmul_bias_grad"})

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops or len(op.operands) < 2:
            return False
        a, b = op.operands[:2]
        if a.ndim < 2 or b.ndim < 2 or a.dtype is not b.dtype or a.dtype not in (*TENSOR_CORE_DTYPES, DType.float32):
            return False
        accum = op.attr_map.get("accum_dtype")
        if accum is not None and DType.parse(accum) is not DType.float32:
            return False
        at = op.attr_map
        if len(op.operands) != 2 + len(epilogue_operands(at.get("has_bias"), at.get("activation", "none"),
                                                         at.get("has_residual"))):
            return False
        p = GemmProblem.of(op)
        if p.out_dtype not in _OUT_DTYPES or p.activation not in _ACTIVATIONS or not math.isfinite(p.scale):
            return False
        if p.nbatch * -(-p.m // 16) * -(-p.n // 16) > _MAX_BLOCKS:
            return False
        if any(t.dtype not in _OUT_DTYPES for t in (p.bias, p.aux, p.residual) if t is not None):
            return False
        if max(p.m * p.k, p.k * p.n, p.m * p.n) >= _INT_INDEX or min(p.m, p.n, p.k) < 1:
            return False
        return True

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        p = GemmProblem.of(op)
        product = DType.float32 if not p.tensor_core else p.in_dtype
        steps = (("bias_grad", p.bias_grad), ("scale", p.scale != 1.0), ("bias", p.bias is not None),
                 (p.activation, p.activation != "none"), ("residual", p.residual is not None),
                 ("cast", p.out_dtype is not product))
        return tuple(name for name, on in steps if on)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        p = GemmProblem.of(op)
        defaults = _TF32_DEFAULTS if p.tf32 else _TC_DEFAULTS if p.tensor_core else _SIMT_DEFAULTS
        return tuple(s for s in defaults if self._valid(p, s, arch))

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        p = GemmProblem.of(op)
        if p.tensor_core:
            grid = (GemmSchedule(bm, bn, bk, wm, wn, st) for bm in _TC_TILES for bn in _TC_TILES
                    for bk in _k_depths(p) for wm in _TC_WARPS for wn in _TC_WARPS for st in _TC_STAGES)
        else:
            grid = (GemmSimtSchedule(bm, bn, bk, tm, tn) for bm in _SIMT_TILES for bn in _SIMT_TILES
                    for bk in _SIMT_BK for tm in _SIMT_THREAD_TILES for tn in _SIMT_THREAD_TILES)
        # a tile past the problem's next power of two only multiplies padding
        return grid_space(self.schedules(op, arch), grid,
                          lambda s: self._valid(p, s, arch) and _calibrated(p, s)
                          and s.bm <= max(64, _pow2(p.m)) and s.bn <= max(64, _pow2(p.n)))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        if not self.accepts(op):
            return False
        p = GemmProblem.of(op)
        wanted = GemmSchedule if p.tensor_core else GemmSimtSchedule
        return isinstance(schedule, wanted) and self._valid(p, schedule, arch)

    def _valid(self, p: GemmProblem, s: Schedule, arch: ArchSpec) -> bool:
        smem = _smem(p, s)
        if smem > min(_STATIC_SMEM, arch.smem_per_block) or s.threads > arch.max_threads_per_block:
            return False
        # __launch_bounds__(threads) lets ptxas use at most the file split over one block
        if _registers(p, s) > min(arch.registers_per_thread, arch.registers_per_sm // s.threads):
            return False
        if isinstance(s, GemmSchedule):
            el = 16 // p.in_dtype.itemsize     # elements per 16-byte chunk
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
        regs = _registers(p, s)
        smem = _smem(p, s)
        per_sm = _blocks_per_sm(s.threads, regs, smem, arch)
        wave = max(1, arch.sm_count * per_sm)
        a, b = op.operands[:2]
        extra = sum(t.nbytes for t in op.operands[2:])
        # A's row panel is shared by the blocks of one tile row, which run side by side in a wave
        # (grid.x walks N first), so HBM sees it once per wave-width of columns. B is swept once
        # per tile row; it stays in L2 when it fits beside the A panels (half of L2), else each
        # wave, covering wave/tiles_n tile rows, brings it in again.
        if a.nbytes + b.nbytes <= arch.l2_bytes // 2:
            a_reads = b_reads = 1
        else:
            a_reads = -(-tiles_n // min(tiles_n, wave))
            b_reads = 1 if b.nbytes <= arch.l2_bytes // 2 else -(-tiles_m // max(1, wave // tiles_n))
        hbm = a.nbytes * a_reads + b.nbytes * b_reads + extra + op.result.nbytes
        # the ones row of a bias-gradient product runs through the MMAs like any row of A
        epilogue = max(0, op.flops - 2 * p.nbatch * p.m * p.n * p.k)
        flops = 2 * p.nbatch * tiles_m * s.bm * tiles_n * s.bn * tiles_k * s.bk + epilogue
        if p.tf32:
            # tf32 mma.sync issues half the k per instruction plus a cvt per fragment element
            unit, eff = MathUnit.TF32, (0.7 if arch.compute_capability[0] < 9 else 0.55)
        elif p.tensor_core:
            unit, eff = MathUnit.BF16, (0.8 if arch.compute_capability[0] < 9 else 0.65)
        else:
            unit, eff = MathUnit.FP32, 0.7
        spill = max(0, regs - arch.registers_per_thread) * 4
        return Resources(threads=s.threads, blocks=blocks, registers=min(regs, arch.registers_per_thread),
                         smem_bytes=smem, hbm_bytes=hbm, flops=flops, unit=unit, efficiency=eff,
                         spill_bytes=spill)

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        if not self.accepts(op):
            raise TesseraError("the gemm template cannot implement this op", op=op.op, operands=str(op),
                               hint="it takes rank >= 2 operands of one dtype in (bfloat16, float16, float32), "
                                    "fp32 accumulation, and bias/aux/residual in those dtypes")
        p = GemmProblem.of(op)
        wanted = GemmSchedule if p.tensor_core else GemmSimtSchedule
        if not isinstance(schedule, wanted):
            raise TesseraError(f"{'tf32' if p.tf32 else p.in_dtype} operands take a {wanted.__name__}, "
                               f"got {schedule!r}", op=op.op)
        name = kernel_name(p, schedule)
        header = (f"// {op}\n// kernel kind gemm, fused {list(self.fused(op))}, schedule {schedule.describe()}, "
                  f"{arch.name}\n")
        body = emit_tensor_core(p, schedule, name) if p.tensor_core else emit_simt(p, schedule, name)
        return KernelSource(name, header + body, schedule.threads,
                            grid=(self.resources(op, schedule, arch).blocks, 1, 1),
                            fast_math=op.numerics is Numerics.FAST)

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f16, f32 = DType.bfloat16, DType.float16, DType.float32

        def mm(a, b, dtype, numerics=Numerics.DEFAULT):
            ta, tb = TensorType(a, dtype), TensorType(b, dtype)
            batch, m, n, _ = matmul_dims(a, b)
            return KernelOp.of("matmul", (ta, tb), TensorType(batch + (m, n), dtype), accum_dtype=None,
                               numerics=numerics)

        def gemm(a, b, dtype, out, extra=(), trans_a=False, trans_b=False, **attrs):
            # an operand stored transposed is the product's operand with its last two axes swapped back
            ta, tb = read_as(TensorType(a, dtype), trans_a), read_as(TensorType(b, dtype), trans_b)
            batch, m, n, _ = matmul_dims(a, b)
            base = dict(scale=1.0, activation="none", has_bias=False, has_residual=False, accum_dtype=None,
                        dtype=out, trans_a=trans_a, trans_b=trans_b)
            return KernelOp.of("gemm", (ta, tb, *extra), TensorType(batch + (m, n), out), **(base | attrs))

        def bias_grad(m, k, n, dtype, numerics=Numerics.DEFAULT, trans_a=False):
            return KernelOp.of("matmul_bias_grad", (read_as(TensorType((m, k), dtype), trans_a), TensorType((k, n), dtype)),
                               TensorType((m + 1, n), dtype), accum_dtype=None, numerics=numerics, trans_a=trans_a)

        return (
            mm((4096, 4096), (4096, 4096), bf),
            gemm((2048, 1024), (1024, 4096), bf, bf, (TensorType((4096,), bf),), has_bias=True,
                 activation="gelu"),
            gemm((1024, 2048), (2048, 1024), f16, f32, (TensorType((1024, 1024), f32),), has_residual=True,
                 scale=0.5),
            mm((8, 512, 64), (64, 512), bf),
            mm((1024, 1024), (1024, 1024), f32),
            mm((1000, 1000), (1000, 1000), bf),
            mm((1001, 999), (999, 1003), bf),    # rows not 16-byte aligned: element-wise loads
            mm((4096, 4096), (4096, 4096), f32, Numerics.FAST),     # tf32 tensor cores
            mm((1000, 1000), (1000, 1000), f32, Numerics.FAST),     # tf32, partial tiles through cp.async
            mm((4, 1001, 999), (999, 1003), f32, Numerics.FAST),    # tf32, ragged rows: element-wise loads
            gemm((2048, 1024), (1024, 768), f32, f32, (TensorType((768,), f32),), has_bias=True,
                 activation="gelu_tanh", numerics=Numerics.FAST),  # tf32 with an epilogue
            # activation derivatives of a backward pass, reading the pre-activation
            gemm((2048, 768), (768, 3072), bf, bf, (TensorType((2048, 3072), bf),), activation="dgelu"),
            gemm((4, 256, 512), (512, 384), f16, f16, (TensorType((4, 256, 384), f16),), activation="dsilu"),
            gemm((1000, 1000), (1000, 1000), f32, f32, (TensorType((1000, 1000), f32),), activation="drelu"),
            gemm((1024, 512), (512, 1024), f32, f32, (TensorType((1024, 1024), f32),), activation="dgelu_tanh",
                 numerics=Numerics.FAST),
            # bias gradients: the ones row alone in the last tile row (768 = 6 x 128), in the middle
            # of a ragged tile with element-wise loads, on SIMT, and in tf32; small enough that the
            # GPU check's reference covers every row (kernel_check subsets big products by rows of A)
            bias_grad(768, 1024, 1024, bf),
            bias_grad(1000, 999, 1003, f16),
            bias_grad(500, 777, 300, f32),
            bias_grad(1024, 512, 1024, f32, Numerics.FAST),
            # transposed operands, read in place: a backward pass's dX = dY Wᵀ (with an activation
            # derivative) and dW = Xᵀ dY (with the bias gradient), on each path and with ragged rows
            gemm((2048, 768), (768, 3072), bf, bf, (TensorType((2048, 3072), bf),), activation="dgelu", trans_b=True),
            bias_grad(768, 2048, 3072, bf, trans_a=True),
            gemm((4, 256, 512), (512, 384), f16, f16, trans_a=True, trans_b=True),
            gemm((1001, 999), (999, 1003), bf, f32, trans_a=True),
            bias_grad(1000, 999, 1003, f16, trans_a=True),
            gemm((1000, 1000), (1000, 1000), f32, f32, trans_a=True, numerics=Numerics.FAST),
            gemm((1024, 512), (512, 1024), f32, f32, trans_b=True, numerics=Numerics.FAST),
            bias_grad(500, 777, 300, f32, trans_a=True),
            gemm((3, 300, 200), (200, 500), f32, f32, trans_a=True, trans_b=True),
        )


def _k_depths(p: GemmProblem) -> tuple[int, ...]:
    """The bk the mma kernel is written for: 4 or 8 16-byte chunks per shared row of A, the widths
    its XOR swizzle spreads over distinct bank groups (tf32 values are twice as wide: half the k)."""
    return (16, 32) if p.tf32 else (32, 64)


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
    square = s.bn <= 2 * s.bm and s.bm <= 2 * s.bn
    if isinstance(s, GemmSchedule):
        warp_m, warp_n = s.bm // s.warps_m, s.bn // s.warps_n
        return (square and s.threads >= 128 and s.warps_m <= s.warps_n and s.bk == _k_depths(p)[0]
                and warp_m in (32, 64) and warp_n in (32, 64))
    return square and s.threads >= 128 and s.tm == s.tn and (s.bk == _SIMT_BK[0] or s.threads >= 256)


# ---- resource model --------------------------------------------------------------------------

def _smem(p: GemmProblem, s: Schedule) -> int:
    """Shared bytes per block: swizzled (unpadded) stages for mma (tf32 included), two padded fp32
    buffers for SIMT."""
    if isinstance(s, GemmSchedule):
        return s.stages * (s.bm * s.bk + s.bk * s.bn) * p.in_dtype.itemsize
    return 2 * s.bk * (s.bm + SIMT_PAD + s.bn) * 4


def _registers(p: GemmProblem, s: Schedule) -> int:
    """Registers per thread: fp32 accumulators plus the main loop's operands and addressing.

    mma: each warp holds (bm/warps_m)/16 x (bn/warps_n)/8 m16n8 tiles of 4 fp32 accumulators; per
    16-wide k-step, A fragments of 4 registers per m16 tile and B fragments of 2 per n8 tile, which
    ptxas partly double-buffers across the unrolled k-steps (x1.25); and each 16-byte cp.async
    chunk a thread issues per stage keeps its global address, swizzled smem offset and predicate
    live across the loop (~9 registers, ~12 when unaligned rows copy through registers; about two
    thirds of that when K is short enough that the prologue issues every tile and the loop loads
    nothing). The epilogue runs element by element after the operand registers are dead, so it
    adds nothing at the peak. SIMT: tm*tn accumulators, tm+tn operands per k (double-buffered),
    the registers staging the next tile, and a fixed loop overhead.
    """
    if isinstance(s, GemmSchedule):
        mi, ni = s.bm // s.warps_m // 16, s.bn // s.warps_n // 8
        chunks = (s.bm * s.bk + s.bk * s.bn) * p.in_dtype.itemsize // 16 // s.threads
        # fp32 chunks copied element-wise go straight from 4 loads to one float4 store: no packing
        addressing = (_CHUNK_REGISTERS if p.rows_aligned or p.tf32 else _CHUNK_REGISTERS_COPY8) * chunks
        if -(-p.k // s.bk) <= s.stages - 1:   # every k-tile issued in the prologue: no loads in the loop
            addressing = math.ceil(addressing * _PROLOGUE_ONLY)
        reuse = _FRAG_REUSE_TF32 if p.tf32 else _FRAG_REUSE
        return mi * ni * 4 + math.ceil(reuse * (mi * 4 + ni * 2)) + addressing + _TC_OVERHEAD
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
_TC_OVERHEAD = -8      # the chunk term over-counts shared row/column bases; net of tile origins and counters
_SIMT_OVERHEAD = 30    # thread coordinates, global pointers of the staged loads, loop counters
_SIMT_SHARED_STAGING = 8  # a TN product's staged loads share coordinates (64x64 tiles: 47 registers, not 61, on sm_80)


def _blocks_per_sm(threads: int, registers: int, smem: int, arch: ArchSpec) -> int:
    """Resident blocks per SM allowed by warps, registers (256 per warp granule) and shared memory."""
    warps = -(-threads // 32)
    by_warps = arch.max_warps_per_sm // warps
    by_regs = arch.registers_per_sm // (warps * 32 * (-(-registers // 8) * 8))
    by_smem = arch.smem_per_sm // max(smem, 1)
    return max(1, min(by_warps, by_regs, by_smem, arch.max_blocks_per_sm))
