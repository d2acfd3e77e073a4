// matmul_bias_grad(bf16[2048,768], bf16[2048,3072], trans_a=True) -> bf16[769,3072]
// kernel kind gemm, fused ['bias_grad'], schedule wg bm=128 bn=256 bk=64 wg_m=2 wg_n=1 stages=4, H100-SXM
// launch: gemm_bf16_bf16_none_bgrad_tn_1x769x3072x2048_wg128x256x64x2x1x4<<<84, 256>>> (a 1-d grid of resources().blocks, 197632 bytes of dynamic shared memory)
// arguments: const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, bf16_t* __restrict__ C
__device__ __forceinline__ long long gemm_boff_a(int z) { return 0LL; }
__device__ __forceinline__ long long gemm_boff_b(int z) { return 0LL; }
__device__ __forceinline__ long long gemm_boff_c(int z) { return 0LL; }
__device__ __forceinline__ float gemm_epilogue(float v, int z, int r, int c) {
    v = v;
    return v;
}

__device__ __forceinline__ void gemm_one_after8(unsigned short* dst, const unsigned short* src, int valid) {
    unsigned w[4];
    #pragma unroll
    for (int e = 0; e < 8; ++e) {
        const unsigned h = e < valid ? src[e] : e == valid ? 0x3F80u : 0u;
        if (e % 2 == 0) w[e / 2] = h; else w[e / 2] |= h << 16;
    }
    *(uint4*)dst = make_uint4(w[0], w[1], w[2], w[3]);
}
// wgmma matrix descriptor: start address, leading / stride byte offsets (16-byte units),
// 128-byte swizzle
__device__ __forceinline__ unsigned long long gemm_desc(const void* tile, unsigned leading, unsigned stride) {
    return (unsigned long long)((smem_addr(tile) & 0x3FFFFu) >> 4) | ((unsigned long long)(leading >> 4) << 16)
         | ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}
// where the 16-byte chunk c (0-7) of row r of a swizzled tile lies: bits 4-6 of its address XOR bits 7-9
__device__ __forceinline__ int gemm_swz(int r, int c) { return (c ^ r) & 7; }

