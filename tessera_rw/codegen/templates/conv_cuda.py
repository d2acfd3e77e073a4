"""The CUDA text of the direct convolution's two kernels, with the op's sizes folded in as constants.

`implicit_gemm_source` writes the per-group implicit GEMM (tensor-core mma.sync for 16-bit inputs, an
FFMA tile for fp32); `depthwise_source` writes the sliding-window kernel for one input channel per
group. Both take the sizes as a name -> int map and return the kernel without the prelude:

>>> "conv_x(" in implicit_gemm_source("conv_x", dict.fromkeys(GEMM_CONSTANTS, 1),
...                                    dict(BM=64, BN=16, BK=16, WARPS_M=4, WARPS_N=1, PAD=1), None)
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tessera_rw.codegen.arch import WARP_SIZE
from tessera_rw.codegen.templates.conv_epilogue import ConvEpilogue, placed

# Sizes the implicit GEMM's text names; the caller supplies each.
GEMM_CONSTANTS = ("CV_C", "CV_H", "CV_W", "CV_O", "CV_CG", "CV_OG", "CV_KH", "CV_KW", "CV_OH", "CV_OW",
                  "CV_SH", "CV_SW", "CV_PH", "CV_PW", "CV_DH", "CV_DW", "CV_M")
# Sizes and tile facts the depthwise text names (constexprs in its config namespace).
DEPTHWISE_CONSTANTS = ("C", "H", "W", "O", "MULT", "KH", "KW", "OH", "OW", "SH", "SW", "PH", "PW", "DH", "DW",
                       "TH", "TW", "V", "THREADS")
# Depthwise window: up to this many taps per row are unrolled as one chunk, longer rows go in chunks
# of _TAP_CHUNK (rows zero-padded to a multiple); up to _REGISTER_TAPS taps in all live in registers.
_MAX_TAPS_UNROLLED, _TAP_CHUNK, _REGISTER_TAPS = 16, 8, 16
_FLOAT4 = 4                              # floats per 16-byte shared-memory load


@dataclass(frozen=True)
class DepthwiseLayout:
    """How a depthwise block stages its input tile in shared memory and how its threads read it.

    >>> DepthwiseLayout.of((1, 3), (1, 1), (1, 1), (1, 1024), 8)
    DepthwiseLayout(tj=3, kwp=3, rows_in=1, srow=1032, taps_in_registers=True, vector_reads=True)
    """
    tj: int                              # taps per unrolled chunk of a kernel row
    kwp: int                             # kernel row length padded to whole chunks
    rows_in: int                         # staged input rows (tile rows and halo)
    srow: int                            # staged floats per row (columns, halo and vector overrun)
    taps_in_registers: bool
    vector_reads: bool                   # the window is read as aligned float4s

    @classmethod
    def of(cls, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
           tile: tuple[int, int], outputs_per_thread: int) -> DepthwiseLayout:
        (kh, kw), (sh, sw), (dh, dw), (th, tw) = kernel, stride, dilation, tile
        tj = kw if kw <= _MAX_TAPS_UNROLLED else _TAP_CHUNK
        kwp = -(-kw // tj) * tj
        # float4 reads need a 16-byte aligned window start: c0 and every chunk start multiples of 4
        vector = sw == dw == 1 and outputs_per_thread % _FLOAT4 == 0 and (kwp == tj or tj % _FLOAT4 == 0)
        cols = (tw - 1) * sw + (kwp - 1) * dw + 1 + (_FLOAT4 - 1 if vector else 0)
        return cls(tj=tj, kwp=kwp, rows_in=(th - 1) * sh + (kh - 1) * dh + 1, srow=-(-cols // _FLOAT4) * _FLOAT4,
                   taps_in_registers=kh * kw <= _REGISTER_TAPS, vector_reads=vector)


# dtype suffix (prelude converters) -> C type; None is fp32
_CTYPES = {"bf16": "bf16_t", "f16": "f16_t", None: "float"}

_GEMM_BODY = r"""
extern "C" __global__ void __launch_bounds__(THREADS) NAME(const T* __restrict__ x, const T* __restrict__ wEXTRA_PARAMS,
                                                           T* __restrict__ ySPLIT_PARAM) {
    constexpr int C = CV_C, H = CV_H, W = CV_W, O = CV_O, CG = CV_CG, OG = CV_OG, KH = CV_KH, KW = CV_KW;
    constexpr int OH = CV_OH, OW = CV_OW, SH = CV_SH, SW = CV_SW, PH = CV_PH, PW = CV_PW, DH = CV_DH, DW = CV_DW;
    constexpr int P = OH * OW, TAPS = KH * KW, M = CV_M, K = CG * TAPS, KTILES = (K + BK - 1) / BK;
    constexpr int EA = BM * BK / THREADS, EB = BN * BK / THREADS, KSTEP = THREADS / BM, OSTEP = THREADS / BK;
    SMEM_DECL
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = blockIdx.z / SPLITK, part = blockIdx.z % SPLITK, m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    // this block's share of the K tiles (all of them without a split)
    constexpr int KT_PER = (KTILES + SPLITK - 1) / SPLITK;
    const int kt0 = part * KT_PER, kt1 = min(KTILES, kt0 + KT_PER);

    // Each thread gathers one A row (one output position) for the whole K loop: decode it once.
    const int row = tid % BM, kcol = tid / BM;
    const bool row_ok = m0 + row < M;
    const int mr = row_ok ? m0 + row : 0;
    const int img = mr / P, pos = mr - img * P;
    const int ih0 = (pos / OW) * SH - PH, iw0 = (pos % OW) * SW - PW;
    const T* xrow = x + ((long long)img * C + g * CG) * (H * W);
    // ... and one k column of B (w is (O, K) row-major), walking OSTEP output channels per element.
    const int kb = tid % BK, ob = tid / BK;
    const T* wrow = w + (long long)(g * OG + n0 + ob) * K + kb;

    T ra[EA], rb[EB];
    auto load = [&](int k0) {
        #pragma unroll
        for (int j = 0; j < EA; ++j) {              // A: im2col gather, zero outside the input
            const int k = k0 + kcol + j * KSTEP;
            const int c = k / TAPS, t = k - c * TAPS;
            const int ih = ih0 + (t / KW) * DH, iw = iw0 + (t % KW) * DW;
            T v = 0;
            if (row_ok && k < K && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W)
                v = xrow[c * (H * W) + ih * W + iw];
            ra[j] = v;
        }
        const bool k_ok = k0 + kb < K;
        #pragma unroll
        for (int j = 0; j < EB; ++j) {              // B: w rows are contiguous in k
            T v = 0;
            if (k_ok && n0 + ob + j * OSTEP < OG) v = wrow[j * OSTEP * K + k0];
            rb[j] = v;
        }
    };

    COMPUTE_DECL
    load(kt0 * BK);
    #pragma unroll 1
    for (int kt = kt0; kt < kt1; ++kt) {
        #pragma unroll
        for (int j = 0; j < EA; ++j) STORE_A;
        #pragma unroll
        for (int j = 0; j < EB; ++j) STORE_B;
        __syncthreads();
        if (kt + 1 < kt1) load((kt + 1) * BK);      // the next tile's loads fly during this tile's math
        COMPUTE
        __syncthreads();
    }
    SPLIT_MEET
    EPILOGUE
}
"""

# A split K's blocks meet (SPLITK > 1): each parks its accumulators in the zeroed workspace and counts
# its arrival; the last of the tile's blocks sums every part in part order (the same bits whichever
# arrives last) into its own accumulators, which the epilogue then writes.
_SPLIT_MEET = r"""{
        constexpr int NACC = BM * BN / THREADS;
        const int tile = (g * (int)gridDim.y + (int)blockIdx.y) * (int)gridDim.x + (int)blockIdx.x;
        float* parts = reinterpret_cast<float*>(work) + (long long)tile * SPLITK * BM * BN;
        float* mine = reinterpret_cast<float*>(acc);
        #pragma unroll
        for (int i = 0; i < NACC; ++i) parts[(part * NACC + i) * THREADS + tid] = mine[i];
        __threadfence();
        __syncthreads();
        __shared__ unsigned last;
        unsigned* arrived = reinterpret_cast<unsigned*>(work + WORK_COUNTERS);
        if (tid == 0) last = atomicAdd(&arrived[tile], 1u) == SPLITK - 1;
        __syncthreads();
        if (!last) return;                          // another block of the tile comes later
        __threadfence();
        #pragma unroll
        for (int i = 0; i < NACC; ++i) {
            float sum = 0.0f;
            for (int p = 0; p < SPLITK; ++p) sum += ((volatile float*)parts)[(p * NACC + i) * THREADS + tid];
            mine[i] = sum;
        }
    }"""

_MMA = dict(
    SMEM_DECL="__shared__ __align__(16) T As[BM][BK + PAD];\n    __shared__ __align__(16) T Bs[BN][BK + PAD];",
    STORE_A="As[row][kcol + j * KSTEP] = ra[j]",
    STORE_B="Bs[ob + j * OSTEP][kb] = rb[j]",
    COMPUTE_DECL="""constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, MT = WM / 16, NT = WN / 8;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M, gid = lane >> 2, tig = lane & 3;
    float acc[MT][NT][4] = {};""",
    COMPUTE="""#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned af[MT][4], bf[NT][2];
            #pragma unroll
            for (int i = 0; i < MT; ++i) {           // A fragment: rows gid, gid+8; k pairs 2*tig, +8
                const T* a = &As[wm * WM + i * 16 + gid][kk + 2 * tig];
                af[i][0] = *(const unsigned*)a;
                af[i][1] = *(const unsigned*)(a + 8 * (BK + PAD));
                af[i][2] = *(const unsigned*)(a + 8);
                af[i][3] = *(const unsigned*)(a + 8 * (BK + PAD) + 8);
            }
            #pragma unroll
            for (int j = 0; j < NT; ++j) {           // B fragment: column gid; k pairs 2*tig, +8
                const T* b = &Bs[wn * WN + j * 8 + gid][kk + 2 * tig];
                bf[j][0] = *(const unsigned*)b;
                bf[j][1] = *(const unsigned*)(b + 8);
            }
            #pragma unroll
            for (int i = 0; i < MT; ++i)
                #pragma unroll
                for (int j = 0; j < NT; ++j) MMA(acc[i][j], af[i], bf[j]);
        }""",
    EPILOGUE="""#pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int half = 0; half < 2; ++half) {       // accumulator rows gid and gid+8
            const int m = m0 + wm * WM + i * 16 + gid + half * 8;
            if (m >= M) continue;
            const int im = m / P, p = m - im * P;
            T* yrow = y + ((long long)im * O + g * OG) * P + p;
            #pragma unroll
            for (int j = 0; j < NT; ++j)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int o = n0 + wn * WN + j * 8 + 2 * tig + e;
                    if (o < OG) WRITE_Y(acc[i][j][half * 2 + e]);
                }
        }""")

_SIMT = dict(
    SMEM_DECL="__shared__ float As[BK][BM];\n    __shared__ float Bs[BK][BN + PAD];",
    STORE_A="As[kcol + j * KSTEP][row] = ra[j]",
    STORE_B="Bs[kb][ob + j * OSTEP] = rb[j]",
    COMPUTE_DECL="""constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, TM = WM / 8, TN = WN / 4;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M, lm = lane & 7, ln = lane >> 3;
    float acc[TM][TN] = {};""",
    COMPUTE="""#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {            // lanes interleave rows and columns: no conflicts
            float a[TM], b[TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[kk][wm * WM + i * 8 + lm];
            #pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[kk][wn * WN + j * 4 + ln];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }""",
    EPILOGUE="""#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + wm * WM + i * 8 + lm;
        if (m >= M) continue;
        const int im = m / P, p = m - im * P;
        float* yrow = y + ((long long)im * O + g * OG) * P + p;
        #pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int o = n0 + wn * WN + j * 4 + ln;
            if (o < OG) WRITE_Y(acc[i][j]);
        }
    }""")


