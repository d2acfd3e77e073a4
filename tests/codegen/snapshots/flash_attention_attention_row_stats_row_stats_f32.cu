// attention_row_stats(bf16[2,4,1024,64], bf16[2,4,1024,64], bf16[2,4,1024,64], bf16[2,4,1024,64], scale=0.125) -> f32[2,4,1024,2]
// schedule: rows=64 cols=64 warps=4 stages=2
// launch: attention_row_stats_bf16_d64_r64_c64_w4_s2<<<128, 128, 24576>>>(q, k, o, do, stats); dynamic shared memory 24576 bytes
// contiguous row-major operands of one batch; stats [B·H][Sq][2] fp32

// element offset of (row, col) in a [rows][width] shared tile whose 16-byte chunks are XOR-swizzled
// by row, so the 8 row addresses of one ldmatrix land in different bank groups: within aligned groups
// of 8 chunks where the row has whole ones (64-value rows), else of 4 or 2 (a head dim of 96, 80),
// so a chunk never leaves its row
__device__ __forceinline__ int fa_swizzle(int row, int col, int width) {
    const int chunks = width >> 3, group = chunks % 8 == 0 ? 8 : chunks % 4 == 0 ? 4 : chunks % 2 == 0 ? 2 : 1;
    return row * width + (((col >> 3) ^ (row & (group - 1))) << 3) + (col & 7);
}

// rows [0, valid) of a [ROWS][WIDTH] global tile, its rows SRC_ROW elements apart, into swizzled
// shared memory; later rows read as zero
template <int ROWS, int WIDTH, int THREADS, int SRC_ROW = WIDTH>
__device__ __forceinline__ void fa_load_tile(unsigned short* dst, const unsigned short* src, int valid, int tid) {
    constexpr int CHUNKS = ROWS * WIDTH / 8;
    #pragma unroll
    for (int it = 0; it < (CHUNKS + THREADS - 1) / THREADS; ++it) {
        const int c = it * THREADS + tid;
        if (CHUNKS % THREADS == 0 || c < CHUNKS) {
            const int r = c / (WIDTH / 8), col = (c % (WIDTH / 8)) * 8;
            // a zero-byte copy reads nothing, so a row past `valid` may point past the tensor
            cp_async_16(dst + fa_swizzle(r, col, WIDTH), src + r * SRC_ROW + col, r < valid ? 16 : 0);
        }
    }
}


constexpr bool HAS_MASK = false;
constexpr long long MASK_ROW = 0, MASK_COL = 0;
__device__ __forceinline__ float fab_mask(const float* mp, int query, int key) {
    constexpr float LOG2E = 1.4426950408889634f;
    const float mv = mp[query * MASK_ROW + key * MASK_COL];
    return 0.f;                                    // -inf where a bool mask is false
}

