"""The pieces of the attention backward kernel's atomic form (dq="atomic", the `fast` policy only),
which attention_backward_cuda.py splices into the key blocks' walk: each key block writes its dS
tile to shared memory, adds its share dS K of the tile's dQ into an fp32 workspace with atomics and
counts its arrival; after its walk, it converts the query tiles it was the last to reach.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.attention_backward import BackwardShape, BackwardSchedule


def workspace_bytes(shape: BackwardShape, s: BackwardSchedule) -> int:
    """The atomic form's zeroed workspace: the fp32 dQ sum [B·H][Sq][D], then one arrival counter
    per (batch·head, query tile), rounded up to 16 bytes."""
    counters = shape.bh * -(-shape.sq // s.cols)
    return -(-(shape.bh * shape.sq * shape.d + counters) * 4 // 16) * 16


# The atomic form: its shared memory beside the walk's (the dS tile, the marks of the query tiles
# the block completes, cleared before the walk's first barrier), ...
DQ_SMEM = r"""    $ELEM* ds_s = o_s + STAGES * COLS * D;                 // [ROWS][COLS], dSᵀ
    __shared__ unsigned last_tiles[(NQT + 31) / 32];
    for (int i = threadIdx.x; i < (NQT + 31) / 32; i += THREADS) last_tiles[i] = 0;
"""

# ... the key blocks' dS tile into shared memory (each warp its 16 keys' rows), ...
DS_STORE = r"""        #pragma unroll
        for (int j = 0; j < COLS / 8; ++j)
            #pragma unroll
            for (int h = 0; h < 2; ++h)
                *(unsigned*)(ds_s + fa_swizzle(warp * 16 + g + 8 * h, j * 8 + 2 * t4, COLS)) =
                    $PACK(dp[j][2 * h], dp[j][2 * h + 1]);
"""

# ... then, once every warp's rows are in, the tile's dQ share added into the workspace's sum and
# the block's arrival counted (this head's parts of `out` and `work` are found here, from the
# kernel's parameters, rather than held in registers through the walk; dq_out is the head's) ...
DQ_STEP = r"""        __syncthreads();                                  // every warp's rows of dSᵀ are in ds_s
        fab_dq_share(work + (long long)(blockIdx.x / NKB) * SQ * D, ds_s, k_s, c0, warp, lane);
        fab_dq_arrive((unsigned*)(work + NQ) + (long long)(blockIdx.x / NKB) * NQT, last_tiles, t, tid);
"""

# ... and after the walk, with dK and dV stored and their registers free, the tiles this block
# completed converted
DQ_FINISH = r"""    fab_dq_finish(work + (long long)(blockIdx.x / NKB) * SQ * D, dq_out, last_tiles, tid);
"""

DQ_HELPERS = r"""// query tile t is visited by the key blocks whose first key comes before its last query (all of
// them without a causal mask) and, under a window, whose last key's band reaches its first query:
// the arrivals that complete it
__device__ __forceinline__ unsigned fab_visitors(int t) {
    const int last = CAUSAL ? min(NKB - 1, ((t + 1) * COLS - 1) / ROWS) : NKB - 1;
    const int first = WINDOW ? max(0, (t * COLS - WINDOW + 1) / ROWS) : 0;
    return (unsigned)(last - first + 1);
}

