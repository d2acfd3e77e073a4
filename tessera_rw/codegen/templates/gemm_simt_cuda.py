"""The SIMT GEMM kernel: fp32 operands in FFMA (full fp32 products, as numpy gives), double-buffered.

Each thread owns a tm x tn patch of the bm x bn block tile. A tile goes global → registers →
shared memory: the next tile's loads are in flight while this one's FFMAs run. Shared memory
holds A k-major (transposed, padded) and B as [BK][BN], so a thread reads its rows and columns as
float4s. Consecutive threads load consecutive elements of a stored row, whichever way an operand
is stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.templates.gemm_cuda import a_rows_name, block_origin, common, launch_comment, ones_row_decl

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.gemm import GemmSimtSchedule
    from tessera_rw.codegen.templates.gemm_problem import GemmProblem

SIMT_PAD = 4                    # floats of padding per transposed A row: conflict-free stores, float4 reads

_STORE1 = {DType.float32: "C[{o}cz + (long long)r * N + c] = {v};",
           DType.bfloat16: "C[{o}cz + (long long)r * N + c] = f32_to_bf16({v});",
           DType.float16: "C[{o}cz + (long long)r * N + c] = f32_to_f16({v});"}


def _a_coordinates(p: GemmProblem) -> tuple[str, str]:
    """(the tile row r and k-column c of the element load `id` takes, its global offset in Ab)."""
    if p.trans_a:      # stored [K, M]: consecutive ids walk M
        return "r = id % BM, c = id / BM", f"(k0 + c) * {a_rows_name(p)} + m0 + r"
    return "r = id / BK, c = id % BK", "(m0 + r) * K + k0 + c"


def _b_coordinates(p: GemmProblem) -> tuple[str, str]:
    """(the tile k-row r and column c of the element load `id` takes, its global offset in Bb)."""
    if p.trans_b:      # stored [N, K]: consecutive ids walk K
        return "r = id % BK, c = id / BK", "(n0 + c) * K + k0 + r"
    return "r = id / BN, c = id % BN", "(k0 + r) * N + n0 + c"


def emit_simt(p: GemmProblem, s: GemmSimtSchedule, name: str, group: int) -> str:
    """The FFMA kernel for fp32 operands, after its launch comment and device helpers."""
    fns, signature, args = common(p)
    store = _STORE1[p.out_dtype].format(o="", v="v")
    if p.keep_pre:     # v is the pre-activation; the activation goes one product further on
        store += " " + _STORE1[p.out_dtype].format(o=f"{p.nbatch * p.m * p.n}LL + ", v="gemm_activate(v)")
    return launch_comment(p, s, name, signature) + fns + f"""
extern "C" __global__ void __launch_bounds__({s.threads}) {name}({signature}) {{
    constexpr int M = {p.m}, N = {p.n}, K = {p.k};{ones_row_decl(p)}
    constexpr int BM = {s.bm}, BN = {s.bn}, BK = {s.bk}, TM = {s.tm}, TN = {s.tn}, PAD = {SIMT_PAD};
    constexpr int TX = BN / TN, THREADS = {s.threads}, GM = TM / 4, GN = TN / 4;
    constexpr int LA = BM * BK / THREADS, LB = BK * BN / THREADS, KT = (K + BK - 1) / BK;
    // A is stored transposed (k-major) so a thread's rows are one float4 per group
    __shared__ __align__(16) float sA[2][BK][BM + PAD];
    __shared__ __align__(16) float sB[2][BK][BN];
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
{block_origin("float", group)}
{_register_staging(p)}

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


def _register_staging(p: GemmProblem) -> str:
    """The lambdas moving a k-tile through registers: `fetch` loads the next one from global memory
    (zeros past the edges), `stash` writes it to the other shared buffer."""
    a_at, a_offset = _a_coordinates(p)
    b_at, b_offset = _b_coordinates(p)
    # a bias-gradient product reads A's MA rows and has ones in row MA
    a_load = (f"(m0 + r < M && k0 + c < K) ? Ab[{a_offset}] : 0.0f" if not p.bias_grad else
              f"(m0 + r < MA && k0 + c < K) ? Ab[{a_offset}] : (m0 + r == MA && k0 + c < K) ? 1.0f : 0.0f")
    return f"""    float ra[LA], rb[LB];
    auto fetch = [&](int k0) {{   // the next tile into registers, zeros past the edges
        #pragma unroll
        for (int i = 0; i < LA; ++i) {{
            const int id = tid + i * THREADS, {a_at};
            ra[i] = {a_load};
        }}
        #pragma unroll
        for (int i = 0; i < LB; ++i) {{
            const int id = tid + i * THREADS, {b_at};
            rb[i] = (k0 + r < K && n0 + c < N) ? Bb[{b_offset}] : 0.0f;
        }}
    }};
    auto stash = [&](int buf) {{
        #pragma unroll
        for (int i = 0; i < LA; ++i) {{ const int id = tid + i * THREADS, {a_at}; sA[buf][c][r] = ra[i]; }}
        #pragma unroll
        for (int i = 0; i < LB; ++i) {{ const int id = tid + i * THREADS, {b_at}; sB[buf][r][c] = rb[i]; }}
    }};"""