extern "C" __global__ void __launch_bounds__(4 * 32)
attention_row_stats_bf16_d64_r64_c64_w4_s2(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ o,
      const bf16_t* __restrict__ dout,  float* __restrict__ stats) {
    constexpr int BM = 64, BN = 64, D = 64, WARPS = 4, STAGES = 2, THREADS = 32 * WARPS;
    constexpr int SQ = 1024, SK = 1024, NQB = (SQ + BM - 1) / BM, NKT = (SK + BN - 1) / BN;
    constexpr float SCALE_LOG2 = 0.18033688011112042f;             // scores in base 2: scale · log2(e)
    constexpr float LN2 = 0.6931471805599453f;
    constexpr bool CAUSAL = false;
    constexpr int WINDOW = 0;                       // row i keeps keys i - WINDOW + 1 .. i (0: all to i)
    const float NEG_INF = __int_as_float(0xff800000);

    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16_t* q_s = (bf16_t*)fa_smem;                         // [BM][D]
    bf16_t* k_s = q_s + BM * D;                            // [STAGES][BN][D]

    // a head's query blocks side by side, causal ones longest first (as the forward kernels)
    const int qb = CAUSAL ? NQB - 1 - (int)(blockIdx.x % NQB) : (int)(blockIdx.x % NQB), bh = blockIdx.x / NQB;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;               // mma fragment: row in 8, column pair in 4
    const int q0 = qb * BM, row0 = q0 + warp * 16;
    const long long q_off = (long long)bh * SQ * D;
    const float* mp = nullptr;
    // causal stops at the block's last row; a window starts at key key0, where its first row's band does
    const int end_tile = CAUSAL ? min(NKT, (q0 + BM + BN - 1) / BN) : NKT;
    const int key0 = WINDOW ? min(max(0, q0 - WINDOW + 1) / BN, end_tile - 1) * BN : 0;
    const int n_tiles = end_tile - key0 / BN;
    const bf16_t* kp = k + (long long)bh * SK * D + (long long)key0 * D;

    fa_load_tile<BM, D, THREADS>(q_s, q + q_off + (long long)q0 * D, SQ - q0, tid);
    cp_async_commit();
    #pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < n_tiles)
            fa_load_tile<BN, D, THREADS>(k_s + t * BN * D, kp + (long long)t * BN * D, SK - key0 - t * BN, tid);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 1>();
    __syncthreads();

    unsigned qf[D / 16][4];
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk], q_s + fa_swizzle(row0 - q0 + (lane & 15), kk * 16 + (lane >> 4) * 8, D));
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.f, 0.f};

    for (int t = 0; t < n_tiles; ++t) {
        const int next = t + STAGES - 1;
        if (next < n_tiles)
            fa_load_tile<BN, D, THREADS>(k_s + (next % STAGES) * BN * D, kp + (long long)next * BN * D,
                                         SK - key0 - next * BN, tid);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const bf16_t* kt = k_s + (t % STAGES) * BN * D;
        const int k0 = key0 + t * BN;
        float s[BN / 8][4];
        #pragma unroll
        for (int j = 0; j < BN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            #pragma unroll
            for (int j = 0; j < BN / 16; ++j) {
                unsigned b[4];
                ldmatrix_x4(b, kt + fa_swizzle(j * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + ((lane >> 3) & 1) * 8, D));
                mma_bf16_16816(s[2 * j], qf[kk], b);
                mma_bf16_16816(s[2 * j + 1], qf[kk], b + 2);
            }
        const bool edge = (k0 + BN > SK) || (CAUSAL && k0 + BN - 1 > row0) || (WINDOW && k0 <= row0 + 15 - WINDOW);
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + g + 8 * h;
            float mx = NEG_INF;
            #pragma unroll
            for (int j = 0; j < BN / 8; ++j)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = k0 + j * 8 + 2 * t4 + e;
                    float x = s[j][2 * h + e] * SCALE_LOG2;
                    if (HAS_MASK && row < SQ && col < SK) x += fab_mask(mp, row, col);
                    if (edge && (col >= SK || (CAUSAL && col > row) || (WINDOW && col <= row - WINDOW))) x = NEG_INF;
                    s[j][2 * h + e] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the 4 lanes of a quad share a row
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run[h], mx);
            const float base = m_new == NEG_INF ? 0.f : m_new;
            float sum = 0.f;
            #pragma unroll
            for (int j = 0; j < BN / 8; ++j) sum += exp2_approx(s[j][2 * h] - base) + exp2_approx(s[j][2 * h + 1] - base);
            l_run[h] = l_run[h] * exp2_approx(m_run[h] - base) + sum;
            m_run[h] = m_new;
        }
        __syncthreads();                                  // the stage is refilled next iteration
    }

    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = l_run[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = row0 + g + 8 * h;
        if (t4 == 0 && row < SQ) stats[((long long)bh * SQ + row) * 2] = (m_run[h] + log2f(l)) * LN2;
    }
    // D = Σ_d dO·O for this warp's 16 rows, two elements per lane per step
    for (int r = 0; r < 16; ++r) {
        const int row = row0 + r;
        if (row >= SQ) break;                             // the same for the whole warp
        const long long at = q_off + (long long)row * D;
        float sum = 0.f;
        #pragma unroll
        for (int c = 2 * lane; c < D; c += 64) {
            const unsigned ov = *(const unsigned*)(o + at + c), dv = *(const unsigned*)(dout + at + c);
            sum += bf16_to_f32((bf16_t)(ov & 0xffffu)) * bf16_to_f32((bf16_t)(dv & 0xffffu))
                 + bf16_to_f32((bf16_t)(ov >> 16)) * bf16_to_f32((bf16_t)(dv >> 16));
        }
        sum = warp_sum(sum);
        if (lane == 0) stats[((long long)bh * SQ + row) * 2 + 1] = sum;
    }
}