_DEPTHWISE_BODY = r"""
extern "C" __global__ void __launch_bounds__(THREADS) NAME(const T* __restrict__ x, const T* __restrict__ wEXTRA_PARAMS,
                                                           T* __restrict__ y) {
    constexpr int TAPS = KH * KW, TILES_W = (OW + TW - 1) / TW, GROUPS_W = TW / V;
    constexpr int WIN = (V - 1) * SW + (TJ - 1) * DW + 1;            // inputs one tap chunk of V outputs reads
    constexpr int STAGED = ROWS_IN * SROW, STAGE_STEPS = (STAGED + THREADS - 1) / THREADS;
    __shared__ __align__(16) float xs[STAGED];
    TAPS_DECL
    const int tid = threadIdx.x, o = blockIdx.y, img = blockIdx.z;
    const int tr0 = (blockIdx.x / TILES_W) * TH, tc0 = (blockIdx.x % TILES_W) * TW;
    const T* xc = x + ((long long)img * C + o / MULT) * (H * W);    // the one input channel of o's group
    const T* wo = w + (long long)o * TAPS;
    TAPS_LOAD
    // The input tile and its halo, converted to fp32 once: consecutive threads take consecutive
    // columns (coalesced loads, conflict-free stores); zero outside the input is the padding.
    const int ih0 = tr0 * SH - PH, iw0 = tc0 * SW - PW;
    #pragma unroll STAGE_UNROLL
    for (int k = 0; k < STAGE_STEPS; ++k) {
        const int idx = tid + k * THREADS, r = idx / SROW, s = idx - r * SROW;
        const int ih = ih0 + r, iw = iw0 + s;
        float v = 0.f;
        if (idx < STAGED && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W) v = TO_F(xc[ih * W + iw]);
        if (idx < STAGED) xs[idx] = v;
    }
    __syncthreads();

    // V consecutive outputs of one row per thread: each staged input feeds up to V FMAs from registers.
    const int r = tid / GROUPS_W, c0 = (tid - r * GROUPS_W) * V;
    float acc[V] = {};
    #pragma unroll ROW_UNROLL
    for (int i = 0; i < KH; ++i) {
        const float* xr = xs + (r * SH + i * DH) * SROW + c0 * SW;
        #pragma unroll 1
        for (int j0 = 0; j0 < KWP; j0 += TJ) {
            float win[(WIN + 3) / 4 * 4];
            if (VEC_READ) {                                              // 16-byte aligned: c0, j0 multiples of 4
                #pragma unroll
                for (int q = 0; q < (WIN + 3) / 4; ++q) {
                    const float4 f = *(const float4*)(xr + j0 + 4 * q);
                    win[4 * q] = f.x; win[4 * q + 1] = f.y; win[4 * q + 2] = f.z; win[4 * q + 3] = f.w;
                }
            } else {
                #pragma unroll
                for (int q = 0; q < WIN; ++q) win[q] = xr[j0 * DW + q];
            }
            #pragma unroll
            for (int j = 0; j < TJ; ++j) {
                const float t = TAP_VALUE;
                #pragma unroll
                for (int v = 0; v < V; ++v) acc[v] = fmaf(win[j * DW + v * SW], t, acc[v]);
            }
        }
    }

    // Whole vectors where the row holds them (OW % SV == 0 keeps every vector aligned), else scalars.
    constexpr int SV = V * (int)sizeof(T) > 16 ? 16 / (int)sizeof(T) : V, WORDS = SV * (int)sizeof(T) / 4;
    const int oh = tr0 + r, left = OW - (tc0 + c0);
    if (oh >= OH || left <= 0) return;
    T* yr = y + (((long long)img * O + o) * OH + oh) * OW + tc0 + c0;
    EPILOGUE_IN_PLACE
    #pragma unroll
    for (int q = 0; q < V; q += SV) {
        if (OW % SV == 0 && q + SV <= left) {
            unsigned words[WORDS];
            #pragma unroll
            for (int e = 0; e < WORDS; ++e) words[e] = pack2(acc, q + e * EPW);   // EPW outputs per word
            store_words<WORDS>(yr + q, words);
        } else {
            #pragma unroll
            for (int e = 0; e < SV; ++e)
                if (q + e < left) yr[q + e] = FROM_F(acc[q + e]);
        }
    }
}
"""