// dQ[c0 + q][d] += Σ_key dS[q][key] K[key][d] over this block's ROWS keys, in tasks of 16 queries ×
// DQ_COLS columns spread over the warps (16 columns beside D=128's dK and dV, which leave few
// registers): dS's A fragments by transposed ldmatrix from dSᵀ (ds_s, [ROWS][COLS]), K's B
// fragments by transposed ldmatrix from k_s
__device__ __forceinline__ void fab_dq_share(float* dq_sum, const $ELEM* ds_s, const $ELEM* k_s, int c0, int warp, int lane) {
    constexpr int DQ_COLS = D <= 64 ? 32 : 16, GROUPS = COLS / 16, TASKS = GROUPS * (D / DQ_COLS);
    const int g = lane >> 2, t4 = lane & 3;
    #pragma unroll 1
    for (int task = warp; task < TASKS; task += WARPS) {
        const int qg = task % GROUPS, d0 = (task / GROUPS) * DQ_COLS;
        float acc[DQ_COLS / 8][4];
        fab_zero(acc, DQ_COLS / 8);
        #pragma unroll
        for (int kk = 0; kk < ROWS / 16; ++kk) {
            unsigned a[4];
            ldmatrix_x4_trans(a, ds_s + fa_swizzle(kk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                   qg * 16 + ((lane >> 3) & 1) * 8, COLS));
            #pragma unroll
            for (int n = 0; n < DQ_COLS / 16; ++n) {
                unsigned b[4];
                ldmatrix_x4_trans(b, k_s + fa_swizzle(kk * 16 + (lane & 15), d0 + n * 16 + (lane >> 4) * 8, D));
                $MMA(acc[2 * n], a, b);
                $MMA(acc[2 * n + 1], a, b + 2);
            }
        }
        // lanes t4 and t4 ^ 1 swap halves so that each adds four adjacent columns of one row: the
        // even lane row g's, the odd lane row g + 8's, one 16-byte reduction each
        const bool odd = t4 & 1;
        const int row = c0 + qg * 16 + g + (odd ? 8 : 0);
        #pragma unroll
        for (int n = 0; n < DQ_COLS / 8; ++n) {
            const float r0 = __shfl_xor_sync(0xffffffffu, odd ? acc[n][0] : acc[n][2], 1);
            const float r1 = __shfl_xor_sync(0xffffffffu, odd ? acc[n][1] : acc[n][3], 1);
            if (row < SQ)
                atomic_add_f32x4(dq_sum + (long long)row * D + d0 + n * 8 + 4 * (t4 >> 1),
                                 odd ? make_float4(r0, r1, acc[n][2], acc[n][3]) : make_float4(acc[n][0], acc[n][1], r0, r1));
        }
    }
}

// This block's share of query tile t is added (each thread's adds fenced, then the block's
// barrier): one arrival, and the tile marked in last_tiles when it is the one that completes it
__device__ __forceinline__ void fab_dq_arrive(unsigned* arrivals, unsigned* last_tiles, int t, int tid) {
    __threadfence();
    __syncthreads();
    if (tid == 0 && atomicAdd(arrivals + t, 1u) + 1u == fab_visitors(t))
        last_tiles[t >> 5] |= 1u << (t & 31);
}

// The tiles this block completed: dQ = scale · sum as $ELEM, the sum read from L2
__device__ __forceinline__ void fab_dq_finish(const float* dq_sum, $ELEM* dq_out, const unsigned* last_tiles, int tid) {
    __syncthreads();                                      // the walk's last marks are in
    __threadfence();
    for (int w = 0; w < (NQT + 31) / 32; ++w)
        for (unsigned bits = last_tiles[w]; bits; bits &= bits - 1) {
            const int c0 = (w * 32 + __ffs(bits) - 1) * COLS;
            for (int i = tid; i < COLS * D / 4; i += THREADS) {
                const int row = c0 + i / (D / 4), col = (i % (D / 4)) * 4;
                if (row < SQ) {
                    const float4 x = __ldcg((const float4*)(dq_sum + (long long)row * D + col));
                    *(uint2*)(dq_out + (long long)row * DQ_ROW + col) =
                        make_uint2($PACK(x.x * SCALE, x.y * SCALE), $PACK(x.z * SCALE, x.w * SCALE));
                }
            }
        }
}

"""

BWD_KERNEL_ATOMIC = r"""
extern "C" __global__ void __launch_bounds__(THREADS)
$NAME(const $ELEM* __restrict__ q, const $ELEM* __restrict__ k, const $ELEM* __restrict__ v,
      const $ELEM* __restrict__ dout, const float* __restrict__ stats, $MASK_ARG$ELEM* __restrict__ out,
      float* __restrict__ work) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    const int bh = blockIdx.x / NKB, kb = blockIdx.x % NKB;   // under a causal mask the first key blocks walk longest
$OFFSETS
    const float* st = stats + (long long)bh * SQ * 2;
$MASK_OFFSET
    fab_dk_dv(q + q_off, k + k_off, v + v_off, dout + do_off, st, mp, out + dk_off, out + dv_off,
              kb * ROWS, fa_smem, out + dq_off, work);
}
"""
