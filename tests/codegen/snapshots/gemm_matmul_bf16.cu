// matmul(bf16[4096,4096], bf16[4096,4096]) -> bf16[4096,4096]
// kernel kind gemm, fused [], schedule tma bm=128 bn=256 bk=64 wg_m=2 wg_n=1 stages=4, H100-SXM
// launch: gemm_bf16_bf16_none_1x4096x4096x4096_tma128x256x64x2x1x4<<<512, 384>>> (a 1-d grid of resources().blocks, 197696 bytes of dynamic shared memory)
// arguments: const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, bf16_t* __restrict__ C, const __grid_constant__ TmaMap tma_a, const __grid_constant__ TmaMap tma_b
__device__ __forceinline__ long long gemm_boff_a(int z) { return 0LL; }
__device__ __forceinline__ long long gemm_boff_b(int z) { return 0LL; }
__device__ __forceinline__ long long gemm_boff_c(int z) { return 0LL; }
__device__ __forceinline__ float gemm_epilogue(float v, int z, int r, int c) {
    v = v;
    return v;
}


// where the 16-byte chunk c (0-7) of row r of a swizzled tile lies: bits 4-6 of its address XOR bits 7-9
__device__ __forceinline__ int gemm_swz(int r, int c) { return (c ^ r) & 7; }

extern "C" __global__ void __launch_bounds__(384, 1) gemm_bf16_bf16_none_1x4096x4096x4096_tma128x256x64x2x1x4(const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, bf16_t* __restrict__ C, const __grid_constant__ TmaMap tma_a, const __grid_constant__ TmaMap tma_b) {
    constexpr int M = 4096, N = 4096, K = 4096;
    constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, THREADS = 384;
    constexpr int WG_N = 1, WARPGROUP_M = BM / 2, WARPGROUP_N = BN / WG_N;
    constexpr int MI = WARPGROUP_M / 64, NI = WARPGROUP_N / 8, EL = 8, ROW = BK, KS = 16;
    constexpr unsigned ROW_BYTES = 128, ATOM = 1024;
    constexpr int KT = (K + BK - 1) / BK;
    // tiles start on 1024-byte atoms: the swizzle is a function of the shared address
    extern __shared__ __align__(16) unsigned char gemm_smem[];
    bf16_t* const sA = (bf16_t*)(gemm_smem + ((ATOM - (smem_addr(gemm_smem) & (ATOM - 1))) & (ATOM - 1)));
    bf16_t* const sB = sA + STAGES * BM * BK;
    constexpr int CONSUMERS = 2, BOX = ROW_BYTES / sizeof(bf16_t);
    constexpr unsigned STAGE_BYTES = (BM + BN) * BK * sizeof(bf16_t);
    unsigned long long* const full = (unsigned long long*)(sB + STAGES * BK * BN);   // a stage's tiles have landed
    unsigned long long* const empty = full + STAGES;     // every consumer warp is done with a stage
    const int tid = threadIdx.x, lane = tid & 31, warpgroup = tid >> 7, warp = (tid >> 5) & 3;
    // one flat grid: groups of GROUP tile rows, each walked column by column (a wave's blocks share GROUP
    // row panels of A and a few column panels of B), then the next group, then batch
    constexpr int TILES_N = (N + BN - 1) / BN, TILES_M = (M + BM - 1) / BM;
    constexpr int GROUP = 16;
    const int z = blockIdx.x / (TILES_N * TILES_M), in_batch = blockIdx.x % (TILES_N * TILES_M);
    const int first = in_batch / (GROUP * TILES_N) * GROUP, in_group = in_batch % (GROUP * TILES_N);
    const int rows = TILES_M - first < GROUP ? TILES_M - first : GROUP;   // the last group may be short
    const int m0 = (first + in_group % rows) * BM, n0 = in_group / rows * BN;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4 * CONSUMERS);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (warpgroup == CONSUMERS) {     // the producer warpgroup: its first thread issues every copy
        setmaxnreg_dec<40>();   // registers: the producer needs few
        if (tid == CONSUMERS * 128) {
            for (int kt = 0; kt < KT; ++kt) {
                const int s = kt % STAGES, k0 = kt * BK;
                if (kt >= STAGES) mbar_wait(&empty[s], (kt / STAGES - 1) & 1);   // tile kt - STAGES's MMAs retired
                mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
                bf16_t* dA = sA + s * BM * BK;
                bf16_t* dB = sB + s * BK * BN;
                tma_load_2d(dA, &tma_a, k0, m0, &full[s]);
                for (int b = 0; b < BN / BOX; ++b)   // 64-wide blocks, BK rows apart
                    tma_load_2d(dB + b * BK * BOX, &tma_b, n0 + b * BOX, k0, &full[s]);
            }
        }
        return;
    }
    setmaxnreg_inc<232>();   // registers: to the consumers
    const int wm0 = (warpgroup / WG_N) * WARPGROUP_M, wn0 = (warpgroup % WG_N) * WARPGROUP_N;

    float acc[MI][NI][4];
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;


    for (int kt = 0; kt < KT; ++kt) {
        const int s = kt % STAGES;
        mbar_wait(&full[s], (kt / STAGES) & 1);            // tile kt has landed
        const bf16_t* cA = sA + s * BM * BK;
        const bf16_t* cB = sB + s * BK * BN;
        wgmma_hold<MI * NI * 4>(&acc[0][0][0]);
        wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < BK / KS; ++ks)
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                wgmma_m64n256k16_bf16<0, 1>(&acc[i][0][0], wgmma_desc(cA + (wm0 + i * 64) * ROW + ks * KS, 16, ATOM), wgmma_desc(cB + wn0 / 64 * BK * ROW + ks * KS * ROW, BK * ROW_BYTES, ATOM));
        wgmma_commit();
        wgmma_wait<1>();                                    // tile kt - 1's MMAs are done; tile kt's run on
        wgmma_hold<MI * NI * 4>(&acc[0][0][0]);
        if (kt > 0 && lane == 0) mbar_arrive(&empty[(kt - 1) % STAGES]);
    }
    wgmma_wait<0>();
    wgmma_hold<MI * NI * 4>(&acc[0][0][0]);   // the epilogue reads them after the wait, not before

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
