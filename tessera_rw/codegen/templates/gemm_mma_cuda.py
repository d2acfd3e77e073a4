"""The tensor-core GEMM kernel: mma.sync m16n8k16 for bf16/fp16 operands, m16n8k32 for fp8 ones
(e4m3, e5m2; gemm_fp8_cuda.py), m16n8k8 for fp32 ones in tf32 (the `fast` numerics policy), fp32
accumulators, a cp.async pipeline of `stages` tiles.

Each operand's tile sits in shared memory as it is stored in global memory, so a tile row is a
run of contiguous global elements whichever the layout: A [BM][BK] (or [BK][BM] when A is stored
transposed), B [BK][BN] (or [BN][BK]). Rows are XOR-swizzled in 16-byte chunks so the 8 rows one
ldmatrix phase reads fall in distinct bank groups. Fragments come out in the mma's layout either
way: ldmatrix reads a tile whose rows run along the fragment's k, ldmatrix .trans one whose rows
run along M or N. tf32 fragments whose 32-bit words ldmatrix cannot transpose are read one by one
under a swizzle that keeps those reads conflict-free. fp8 tiles always hold k contiguous: an fp8
operand stored the other way is transposed on its way into shared memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.templates import gemm_fp8_cuda as fp8
from tessera_rw.codegen.templates.gemm_cuda import (CTYPE, a_rows_name, block_origin, common, launch_comment,
                                                 ones_row_decl)
from tessera_rw.codegen.templates.gemm_problem import CP_ASYNC_BYTES

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.gemm import GemmSchedule
    from tessera_rw.codegen.templates.gemm_problem import GemmProblem


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

_COPY_ELEMENTWISE_F32 = """// `valid` floats of a row into a 16-byte smem chunk, the rest zero-filled, one by one
__device__ __forceinline__ void gemm_copy4(float* dst, const float* src, int valid) {
    float w[4];
    #pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = e < valid ? src[e] : 0.0f;
    *(float4*)dst = make_float4(w[0], w[1], w[2], w[3]);
}"""

# tf32 operands: fp32 values (or their bits, as ldmatrix leaves them) rounded as mma expects
_TF32 = """__device__ __forceinline__ unsigned gemm_tf32(unsigned x) { return tf32_round(__uint_as_float(x)); }
__device__ __forceinline__ unsigned gemm_tf32(float x) { return tf32_round(x); }"""

# Row MA of [A; 1ᵀ] (bias gradients) is read by no load. Stored as A, each 16-byte chunk of that row
# is written as `valid` ones (K - the chunk's first k), zeros past K, so the k-tail multiplies to
# nothing. Stored transposed, it is column MA of each k-row: the chunk holding it takes `valid`
# elements of the row, then the one, then zeros.
_ONES = {DType.bfloat16: "0x3F80u", DType.float16: "0x3C00u"}
_ONES_ROW_16 = """__device__ __forceinline__ void gemm_ones8(unsigned short* dst, int valid) {
    unsigned w[4];
    #pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = (2 * e < valid ? ONE : 0u) | ((2 * e + 1 < valid ? ONE : 0u) << 16);
    *(uint4*)dst = make_uint4(w[0], w[1], w[2], w[3]);
}"""
_ONES_ROW_F32 = """__device__ __forceinline__ void gemm_ones4(float* dst, int valid) {
    float w[4];
    #pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = e < valid ? 1.0f : 0.0f;
    *(float4*)dst = make_float4(w[0], w[1], w[2], w[3]);
}"""
_ONES_COLUMN_16 = """__device__ __forceinline__ void gemm_one_after8(unsigned short* dst, const unsigned short* src, int valid) {
    unsigned w[4];
    #pragma unroll
    for (int e = 0; e < 8; ++e) {
        const unsigned h = e < valid ? src[e] : e == valid ? ONE : 0u;
        if (e % 2 == 0) w[e / 2] = h; else w[e / 2] |= h << 16;
    }
    *(uint4*)dst = make_uint4(w[0], w[1], w[2], w[3]);
}"""
_ONES_COLUMN_F32 = """__device__ __forceinline__ void gemm_one_after4(float* dst, const float* src, int valid) {
    float w[4];
    #pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = e < valid ? src[e] : e == valid ? 1.0f : 0.0f;
    *(float4*)dst = make_float4(w[0], w[1], w[2], w[3]);
}"""

# Fragments whose 32-bit tf32 words are read one by one (4 consecutive k-rows, 8 consecutive
# columns): this swizzle puts the 4 rows on disjoint pairs of 16-byte chunks, so 32 lanes hit 32 banks.
_TF32_SWIZZLE = "c ^ ((r & 3) << 1)"


def _swizzle(chunks: int) -> str:
    """The XOR swizzle of a tile with `chunks` 16-byte chunks per row, for ldmatrix reads of 8 rows."""
    return f"c ^ ((r / {max(1, 8 // chunks)}) & {min(chunks, 8) - 1})"


def _fragments_a(p: GemmProblem) -> str:
    """The loop filling af[MI][4] for one k-step `ks` of the current stage cA."""
    if p.a_k_major:
        convert = ("\n                #pragma unroll\n                for (int e = 0; e < 4; ++e) "
                   "af[i][e] = gemm_tf32(af[i][e]);") if p.tf32 else ""
        return f"""#pragma unroll
            for (int i = 0; i < MI; ++i) {{   // x4: rows 0-7 / 8-15 of chunks 2ks and 2ks+1, as the mma lays A out
                const int r = wm0 + i * 16 + (lane & 15), c = ks * 2 + (lane >> 4);
                ldmatrix_x4(af[i], cA + r * BK + gemm_swz_a(r, c) * EL);{convert}
            }}"""
    if p.tf32:
        reads = [f"af[i][{e}] = gemm_tf32(cA[{k} * BM + gemm_swz_a({k}, {m} / 4) * 4 + m % 4]);"
                 for e, (m, k) in enumerate((("m", "k"), ("(m + 8)", "k"), ("m", "(k + 4)"), ("(m + 8)", "(k + 4)")))]
        body = "\n                ".join(reads)
        return f"""#pragma unroll
            for (int i = 0; i < MI; ++i) {{   // (row, k) = (lane/4, lane%4), 8 rows and 4 k on: one word each
                const int m = wm0 + i * 16 + (lane >> 2), k = ks * 8 + (lane & 3);
                {body}
            }}"""
    return """#pragma unroll
            for (int i = 0; i < MI; ++i) {   // x4.trans of k-rows: (k 0-7, rows 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15)
                const int r = ks * 16 + (lane & 7) + ((lane >> 4) << 3), c = (wm0 + i * 16) / 8 + ((lane >> 3) & 1);
                ldmatrix_x4_trans(af[i], cA + r * BM + gemm_swz_a(r, c) * EL);
            }"""


def _fragments_b(p: GemmProblem) -> str:
    """The loop filling bf[NI][2] for one k-step `ks` of the current stage cB."""
    if p.b_k_major:
        word = "gemm_tf32(q[{}])" if p.tf32 else "q[{}]"
        return f"""#pragma unroll
            for (int j = 0; j < NI; j += 2) {{   // x4 of n-rows: (n 0-7, k-chunk 2ks), (0-7, 2ks+1), (8-15, 2ks), (8-15, 2ks+1)
                const int r = wn0 + j * 8 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
                unsigned q[4];
                ldmatrix_x4(q, cB + r * BK + gemm_swz_b(r, c) * EL);
                bf[j][0] = {word.format(0)}; bf[j][1] = {word.format(1)}; bf[j + 1][0] = {word.format(2)}; bf[j + 1][1] = {word.format(3)};
            }}"""
    if p.tf32:
        return """#pragma unroll
            for (int j = 0; j < NI; ++j) {   // (k, n) = (lane%4, lane/4), and 4 k on: one word each
                const int n = wn0 + j * 8 + (lane >> 2), k = ks * 8 + (lane & 3);
                bf[j][0] = gemm_tf32(cB[k * BN + gemm_swz_b(k, n / 4) * 4 + n % 4]);
                bf[j][1] = gemm_tf32(cB[(k + 4) * BN + gemm_swz_b(k + 4, n / 4) * 4 + n % 4]);
            }"""
    return """#pragma unroll
            for (int j = 0; j < NI; j += 2) {
                const int r = ks * 16 + (lane & 15), c = (wn0 + j * 8) / 8 + (lane >> 4);
                unsigned q[4];
                ldmatrix_x4_trans(q, cB + r * BN + gemm_swz_b(r, c) * EL);
                bf[j][0] = q[0]; bf[j][1] = q[1]; bf[j + 1][0] = q[2]; bf[j + 1][1] = q[3];
            }"""


def chunk_copy(p: GemmProblem, valid: str) -> tuple[str, str]:
    """(copy function, its size argument) of a chunk with `valid` elements left in its row."""
    if p.rows_aligned:   # every stored row a multiple of a chunk: a chunk is wholly inside or outside
        return "cp_async_16", "ok ? 16 : 0"
    el = CP_ASYNC_BYTES // p.in_dtype.itemsize
    copy = "gemm_copy4" if p.tf32 else "gemm_copy16" if p.fp8 else "gemm_copy8"
    return copy, f"ok ? min({valid}, {el}) : 0"


def _tile_loop(p: GemmProblem, operand: str, rows: str, row: str, left: str, ok: str, src: str,
               note: str = "", ones=None) -> str:
    """The loop copying one stage's tile of `operand` (A or B): `rows` rows of `row` elements, in
    16-byte chunks; `left` declares the elements the stored row holds from chunk c on, `ok` whether
    the chunk is read from `src`. `ones(dst, src)` spells the bias gradient's ones chunk."""
    chunks = "CA" if operand == "A" else "CB"
    dst = f"d{operand} + r * {row} + gemm_swz_{operand.lower()}(r, c) * EL"
    copy, size = chunk_copy(p, left.split()[0])
    prefix = f"{ones(dst, src)}\n            else " if ones else ""
    return f"""#pragma unroll
        for (int i = 0; i < {rows} * {chunks} / THREADS; ++i) {{{note}
            const int id = tid + i * THREADS, r = id / {chunks}, c = id % {chunks}, {left};
            const bool ok = {ok};
            {prefix}{copy}({dst}, ok ? {src} : {operand}b, {size});
        }}"""


