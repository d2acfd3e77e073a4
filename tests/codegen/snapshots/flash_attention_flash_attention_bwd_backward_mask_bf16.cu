// flash_attention_bwd(bf16[2,4,1024,64], bf16[2,4,1024,64], bf16[2,4,1024,64], bf16[2,4,1024,64], f32[2,4,1024,2], bool[2,1,1024,1024], has_mask=True, scale=0.125) -> bf16[1572864]
// schedule: rows=64 cols=64 warps=4 stages=2 dq=jobs
// launch: flash_attention_bwd_bf16_d64_mask_r64_c64_w4_s2<<<256, 128, 49152>>>(q, k, v, do, stats, mask, out); dynamic shared memory 49152 bytes
// out = [dQ | dK | dV], each [B·H][S][D]; blocks per head: the dK/dV jobs, then the dQ jobs

// element offset of (row, col) in a [rows][width] shared tile whose 16-byte chunks are XOR-swizzled
// by row, so the 8 row addresses of one ldmatrix land in different bank groups: within aligned groups
// of 8 chunks where the row has whole ones (64-value rows), else of 4 or 2 (a head dim of 96, 80),
// so a chunk never leaves its row
__device__ __forceinline__ int fa_swizzle(int row, int col, int width) {
    const int chunks = width >> 3, group = chunks % 8 == 0 ? 8 : chunks % 4 == 0 ? 4 : chunks % 2 == 0 ? 2 : 1;
    return row * width + (((col >> 3) ^ (row & (group - 1))) << 3) + (col & 7);
}

// rows [0, valid) of a [ROWS][WIDTH] global tile into swizzled shared memory; later rows read as zero
template <int ROWS, int WIDTH, int THREADS>
__device__ __forceinline__ void fa_load_tile(unsigned short* dst, const unsigned short* src, int valid, int tid) {
    constexpr int CHUNKS = ROWS * WIDTH / 8;
    #pragma unroll
    for (int it = 0; it < (CHUNKS + THREADS - 1) / THREADS; ++it) {
        const int c = it * THREADS + tid;
        if (CHUNKS % THREADS == 0 || c < CHUNKS) {
            const int r = c / (WIDTH / 8), col = (c % (WIDTH / 8)) * 8;
            // a zero-byte copy reads nothing, so a row past `valid` may point past the tensor
            cp_async_16(dst + fa_swizzle(r, col, WIDTH), src + r * WIDTH + col, r < valid ? 16 : 0);
        }
    }
}


constexpr bool HAS_MASK = true;
constexpr long long MASK_ROW = 1024, MASK_COL = 1;
__device__ __forceinline__ float fab_mask(const unsigned char* mp, int query, int key) {
    constexpr float LOG2E = 1.4426950408889634f;
    const unsigned char mv = mp[query * MASK_ROW + key * MASK_COL];
    return mv ? 0.f : __int_as_float(0xff800000);                                    // -inf where a bool mask is false
}

constexpr int ROWS = 64, COLS = 64, D = 64, WARPS = 4, STAGES = 2, THREADS = 32 * WARPS;
constexpr int SQ = 1024, SK = 1024, BH = 8;
constexpr int NKB = (SK + ROWS - 1) / ROWS, NQB = (SQ + ROWS - 1) / ROWS;
constexpr int NQT = (SQ + COLS - 1) / COLS, NKT = (SK + COLS - 1) / COLS;
constexpr float SCALE = 0.125f, SCALE_LOG2 = 0.18033688011112042f, LOG2E = 1.4426950408889634f;
constexpr bool CAUSAL = false;
constexpr long long NQ = (long long)BH * SQ * D, NK = (long long)BH * SK * D;

__device__ __forceinline__ void fab_zero(float (*acc)[4], int n) {
    for (int i = 0; i < n; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}

// Two products sharing their B tiles' rows: x = A_x Bᵀ and y = A_y Cᵀ over D, for this warp's 16
// rows of a_s / c_s (A fragments) against the COLS rows of the tiles bt / ct (B fragments)
__device__ __forceinline__ void fab_scores(float (*x)[4], float (*y)[4], const bf16_t* a_s, const bf16_t* c_s,
                                           const bf16_t* bt, const bf16_t* ct, int warp, int lane) {
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned xa[4], ya[4];
        ldmatrix_x4(xa, a_s + fa_swizzle(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8, D));
        ldmatrix_x4(ya, c_s + fa_swizzle(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8, D));
        #pragma unroll
        for (int j = 0; j < COLS / 16; ++j) {
            const int at = fa_swizzle(j * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + ((lane >> 3) & 1) * 8, D);
            unsigned b[4];
            ldmatrix_x4(b, bt + at);
            mma_bf16_16816(x[2 * j], xa, b);
            mma_bf16_16816(x[2 * j + 1], xa, b + 2);
            ldmatrix_x4(b, ct + at);
            mma_bf16_16816(y[2 * j], ya, b);
            mma_bf16_16816(y[2 * j + 1], ya, b + 2);
        }
    }
}