def _substitute(text: str, values: Mapping[str, object]) -> str:
    """Replace each placeholder, longest first so that no name clobbers a longer one containing it."""
    for key in sorted(values, key=len, reverse=True):
        text = text.replace(key, str(values[key]))
    return text


def _wrap(name: str, ctype: str, config: str, text: str, threads: int) -> str:
    return (f"namespace {name}_config {{\ntypedef {ctype} T;\n{config}}}\nusing namespace {name}_config;\n"
            + text.replace("THREADS)", f"{threads})", 1).replace("NAME(", f"{name}(", 1))


def implicit_gemm_source(name: str, sizes: Mapping[str, int], tile: Mapping[str, int], suffix: str | None,
                         epilogue: ConvEpilogue | None = None) -> str:
    """The implicit-GEMM kernel: mma.sync when `suffix` names a 16-bit dtype ('bf16', 'f16'), else FFMA.

    `tile` holds BM, BN, BK, WARPS_M, WARPS_N, PAD (smem row padding in elements) and, where blocks
    split K, SPLITK and WORK_COUNTERS (the byte offset of the arrival counters in the workspace).
    """
    split = tile.get("SPLITK", 1)
    meet = {"SPLIT_MEET": _SPLIT_MEET if split > 1 else "",
            "SPLIT_PARAM": ", unsigned char* __restrict__ work" if split > 1 else ""}
    text = _substitute(_substitute(_GEMM_BODY, meet), _MMA if suffix else _SIMT)   # COMPUTE_DECL before COMPUTE
    if suffix:
        text = text.replace("MMA(", f"mma_{suffix}_16816(")
    text = placed(text, epilogue, f"f32_to_{suffix}" if suffix else "")
    threads = WARP_SIZE * tile["WARPS_M"] * tile["WARPS_N"]
    config = "constexpr int " + ", ".join(f"{k} = {v}" for k, v in {"SPLITK": 1, **tile, "THREADS": threads}.items()) \
        + ";\n"
    return _wrap(name, _CTYPES[suffix], config, _substitute(text, sizes), threads)