def _load_a(p: GemmProblem) -> str:
    """The loop bringing stage `stage`'s tile of A into dA; the ones row of a bias gradient too."""
    width, ma = ("4" if p.in_dtype is DType.float32 else "8"), a_rows_name(p)
    if not p.trans_a:
        ones = (lambda dst, src: f"if (m0 + r == MA) gemm_ones{width}({dst}, kv);") if p.bias_grad else None
        return _tile_loop(p, "A", "BM", "BK", "kv = K - (k0 + c * EL)", f"m0 + r < {ma} && kv > 0",
                          "Ab + (m0 + r) * K + k0 + c * EL", ones=ones)
    ones = (lambda dst, src: f"if (k0 + r < K && mv >= 0 && mv < EL) gemm_one_after{width}({dst}, {src}, mv);") \
        if p.bias_grad else None
    return _tile_loop(p, "A", "BK", "BM", f"mv = {ma} - (m0 + c * EL)", "k0 + r < K && mv > 0",
                      f"Ab + (k0 + r) * {ma} + m0 + c * EL", "   // A stored [K, M]: a tile row is one k", ones)


def _load_b(p: GemmProblem) -> str:
    """The loop bringing stage `stage`'s tile of B into dB."""
    if not p.trans_b:
        return _tile_loop(p, "B", "BK", "BN", "nv = N - (n0 + c * EL)", "k0 + r < K && nv > 0",
                          "Bb + (k0 + r) * N + n0 + c * EL")
    return _tile_loop(p, "B", "BN", "BK", "kv = K - (k0 + c * EL)", "n0 + r < N && kv > 0",
                      "Bb + (n0 + r) * K + k0 + c * EL", "   // B stored [N, K]: a tile row is one n")


