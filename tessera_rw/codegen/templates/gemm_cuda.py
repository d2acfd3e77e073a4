"""The CUDA text of GemmTemplate's kernels: mma.sync for 16-bit operands (and for fp32 operands in
tf32 under the `fast` numerics policy), SIMT FFMA for fp32.

GemmTemplate (gemm.py) decodes the op into a `_Problem`, picks the schedule and models its cost;
this module only spells the chosen kernel out, with every size folded in as a constant. It is a
module of its own so the template's decisions read apart from some 300 lines of kernel text. It
imports nothing from gemm.py at run time; gemm.py reads two layout facts from here (SIMT_PAD and
rows_aligned) so its shared-memory and register counts match the text.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.codegen.kernel_op import KernelOp
>>> from tessera_rw.codegen.templates.gemm import GemmSimtSchedule, _Problem
>>> t = TensorType((64, 64), DType.float32)
>>> p = _Problem.of(KernelOp.of("matmul", (t, t), t, accum_dtype=None))
>>> kernel_name(p, GemmSimtSchedule())
'gemm_f32_f32_none_1x64x64x64_128x128x8x8x8'
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.templates.base import Schedule

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.gemm import GemmSchedule, GemmSimtSchedule, _Problem

_CP_ASYNC_BYTES = 16            # one cp.async moves 16 bytes: rows must start 16-byte aligned
SIMT_PAD = 4                    # floats of padding per transposed A row: conflict-free stores, float4 reads

_CTYPE = {DType.float32: "float", DType.bfloat16: "bf16_t", DType.float16: "f16_t"}
_LOAD = {DType.float32: "{}", DType.bfloat16: "bf16_to_f32({})", DType.float16: "f16_to_f32({})"}
_ACT = {
    "none": "v",
    "relu": "fmaxf(v, 0.0f)",
    "gelu": "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))",
    "gelu_tanh": "0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)))",
    "silu": "v / (1.0f + expf(-v))",
}
# v · act'(a) for a derivative activation, a being the aux operand's element: statements, as the
# tanh-gelu derivative uses its tanh twice
_DERIVATIVE = {
    "drelu": "v = a > 0.0f ? v : 0.0f;",
    "dgelu": "v *= 0.5f * (1.0f + erff(a * 0.70710678118654752f)) + a * 0.39894228040143268f * expf(-0.5f * a * a);",
    "dgelu_tanh": ("const float t = tanhf(0.79788456080286536f * (a + 0.044715f * a * a * a)); "
                   "v *= 0.5f * (1.0f + t) + 0.5f * a * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 0.134145f * a * a);"),
    "dsilu": "const float sg = 1.0f / (1.0f + expf(-a)); v *= sg * (1.0f + a * (1.0f - sg));",
}


def kernel_name(p: _Problem, s: Schedule) -> str:
    """The entry point's name: dtypes, epilogue, sizes and tile, one name per specialization."""
    tile = "x".join(str(getattr(s, f)) for f in s.__dataclass_fields__)
    epi = ("b" if p.bias else "") + ("r" if p.residual else "") + ("bgrad" if p.bias_grad else "")
    shape = f"{p.nbatch}x{p.m}x{p.n}x{p.k}"
    operands = "tf32" if p.tf32 else p.in_dtype.short
    return f"gemm_{operands}_{p.out_dtype.short}_{p.activation}{epi and '_' + epi}_{shape}_{tile}"


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
    """Offset functions of a bias/aux/residual broadcast onto (batch..., M, N)."""
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
    fns = (_batch_offset("a", p.a_batch, p.batch, p.a_rows * p.k) +
           _batch_offset("b", p.b_batch, p.batch, p.k * p.n) +
           _batch_offset("c", p.batch, p.batch, p.m * p.n))
    params, args, steps = "", "", []
    if p.scale != 1.0:
        steps.append(f"v *= {p.scale!r}f;")
    operands = (("bias", p.bias), ("aux", p.aux), ("res", p.residual))
    for name, t in operands:
        if t is None:
            continue
        fns += _operand_index(name, t, p)
        params += f"const {_CTYPE[t.dtype]}* __restrict__ {name}, "
        args += f", {name}"
    if p.bias is not None:
        steps.append(f"v += {_LOAD[p.bias.dtype].format('bias[gemm_idx_bias(z, r, c)]')};")
    if p.aux is not None:
        steps.append(f"const float a = {_LOAD[p.aux.dtype].format('aux[gemm_idx_aux(z, r, c)]')}; "
                     f"{_DERIVATIVE[p.activation]}")
    else:
        steps.append(f"v = {_ACT[p.activation]};")
    if p.residual is not None:
        steps.append(f"v += {_LOAD[p.residual.dtype].format('res[gemm_idx_res(z, r, c)]')};")
    epi_params = "".join(f", const {_CTYPE[t.dtype]}* __restrict__ {n}" for n, t in operands if t is not None)
    fns += (f"__device__ __forceinline__ float gemm_epilogue(float v, int z, int r, int c{epi_params}) {{\n"
            f"    {' '.join(steps)}\n    return v;\n}}\n")
    signature = (f"const {t_in}* __restrict__ A, const {t_in}* __restrict__ B, {params}"
                 f"{_CTYPE[p.out_dtype]}* __restrict__ C")
    return fns, signature, args