extern "C" __global__ void __launch_bounds__(256, 1) gemm_bf16_bf16_none_bgrad_tn_1x769x3072x2048_wg128x256x64x2x1x4(const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, bf16_t* __restrict__ C) {
    constexpr int M = 769, N = 3072, K = 2048;
    constexpr int MA = 768;   // rows of A; row MA is the virtual row of ones
    constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, THREADS = 256;
    constexpr int WG_N = 1, WARPGROUP_M = BM / 2, WARPGROUP_N = BN / WG_N;
    constexpr int MI = WARPGROUP_M / 64, NI = WARPGROUP_N / 8, EL = 8, ROW = BK, KS = 16;
    constexpr unsigned ROW_BYTES = 128, ATOM = 1024;
    constexpr int KT = (K + BK - 1) / BK;
    // tiles start on 1024-byte atoms: the swizzle is a function of the shared address
    extern __shared__ __align__(16) unsigned char gemm_smem[];
    bf16_t* const sA = (bf16_t*)(gemm_smem + ((ATOM - (smem_addr(gemm_smem) & (ATOM - 1))) & (ATOM - 1)));
    bf16_t* const sB = sA + STAGES * BM * BK;
    const int tid = threadIdx.x, lane = tid & 31, warpgroup = tid >> 7, warp = (tid >> 5) & 3;
    const int wm0 = (warpgroup / WG_N) * WARPGROUP_M, wn0 = (warpgroup % WG_N) * WARPGROUP_N;
    // one flat grid: column tiles fastest (blocks sharing an A row panel run together), then rows, then batch
    constexpr int TILES_N = (N + BN - 1) / BN, TILES_M = (M + BM - 1) / BM;
    const int n0 = (blockIdx.x % TILES_N) * BN, m0 = (blockIdx.x / TILES_N % TILES_M) * BM;
    const int z = blockIdx.x / (TILES_N * TILES_M);
    const bf16_t* Ab = A + gemm_boff_a(z);
    const bf16_t* Bb = B + gemm_boff_b(z);

    // one k-tile into one stage; chunks past M, N or K are zero-filled (0 valid bytes)
    auto load_tile = [&](int stage, int kt) {
        const int k0 = kt * BK;
        bf16_t* dA = sA + stage * BM * BK;
        #pragma unroll
        for (int i = 0; i < BK * (BM / EL) / THREADS; ++i) {   // BM-runs of one k each
            const int id = tid + i * THREADS, r = id / (BM / EL), c = id % (BM / EL), mv = MA - (m0 + c * EL);
            const bool ok = k0 + r < K && mv > 0;
            if (k0 + r < K && mv >= 0 && mv < EL) gemm_one_after8(dA + (c / 8) * BK * ROW + r * ROW + gemm_swz(r, c % 8) * EL, Ab + (k0 + r) * MA + m0 + c * EL, mv);
            else cp_async_16(dA + (c / 8) * BK * ROW + r * ROW + gemm_swz(r, c % 8) * EL, ok ? Ab + (k0 + r) * MA + m0 + c * EL : Ab, ok ? 16 : 0);
        }
        bf16_t* dB = sB + stage * BK * BN;
        #pragma unroll
        for (int i = 0; i < BK * (BN / EL) / THREADS; ++i) {   // BN-runs of one k each
            const int id = tid + i * THREADS, r = id / (BN / EL), c = id % (BN / EL), nv = N - (n0 + c * EL);
            const bool ok = k0 + r < K && nv > 0;
            cp_async_16(dB + (c / 8) * BK * ROW + r * ROW + gemm_swz(r, c % 8) * EL, ok ? Bb + (k0 + r) * N + n0 + c * EL : Bb, ok ? 16 : 0);
        }
    };

    float acc[MI][NI][4];
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    #pragma unroll
    for (int st = 0; st < STAGES - 2; ++st) {
        if (st < KT) load_tile(st, st);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 3>();   // tile kt has landed
        fence_proxy_async();           // where the tensor cores read it
        __syncthreads();               // for every thread; and every warpgroup has retired tile kt - 2's MMAs
        const int next = kt + STAGES - 2;
        if (next < KT) load_tile(next % STAGES, next);   // into tile kt - 2's stage
        cp_async_commit();
        const bf16_t* cA = sA + (kt % STAGES) * BM * BK;
        const bf16_t* cB = sB + (kt % STAGES) * BK * BN;
        wgmma_hold<MI * NI * 4>(&acc[0][0][0]);
        wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < BK / KS; ++ks)
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                wgmma_m64n256k16_bf16<1, 1>(&acc[i][0][0], gemm_desc(cA + (wm0 + i * 64) / 64 * BK * ROW + ks * KS * ROW, BK * ROW_BYTES, ATOM), gemm_desc(cB + wn0 / 64 * BK * ROW + ks * KS * ROW, BK * ROW_BYTES, ATOM));
        wgmma_commit();
        wgmma_wait<1>();               // tile kt - 1's MMAs are done; tile kt's run on
        wgmma_hold<MI * NI * 4>(&acc[0][0][0]);
    }
    wgmma_wait<0>();
    wgmma_hold<MI * NI * 4>(&acc[0][0][0]);   // the epilogue reads them after the wait, not before
    cp_async_wait<0>();

    // accumulator (i, j, e) of warp w: row 16w + lane/4 (+8 for e >= 2) of slab i, column pair 2*(lane%4) of n8 block j
    const long long cz = gemm_boff_c(z);
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = m0 + wm0 + i * 64 + warp * 16 + h * 8 + (lane >> 2);
                const int c = n0 + wn0 + j * 8 + (lane & 3) * 2;
                if (r < M && c < N) {
                    const long long o = cz + (long long)r * N + c;
                    const float v0 = gemm_epilogue(acc[i][j][2 * h + 0], z, r, c + 0), v1 = gemm_epilogue(acc[i][j][2 * h + 1], z, r, c + 1);
                    *(unsigned*)(C + o) = pack_bf16x2(v0, v1);
                }
            }
}
