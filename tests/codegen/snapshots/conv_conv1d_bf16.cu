// conv1d(bf16[16,64,2048], bf16[64,64,3], dilation=(1,), groups=1, padding=((1, 1),), stride=(1,)) -> bf16[16,64,2048]
// schedule: bm=128 bn=64 bk=32 warps_m=4 warps_n=2
// implicit GEMM per group: M=32768 N=64 K=192, groups=1
// launch: conv_mma_128x64x32_4x2(x, w, y); grid=(256, 1, 1), block=(256)
namespace conv_mma_128x64x32_4x2_config {
typedef bf16_t T;
constexpr int SPLITK = 1, BM = 128, BN = 64, BK = 32, WARPS_M = 4, WARPS_N = 2, PAD = 8, THREADS = 256;
}
using namespace conv_mma_128x64x32_4x2_config;

extern "C" __global__ void __launch_bounds__(256) conv_mma_128x64x32_4x2(const T* __restrict__ x, const T* __restrict__ w,
                                                           T* __restrict__ y) {
    constexpr int C = 64, H = 1, W = 2048, O = 64, CG = 64, OG = 64, KH = 1, KW = 3;
    constexpr int OH = 1, OW = 2048, SH = 1, SW = 1, PH = 0, PW = 1, DH = 1, DW = 1;
    constexpr int P = OH * OW, TAPS = KH * KW, M = 32768, K = CG * TAPS, KTILES = (K + BK - 1) / BK;
    constexpr int EA = BM * BK / THREADS, EB = BN * BK / THREADS, KSTEP = THREADS / BM, OSTEP = THREADS / BK;
    __shared__ __align__(16) T As[BM][BK + PAD];
    __shared__ __align__(16) T Bs[BN][BK + PAD];
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

    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, MT = WM / 16, NT = WN / 8;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M, gid = lane >> 2, tig = lane & 3;
    float acc[MT][NT][4] = {};
    load(kt0 * BK);
    #pragma unroll 1
    for (int kt = kt0; kt < kt1; ++kt) {
        #pragma unroll
        for (int j = 0; j < EA; ++j) As[row][kcol + j * KSTEP] = ra[j];
        #pragma unroll
        for (int j = 0; j < EB; ++j) Bs[ob + j * OSTEP][kb] = rb[j];
        __syncthreads();
        if (kt + 1 < kt1) load((kt + 1) * BK);      // the next tile's loads fly during this tile's math
        #pragma unroll
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
                for (int j = 0; j < NT; ++j) mma_bf16_16816(acc[i][j], af[i], bf[j]);
        }
        __syncthreads();
    }
    
    #pragma unroll
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
                    if (o < OG) yrow[(long long)o * P] = f32_to_bf16(acc[i][j][half * 2 + e]);
                }
        }
}
