"""The Hopper GEMM kernel: warpgroup MMAs (wgmma, sm_90a) reading both operands from shared memory.

Each 128-thread warpgroup owns a (bm / wg_m) x (bn / wg_n) slab of the block tile and issues one
m64 x WN wgmma per 64 rows of it and per k-step (16 values of bf16/fp16, 32 of fp8), its fp32
accumulators in registers. The operands never pass through registers: tiles land in shared memory
by cp.async in the layout wgmma reads through its matrix descriptors, rows of 128 bytes (64 bf16
or 128 fp8 values) in 1024-byte atoms of 8 rows whose 16-byte chunks are XOR-swizzled by row:

- an operand stored with k contiguous (A as [M, K], B as [N, K]) is K-major: one 128-byte row per
  m (n) holds the tile's k-run; the k-step's descriptor starts 32 bytes further along the row;
- stored the other way (A as [K, M], B as [K, N], 16-bit only) it is MN-major: one 128-byte row
  per k holds 64 consecutive m (n), blocks of 64 of them BK rows apart (the leading byte offset);
  the k-step's descriptor starts 16 rows further down.

fp8 wgmma takes K-major operands only, so fp8 products with a transposed-across-k operand stay on
mma.sync (gemm_mma_cuda.py). A bias gradient's row of ones under A is written into each tile by
plain stores, as the mma kernel does (fenced like the copies before the tensor cores read it).

The pipeline keeps STAGES - 2 tiles in flight ahead of the MMAs: wgmma runs asynchronously, one
k-tile's group still in flight while the next is issued, so the stage a refill overwrites is the
one read two tiles back, retired by every warpgroup before the barrier that precedes the refill.
cp.async writes through the generic proxy and wgmma reads through the async one: each thread fences
the proxies after its copies land, before that barrier. The epilogue is the mma kernel's: the wgmma
accumulator layout per warp is mma.sync's m16n8.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.prelude import ATOM_BYTES, ROW_BYTES, wgmma_name
from tessera_rw.codegen.templates.gemm_cuda import (CTYPE, a_rows_name, block_origin, common, launch_comment,
                                                 ones_row_decl)
from tessera_rw.codegen.templates.gemm_mma_cuda import chunk_copy, helpers, store_pair

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.gemm_footprint import TmaSchedule, WgmmaSchedule
    from tessera_rw.codegen.templates.gemm_problem import GemmProblem

_KIND = {DType.bfloat16: "bf16", DType.float16: "f16", DType.float8_e4m3: "e4m3", DType.float8_e5m2: "e5m2"}

# where the 16-byte chunk c (0-7) of row r of a 128-byte swizzled tile lies (tiles on 1024-byte atoms)
SWIZZLE_HELPER = """// where the 16-byte chunk c (0-7) of row r of a swizzled tile lies: bits 4-6 of its address XOR bits 7-9
__device__ __forceinline__ int gemm_swz(int r, int c) { return (c ^ r) & 7; }"""


def _load(p: GemmProblem, operand: str) -> str:
    """The loop copying one stage's tile of `operand` (A or B) into d{operand} in wgmma's layout."""
    k_major = (not p.trans_a) if operand == "A" else p.trans_b
    # the stored rows of A: MA under a bias gradient's ones row (row MA of the product's A)
    extent, origin, limit = ("BM", "m0", a_rows_name(p)) if operand == "A" else ("BN", "n0", "N")
    src, ones = f"{operand}b", operand == "A" and p.bias_grad
    if k_major:
        # rows along M (N), 8 chunks of k each; B as [N, K] or A as [M, K]
        left, ok = "kv = K - (k0 + c * EL)", f"{origin} + r < {limit} && kv > 0"
        at = f"{src} + ({origin} + r) * K + k0 + c * EL"
        dst = f"d{operand} + r * ROW + gemm_swz(r, c) * EL"
        rows, chunks, note = extent, "8", "k-runs of one row each"
        one = f"if (m0 + r == MA) gemm_ones8({dst}, kv);"          # the ones row: K - k0 ones, then zeros
    else:
        # rows along k, 64-wide blocks of M (N) one after another, BK rows apart
        valid = f"{limit[0].lower()}v"      # mv or nv: elements of the stored row from chunk c on
        left, ok = f"{valid} = {limit} - ({origin} + c * EL)", f"k0 + r < K && {valid} > 0"
        at = f"{src} + (k0 + r) * {limit} + {origin} + c * EL"
        dst = f"d{operand} + (c / 8) * BK * ROW + r * ROW + gemm_swz(r, c % 8) * EL"
        rows, chunks, note = "BK", f"({extent} / EL)", f"{extent}-runs of one k each"
        one = f"if (k0 + r < K && mv >= 0 && mv < EL) gemm_one_after8({dst}, {at}, mv);"   # the one after row k's M
    copy, size = chunk_copy(p, left.split()[0])
    prefix = f"{one}\n            else " if ones else ""
    return f"""#pragma unroll
        for (int i = 0; i < {rows} * {chunks} / THREADS; ++i) {{   // {note}
            const int id = tid + i * THREADS, r = id / {chunks}, c = id % {chunks}, {left};
            const bool ok = {ok};
            {prefix}{copy}({dst}, ok ? {at} : {src}, {size});
        }}"""


def _descriptors(p: GemmProblem) -> tuple[str, str]:
    """(A's descriptor for slab i and k-step ks, B's for k-step ks) in the current stage cA / cB."""
    # K-major: the slab's first row, KS values along it (the leading offset unused: 1 by convention);
    # MN-major: its 64-wide block, KS rows down, the next block BK rows on
    a = ("wgmma_desc(cA + (wm0 + i * 64) * ROW + ks * KS, 16, ATOM)" if not p.trans_a
         else "wgmma_desc(cA + (wm0 + i * 64) / 64 * BK * ROW + ks * KS * ROW, BK * ROW_BYTES, ATOM)")
    b = ("wgmma_desc(cB + wn0 * ROW + ks * KS, 16, ATOM)" if p.trans_b
         else "wgmma_desc(cB + wn0 / 64 * BK * ROW + ks * KS * ROW, BK * ROW_BYTES, ATOM)")
    return a, b


def tile_setup(p: GemmProblem, s: WgmmaSchedule | TmaSchedule) -> str:
    """The kernel's first lines, shared by both wgmma kernels: sizes, tile constants, and the
    stages sA / sB in dynamic shared memory, each aligned to a swizzle atom."""
    t = CTYPE[p.in_dtype]
    return f"""    constexpr int M = {p.m}, N = {p.n}, K = {p.k};{ones_row_decl(p)}
    constexpr int BM = {s.bm}, BN = {s.bn}, BK = {s.bk}, STAGES = {s.stages}, THREADS = {s.threads};
    constexpr int WG_N = {s.wg_n}, WARPGROUP_M = BM / {s.wg_m}, WARPGROUP_N = BN / WG_N;
    constexpr int MI = WARPGROUP_M / 64, NI = WARPGROUP_N / 8, EL = {16 // p.in_dtype.itemsize}, ROW = BK, KS = {32 // p.in_dtype.itemsize};
    constexpr unsigned ROW_BYTES = {ROW_BYTES}, ATOM = {ATOM_BYTES};
    constexpr int KT = (K + BK - 1) / BK;
    // tiles start on 1024-byte atoms: the swizzle is a function of the shared address
    extern __shared__ __align__(16) unsigned char gemm_smem[];
    {t}* const sA = ({t}*)(gemm_smem + ((ATOM - (smem_addr(gemm_smem) & (ATOM - 1))) & (ATOM - 1)));
    {t}* const sB = sA + STAGES * BM * BK;"""


def kernel_opening(p: GemmProblem, s: WgmmaSchedule | TmaSchedule, name: str, fns: str, signature: str,
                   smem: int) -> str:
    """A wgmma kernel up to its body's own lines: launch comment, device functions and helpers, the
    entry point and tile_setup."""
    comment = launch_comment(p, s, name, signature).replace(
        "no dynamic shared memory", f"{smem} bytes of dynamic shared memory")
    return comment + fns + f"""
{helpers(p)}
{SWIZZLE_HELPER}

extern "C" __global__ void __launch_bounds__({s.threads}, 1) {name}({signature}) {{
{tile_setup(p, s)}
"""


def accumulators() -> str:
    """The warpgroup's fp32 accumulators, zeroed."""
    return """    float acc[MI][NI][4];
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;"""


def issue_mmas(p: GemmProblem, s: WgmmaSchedule | TmaSchedule, indent: str) -> str:
    """The statements issuing one k-tile's wgmmas from stage pointers cA / cB, as one group."""
    mma = f"{wgmma_name(s.bn // s.wg_n, _KIND[p.in_dtype])}<{int(p.trans_a)}, {int(not p.trans_b)}>"
    desc_a, desc_b = _descriptors(p)
    return "\n".join(indent + line for line in f"""wgmma_hold<MI * NI * 4>(&acc[0][0][0]);
wgmma_fence();
#pragma unroll
for (int ks = 0; ks < BK / KS; ++ks)
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        {mma}(&acc[i][0][0], {desc_a}, {desc_b});
wgmma_commit();""".splitlines())


def store_accumulators(p: GemmProblem, args: str) -> str:
    """The epilogue: each accumulator through gemm_epilogue into C, predicated on the edges."""
    return f"""    // accumulator (i, j, e) of warp w: row 16w + lane/4 (+8 for e >= 2) of slab i, column pair 2*(lane%4) of n8 block j
    const long long cz = gemm_boff_c(z);
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {{
                const int r = m0 + wm0 + i * 64 + warp * 16 + h * 8 + (lane >> 2);
                const int c = n0 + wn0 + j * 8 + (lane & 3) * 2;
                if (r < M && c < N) {{
                    const long long o = cz + (long long)r * N + c;
{store_pair(p, args)}
                }}
            }}"""


def emit_wgmma(p: GemmProblem, s: WgmmaSchedule, name: str, group: int) -> str:
    """The wgmma kernel, after its launch comment and device helpers."""
    fns, signature, args = common(p)
    t = CTYPE[p.in_dtype]
    return kernel_opening(p, s, name, fns, signature, smem_bytes_of(p, s)) + f"""    const int tid = threadIdx.x, lane = tid & 31, warpgroup = tid >> 7, warp = (tid >> 5) & 3;
    const int wm0 = (warpgroup / WG_N) * WARPGROUP_M, wn0 = (warpgroup % WG_N) * WARPGROUP_N;
{block_origin(t, group)}

    // one k-tile into one stage; chunks past M, N or K are zero-filled (0 valid bytes)
    auto load_tile = [&](int stage, int kt) {{
        const int k0 = kt * BK;
        {t}* dA = sA + stage * BM * BK;
        {_load(p, "A")}
        {t}* dB = sB + stage * BK * BN;
        {_load(p, "B")}
    }};

{accumulators()}

    #pragma unroll
    for (int st = 0; st < STAGES - 2; ++st) {{
        if (st < KT) load_tile(st, st);
        cp_async_commit();
    }}
    for (int kt = 0; kt < KT; ++kt) {{
        cp_async_wait<STAGES - 3>();   // tile kt has landed
        fence_proxy_async();           // where the tensor cores read it
        __syncthreads();               // for every thread; and every warpgroup has retired tile kt - 2's MMAs
        const int next = kt + STAGES - 2;
        if (next < KT) load_tile(next % STAGES, next);   // into tile kt - 2's stage
        cp_async_commit();
        const {t}* cA = sA + (kt % STAGES) * BM * BK;
        const {t}* cB = sB + (kt % STAGES) * BK * BN;
{issue_mmas(p, s, "        ")}
        wgmma_wait<1>();               // tile kt - 1's MMAs are done; tile kt's run on
        wgmma_hold<MI * NI * 4>(&acc[0][0][0]);
    }}
    wgmma_wait<0>();
    wgmma_hold<MI * NI * 4>(&acc[0][0][0]);   // the epilogue reads them after the wait, not before
    cp_async_wait<0>();

{store_accumulators(p, args)}
}}
"""


def smem_bytes_of(p: GemmProblem, s: WgmmaSchedule) -> int:
    """Dynamic shared memory the kernel asks for: its stages, and room to align them to an atom."""
    return s.stages * (s.bm + s.bn) * s.bk * p.in_dtype.itemsize + ATOM_BYTES