def _copied_tiles(p: GemmProblem) -> str:
    """load_tile's body past k0: each operand not staged through registers (fetch_x and stash_x
    bring those), copied into its stage."""
    t = CTYPE[p.in_dtype]
    parts = [f"\n        {t}* d{x} = s{x} + stage * {tile};\n        {load(p)}"
             for x, tile, load, staged in (("A", "BM * BK", _load_a, p.stage_a), ("B", "BK * BN", _load_b, p.stage_b))
             if not staged]
    return "".join(parts)


def helpers(p: GemmProblem) -> str:
    """The device functions the kernel's loads need: element-wise chunk copies for rows cp.async
    cannot take, fp8 staging, tf32 rounding, the ones of a bias gradient."""
    if p.fp8:
        return "\n".join(fp8.helpers(p))
    wide = p.in_dtype is DType.float32
    parts = [] if p.rows_aligned else [_COPY_ELEMENTWISE_F32 if wide else _COPY_ELEMENTWISE]
    parts += [_TF32] if p.tf32 else []
    if p.bias_grad:
        one = "" if wide else _ONES[p.in_dtype]
        ones = (_ONES_COLUMN_F32 if wide else _ONES_COLUMN_16) if p.trans_a else (_ONES_ROW_F32 if wide else _ONES_ROW_16)
        parts.append(ones.replace("ONE", one))
    return "\n".join(parts)


