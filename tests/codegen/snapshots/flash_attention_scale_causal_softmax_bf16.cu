// flash_attention(bf16[2,16,2048,128], bf16[2,16,2048,128], bf16[2,16,2048,128], causal=True, scale=0.08838834764831845) -> bf16[2,16,2048,128]
// schedule: wg bm=128 bn=128 warps=8 stages=3
// launch: flash_attention_wg_bf16_d128_causal_bm128_bn128_w8_s3<<<512, 256, 230400>>>(q, k, v, out); dynamic shared memory 230400 bytes (raise cudaFuncAttributeMaxDynamicSharedMemorySize above 48 KB)
// rows of 128 contiguous values, 128, 128, 128, 128 apart in q, k, v, out; blocks are (batch·head, query block), query block fastest

// rows [0, valid) of a [ROWS][D] global tile, its rows SRC_ROW elements apart, into shared memory
// in wgmma's 128-byte swizzled layout: [D / 64][ROWS][64], chunk c of a row's 64-value block at chunk
// (c ^ row) % 8; later rows read as zero
template <int ROWS, int D, int THREADS, int SRC_ROW = D>
__device__ __forceinline__ void fa_load_wg_tile(unsigned short* dst, const unsigned short* src, int valid, int tid) {
    constexpr int CHUNKS = ROWS * D / 8;
    #pragma unroll
    for (int it = 0; it < (CHUNKS + THREADS - 1) / THREADS; ++it) {
        const int c = it * THREADS + tid;
        if (CHUNKS % THREADS == 0 || c < CHUNKS) {
            const int r = c / (D / 8), cc = c % (D / 8);
            // a row past `valid` copies zero bytes from the tile's first row, inside the tensor
            cp_async_16(dst + (cc / 8) * ROWS * 64 + r * 64 + ((cc ^ r) & 7) * 8,
                        src + (r < valid ? r * SRC_ROW + cc * 8 : 0), r < valid ? 16 : 0);
        }
    }
}