# Staging steps per thread up to this many are unrolled in full (all loads in flight before the
# stores); a longer staging loop (long kernels' halos) is unrolled by _STAGE_PARTIAL_UNROLL.
_STAGE_FULL_UNROLL, _STAGE_PARTIAL_UNROLL = 16, 4


def depthwise_source(name: str, sizes: Mapping[str, int], suffix: str | None, layout: DepthwiseLayout,
                     epilogue: ConvEpilogue | None = None) -> str:
    """The sliding-window kernel; `sizes` holds every name in DEPTHWISE_CONSTANTS.

    Taps in registers need every tap index constant, so that path unrolls the tap rows in full.
    """
    sizes = {**sizes, "TJ": layout.tj, "KWP": layout.kwp, "ROWS_IN": layout.rows_in, "SROW": layout.srow}
    if layout.taps_in_registers:
        taps = dict(TAPS_DECL="float taps[TAPS];",
                    TAPS_LOAD="#pragma unroll\n    for (int t = 0; t < TAPS; ++t) taps[t] = TO_F(wo[t]);",
                    TAP_VALUE="taps[i * KW + j0 + j]", ROW_UNROLL="")
    else:
        taps = dict(TAPS_DECL="__shared__ __align__(16) float ws[KH * KWP];",
                    TAPS_LOAD="for (int t = tid; t < KH * KWP; t += THREADS) {   // taps, zero-padded to KWP\n"
                              "        const int i = t / KWP, j = t - i * KWP;\n"
                              "        ws[t] = j < KW ? TO_F(wo[i * KW + j]) : 0.f;\n    }",
                    TAP_VALUE="ws[i * KWP + j0 + j]", ROW_UNROLL="1")
    steps = -(-sizes["ROWS_IN"] * sizes["SROW"] // sizes["THREADS"])
    text = _substitute(_DEPTHWISE_BODY, {**taps, "STAGE_UNROLL": "" if steps <= _STAGE_FULL_UNROLL else _STAGE_PARTIAL_UNROLL})
    if suffix:
        convert = dict(TO_F=f"{suffix}_to_f32", FROM_F=f"f32_to_{suffix}", EPW="2")
        pack = f"return pack_{suffix}x2(a[k], a[k + 1]);"
    else:
        convert = dict(TO_F="", FROM_F="", EPW="1")
        pack = "return __float_as_uint(a[k]);"
    text = placed(_substitute(text, convert), epilogue, "")
    names = DEPTHWISE_CONSTANTS + ("TJ", "KWP", "ROWS_IN", "SROW")
    config = ("constexpr int " + ", ".join(f"{k} = {sizes[k]}" for k in names) + ";\n"
              f"constexpr bool VEC_READ = {'true' if layout.vector_reads else 'false'};\n"
              f"__device__ __forceinline__ unsigned pack2(const float* a, int k) {{ {pack} }}\n"
              + _STORE_WORDS)
    return _wrap(name, _CTYPES[suffix], config, text, sizes["THREADS"])


# One vector store of N 32-bit words (N = 1, 2, 4: 4, 8 or 16 bytes); the address is N*4-aligned.
_STORE_WORDS = """template <int N> __device__ __forceinline__ void store_words(void* p, const unsigned* w);
template <> __device__ __forceinline__ void store_words<1>(void* p, const unsigned* w) { *(unsigned*)p = w[0]; }
template <> __device__ __forceinline__ void store_words<2>(void* p, const unsigned* w) {
    *(uint2*)p = make_uint2(w[0], w[1]);
}
template <> __device__ __forceinline__ void store_words<4>(void* p, const unsigned* w) {
    *(uint4*)p = make_uint4(w[0], w[1], w[2], w[3]);
}
"""
