"""The kernel for rmsnorm_matmul: each block normalizes its rows once and multiplies on the fly.

A block owns a BM x BN tile of the output. It first sums the squares of its BM rows of x (PER_ROW
threads a row, a shuffle tree: a fixed order), then walks K in BK steps, staging x·g (A) and w (B)
in shared memory as fp32 and accumulating TM x TN products per thread in FFMAs; the epilogue scales
each row by its 1 / rms. The normalized activations never leave the block. It is a SIMT kernel
(no tensor cores): where a tensor-core GEMM after a separate rmsnorm is faster, the cost model
keeps that plan.

>>> from tessera_rw.plugin import arch_named
>>> t = RmsnormMatmulTemplate()
>>> [s.describe() for s in t.schedules(t.samples()[0], arch_named("H100-SXM"))]
['bm=64 bn=64 bk=16', 'bm=32 bn=32 bk=16']
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_rw.plugin import (ArchSpec, DType, KernelOp, KernelSource, MathUnit, Numerics, Resources, Schedule,
                               Template, TensorType, cuda_load, cuda_store, cuda_storage, kernel_name)

THREADS = 256
MAX_GRID_Y = 65535        # the row tiles run along grid x (2^31 - 1 blocks), the column tiles along y
DTYPES = (DType.float32, DType.bfloat16, DType.float16)


@dataclass(frozen=True)
class TileSchedule(Schedule):
    """The output tile a block owns and the K step it stages."""
    bm: int = 64
    bn: int = 64
    bk: int = 16

    @property
    def tm(self) -> int:         # rows per thread: 16 x 16 threads cover the tile
        return self.bm // 16

    @property
    def tn(self) -> int:
        return self.bn // 16


SCHEDULES = (TileSchedule(64, 64, 16), TileSchedule(32, 32, 16))


@dataclass(frozen=True)
class _Problem:
    m: int
    n: int
    k: int
    dtype: DType
    eps: float

    @classmethod
    def of(cls, op: KernelOp) -> _Problem:
        x, _, w = op.operands
        return cls(math.prod(x.shape[:-1]), w.shape[1], w.shape[0], x.dtype, float(op.attr_map["eps"]))


class RmsnormMatmulTemplate(Template):
    kind = "gemm"
    ops = frozenset({"rmsnorm_matmul"})

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops:
            return False
        x, g, w = op.operands
        return (x.dtype in DTYPES and g.dtype is x.dtype and w.dtype is x.dtype and op.result.dtype is x.dtype
                and x.ndim >= 1 and w.ndim == 2 and -(-w.shape[1] // min(s.bn for s in SCHEDULES)) <= MAX_GRID_Y)

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return ("rmsnorm",)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[TileSchedule, ...]:
        return SCHEDULES

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        assert isinstance(schedule, TileSchedule)
        p, s = _Problem.of(op), schedule
        row_tiles, col_tiles = -(-p.m // s.bm), -(-p.n // s.bn)
        size = p.dtype.itemsize
        # each block reads its rows of x twice (the squares, then the product) and its columns of w
        # once; L2 serves the re-reads of the column tiles' x rows when x fits it
        x_reads = (2 if p.m * p.k * size <= arch.l2_bytes // 2 else 2 * col_tiles) * p.m * p.k * size
        flops = 2 * row_tiles * s.bm * col_tiles * s.bn * p.k + 3 * p.m * p.k * col_tiles
        return Resources(threads=THREADS, blocks=row_tiles * col_tiles, registers=self.registers(s),
                         smem_bytes=4 * (s.bk * (s.bm + 1) + s.bk * s.bn + s.bm),
                         hbm_bytes=x_reads + row_tiles * p.k * p.n * size + p.k * size + p.m * p.n * size,
                         flops=flops, unit=MathUnit.FP32, efficiency=0.5)

    @staticmethod
    def registers(s: TileSchedule) -> int:
        """The accumulators and the A and B values they are fed from (about as many again), plus
        some 24 for addresses and loop state: within 20% of ptxas on sm_80 and sm_90."""
        return 2 * s.tm * s.tn + 24

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        assert isinstance(schedule, TileSchedule)
        if not self.accepts(op):
            raise ValueError(f"the rmsnorm_matmul template cannot implement {op}")
        p, s = _Problem.of(op), schedule
        name = kernel_name("gemm", op, s)
        t = cuda_storage(p.dtype)
        per_row = THREADS // s.bm
        source = f"""// {op}
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
        const {t}* __restrict__ X, const {t}* __restrict__ G, const {t}* __restrict__ W, {t}* __restrict__ Y) {{
    constexpr int M = {p.m}, N = {p.n}, K = {p.k}, BM = {s.bm}, BN = {s.bn}, BK = {s.bk};
    constexpr int TM = {s.tm}, TN = {s.tn}, PER_ROW = {per_row}, THREADS = {THREADS};
    __shared__ float sInv[BM];
    __shared__ float sA[BK][BM + 1];
    __shared__ float sB[BK][BN];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    {{  // 1 / rms of the block's rows: PER_ROW neighbouring lanes a row, summed by a shuffle tree
        const int r = tid / PER_ROW, lane = tid % PER_ROW;
        float ss = 0.0f;
        if (m0 + r < M)
            for (int k = lane; k < K; k += PER_ROW) {{
                const float v = {cuda_load(p.dtype, "X[(long long)(m0 + r) * K + k]")};
                ss += v * v;
            }}
        for (int off = PER_ROW / 2; off > 0; off >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (lane == 0)
            sInv[r] = 1.0f / sqrtf(ss / (float)K + {p.eps!r}f);
    }}
    float acc[TM][TN];
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += BK) {{
        for (int e = tid; e < BM * BK; e += THREADS) {{      // A = x * g, stored k-major
            const int r = e / BK, c = e % BK, k = k0 + c;
            sA[c][r] = (m0 + r < M && k < K)
                ? {cuda_load(p.dtype, "X[(long long)(m0 + r) * K + k]")} * {cuda_load(p.dtype, "G[k]")} : 0.0f;
        }}
        for (int e = tid; e < BK * BN; e += THREADS) {{
            const int r = e / BN, c = e % BN, k = k0 + r;
            sB[r][c] = (k < K && n0 + c < N) ? {cuda_load(p.dtype, "W[(long long)k * N + n0 + c]")} : 0.0f;
        }}
        __syncthreads();
        for (int kk = 0; kk < BK; ++kk) {{
            float a[TM], b[TN];
            for (int i = 0; i < TM; ++i) a[i] = sA[kk][ty * TM + i];
            for (int j = 0; j < TN; ++j) b[j] = sB[kk][tx * TN + j];
            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < TN; ++j)
                    acc[i][j] += a[i] * b[j];
        }}
        __syncthreads();
    }}
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) {{
            const int r = m0 + ty * TM + i, c = n0 + tx * TN + j;
            if (r < M && c < N)
                Y[(long long)r * N + c] = {cuda_store(p.dtype, "acc[i][j] * sInv[ty * TM + i]")};
        }}
}}
"""
        return KernelSource(name, source, threads=THREADS, grid=(-(-p.m // s.bm), -(-p.n // s.bn), 1),
                            fast_math=op.numerics is Numerics.FAST)

    def samples(self) -> tuple[KernelOp, ...]:
        def sample(m: int, k: int, n: int, dtype: DType) -> KernelOp:
            x, g, w = TensorType((2, m, k), dtype), TensorType((k,), dtype), TensorType((k, n), dtype)
            return KernelOp.of("rmsnorm_matmul", (x, g, w), TensorType((2, m, n), dtype), eps=1e-6)
        return sample(256, 512, 384, DType.float32), sample(100, 300, 70, DType.bfloat16)


def templates() -> tuple[Template, ...]:
    return (RmsnormMatmulTemplate(),)