def store_pair(p: GemmProblem, args: str) -> str:
    """The epilogue of one accumulator pair (columns c and c + 1 of row r) and its store; a product
    keeping its pre-activation stores it at o and the activation one product further on."""
    epi = [f"gemm_epilogue(acc[i][j][2 * h + {e}], z, r, c + {e}{args})" for e in (0, 1)]
    stores = [("o", "v", epi)]
    if p.keep_pre:
        stores = [("o", "p", epi), (f"{p.nbatch * p.m * p.n}LL + o", "v", ["gemm_activate(p0)", "gemm_activate(p1)"])]
    if p.n % 2 == 0:   # c is even, so c + 1 < N and the pair is 2-element aligned
        pair = {DType.bfloat16: "*(unsigned*)(C + {o}) = pack_bf16x2({v}0, {v}1);",
                DType.float16: "*(unsigned*)(C + {o}) = pack_f16x2({v}0, {v}1);",
                DType.float32: "*(float2*)(C + {o}) = make_float2({v}0, {v}1);"}[p.out_dtype]
        store = "\n".join(f"const float {v}0 = {e0}, {v}1 = {e1};\n" + pair.format(o=o, v=v)
                          for o, v, (e0, e1) in stores)
    else:
        cvt = {DType.bfloat16: "f32_to_bf16", DType.float16: "f32_to_f16", DType.float32: ""}[p.out_dtype]
        halves = [" ".join(f"const float {v}{e} = {exprs[e]}; C[{o} + {e}] = {cvt}({v}{e});" for o, v, exprs in stores)
                  for e in (0, 1)]
        store = f"{{ {halves[0]} }}\nif (c + 1 < N) {{ {halves[1]} }}"
    return "\n".join(" " * 20 + line for line in store.splitlines())


