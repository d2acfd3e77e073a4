// gemm(f8e4m3[2048,1024], f8e4m3[1024,4096], bf16[4096], activation='gelu', dtype=<DType.bfloat16: 'bfloat16'>, has_bias=True, scale=1.0) -> bf16[2048,4096]
// kernel kind gemm, fused ['bias', 'gelu', 'cast'], schedule bm=128 bn=128 bk=64 warps_m=2 warps_n=4 stages=3, H100-SXM
// launch: gemm_f8e4m3_bf16_gelu_b_1x2048x4096x1024_128x128x64x2x4x3<<<512, 256>>> (a 1-d grid of resources().blocks, no dynamic shared memory)
// arguments: const fp8_t* __restrict__ A, const fp8_t* __restrict__ B, const bf16_t* __restrict__ bias, bf16_t* __restrict__ C
__device__ __forceinline__ long long gemm_boff_a(int z) { return 0LL; }
__device__ __forceinline__ long long gemm_boff_b(int z) { return 0LL; }
__device__ __forceinline__ long long gemm_boff_c(int z) { return 0LL; }
__device__ __forceinline__ long long gemm_boff_bias(int z) { return 0LL; }
__device__ __forceinline__ long long gemm_idx_bias(int z, int r, int c) { return gemm_boff_bias(z) + (long long)r * 0 + (long long)c * 1; }
__device__ __forceinline__ float gemm_epilogue(float v, int z, int r, int c, const bf16_t* __restrict__ bias) {
    v += bf16_to_f32(bias[gemm_idx_bias(z, r, c)]); v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    return v;
}

template <bool VECTOR>
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
}
__device__ __forceinline__ void gemm_transpose4x4(unsigned r0, unsigned r1, unsigned r2, unsigned r3, unsigned* out) {
    const unsigned lo01 = __byte_perm(r0, r1, 0x5140), hi01 = __byte_perm(r0, r1, 0x7362);
    const unsigned lo23 = __byte_perm(r2, r3, 0x5140), hi23 = __byte_perm(r2, r3, 0x7362);
    out[0] = __byte_perm(lo01, lo23, 0x5410); out[1] = __byte_perm(lo01, lo23, 0x7632);
    out[2] = __byte_perm(hi01, hi23, 0x5410); out[3] = __byte_perm(hi01, hi23, 0x7632);
}
// XOR swizzle of 16-byte chunks: the rows one fragment read touches land in distinct bank groups
__device__ __forceinline__ int gemm_swz_a(int r, int c) { return c ^ ((r / 2) & 3); }
__device__ __forceinline__ int gemm_swz_b(int r, int c) { return c ^ ((r / 2) & 3); }

