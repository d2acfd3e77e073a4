// flash_attention(bf16[2,16,2048,128], bf16[2,16,2048,128], bf16[2,16,2048,128], causal=True, scale=0.08838834764831845) -> bf16[2,16,2048,128]
// schedule: bm=128 bn=64 warps=8 stages=2
// launch: flash_attention_bf16_d128_causal_bm128_bn64_w8_s2<<<512, 256, 98304>>>(q, k, v, out); dynamic shared memory 98304 bytes (raise cudaFuncAttributeMaxDynamicSharedMemorySize above 48 KB)
// rows of 128 contiguous values, 128, 128, 128, 128 apart in q, k, v, out; blocks are (batch·head, query block), query block fastest

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

extern "C" __global__ void __launch_bounds__(8 * 32)
flash_attention_bf16_d128_causal_bm128_bn64_w8_s2(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
      bf16_t* __restrict__ out) {
    constexpr int BM = 128, BN = 64, D = 128, WARPS = 8, STAGES = 2, THREADS = 32 * WARPS;
    constexpr int MT = BM / (16 * WARPS);                 // 16-row MMA tiles per warp
    constexpr int SQ = 2048, SK = 2048, NQB = (SQ + BM - 1) / BM, NKT = (SK + BN - 1) / BN;
    constexpr float SCALE_LOG2 = 0.12751743082459868f;             // the softmax runs in base 2: scale · log2(e)
    constexpr float LOG2E = 1.4426950408889634f;
    const float NEG_INF = __int_as_float(0xff800000);
    constexpr bool CAUSAL = true, HAS_MASK = false, MASK_BOOL = false;
    constexpr int WINDOW = 0;                       // row i keeps keys i - WINDOW + 1 .. i (0: all to i)
    constexpr long long MASK_ROW = 0, MASK_COL = 0;
    constexpr int Q_ROW = 128, K_ROW = 128, V_ROW = 128;   // elements from row to row
    constexpr long long O_ROW = 128;

    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16_t* q_s = (bf16_t*)fa_smem;                         // [BM][D]
    bf16_t* k_s = q_s + BM * D;                            // [STAGES][BN][D]
    bf16_t* v_s = k_s + STAGES * BN * D;                   // [STAGES][BN][D]

    // a head's query blocks run side by side (they share its K and V in L2); causal ones longest first,
    // so the short blocks fill the last wave
    const int qb = CAUSAL ? NQB - 1 - (int)(blockIdx.x % NQB) : (int)(blockIdx.x % NQB), bh = blockIdx.x / NQB;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;               // mma fragment: row in 8, column pair in 4
    long long q_off = 0, k_off = 0, v_off = 0, o_off = 0;
    {  int rem = bh, i;
        i = rem % 16; rem /= 16; q_off += (long long)i * 262144; k_off += (long long)i * 262144; v_off += (long long)i * 262144; o_off += (long long)i * 262144;
        i = rem % 2; rem /= 2; q_off += (long long)i * 4194304; k_off += (long long)i * 4194304; v_off += (long long)i * 4194304; o_off += (long long)i * 4194304;
    }
    const int q0 = qb * BM, row0 = q0 + warp * 16 * MT;
    // causal: key tiles past the block's last row are all masked, so they are never loaded; under a
    // window neither are those before its first row's band: the walk starts at key key0
    const int end_tile = CAUSAL ? min(NKT, (q0 + BM + BN - 1) / BN) : NKT;
    const int key0 = WINDOW ? min(max(0, q0 - WINDOW + 1) / BN, end_tile - 1) * BN : 0;
    const int n_tiles = end_tile - key0 / BN;
    const bf16_t* kp = k + k_off + (long long)key0 * K_ROW;
    const bf16_t* vp = v + v_off + (long long)key0 * V_ROW;
    const float* mp = nullptr;

    fa_load_tile<BM, D, THREADS, Q_ROW>(q_s, q + q_off + (long long)q0 * Q_ROW, SQ - q0, tid);
    cp_async_commit();
    #pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < n_tiles) {
            fa_load_tile<BN, D, THREADS, K_ROW>(k_s + t * BN * D, kp + (long long)t * BN * K_ROW, SK - key0 - t * BN,
                                                tid);
            fa_load_tile<BN, D, THREADS, V_ROW>(v_s + t * BN * D, vp + (long long)t * BN * V_ROW, SK - key0 - t * BN,
                                                tid);
        }
        cp_async_commit();
    }
    cp_async_wait<STAGES - 1>();                          // the Q group is complete
    __syncthreads();

    unsigned qf[MT][D / 16][4];                           // this warp's Q rows as mma A fragments
    #pragma unroll
    for (int m = 0; m < MT; ++m)
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            ldmatrix_x4(qf[m][kk], q_s + fa_swizzle(row0 - q0 + m * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8, D));

    float o[MT][D / 8][4];
    float m_run[MT][2], l_run[MT][2];                     // rows g and g + 8: running max (base 2), partial sum
    #pragma unroll
    for (int m = 0; m < MT; ++m) {
        #pragma unroll
        for (int n = 0; n < D / 8; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.f;
        m_run[m][0] = m_run[m][1] = NEG_INF;
        l_run[m][0] = l_run[m][1] = 0.f;
    }

    for (int t = 0; t < n_tiles; ++t) {
        const int next = t + STAGES - 1;
        if (next < n_tiles) {
            const int st = next % STAGES;
            fa_load_tile<BN, D, THREADS, K_ROW>(k_s + st * BN * D, kp + (long long)next * BN * K_ROW,
                                                SK - key0 - next * BN, tid);
            fa_load_tile<BN, D, THREADS, V_ROW>(v_s + st * BN * D, vp + (long long)next * BN * V_ROW,
                                                SK - key0 - next * BN, tid);
        }
        cp_async_commit();                                // an empty group keeps the wait count uniform
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const bf16_t* kt = k_s + (t % STAGES) * BN * D;
        const bf16_t* vt = v_s + (t % STAGES) * BN * D;
        const int k0 = key0 + t * BN;

        // S = Q Kᵀ; K's rows are Kᵀ's columns, so plain ldmatrix yields the B fragments
        float s[MT][BN / 8][4];
        #pragma unroll
        for (int m = 0; m < MT; ++m)
            #pragma unroll
            for (int j = 0; j < BN / 8; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            #pragma unroll
            for (int j = 0; j < BN / 16; ++j) {
                unsigned b[4];
                ldmatrix_x4(b, kt + fa_swizzle(j * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + ((lane >> 3) & 1) * 8, D));
                #pragma unroll
                for (int m = 0; m < MT; ++m) { mma_bf16_16816(s[m][2 * j], qf[m][kk], b); mma_bf16_16816(s[m][2 * j + 1], qf[m][kk], b + 2); }
            }

        // online softmax; only the ragged last tile and tiles crossing this warp's diagonal (or
        // its window's lower edge) need bounds
        const bool edge = (k0 + BN > SK) || (CAUSAL && k0 + BN - 1 > row0)
                          || (WINDOW && k0 <= row0 + 16 * MT - 1 - WINDOW);
        #pragma unroll
        for (int m = 0; m < MT; ++m)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + m * 16 + g + 8 * h;
                float mx = NEG_INF;
                #pragma unroll
                for (int j = 0; j < BN / 8; ++j)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int col = k0 + j * 8 + 2 * t4 + e;
                        float x = s[m][j][2 * h + e] * SCALE_LOG2;
                        if (HAS_MASK && row < SQ && col < SK) {
                            const float mv = mp[row * MASK_ROW + col * MASK_COL];
                            if (MASK_BOOL) x = mv ? x : NEG_INF;
                            else x += 0.f * LOG2E;
                        }
                        if (edge && (col >= SK || (CAUSAL && col > row) || (WINDOW && col <= row - WINDOW)))
                            x = NEG_INF;
                        s[m][j][2 * h + e] = x;
                        mx = fmaxf(mx, x);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the 4 lanes of a quad share a row
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m_run[m][h], mx);
                const float base = m_new == NEG_INF ? 0.f : m_new;   // no -inf - -inf while a row is all masked
                const float corr = exp2_approx(m_run[m][h] - base);
                m_run[m][h] = m_new;
                float sum = 0.f;
                #pragma unroll
                for (int j = 0; j < BN / 8; ++j)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float p = exp2_approx(s[m][j][2 * h + e] - base);
                        s[m][j][2 * h + e] = p;
                        sum += p;
                    }
                l_run[m][h] = l_run[m][h] * corr + sum;
                #pragma unroll
                for (int n = 0; n < D / 8; ++n) { o[m][n][2 * h] *= corr; o[m][n][2 * h + 1] *= corr; }
            }

        // O += P V: the S accumulators are already laid out as A fragments; V needs transposed ldmatrix
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            unsigned a[MT][4];
            #pragma unroll
            for (int m = 0; m < MT; ++m) {
                a[m][0] = pack_bf16x2(s[m][2 * kk][0], s[m][2 * kk][1]);
                a[m][1] = pack_bf16x2(s[m][2 * kk][2], s[m][2 * kk][3]);
                a[m][2] = pack_bf16x2(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
                a[m][3] = pack_bf16x2(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
            }
            #pragma unroll
            for (int n = 0; n < D / 16; ++n) {
                unsigned b[4];
                ldmatrix_x4_trans(b, vt + fa_swizzle(kk * 16 + (lane & 15), n * 16 + (lane >> 4) * 8, D));
                #pragma unroll
                for (int m = 0; m < MT; ++m) { mma_bf16_16816(o[m][2 * n], a[m], b); mma_bf16_16816(o[m][2 * n + 1], a[m], b + 2); }
            }
        }
        __syncthreads();                                  // the stage is refilled next iteration
    }

    #pragma unroll
    for (int m = 0; m < MT; ++m)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_run[m][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = 1.f / l;                    // 0 · inf = NaN for an all-masked row, as the reference
            const int row = row0 + m * 16 + g + 8 * h;
            if (row < SQ) {
                bf16_t* dst = out + o_off + (long long)row * O_ROW + 2 * t4;
                #pragma unroll
                for (int n = 0; n < D / 8; ++n)
                    *(unsigned*)(dst + n * 8) = pack_bf16x2(o[m][n][2 * h] * inv, o[m][n][2 * h + 1] * inv);
            }
        }
}
