// conv1d(bf16[16,768,4096], bf16[768,1,3], dilation=(1,), groups=768, padding=((1, 1),), stride=(1,)) -> bf16[16,768,4096]
// schedule: threads=128 outputs_per_thread=8 tile=(1, 1024)
// depthwise sliding window: 1 output channel(s) per input channel, taps in registers
// launch: conv_depthwise_128x8_1x1024(x, w, y); grid=(4, 768, 16), block=(128)
namespace conv_depthwise_128x8_1x1024_config {
typedef bf16_t T;
constexpr int C = 768, H = 1, W = 4096, O = 768, MULT = 1, KH = 1, KW = 3, OH = 1, OW = 4096, SH = 1, SW = 1, PH = 0, PW = 1, DH = 1, DW = 1, TH = 1, TW = 1024, V = 8, THREADS = 128, TJ = 3, KWP = 3, ROWS_IN = 1, SROW = 1032;
constexpr bool VEC_READ = true;
__device__ __forceinline__ unsigned pack2(const float* a, int k) { return pack_bf16x2(a[k], a[k + 1]); }
template <int N> __device__ __forceinline__ void store_words(void* p, const unsigned* w);
template <> __device__ __forceinline__ void store_words<1>(void* p, const unsigned* w) { *(unsigned*)p = w[0]; }
template <> __device__ __forceinline__ void store_words<2>(void* p, const unsigned* w) {
    *(uint2*)p = make_uint2(w[0], w[1]);
}
template <> __device__ __forceinline__ void store_words<4>(void* p, const unsigned* w) {
    *(uint4*)p = make_uint4(w[0], w[1], w[2], w[3]);
}
}
using namespace conv_depthwise_128x8_1x1024_config;

extern "C" __global__ void __launch_bounds__(128) conv_depthwise_128x8_1x1024(const T* __restrict__ x, const T* __restrict__ w,
                                                           T* __restrict__ y) {
    constexpr int TAPS = KH * KW, TILES_W = (OW + TW - 1) / TW, GROUPS_W = TW / V;
    constexpr int WIN = (V - 1) * SW + (TJ - 1) * DW + 1;            // inputs one tap chunk of V outputs reads
    constexpr int STAGED = ROWS_IN * SROW, STAGE_STEPS = (STAGED + THREADS - 1) / THREADS;
    __shared__ __align__(16) float xs[STAGED];
    float taps[TAPS];
    const int tid = threadIdx.x, o = blockIdx.y, img = blockIdx.z;
    const int tr0 = (blockIdx.x / TILES_W) * TH, tc0 = (blockIdx.x % TILES_W) * TW;
    const T* xc = x + ((long long)img * C + o / MULT) * (H * W);    // the one input channel of o's group
    const T* wo = w + (long long)o * TAPS;
    #pragma unroll
    for (int t = 0; t < TAPS; ++t) taps[t] = bf16_to_f32(wo[t]);
    // The input tile and its halo, converted to fp32 once: consecutive threads take consecutive
    // columns (coalesced loads, conflict-free stores); zero outside the input is the padding.
    const int ih0 = tr0 * SH - PH, iw0 = tc0 * SW - PW;
    #pragma unroll 
    for (int k = 0; k < STAGE_STEPS; ++k) {
        const int idx = tid + k * THREADS, r = idx / SROW, s = idx - r * SROW;
        const int ih = ih0 + r, iw = iw0 + s;
        float v = 0.f;
        if (idx < STAGED && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W) v = bf16_to_f32(xc[ih * W + iw]);
        if (idx < STAGED) xs[idx] = v;
    }
    __syncthreads();

    // V consecutive outputs of one row per thread: each staged input feeds up to V FMAs from registers.
    const int r = tid / GROUPS_W, c0 = (tid - r * GROUPS_W) * V;
    float acc[V] = {};
    #pragma unroll 
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
                const float t = taps[i * KW + j0 + j];
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
    #pragma unroll
    for (int q = 0; q < V; q += SV) {
        if (OW % SV == 0 && q + SV <= left) {
            unsigned words[WORDS];
            #pragma unroll
            for (int e = 0; e < WORDS; ++e) words[e] = pack2(acc, q + e * 2);   // 2 outputs per word
            store_words<WORDS>(yr + q, words);
        } else {
            #pragma unroll
            for (int e = 0; e < SV; ++e)
                if (q + e < left) yr[q + e] = f32_to_bf16(acc[q + e]);
        }
    }
}
