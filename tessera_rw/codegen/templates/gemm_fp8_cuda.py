"""What fp8 operands add to the tensor-core GEMM kernel (gemm_mma_cuda.py).

mma.sync m16n8k32 takes e4m3 or e5m2 fragments whose bytes lie as a bf16 m16n8k16 fragment's do:
four k-consecutive values to a register where bf16 has two. So a shared tile whose rows run along k
is read by the same non-transposing ldmatrix calls, 32 values of k per 32-byte step.

ldmatrix transposes only 16-bit elements, though, so an operand stored with k across its rows
(A as [K, M], B as [K, N]) is *staged*: each thread loads units of 4 k-rows by 16 bytes into
registers, transposes each 4x4 block of bytes with prmt (__byte_perm), and writes k-contiguous
words into the swizzled tile. When one operand is staged, its loads for tile kt + STAGES - 1 are
issued before tile kt's MMAs and written to shared memory after them, so their latency hides
behind the math as cp.async's does; when both are, holding both across the MMAs would spill, so
each is written as soon as it lands. Consecutive threads take consecutive 4-row groups of one 16-byte column, so
a warp's stores fill whole tile rows (at most two-way bank conflicts) and its loads fill whole
32-byte sectors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.templates.gemm_cuda import a_rows_name

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.gemm_problem import GemmProblem

MMA = {DType.float8_e4m3: "mma_e4m3_16832", DType.float8_e5m2: "mma_e5m2_16832"}
UNIT_BYTES = 64             # one staged unit: 4 k-rows of 16 bytes, 16 registers

# A stored row's 16 bytes from `src` into four words, zeros past `valid`. Rows of a multiple of 16
# bytes hold whole chunks (`valid` is 16 or more, or nothing): one vector load. Others byte by byte.
_FETCH = """template <bool VECTOR>
__device__ __forceinline__ void gemm_fetch16(unsigned* w, const fp8_t* src, int valid) {
    if (VECTOR) {
        const uint4 v = valid > 0 ? *(const uint4*)src : make_uint4(0u, 0u, 0u, 0u);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
        return;
    }
    #pragma unroll
    for (int e = 0; e < 4; ++e) {
        w[e] = 0u;
        #pragma unroll
        for (int b = 0; b < 4; ++b) w[e] |= (4 * e + b < valid ? (unsigned)src[4 * e + b] : 0u) << (8 * b);
    }
}"""

# Rows that are not 16-byte aligned cannot use cp.async: the chunk goes through registers.
_COPY = """// `valid` bytes of a row into a 16-byte smem chunk, the rest zero-filled, byte by byte
__device__ __forceinline__ void gemm_copy16(fp8_t* dst, const fp8_t* src, int valid) {
    unsigned w[4];
    gemm_fetch16<false>(w, src, valid);
    *(uint4*)dst = make_uint4(w[0], w[1], w[2], w[3]);
}"""

# word e of four consecutive k-rows -> one word per column 4e..4e+3 holding its four k values
_TRANSPOSE = """__device__ __forceinline__ void gemm_transpose4x4(unsigned r0, unsigned r1, unsigned r2, unsigned r3, unsigned* out) {
    const unsigned lo01 = __byte_perm(r0, r1, 0x5140), hi01 = __byte_perm(r0, r1, 0x7362);
    const unsigned lo23 = __byte_perm(r2, r3, 0x5140), hi23 = __byte_perm(r2, r3, 0x7362);
    out[0] = __byte_perm(lo01, lo23, 0x5410); out[1] = __byte_perm(lo01, lo23, 0x7632);
    out[2] = __byte_perm(hi01, hi23, 0x5410); out[3] = __byte_perm(hi01, hi23, 0x7632);
}"""


def helpers(p: GemmProblem) -> list[str]:
    """The device functions an fp8 kernel needs beyond the 16-bit path's."""
    staged = p.stage_a or p.stage_b
    parts = [_FETCH] if staged or not p.rows_aligned else []
    parts += [] if p.rows_aligned else [_COPY]
    return parts + ([_TRANSPOSE] if staged else [])


def _operand(p: GemmProblem, operand: str) -> tuple[str, str, str, str]:
    """(stored row length, tile extent, tile origin, batch base) of a staged operand."""
    return (a_rows_name(p), "BM", "m0", "Ab") if operand == "A" else ("N", "BN", "n0", "Bb")


def staged_loads(p: GemmProblem, operand: str) -> str:
    """The declarations of a staged operand's registers and its two lambdas: fetch_x(kt) loads
    tile kt's units into registers, stash_x(stage) writes them transposed into a stage's tile."""
    stride, extent, origin, base = _operand(p, operand)
    x = operand.lower()
    vector = "true" if p.stride_aligned(p.a_stride if operand == "A" else p.b_stride) else "false"
    tile = "BM * BK" if operand == "A" else "BK * BN"
    return f"""// {operand} stored [K, {stride}]: units of 4 k-rows x 16 columns pass through registers, transposed
    constexpr int UNITS_{operand} = {extent} * BK / {UNIT_BYTES}, U{operand} = (UNITS_{operand} + THREADS - 1) / THREADS;
    unsigned r{x}[U{operand}][16];
    auto fetch_{x} = [&](int kt) {{
        #pragma unroll
        for (int u = 0; u < U{operand}; ++u) {{
            const int id = tid + u * THREADS, kq = id % (BK / 4), q = id / (BK / 4);
            const int k = kt * BK + 4 * kq, cv = {stride} - ({origin} + 16 * q);
            #pragma unroll
            for (int j = 0; j < 4; ++j) {{
                const bool ok = id < UNITS_{operand} && k + j < K && cv > 0;
                gemm_fetch16<{vector}>(r{x}[u] + 4 * j, ok ? {base} + (long long)(k + j) * {stride} + {origin} + 16 * q : {base}, ok ? cv : 0);
            }}
        }}
    }};
    auto stash_{x} = [&](int stage) {{
        fp8_t* d{operand} = s{operand} + stage * {tile};
        #pragma unroll
        for (int u = 0; u < U{operand}; ++u) {{
            const int id = tid + u * THREADS, kq = id % (BK / 4), q = id / (BK / 4);
            if (id >= UNITS_{operand}) continue;
            #pragma unroll
            for (int e = 0; e < 4; ++e) {{
                unsigned col[4];
                gemm_transpose4x4(r{x}[u][e], r{x}[u][4 + e], r{x}[u][8 + e], r{x}[u][12 + e], col);
                #pragma unroll
                for (int i = 0; i < 4; ++i) {{   // column 16q + 4e + i is row r of the k-major tile
                    const int r = 16 * q + 4 * e + i;
                    *(unsigned*)(d{operand} + r * BK + gemm_swz_{x}(r, kq / 4) * EL + 4 * (kq % 4)) = col[i];
                }}
            }}
        }}
    }};
"""


def staged(p: GemmProblem) -> tuple[str, ...]:
    """The operands ('a', 'b') that go through registers."""
    return tuple(x for x, on in (("a", p.stage_a), ("b", p.stage_b)) if on)