def emit_tensor_core(p: GemmProblem, s: GemmSchedule, name: str, group: int) -> str:
    """The mma.sync kernel, after its launch comment and device helpers."""
    fns, signature, args = common(p)
    t = CTYPE[p.in_dtype]
    mma = ("mma_tf32_1688" if p.tf32 else fp8.MMA[p.in_dtype] if p.fp8
           else "mma_bf16_16816" if p.in_dtype is DType.bfloat16 else "mma_f16_16816")
    el = CP_ASYNC_BYTES // p.in_dtype.itemsize    # elements per 16-byte chunk
    kstep = 32 // p.in_dtype.itemsize             # the mma's k: always 32 bytes, two chunks of a k-run
    ca = (s.bk if p.a_k_major else s.bm) // el    # 16-byte chunks per smem row of A and of B
    cb = (s.bk if p.b_k_major else s.bn) // el
    declare, prologue, refill, written = _stage_loads(p)
    # tiles whose fragments tf32 reads word by word: B as stored, A transposed
    swz_a = _TF32_SWIZZLE if p.tf32 and p.trans_a else _swizzle(ca)
    swz_b = _TF32_SWIZZLE if p.tf32 and not p.trans_b else _swizzle(cb)
    return launch_comment(p, s, name, signature) + fns + f"""
{helpers(p)}
// XOR swizzle of 16-byte chunks: the rows one fragment read touches land in distinct bank groups
__device__ __forceinline__ int gemm_swz_a(int r, int c) {{ return {swz_a}; }}
__device__ __forceinline__ int gemm_swz_b(int r, int c) {{ return {swz_b}; }}

extern "C" __global__ void __launch_bounds__({s.threads}) {name}({signature}) {{
    constexpr int M = {p.m}, N = {p.n}, K = {p.k};{ones_row_decl(p)}
    constexpr int BM = {s.bm}, BN = {s.bn}, BK = {s.bk}, STAGES = {s.stages}, THREADS = {s.threads};
    constexpr int WARP_M = {s.bm // s.warps_m}, WARP_N = {s.bn // s.warps_n}, WARPS_N = {s.warps_n};
    constexpr int MI = WARP_M / 16, NI = WARP_N / 8, CA = {ca}, CB = {cb}, EL = {el};
    constexpr int KT = (K + BK - 1) / BK;
    __shared__ __align__(128) {t} sA[STAGES * BM * BK];
    __shared__ __align__(128) {t} sB[STAGES * BK * BN];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / WARPS_N) * WARP_M, wn0 = (warp % WARPS_N) * WARP_N;
{block_origin(t, group)}

    // one k-tile into one stage; chunks past M, N or K are zero-filled (0 valid bytes)
    auto load_tile = [&](int stage, int kt) {{
        const int k0 = kt * BK;{_copied_tiles(p)}
    }};
{declare}
    float acc[MI][NI][4];
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    #pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {{
        if (st < KT) {prologue}
        cp_async_commit();
    }}
    for (int kt = 0; kt < KT; ++kt) {{
        cp_async_wait<STAGES - 2>();   // tile kt has landed
        __syncthreads();               // and every warp is done with the stage refilled next
        const int next = kt + STAGES - 1;
        if (next < KT) {refill}
        cp_async_commit();
        const {t}* cA = sA + (kt % STAGES) * BM * BK;
        const {t}* cB = sB + (kt % STAGES) * BK * BN;
        #pragma unroll
        for (int ks = 0; ks < BK / {kstep}; ++ks) {{
            unsigned af[MI][4], bf[NI][2];
            {_fragments_a(p)}
            {_fragments_b(p)}
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NI; ++j) {mma}(acc[i][j], af[i], bf[j]);
        }}{written}
    }}
    cp_async_wait<0>();
{_store_accumulators(p, args)}
}}
"""


def _stage_loads(p: GemmProblem) -> tuple[str, str, str, str]:
    """The main loop's loading statements: the staged operands' register declarations (fp8 read
    through registers, fp8.staged), the prologue's load of stage st, the loop's refill of stage
    `next`, and the stash written after the math when it overlaps the MMAs."""
    staged = fp8.staged(p)
    declare = "".join("    " + fp8.staged_loads(p, x.upper()) for x in staged)
    fetch = "".join(f" fetch_{x}({{kt}});" for x in staged)
    stash = "".join(f" stash_{x}({{stage}});" for x in staged)
    prologue = (f"{{ load_tile(st, st);{fetch.format(kt='st')}{stash.format(stage='st')} }}" if staged
                else "load_tile(st, st);")
    # one staged operand's registers stay live across the MMAs, hiding its loads; two would spill
    overlap = len(staged) == 1
    refill = (f"{{ load_tile(next % STAGES, next);{fetch.format(kt='next')}"
              f"{'' if overlap else stash.format(stage='next % STAGES')} }}" if staged
              else "load_tile(next % STAGES, next);")
    written = (f"\n        if (next < KT) {{{stash.format(stage='next % STAGES')} }}   // after the math: "
               "its loads had it to land" if overlap else "")
    return declare, prologue, refill, written


def _store_accumulators(p: GemmProblem, args: str) -> str:
    """The epilogue: each thread's accumulator pairs through gemm_epilogue into C."""
    return f"""
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
{store_pair(p, args)}
                }}
            }}"""