extern "C" __global__ void __launch_bounds__(256) gemm_f8e4m3_bf16_gelu_b_1x2048x4096x1024_128x128x64x2x4x3(const fp8_t* __restrict__ A, const fp8_t* __restrict__ B, const bf16_t* __restrict__ bias, bf16_t* __restrict__ C) {
    constexpr int M = 2048, N = 4096, K = 1024;
    constexpr int BM = 128, BN = 128, BK = 64, STAGES = 3, THREADS = 256;
    constexpr int WARP_M = 64, WARP_N = 32, WARPS_N = 4;
    constexpr int MI = WARP_M / 16, NI = WARP_N / 8, CA = 4, CB = 4, EL = 16;
    constexpr int KT = (K + BK - 1) / BK;
    __shared__ __align__(128) fp8_t sA[STAGES * BM * BK];
    __shared__ __align__(128) fp8_t sB[STAGES * BK * BN];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / WARPS_N) * WARP_M, wn0 = (warp % WARPS_N) * WARP_N;
    // one flat grid: column tiles fastest (blocks sharing an A row panel run together), then rows, then batch
    constexpr int TILES_N = (N + BN - 1) / BN, TILES_M = (M + BM - 1) / BM;
    const int n0 = (blockIdx.x % TILES_N) * BN, m0 = (blockIdx.x / TILES_N % TILES_M) * BM;
    const int z = blockIdx.x / (TILES_N * TILES_M);
    const fp8_t* Ab = A + gemm_boff_a(z);
    const fp8_t* Bb = B + gemm_boff_b(z);

    // one k-tile into one stage; chunks past M, N or K are zero-filled (0 valid bytes)
    auto load_tile = [&](int stage, int kt) {
        const int k0 = kt * BK;
        fp8_t* dA = sA + stage * BM * BK;
        #pragma unroll
        for (int i = 0; i < BM * CA / THREADS; ++i) {
            const int id = tid + i * THREADS, r = id / CA, c = id % CA, kv = K - (k0 + c * EL);
            const bool ok = m0 + r < M && kv > 0;
            cp_async_16(dA + r * BK + gemm_swz_a(r, c) * EL, ok ? Ab + (m0 + r) * K + k0 + c * EL : Ab, ok ? 16 : 0);
        }
    };
    // B stored [K, N]: units of 4 k-rows x 16 columns pass through registers, transposed
    constexpr int UNITS_B = BN * BK / 64, UB = (UNITS_B + THREADS - 1) / THREADS;
    unsigned rb[UB][16];
    auto fetch_b = [&](int kt) {
        #pragma unroll
        for (int u = 0; u < UB; ++u) {
            const int id = tid + u * THREADS, kq = id % (BK / 4), q = id / (BK / 4);
            const int k = kt * BK + 4 * kq, cv = N - (n0 + 16 * q);
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                const bool ok = id < UNITS_B && k + j < K && cv > 0;
                gemm_fetch16<true>(rb[u] + 4 * j, ok ? Bb + (long long)(k + j) * N + n0 + 16 * q : Bb, ok ? cv : 0);
            }
        }
    };
    auto stash_b = [&](int stage) {
        fp8_t* dB = sB + stage * BK * BN;
        #pragma unroll
        for (int u = 0; u < UB; ++u) {
            const int id = tid + u * THREADS, kq = id % (BK / 4), q = id / (BK / 4);
            if (id >= UNITS_B) continue;
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                unsigned col[4];
                gemm_transpose4x4(rb[u][e], rb[u][4 + e], rb[u][8 + e], rb[u][12 + e], col);
                #pragma unroll
                for (int i = 0; i < 4; ++i) {   // column 16q + 4e + i is row r of the k-major tile
                    const int r = 16 * q + 4 * e + i;
                    *(unsigned*)(dB + r * BK + gemm_swz_b(r, kq / 4) * EL + 4 * (kq % 4)) = col[i];
                }
            }
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
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < KT) { load_tile(st, st); fetch_b(st); stash_b(st); }
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();   // tile kt has landed
        __syncthreads();               // and every warp is done with the stage refilled next
        const int next = kt + STAGES - 1;
        if (next < KT) { load_tile(next % STAGES, next); fetch_b(next); }
        cp_async_commit();
        const fp8_t* cA = sA + (kt % STAGES) * BM * BK;
        const fp8_t* cB = sB + (kt % STAGES) * BK * BN;
        #pragma unroll
        for (int ks = 0; ks < BK / 32; ++ks) {
            unsigned af[MI][4], bf[NI][2];
            #pragma unroll
            for (int i = 0; i < MI; ++i) {   // x4: rows 0-7 / 8-15 of chunks 2ks and 2ks+1, as the mma lays A out
                const int r = wm0 + i * 16 + (lane & 15), c = ks * 2 + (lane >> 4);
                ldmatrix_x4(af[i], cA + r * BK + gemm_swz_a(r, c) * EL);
            }
            #pragma unroll
            for (int j = 0; j < NI; j += 2) {   // x4 of n-rows: (n 0-7, k-chunk 2ks), (0-7, 2ks+1), (8-15, 2ks), (8-15, 2ks+1)
                const int r = wn0 + j * 8 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
                unsigned q[4];
                ldmatrix_x4(q, cB + r * BK + gemm_swz_b(r, c) * EL);
                bf[j][0] = q[0]; bf[j][1] = q[1]; bf[j + 1][0] = q[2]; bf[j + 1][1] = q[3];
            }
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NI; ++j) mma_e4m3_16832(acc[i][j], af[i], bf[j]);
        }
        if (next < KT) { stash_b(next % STAGES); }   // after the math: its loads had it to land
    }
    cp_async_wait<0>();

    // accumulator (i, j, e): row group lane/4 (+8 for e >= 2), column pair 2*(lane%4)
    const long long cz = gemm_boff_c(z);
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = m0 + wm0 + i * 16 + h * 8 + (lane >> 2);
                const int c = n0 + wn0 + j * 8 + (lane & 3) * 2;
                if (r < M && c < N) {
                    const long long o = cz + (long long)r * N + c;
                    const float v0 = gemm_epilogue(acc[i][j][2 * h + 0], z, r, c + 0, bias), v1 = gemm_epilogue(acc[i][j][2 * h + 1], z, r, c + 1, bias);
                    *(unsigned*)(C + o) = pack_bf16x2(v0, v1);
                }
            }
}
