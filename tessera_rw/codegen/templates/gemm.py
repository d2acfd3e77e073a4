"""GEMM: matmul and gemm (act(scale · a @ b + bias) + residual, cast) as one kernel per product.

Two code paths. bf16/fp16 operands run on tensor cores: mma.sync m16n8k16 with fp32 accumulators,
fragments read by ldmatrix from XOR-swizzled shared memory, tiles brought in by a cp.async
pipeline of `stages` buffers. float32 operands run a SIMT FFMA kernel (no tf32: full fp32
products, as numpy gives). Both keep the epilogue in registers and write the result once.
Shapes are baked into the source as constants; the grid is flat (column tiles, row tiles, then
the flattened batch) and a broadcast operand gets batch stride 0.

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
from tessera_rw.algebra.ops.linalg import matmul_dims
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Resources, Schedule, Template

_TENSOR_CORE = (DType.bfloat16, DType.float16)
_OUT_DTYPES = (DType.float32, DType.bfloat16, DType.float16)
# The launch passes no dynamic shared memory, so every schedule lives in the static 48 KiB.
_STATIC_SMEM = 48 * 1024
_CP_ASYNC_BYTES = 16            # one cp.async moves 16 bytes: rows must start 16-byte aligned
_MAX_BLOCKS = 2 ** 31 - 1       # the flat grid's blockIdx.x
_INT_INDEX = 2 ** 31            # one matrix is indexed with 32-bit ints
_ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")


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
_SIMT_PAD = 4                   # floats of padding per transposed A row: conflict-free stores, float4 reads


@dataclass(frozen=True)
class _Problem:
    """The op in the terms the kernels use: batch, M, N, K, dtypes and the epilogue."""
    batch: tuple[int, ...]
    a_batch: tuple[int, ...]
    b_batch: tuple[int, ...]
    m: int
    n: int
    k: int
    in_dtype: DType
    out_dtype: DType
    scale: float
    activation: str
    bias: TensorType | None
    residual: TensorType | None

    @staticmethod
    def of(op: KernelOp) -> _Problem:
        a, b = op.operands[:2]
        batch, m, n, k = matmul_dims(a.shape, b.shape)
        at = op.attr_map
        extra = iter(op.operands[2:])
        bias = next(extra) if at.get("has_bias") else None
        residual = next(extra) if at.get("has_residual") else None
        return _Problem(batch, a.shape[:-2], b.shape[:-2], m, n, k, a.dtype, op.result.dtype,
                        float(at.get("scale", 1.0)), at.get("activation", "none"), bias, residual)

    @property
    def nbatch(self) -> int:
        return math.prod(self.batch)

    @property
    def tensor_core(self) -> bool:
        return self.in_dtype in _TENSOR_CORE


class GemmTemplate(Template):
    """matmul / gemm of rank >= 2 float32, float16 or bfloat16 operands (both the same dtype).

    The tensor-core path streams tiles with cp.async when rows of A and B start 16-byte aligned
    (K*itemsize and N*itemsize multiples of 16); other shapes copy element-wise through registers
    (predicated, slower loads, same math).
    """
    kind: ClassVar[str] = "gemm"
    ops: ClassVar[frozenset[str]] = frozenset({"matmul", "gemm"})

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops or len(op.operands) < 2:
            return False
        a, b = op.operands[:2]
        if a.ndim < 2 or b.ndim < 2 or a.dtype is not b.dtype or a.dtype not in (*_TENSOR_CORE, DType.float32):
            return False
        accum = op.attr_map.get("accum_dtype")
        if accum is not None and DType.parse(accum) is not DType.float32:
            return False
        if len(op.operands) != 2 + bool(op.attr_map.get("has_bias")) + bool(op.attr_map.get("has_residual")):
            return False
        p = _Problem.of(op)
        if p.out_dtype not in _OUT_DTYPES or p.activation not in _ACTIVATIONS or not math.isfinite(p.scale):
            return False
        if p.nbatch * -(-p.m // 16) * -(-p.n // 16) > _MAX_BLOCKS:
            return False
        if any(t.dtype not in _OUT_DTYPES for t in (p.bias, p.residual) if t is not None):
            return False
        if max(p.m * p.k, p.k * p.n, p.m * p.n) >= _INT_INDEX or min(p.m, p.n, p.k) < 1:
            return False
        return True

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        p = _Problem.of(op)
        product = DType.float32 if not p.tensor_core else p.in_dtype
        steps = (("scale", p.scale != 1.0), ("bias", p.bias is not None),
                 (p.activation, p.activation != "none"), ("residual", p.residual is not None),
                 ("cast", p.out_dtype is not product))
        return tuple(name for name, on in steps if on)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        p = _Problem.of(op)
        defaults = _TC_DEFAULTS if p.tensor_core else _SIMT_DEFAULTS
        return tuple(s for s in defaults if self._valid(p, s, arch))

    def _valid(self, p: _Problem, s: Schedule, arch: ArchSpec) -> bool:
        smem = _smem(p, s)
        if smem > min(_STATIC_SMEM, arch.smem_per_block) or s.threads > arch.max_threads_per_block:
            return False
        if _registers(p, s) > arch.registers_per_thread:
            return False
        if isinstance(s, GemmSchedule):
            return (s.bm % (16 * s.warps_m) == 0 and s.bn % (16 * s.warps_n) == 0 and s.bk in (32, 64)
                    and s.bn >= 64 and s.stages >= 2 and (s.bm * s.bk // 8) % s.threads == 0
                    and (s.bk * s.bn // 8) % s.threads == 0)
        return (s.tm % 4 == 0 and s.tn % 4 == 0 and s.bm % s.tm == 0 and s.bn % s.tn == 0
                and (s.bm * s.bk) % s.threads == 0 and (s.bk * s.bn) % s.threads == 0)

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        p = _Problem.of(op)
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
        epilogue = op.flops - 2 * p.nbatch * p.m * p.n * p.k
        flops = 2 * p.nbatch * tiles_m * s.bm * tiles_n * s.bn * tiles_k * s.bk + epilogue
        if p.tensor_core:
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
                                    "fp32 accumulation, and bias/residual in those dtypes")
        p = _Problem.of(op)
        wanted = GemmSchedule if p.tensor_core else GemmSimtSchedule
        if not isinstance(schedule, wanted):
            raise TesseraError(f"{p.in_dtype} operands take a {wanted.__name__}, got {schedule!r}", op=op.op)
        name = _kernel_name(p, schedule)
        header = (f"// {op}\n// kernel kind gemm, fused {list(self.fused(op))}, schedule {schedule.describe()}, "
                  f"{arch.name}\n")
        body = _emit_tensor_core(p, schedule, name) if p.tensor_core else _emit_simt(p, schedule, name)
        return KernelSource(name, header + body, schedule.threads)

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f16, f32 = DType.bfloat16, DType.float16, DType.float32

        def mm(a, b, dtype):
            ta, tb = TensorType(a, dtype), TensorType(b, dtype)
            batch, m, n, _ = matmul_dims(a, b)
            return KernelOp.of("matmul", (ta, tb), TensorType(batch + (m, n), dtype), accum_dtype=None)

        def gemm(a, b, dtype, out, extra=(), **attrs):
            ta, tb = TensorType(a, dtype), TensorType(b, dtype)
            batch, m, n, _ = matmul_dims(a, b)
            base = dict(scale=1.0, activation="none", has_bias=False, has_residual=False, accum_dtype=None,
                        dtype=out)
            return KernelOp.of("gemm", (ta, tb, *extra), TensorType(batch + (m, n), out), **(base | attrs))

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
        )


# ---- resource model --------------------------------------------------------------------------

def _smem(p: _Problem, s: Schedule) -> int:
    """Shared bytes per block: swizzled (unpadded) stages for mma, two padded fp32 buffers for SIMT."""
    if isinstance(s, GemmSchedule):
        return s.stages * (s.bm * s.bk + s.bk * s.bn) * p.in_dtype.itemsize
    return 2 * s.bk * (s.bm + _SIMT_PAD + s.bn) * 4


def _registers(p: _Problem, s: Schedule) -> int:
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
        chunks = (s.bm * s.bk + s.bk * s.bn) // 8 // s.threads
        addressing = (_CHUNK_REGISTERS if _aligned(p) else _CHUNK_REGISTERS_COPY8) * chunks
        if -(-p.k // s.bk) <= s.stages - 1:   # every k-tile issued in the prologue: no loads in the loop
            addressing = math.ceil(addressing * _PROLOGUE_ONLY)
        return mi * ni * 4 + math.ceil(_FRAG_REUSE * (mi * 4 + ni * 2)) + addressing + _TC_OVERHEAD
    staged = (s.bm * s.bk + s.bk * s.bn) // s.threads
    return s.tm * s.tn + 2 * (s.tm + s.tn) + staged + _SIMT_OVERHEAD


_FRAG_REUSE = 1.25     # fragment registers per fragment value: next k-step's loads overlap this one's mma
_CHUNK_REGISTERS = 9   # per cp.async chunk: 64-bit source address, smem offset, bounds predicate, k step
_CHUNK_REGISTERS_COPY8 = 12  # element-wise copy: the chunk's 4 packed words pass through registers too
_PROLOGUE_ONLY = 2 / 3  # share of that addressing still live when no cp.async is issued inside the k-loop
_TC_OVERHEAD = -8      # the chunk term over-counts shared row/column bases; net of tile origins and counters
_SIMT_OVERHEAD = 30    # thread coordinates, global pointers of the staged loads, loop counters


def _blocks_per_sm(threads: int, registers: int, smem: int, arch: ArchSpec) -> int:
    """Resident blocks per SM allowed by warps, registers (256 per warp granule) and shared memory."""
    warps = -(-threads // 32)
    by_warps = arch.max_warps_per_sm // warps
    by_regs = arch.registers_per_sm // (warps * 32 * (-(-registers // 8) * 8))
    by_smem = arch.smem_per_sm // max(smem, 1)
    return max(1, min(by_warps, by_regs, by_smem, arch.max_blocks_per_sm))


# ---- CUDA emission ---------------------------------------------------------------------------

_CTYPE = {DType.float32: "float", DType.bfloat16: "bf16_t", DType.float16: "f16_t"}
_LOAD = {DType.float32: "{}", DType.bfloat16: "bf16_to_f32({})", DType.float16: "f16_to_f32({})"}
_ACT = {
    "none": "v",
    "relu": "fmaxf(v, 0.0f)",
    "gelu": "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))",
    "gelu_tanh": "0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)))",
    "silu": "v / (1.0f + expf(-v))",
}


def _kernel_name(p: _Problem, s: Schedule) -> str:
    tile = "x".join(str(getattr(s, f)) for f in s.__dataclass_fields__)
    epi = ("b" if p.bias else "") + ("r" if p.residual else "")
    shape = f"{p.nbatch}x{p.m}x{p.n}x{p.k}"
    return f"gemm_{p.in_dtype.short}_{p.out_dtype.short}_{p.activation}{epi and '_' + epi}_{shape}_{tile}"


def _batch_offset(name: str, shape: tuple[int, ...], out_batch: tuple[int, ...], inner: int) -> str:
    """A device function: the element offset of batch `z` (flattened over `out_batch`) in a tensor
    whose leading dims `shape` broadcast to `out_batch` and whose matrices hold `inner` elements."""
    shape = (1,) * (len(out_batch) - len(shape)) + tuple(shape)
    if shape == out_batch:
        body = f"(long long)z * {inner}LL" if math.prod(out_batch) > 1 else "0LL"
    else:
        terms, stride, below = [], inner, 1
        for size, out in reversed(list(zip(shape, out_batch))):
            if size == out and size > 1:
                terms.append(f"(long long)((z / {below}) % {size}) * {stride}LL")
            stride *= size
            below *= out
        body = " + ".join(terms) or "0LL"
    return f"__device__ __forceinline__ long long gemm_boff_{name}(int z) {{ return {body}; }}\n"


def _operand_index(name: str, t: TensorType, p: _Problem) -> str:
    """Offset functions of a bias/residual broadcast onto (batch..., M, N)."""
    shape = (1,) * (len(p.batch) + 2 - t.ndim) + t.shape
    rows, cols = shape[-2], shape[-1]
    rs = cols if rows > 1 else 0
    cs = 1 if cols > 1 else 0
    return (_batch_offset(name, shape[:-2], p.batch, rows * cols) +
            f"__device__ __forceinline__ long long gemm_idx_{name}(int z, int r, int c) "
            f"{{ return gemm_boff_{name}(z) + (long long)r * {rs} + (long long)c * {cs}; }}\n")


def _common(p: _Problem) -> tuple[str, str, str]:
    """(device functions, extra kernel parameters, epilogue function) shared by both paths."""
    t_in = _CTYPE[p.in_dtype]
    fns = (_batch_offset("a", p.a_batch, p.batch, p.m * p.k) +
           _batch_offset("b", p.b_batch, p.batch, p.k * p.n) +
           _batch_offset("c", p.batch, p.batch, p.m * p.n))
    params, args, steps = "", "", []
    if p.scale != 1.0:
        steps.append(f"v *= {p.scale!r}f;")
    for name, t in (("bias", p.bias), ("res", p.residual)):
        if t is None:
            continue
        fns += _operand_index(name, t, p)
        params += f"const {_CTYPE[t.dtype]}* __restrict__ {name}, "
        args += f", {name}"
    if p.bias is not None:
        steps.append(f"v += {_LOAD[p.bias.dtype].format('bias[gemm_idx_bias(z, r, c)]')};")
    steps.append(f"v = {_ACT[p.activation]};")
    if p.residual is not None:
        steps.append(f"v += {_LOAD[p.residual.dtype].format('res[gemm_idx_res(z, r, c)]')};")
    epi_params = "".join(f", const {_CTYPE[t.dtype]}* __restrict__ {n}" for n, t in
                         (("bias", p.bias), ("res", p.residual)) if t is not None)
    fns += (f"__device__ __forceinline__ float gemm_epilogue(float v, int z, int r, int c{epi_params}) {{\n"
            f"    {' '.join(steps)}\n    return v;\n}}\n")
    signature = (f"const {t_in}* __restrict__ A, const {t_in}* __restrict__ B, {params}"
                 f"{_CTYPE[p.out_dtype]}* __restrict__ C")
    return fns, signature, args


def _launch(p: _Problem, s: Schedule, name: str, signature: str) -> str:
    blocks = -(-p.n // s.bn) * -(-p.m // s.bm) * p.nbatch
    return (f"// launch: {name}<<<{blocks}, {s.threads}>>> (a 1-d grid of resources().blocks, "
            f"no dynamic shared memory)\n// arguments: {signature}\n")


def _aligned(p: _Problem) -> bool:
    """Whether every row of A and B starts 16-byte aligned, as cp.async needs."""
    size = p.in_dtype.itemsize
    return p.k * size % _CP_ASYNC_BYTES == 0 and p.n * size % _CP_ASYNC_BYTES == 0


# Rows that are not 16-byte aligned cannot use cp.async: the chunk goes through registers instead,
# so that stage's loads are synchronous (the pipeline still overlaps the other stages' math).
_COPY_ELEMENTWISE = """// `valid` elements of a row into a 16-byte smem chunk, the rest zero-filled, element by element
__device__ __forceinline__ void gemm_copy8(unsigned short* dst, const unsigned short* src, int valid) {
    unsigned w[4];
    #pragma unroll
    for (int e = 0; e < 4; ++e) {
        const unsigned lo = 2 * e < valid ? src[2 * e] : 0u, hi = 2 * e + 1 < valid ? src[2 * e + 1] : 0u;
        w[e] = lo | (hi << 16);
    }
    *(uint4*)dst = make_uint4(w[0], w[1], w[2], w[3]);
}"""


def _emit_tensor_core(p: _Problem, s: GemmSchedule, name: str) -> str:
    fns, signature, args = _common(p)
    t = _CTYPE[p.in_dtype]
    mma = "mma_bf16_16816" if p.in_dtype is DType.bfloat16 else "mma_f16_16816"
    ca, cb = s.bk // 8, s.bn // 8            # 16-byte chunks per smem row of A and of B
    aligned = _aligned(p)
    # aligned rows: K and N are multiples of 8, so a chunk is wholly inside or wholly outside
    copy, valid_a, valid_b = (("cp_async_16", "ok ? 16 : 0", "ok ? 16 : 0") if aligned else
                              ("gemm_copy8", "ok ? min(kv, 8) : 0", "ok ? min(nv, 8) : 0"))
    epi = [f"gemm_epilogue(acc[i][j][2 * h + {e}], z, r, c + {e}{args})" for e in (0, 1)]
    if p.n % 2 == 0:   # c is even, so c + 1 < N and the pair is 2-element aligned
        pair = {DType.bfloat16: "*(unsigned*)(C + o) = pack_bf16x2(v0, v1);",
                DType.float16: "*(unsigned*)(C + o) = pack_f16x2(v0, v1);",
                DType.float32: "*(float2*)(C + o) = make_float2(v0, v1);"}[p.out_dtype]
        store = f"const float v0 = {epi[0]}, v1 = {epi[1]};\n{pair}"
    else:
        cvt = {DType.bfloat16: "f32_to_bf16", DType.float16: "f32_to_f16", DType.float32: ""}[p.out_dtype]
        store = f"C[o] = {cvt}({epi[0]});\nif (c + 1 < N) C[o + 1] = {cvt}({epi[1]});"
    store = "\n".join(" " * 20 + line for line in store.splitlines())
    return _launch(p, s, name, signature) + fns + f"""
{"" if aligned else _COPY_ELEMENTWISE}
// XOR swizzle of 16-byte chunks: the 8 rows one ldmatrix phase reads land in 8 distinct bank groups
__device__ __forceinline__ int gemm_swz_a(int r, int c) {{ return c ^ ((r / {max(1, 8 // ca)}) & {min(ca, 8) - 1}); }}
__device__ __forceinline__ int gemm_swz_b(int r, int c) {{ return c ^ ((r / {max(1, 8 // cb)}) & {min(cb, 8) - 1}); }}

extern "C" __global__ void __launch_bounds__({s.threads}) {name}({signature}) {{
    constexpr int M = {p.m}, N = {p.n}, K = {p.k};
    constexpr int BM = {s.bm}, BN = {s.bn}, BK = {s.bk}, STAGES = {s.stages}, THREADS = {s.threads};
    constexpr int WARP_M = {s.bm // s.warps_m}, WARP_N = {s.bn // s.warps_n}, WARPS_N = {s.warps_n};
    constexpr int MI = WARP_M / 16, NI = WARP_N / 8, CA = {ca}, CB = {cb};
    constexpr int KT = (K + BK - 1) / BK;
    __shared__ __align__(128) {t} sA[STAGES * BM * BK];
    __shared__ __align__(128) {t} sB[STAGES * BK * BN];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / WARPS_N) * WARP_M, wn0 = (warp % WARPS_N) * WARP_N;
    // one flat grid: column tiles fastest (blocks sharing an A row panel run together), then rows, then batch
    constexpr int TILES_N = (N + BN - 1) / BN, TILES_M = (M + BM - 1) / BM;
    const int n0 = (blockIdx.x % TILES_N) * BN, m0 = (blockIdx.x / TILES_N % TILES_M) * BM;
    const int z = blockIdx.x / (TILES_N * TILES_M);
    const {t}* Ab = A + gemm_boff_a(z);
    const {t}* Bb = B + gemm_boff_b(z);

    // one k-tile into one stage; chunks past M, N or K are zero-filled (0 valid bytes)
    auto load_tile = [&](int stage, int kt) {{
        const int k0 = kt * BK;
        {t}* dA = sA + stage * BM * BK;
        {t}* dB = sB + stage * BK * BN;
        #pragma unroll
        for (int i = 0; i < BM * CA / THREADS; ++i) {{
            const int id = tid + i * THREADS, r = id / CA, c = id % CA, kv = K - (k0 + c * 8);
            const bool ok = m0 + r < M && kv > 0;
            {copy}(dA + r * BK + gemm_swz_a(r, c) * 8, ok ? Ab + (m0 + r) * K + k0 + c * 8 : Ab, {valid_a});
        }}
        #pragma unroll
        for (int i = 0; i < BK * CB / THREADS; ++i) {{
            const int id = tid + i * THREADS, r = id / CB, c = id % CB, nv = N - (n0 + c * 8);
            const bool ok = k0 + r < K && nv > 0;
            {copy}(dB + r * BN + gemm_swz_b(r, c) * 8, ok ? Bb + (k0 + r) * N + n0 + c * 8 : Bb, {valid_b});
        }}
    }};

    float acc[MI][NI][4];
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    #pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {{
        if (st < KT) load_tile(st, st);
        cp_async_commit();
    }}
    for (int kt = 0; kt < KT; ++kt) {{
        cp_async_wait<STAGES - 2>();   // tile kt has landed
        __syncthreads();               // and every warp is done with the stage refilled next
        if (kt + STAGES - 1 < KT) load_tile((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        cp_async_commit();
        const {t}* cA = sA + (kt % STAGES) * BM * BK;
        const {t}* cB = sB + (kt % STAGES) * BK * BN;
        #pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {{
            unsigned af[MI][4], bf[NI][2];
            #pragma unroll
            for (int i = 0; i < MI; ++i) {{
                const int r = wm0 + i * 16 + (lane & 15), c = ks * 2 + (lane >> 4);
                ldmatrix_x4(af[i], cA + r * BK + gemm_swz_a(r, c) * 8);
            }}
            #pragma unroll
            for (int j = 0; j < NI; j += 2) {{
                const int r = ks * 16 + (lane & 15), c = (wn0 + j * 8) / 8 + (lane >> 4);
                unsigned q[4];
                ldmatrix_x4_trans(q, cB + r * BN + gemm_swz_b(r, c) * 8);
                bf[j][0] = q[0]; bf[j][1] = q[1]; bf[j + 1][0] = q[2]; bf[j + 1][1] = q[3];
            }}
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NI; ++j) {mma}(acc[i][j], af[i], bf[j]);
        }}
    }}
    cp_async_wait<0>();

    // accumulator (i, j, e): row group lane/4 (+8 for e >= 2), column pair 2*(lane%4)
    const long long cz = gemm_boff_c(z);
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {{
                const int r = m0 + wm0 + i * 16 + h * 8 + (lane >> 2);
                const int c = n0 + wn0 + j * 8 + (lane & 3) * 2;
                if (r < M && c < N) {{
                    const long long o = cz + (long long)r * N + c;
{store}
                }}
            }}
}}
"""


def _emit_simt(p: _Problem, s: GemmSimtSchedule, name: str) -> str:
    fns, signature, args = _common(p)
    store = _STORE1[p.out_dtype]
    return _launch(p, s, name, signature) + fns + f"""
extern "C" __global__ void __launch_bounds__({s.threads}) {name}({signature}) {{
    constexpr int M = {p.m}, N = {p.n}, K = {p.k};
    constexpr int BM = {s.bm}, BN = {s.bn}, BK = {s.bk}, TM = {s.tm}, TN = {s.tn}, PAD = {_SIMT_PAD};
    constexpr int TX = BN / TN, THREADS = {s.threads}, GM = TM / 4, GN = TN / 4;
    constexpr int LA = BM * BK / THREADS, LB = BK * BN / THREADS, KT = (K + BK - 1) / BK;
    // A is stored transposed (k-major) so a thread's rows are one float4 per group
    __shared__ __align__(16) float sA[2][BK][BM + PAD];
    __shared__ __align__(16) float sB[2][BK][BN];
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    // one flat grid: column tiles fastest (blocks sharing an A row panel run together), then rows, then batch
    constexpr int TILES_N = (N + BN - 1) / BN, TILES_M = (M + BM - 1) / BM;
    const int n0 = (blockIdx.x % TILES_N) * BN, m0 = (blockIdx.x / TILES_N % TILES_M) * BM;
    const int z = blockIdx.x / (TILES_N * TILES_M);
    const float* Ab = A + gemm_boff_a(z);
    const float* Bb = B + gemm_boff_b(z);
    float ra[LA], rb[LB];
    auto fetch = [&](int k0) {{   // the next tile into registers, zeros past the edges
        #pragma unroll
        for (int i = 0; i < LA; ++i) {{
            const int id = tid + i * THREADS, r = id / BK, c = id % BK;
            ra[i] = (m0 + r < M && k0 + c < K) ? Ab[(m0 + r) * K + k0 + c] : 0.0f;
        }}
        #pragma unroll
        for (int i = 0; i < LB; ++i) {{
            const int id = tid + i * THREADS, r = id / BN, c = id % BN;
            rb[i] = (k0 + r < K && n0 + c < N) ? Bb[(k0 + r) * N + n0 + c] : 0.0f;
        }}
    }};
    auto stash = [&](int buf) {{
        #pragma unroll
        for (int i = 0; i < LA; ++i) {{ const int id = tid + i * THREADS; sA[buf][id % BK][id / BK] = ra[i]; }}
        #pragma unroll
        for (int i = 0; i < LB; ++i) {{ const int id = tid + i * THREADS; sB[buf][id / BN][id % BN] = rb[i]; }}
    }};

    float acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    fetch(0);
    stash(0);
    __syncthreads();
    for (int kt = 0; kt < KT; ++kt) {{
        const int buf = kt & 1;
        if (kt + 1 < KT) fetch((kt + 1) * BK);   // global latency hides behind this tile's FFMAs
        #pragma unroll
        for (int k = 0; k < BK; ++k) {{
            float a[TM], b[TN];
            #pragma unroll
            for (int g = 0; g < GM; ++g) {{
                const float4 v = *(const float4*)&sA[buf][k][g * (BM / GM) + ty * 4];
                a[g * 4] = v.x; a[g * 4 + 1] = v.y; a[g * 4 + 2] = v.z; a[g * 4 + 3] = v.w;
            }}
            #pragma unroll
            for (int g = 0; g < GN; ++g) {{
                const float4 v = *(const float4*)&sB[buf][k][g * (BN / GN) + tx * 4];
                b[g * 4] = v.x; b[g * 4 + 1] = v.y; b[g * 4 + 2] = v.z; b[g * 4 + 3] = v.w;
            }}
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }}
        if (kt + 1 < KT) stash(buf ^ 1);   // buf ^ 1 was last read before the previous barrier
        __syncthreads();
    }}

    const long long cz = gemm_boff_c(z);
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) {{
            const int r = m0 + (i / 4) * (BM / GM) + ty * 4 + i % 4;
            const int c = n0 + (j / 4) * (BN / GN) + tx * 4 + j % 4;
            if (r < M && c < N) {{
                const float v = gemm_epilogue(acc[i][j], z, r, c{args});
                {store}
            }}
        }}
}}
"""


_STORE1 = {DType.float32: "C[cz + (long long)r * N + c] = v;",
           DType.bfloat16: "C[cz + (long long)r * N + c] = f32_to_bf16(v);",
           DType.float16: "C[cz + (long long)r * N + c] = f32_to_f16(v);"}