extern "C" __global__ void __launch_bounds__(8 * 32, 1)
flash_attention_wg_bf16_d128_causal_bm128_bn128_w8_s3(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
      bf16_t* __restrict__ out) {
    constexpr int BM = 128, BN = 128, D = 128, WARPS = 8, STAGES = 3, THREADS = 32 * WARPS;
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
    constexpr unsigned ATOM = 1024, ROW_BYTES = 128;
    static_assert(MT == 1 && WARPS % 4 == 0, "one 64-row slab per warpgroup");
    static_assert(STAGES >= 3, "tile t - 1's V is read while tile t + STAGES - 2 loads");

    // tiles start on 1024-byte atoms: the swizzle is a function of the shared address
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16_t* const q_s = (bf16_t*)(fa_smem + ((ATOM - (smem_addr(fa_smem) & (ATOM - 1))) & (ATOM - 1)));  // [D/64][BM][64]
    bf16_t* const k_s = q_s + BM * D;                      // [STAGES][D/64][BN][64]
    bf16_t* const v_s = k_s + STAGES * BN * D;             // [STAGES][D/64][BN][64]

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
    const int warpgroup = tid >> 7;

    fa_load_wg_tile<BM, D, THREADS, Q_ROW>(q_s, q + q_off + (long long)q0 * Q_ROW, SQ - q0, tid);
    cp_async_commit();
    #pragma unroll
    for (int t = 0; t < STAGES - 2; ++t) {
        if (t < n_tiles) {
            fa_load_wg_tile<BN, D, THREADS, K_ROW>(k_s + t * BN * D, kp + (long long)t * BN * K_ROW,
                                                   SK - key0 - t * BN, tid);
            fa_load_wg_tile<BN, D, THREADS, V_ROW>(v_s + t * BN * D, vp + (long long)t * BN * V_ROW,
                                                   SK - key0 - t * BN, tid);
        }
        cp_async_commit();
    }

    float o[MT][D / 8][4];
    float m_run[MT][2], l_run[MT][2];                     // rows g and g + 8: running max (base 2), partial sum
    #pragma unroll
    for (int m = 0; m < MT; ++m) {
        #pragma unroll
        for (int n = 0; n < D / 8; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.f;
        m_run[m][0] = m_run[m][1] = NEG_INF;
        l_run[m][0] = l_run[m][1] = 0.f;
    }

    unsigned p[BN / 16][4];                               // the previous tile's P, packed: the pending P V's A
    float rescale[MT][2];                                 // rows g and g + 8: O's factor to the new max
    // O += P V for tile `tile`: P's 16-bit pairs are the register A operand as they lie; V's rows
    // (keys) are k, its head dim (contiguous) n
    auto issue_pv = [&](int tile) {
        const bf16_t* vt = v_s + (tile % STAGES) * BN * D;
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_rs_m64n128k16_bf16<1>(&o[0][0][0], p[kk], wgmma_desc(vt + kk * 16 * 64, BN * ROW_BYTES, ATOM));
    };

    // Per tile t: S_t = Q K_t and, behind it, tile t - 1's O += P V are issued together; the
    // softmax of S_t runs while P V is still on the tensor cores, and O is rescaled once it retires.
    for (int t = 0; t < n_tiles; ++t) {
        cp_async_wait<STAGES - 3>();                      // Q and tile t have landed
        fence_proxy_async();                              // where the tensor cores read them
        __syncthreads();                                  // for every thread; and tile t - 2 is retired everywhere
        const int next = t + STAGES - 2;                  // into the stage tile t - 2 held
        if (next < n_tiles) {
            const int st = next % STAGES;
            fa_load_wg_tile<BN, D, THREADS, K_ROW>(k_s + st * BN * D, kp + (long long)next * BN * K_ROW,
                                                   SK - key0 - next * BN, tid);
            fa_load_wg_tile<BN, D, THREADS, V_ROW>(v_s + st * BN * D, vp + (long long)next * BN * V_ROW,
                                                   SK - key0 - next * BN, tid);
        }
        cp_async_commit();                                // an empty group keeps the wait count uniform
        const bf16_t* kt = k_s + (t % STAGES) * BN * D;
        const int k0 = key0 + t * BN;

        // S = Q Kᵀ: per 16 values of the head dim, this warpgroup's 64 Q rows by the tile's BN keys
        float s[MT][BN / 8][4];
        #pragma unroll
        for (int j = 0; j < BN / 8; ++j) s[0][j][0] = s[0][j][1] = s[0][j][2] = s[0][j][3] = 0.f;
        wgmma_hold<BN / 2>(&s[0][0][0]);
        wgmma_hold<D / 2>(&o[0][0][0]);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wgmma_m64n128k16_bf16<0, 0>(&s[0][0][0],
                wgmma_desc(q_s + (kk / 4) * BM * 64 + warpgroup * 64 * 64 + (kk % 4) * 16, 16, ATOM),
                wgmma_desc(kt + (kk / 4) * BN * 64 + (kk % 4) * 16, 16, ATOM));
        wgmma_commit();
        if (t > 0) issue_pv(t - 1);
        wgmma_commit();                                   // (empty on the first tile)
        wgmma_hold<D / 2>(&o[0][0][0]);                   // no copy of O or S is taken while they are written
        wgmma_hold<BN / 2>(&s[0][0][0]);
        wgmma_wait<1>();                                  // S is in; P V may still run
        wgmma_hold<BN / 2>(&s[0][0][0]);

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
                rescale[m][h] = corr;                 // once the pending P V retires
            }

        wgmma_wait<0>();                                  // tile t - 1's P V has retired: O and P are free
        wgmma_hold<D / 2>(&o[0][0][0]);
        wgmma_hold<BN / 4>(&p[0][0]);
        #pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[0][n][0] *= rescale[0][0]; o[0][n][1] *= rescale[0][0];
            o[0][n][2] *= rescale[0][1]; o[0][n][3] *= rescale[0][1];
        }
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            p[kk][0] = pack_bf16x2(s[0][2 * kk][0], s[0][2 * kk][1]);
            p[kk][1] = pack_bf16x2(s[0][2 * kk][2], s[0][2 * kk][3]);
            p[kk][2] = pack_bf16x2(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
            p[kk][3] = pack_bf16x2(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
        }
    }
    // the last tile's P V
    wgmma_hold<D / 2>(&o[0][0][0]);
    wgmma_fence();
    issue_pv(n_tiles - 1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&o[0][0][0]);
    wgmma_hold<BN / 4>(&p[0][0]);

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