def _launch(p: _Problem, s: Schedule, name: str, signature: str) -> str:
    blocks = -(-p.n // s.bn) * -(-p.m // s.bm) * p.nbatch
    return (f"// launch: {name}<<<{blocks}, {s.threads}>>> (a 1-d grid of resources().blocks, "
            f"no dynamic shared memory)\n// arguments: {signature}\n")


def rows_aligned(p: _Problem) -> bool:
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


# tf32 operands: fp32 values (or their bits, as ldmatrix leaves them) rounded as mma expects
_TF32 = """__device__ __forceinline__ unsigned gemm_tf32(unsigned x) { return tf32_round(__uint_as_float(x)); }
__device__ __forceinline__ unsigned gemm_tf32(float x) { return tf32_round(x); }"""

_COPY_ELEMENTWISE_F32 = """// `valid` floats of a row into a 16-byte smem chunk, the rest zero-filled, one by one
__device__ __forceinline__ void gemm_copy4(float* dst, const float* src, int valid) {
    float w[4];
    #pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = e < valid ? src[e] : 0.0f;
    *(float4*)dst = make_float4(w[0], w[1], w[2], w[3]);
}"""

# Row MA of [A; 1ᵀ] (bias gradients): no load reads it, each 16-byte smem chunk of it is written as
# `valid` ones (K - the chunk's first k), zeros past K, so the k-tail multiplies to nothing.
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


def _ones_row(p: _Problem) -> tuple[str, str, str]:
    """(device helper, constant declaration, load prefix) of the ones row; empty without one."""
    if not p.bias_grad:
        return "", "", ""
    wide = p.in_dtype is DType.float32
    helper = _ONES_ROW_F32 if wide else _ONES_ROW_16.replace("ONE", _ONES[p.in_dtype])
    fill = "gemm_ones4" if wide else "gemm_ones8"
    return (helper, f"\n    constexpr int MA = {p.a_rows};   // rows of A; row MA is the virtual row of ones",
            f"if (m0 + r == MA) {fill}(dA + r * BK + gemm_swz_a(r, c) * EL, kv);\n            else ")


# B fragments of the tf32 product (k = lane%4 and +4, n = lane/4) are single 32-bit words that
# ldmatrix cannot transpose; they are read one by one, and this swizzle puts the 4 k-rows a read
# touches on disjoint pairs of 16-byte chunks, so its 32 lanes hit 32 distinct banks.
_TF32_SWIZZLE_B = "c ^ ((r & 3) << 1)"


def _fragments_b(tf32: bool) -> str:
    """The loop filling bf[NI][2] for one k-step `ks` of the current stage cB."""
    if tf32:
        return """#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const int n = wn0 + j * 8 + (lane >> 2), k = ks * 8 + (lane & 3);
                bf[j][0] = gemm_tf32(cB[k * BN + gemm_swz_b(k, n / 4) * 4 + n % 4]);
                bf[j][1] = gemm_tf32(cB[(k + 4) * BN + gemm_swz_b(k + 4, n / 4) * 4 + n % 4]);
            }"""
    return """#pragma unroll
            for (int j = 0; j < NI; j += 2) {
                const int r = ks * 16 + (lane & 15), c = (wn0 + j * 8) / 8 + (lane >> 4);
                unsigned q[4];
                ldmatrix_x4_trans(q, cB + r * BN + gemm_swz_b(r, c) * 8);
                bf[j][0] = q[0]; bf[j][1] = q[1]; bf[j + 1][0] = q[2]; bf[j + 1][1] = q[3];
            }"""


def emit_tensor_core(p: _Problem, s: GemmSchedule, name: str) -> str:
    """The mma.sync kernel for bf16/fp16 operands (m16n8k16) or fp32 operands in tf32 (m16n8k8),
    after its launch comment and device helpers."""
    fns, signature, args = _common(p)
    t = _CTYPE[p.in_dtype]
    mma = "mma_tf32_1688" if p.tf32 else "mma_bf16_16816" if p.in_dtype is DType.bfloat16 else "mma_f16_16816"
    el = _CP_ASYNC_BYTES // p.in_dtype.itemsize   # elements per 16-byte chunk
    kstep = 8 if p.tf32 else 16                   # the mma's k: either way 32 bytes, two chunks of an A row
    ca, cb = s.bk // el, s.bn // el               # 16-byte chunks per smem row of A and of B
    aligned = rows_aligned(p)
    # aligned rows: K and N are multiples of a chunk, so a chunk is wholly inside or wholly outside
    copy_fn = "gemm_copy4" if p.tf32 else "gemm_copy8"
    copy, valid_a, valid_b = (("cp_async_16", "ok ? 16 : 0", "ok ? 16 : 0") if aligned else
                              (copy_fn, f"ok ? min(kv, {el}) : 0", f"ok ? min(nv, {el}) : 0"))
    swz_b = _TF32_SWIZZLE_B if p.tf32 else f"c ^ ((r / {max(1, 8 // cb)}) & {min(cb, 8) - 1})"
    ones_helper, ones_decl, ones_load = _ones_row(p)
    helpers = "\n".join(([] if aligned else [_COPY_ELEMENTWISE_F32 if p.tf32 else _COPY_ELEMENTWISE]) +
                        ([_TF32] if p.tf32 else []) + ([ones_helper] if ones_helper else []))
    convert_a = ("\n                #pragma unroll\n                for (int e = 0; e < 4; ++e) "
                 "af[i][e] = gemm_tf32(af[i][e]);") if p.tf32 else ""
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
{helpers}
// XOR swizzle of 16-byte chunks: the 8 rows one ldmatrix phase reads land in 8 distinct bank groups
__device__ __forceinline__ int gemm_swz_a(int r, int c) {{ return c ^ ((r / {max(1, 8 // ca)}) & {min(ca, 8) - 1}); }}
__device__ __forceinline__ int gemm_swz_b(int r, int c) {{ return {swz_b}; }}

extern "C" __global__ void __launch_bounds__({s.threads}) {name}({signature}) {{
    constexpr int M = {p.m}, N = {p.n}, K = {p.k};{ones_decl}
    constexpr int BM = {s.bm}, BN = {s.bn}, BK = {s.bk}, STAGES = {s.stages}, THREADS = {s.threads};
    constexpr int WARP_M = {s.bm // s.warps_m}, WARP_N = {s.bn // s.warps_n}, WARPS_N = {s.warps_n};
    constexpr int MI = WARP_M / 16, NI = WARP_N / 8, CA = {ca}, CB = {cb}, EL = {el};
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
            const int id = tid + i * THREADS, r = id / CA, c = id % CA, kv = K - (k0 + c * EL);
            const bool ok = m0 + r < {"MA" if p.bias_grad else "M"} && kv > 0;
            {ones_load}{copy}(dA + r * BK + gemm_swz_a(r, c) * EL, ok ? Ab + (m0 + r) * K + k0 + c * EL : Ab, {valid_a});
        }}
        #pragma unroll
        for (int i = 0; i < BK * CB / THREADS; ++i) {{
            const int id = tid + i * THREADS, r = id / CB, c = id % CB, nv = N - (n0 + c * EL);
            const bool ok = k0 + r < K && nv > 0;
            {copy}(dB + r * BN + gemm_swz_b(r, c) * EL, ok ? Bb + (k0 + r) * N + n0 + c * EL : Bb, {valid_b});
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
        for (int ks = 0; ks < BK / {kstep}; ++ks) {{
            unsigned af[MI][4], bf[NI][2];
            #pragma unroll
            for (int i = 0; i < MI; ++i) {{   // x4: rows 0-7 / 8-15 of chunks 2ks and 2ks+1, as the mma lays A out
                const int r = wm0 + i * 16 + (lane & 15), c = ks * 2 + (lane >> 4);
                ldmatrix_x4(af[i], cA + r * BK + gemm_swz_a(r, c) * EL);{convert_a}
            }}
            {_fragments_b(p.tf32)}
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


def emit_simt(p: _Problem, s: GemmSimtSchedule, name: str) -> str:
    """The FFMA kernel for fp32 operands, after its launch comment and device helpers."""
    fns, signature, args = _common(p)
    store = _STORE1[p.out_dtype]
    # a bias-gradient product reads A's MA rows and has ones in row MA
    a_load = ("(m0 + r < M && k0 + c < K) ? Ab[(m0 + r) * K + k0 + c] : 0.0f" if not p.bias_grad else
              "(m0 + r < MA && k0 + c < K) ? Ab[(m0 + r) * K + k0 + c] : (m0 + r == MA && k0 + c < K) ? 1.0f : 0.0f")
    ones_decl = _ones_row(p)[1]
    return _launch(p, s, name, signature) + fns + f"""
extern "C" __global__ void __launch_bounds__({s.threads}) {name}({signature}) {{
    constexpr int M = {p.m}, N = {p.n}, K = {p.k};{ones_decl}
    constexpr int BM = {s.bm}, BN = {s.bn}, BK = {s.bk}, TM = {s.tm}, TN = {s.tn}, PAD = {SIMT_PAD};
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
            ra[i] = {a_load};
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