// acc += P t over the tile's COLS rows: P's accumulators repacked as A fragments, t's rows through
// transposed ldmatrix as B fragments (D output columns)
__device__ __forceinline__ void fab_accumulate(float (*acc)[4], const float (*p)[4], const bf16_t* t, int lane) {
    #pragma unroll
    for (int kk = 0; kk < COLS / 16; ++kk) {
        const unsigned a[4] = {pack_bf16x2(p[2 * kk][0], p[2 * kk][1]), pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                               pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        #pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            unsigned b[4];
            ldmatrix_x4_trans(b, t + fa_swizzle(kk * 16 + (lane & 15), n * 16 + (lane >> 4) * 8, D));
            mma_bf16_16816(acc[2 * n], a, b);
            mma_bf16_16816(acc[2 * n + 1], a, b + 2);
        }
    }
}

// this warp's 16 rows of acc · factor, rows from `row0`, below `rows`, as bf16_t into dst [rows][D]
__device__ __forceinline__ void fab_store(const float (*acc)[4], float factor, bf16_t* dst, int row0, int rows, int lane) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + (lane >> 2) + 8 * h;
        if (row < rows) {
            #pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *(unsigned*)(dst + (long long)row * D + n * 8 + 2 * (lane & 3)) =
                    pack_bf16x2(acc[n][2 * h] * factor, acc[n][2 * h + 1] * factor);
        }
    }
}

// ROWS keys from kr0: dV = Σ Pᵀ dO and dK = scale Σ dSᵀ Q over the query tiles (this head's pointers);
// in the form without dQ blocks they also add each tile's dS K share into dQ's sum
__device__ __forceinline__ void fab_dk_dv(const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* dout,
                                          const float* st, const unsigned char* mp, bf16_t* dk_out, bf16_t* dv_out, int kr0,
                                          unsigned char* smem) {
    bf16_t* k_s = (bf16_t*)smem;                            // [ROWS][D]
    bf16_t* v_s = k_s + ROWS * D;                          // [ROWS][D]
    bf16_t* q_s = v_s + ROWS * D;                          // [STAGES][COLS][D]
    bf16_t* o_s = q_s + STAGES * COLS * D;                 // [STAGES][COLS][D], dO
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int key0 = kr0 + warp * 16;
    const int t0 = CAUSAL ? kr0 / COLS : 0;               // earlier query tiles see none of these keys
    fa_load_tile<ROWS, D, THREADS>(k_s, k + (long long)kr0 * D, SK - kr0, tid);
    fa_load_tile<ROWS, D, THREADS>(v_s, v + (long long)kr0 * D, SK - kr0, tid);
    cp_async_commit();
    #pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        const int t = t0 + i;
        if (t < NQT) {
            fa_load_tile<COLS, D, THREADS>(q_s + i * COLS * D, q + (long long)t * COLS * D, SQ - t * COLS, tid);
            fa_load_tile<COLS, D, THREADS>(o_s + i * COLS * D, dout + (long long)t * COLS * D, SQ - t * COLS, tid);
        }
        cp_async_commit();
    }
    float dk[D / 8][4], dv[D / 8][4];
    fab_zero(dk, D / 8);
    fab_zero(dv, D / 8);
    for (int t = t0; t < NQT; ++t) {
        const int i = t - t0, next = t + STAGES - 1;
        if (next < NQT) {
            const int st_next = (i + STAGES - 1) % STAGES;
            fa_load_tile<COLS, D, THREADS>(q_s + st_next * COLS * D, q + (long long)next * COLS * D, SQ - next * COLS, tid);
            fa_load_tile<COLS, D, THREADS>(o_s + st_next * COLS * D, dout + (long long)next * COLS * D, SQ - next * COLS, tid);
        }
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const bf16_t* qt = q_s + (i % STAGES) * COLS * D;
        const bf16_t* ot = o_s + (i % STAGES) * COLS * D;
        const int c0 = t * COLS;
        float s[COLS / 8][4], dp[COLS / 8][4];            // Sᵀ and dPᵀ: rows are keys, columns queries
        fab_zero(s, COLS / 8);
        fab_zero(dp, COLS / 8);
        fab_scores(s, dp, k_s, v_s, qt, ot, warp, lane);
        #pragma unroll
        for (int j = 0; j < COLS / 8; ++j)
            #pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = c0 + j * 8 + 2 * t4 + e;
                const bool in = col < SQ;
                const float lse2 = in ? st[2 * col] * LOG2E : 0.f, delta = in ? st[2 * col + 1] : 0.f;
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int key = key0 + g + 8 * h;
                    float x = s[j][2 * h + e] * SCALE_LOG2;
                    if (HAS_MASK && in && key < SK) x += fab_mask(mp, col, key);
                    float p = exp2_approx(x - lse2);
                    if (!in || key >= SK || (CAUSAL && key > col)) p = 0.f;
                    s[j][2 * h + e] = p;
                    dp[j][2 * h + e] = p * (dp[j][2 * h + e] - delta);
                }
            }
        fab_accumulate(dv, s, ot, lane);
        fab_accumulate(dk, dp, qt, lane);
        __syncthreads();                                  // the stage is refilled next iteration
    }
    fab_store(dk, SCALE, dk_out, key0, SK, lane);
    fab_store(dv, 1.f, dv_out, key0, SK, lane);
}

// ROWS queries from qr0: dQ = scale Σ dS K over the key tiles (this head's pointers)
__device__ __forceinline__ void fab_dq(const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* dout,
                                       const float* st, const unsigned char* mp, bf16_t* dq_out, int qr0, unsigned char* smem) {
    bf16_t* q_s = (bf16_t*)smem;                            // [ROWS][D]
    bf16_t* o_s = q_s + ROWS * D;                          // [ROWS][D], dO
    bf16_t* k_s = o_s + ROWS * D;                          // [STAGES][COLS][D]
    bf16_t* v_s = k_s + STAGES * COLS * D;                 // [STAGES][COLS][D]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int row0 = qr0 + warp * 16;
    const int n_tiles = CAUSAL ? min(NKT, (qr0 + ROWS + COLS - 1) / COLS) : NKT;
    fa_load_tile<ROWS, D, THREADS>(q_s, q + (long long)qr0 * D, SQ - qr0, tid);
    fa_load_tile<ROWS, D, THREADS>(o_s, dout + (long long)qr0 * D, SQ - qr0, tid);
    cp_async_commit();
    #pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < n_tiles) {
            fa_load_tile<COLS, D, THREADS>(k_s + t * COLS * D, k + (long long)t * COLS * D, SK - t * COLS, tid);
            fa_load_tile<COLS, D, THREADS>(v_s + t * COLS * D, v + (long long)t * COLS * D, SK - t * COLS, tid);
        }
        cp_async_commit();
    }
    float lse2[2], delta[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + g + 8 * h;
        lse2[h] = row < SQ ? st[2 * row] * LOG2E : 0.f;
        delta[h] = row < SQ ? st[2 * row + 1] : 0.f;
    }
    float dq[D / 8][4];
    fab_zero(dq, D / 8);
    for (int t = 0; t < n_tiles; ++t) {
        const int next = t + STAGES - 1;
        if (next < n_tiles) {
            fa_load_tile<COLS, D, THREADS>(k_s + (next % STAGES) * COLS * D, k + (long long)next * COLS * D, SK - next * COLS, tid);
            fa_load_tile<COLS, D, THREADS>(v_s + (next % STAGES) * COLS * D, v + (long long)next * COLS * D, SK - next * COLS, tid);
        }
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const bf16_t* kt = k_s + (t % STAGES) * COLS * D;
        const bf16_t* vt = v_s + (t % STAGES) * COLS * D;
        const int k0 = t * COLS;
        float s[COLS / 8][4], dp[COLS / 8][4];            // S and dP: rows are queries, columns keys
        fab_zero(s, COLS / 8);
        fab_zero(dp, COLS / 8);
        fab_scores(s, dp, q_s, o_s, kt, vt, warp, lane);
        #pragma unroll
        for (int j = 0; j < COLS / 8; ++j)
            #pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = k0 + j * 8 + 2 * t4 + e;
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = row0 + g + 8 * h;
                    float x = s[j][2 * h + e] * SCALE_LOG2;
                    if (HAS_MASK && row < SQ && key < SK) x += fab_mask(mp, row, key);
                    float p = exp2_approx(x - lse2[h]);
                    if (key >= SK || (CAUSAL && key > row)) p = 0.f;
                    dp[j][2 * h + e] = p * (dp[j][2 * h + e] - delta[h]);
                }
            }
        fab_accumulate(dq, dp, kt, lane);
        __syncthreads();
    }
    fab_store(dq, SCALE, dq_out, row0, SQ, lane);
}

extern "C" __global__ void __launch_bounds__(THREADS)
flash_attention_bwd_bf16_d64_mask_r64_c64_w4_s2(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
      const bf16_t* __restrict__ dout, const float* __restrict__ stats, const unsigned char* __restrict__ mask, bf16_t* __restrict__ out) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    const int bh = blockIdx.x / (NKB + NQB), job = blockIdx.x % (NKB + NQB);
    const long long q_off = (long long)bh * SQ * D, k_off = (long long)bh * SK * D;
    const float* st = stats + (long long)bh * SQ * 2;
    long long m_off = 0;
    {  int rem = bh, i;
        i = rem % 4; rem /= 4; 
        i = rem % 2; rem /= 2; m_off += (long long)i * 1048576;
    }
    const unsigned char* mp = mask + m_off;
    if (job < NKB)
        fab_dk_dv(q + q_off, k + k_off, v + k_off, dout + q_off, st, mp, out + NQ + k_off, out + NQ + NK + k_off,
                  job * ROWS, fa_smem);
    else
        fab_dq(q + q_off, k + k_off, v + k_off, dout + q_off, st, mp, out + q_off, (job - NKB) * ROWS, fa_smem);
}
