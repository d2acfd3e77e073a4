"""The CUDA text of the attention backward's row-statistics kernel and the function that fills it in.

ROW_STATS_KERNEL: one block per (batch·head, ROWS query rows); each warp keeps its 16 rows of Q as
mma A fragments, streams K in COLS-key tiles (cp.async, `stages` buffers) and runs the forward's
online max/sum without the P V product, then adds Σ_d dO·O per row: stats[row] = (lse, D).
AttentionRowStatsTemplate (attention_backward.py) chooses the schedule.
"""

from __future__ import annotations

from string import Template as Text
from typing import TYPE_CHECKING

from tessera_rw.codegen.arch import WARP_SIZE
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.attention_backward_cuda import MASK_HELPER, backward_constants, kernel_name
from tessera_rw.codegen.templates.attention_cuda import TILE_HELPERS

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.attention_backward import BackwardShape, BackwardSchedule


def emit_row_stats(op: KernelOp, shape: BackwardShape, s: BackwardSchedule, smem: int) -> KernelSource:
    """The row-statistics kernel for `op` under `s`, after its launch comment."""
    name = kernel_name("attention_row_stats", shape, s)
    blocks = shape.bh * -(-shape.sq // s.rows)
    header = (f"// {op}\n// schedule: {s.describe()}\n"
              f"// launch: {name}<<<{blocks}, {WARP_SIZE * s.warps}, {smem}>>>(q, k, o, do, {'mask, ' if shape.mask else ''}"
              f"stats); dynamic shared "
              f"memory {smem} bytes\n// contiguous row-major operands of one batch; stats [B·H][Sq][2] fp32\n")
    source = Text(MASK_HELPER + ROW_STATS_KERNEL).substitute(NAME=name, **backward_constants(shape, s))
    return KernelSource(name, header + TILE_HELPERS + source, threads=WARP_SIZE * s.warps, grid=(blocks, 1, 1),
                        dynamic_smem=smem, fast_math=op.numerics is Numerics.FAST)


ROW_STATS_KERNEL = r"""
extern "C" __global__ void __launch_bounds__($WARPS * 32)
$NAME(const $ELEM* __restrict__ q, const $ELEM* __restrict__ k, const $ELEM* __restrict__ o,
      const $ELEM* __restrict__ dout, $MASK_ARG float* __restrict__ stats) {
    constexpr int BM = $ROWS, BN = $COLS, D = $D, WARPS = $WARPS, STAGES = $STAGES, THREADS = 32 * WARPS;
    constexpr int SQ = $SQ, SK = $SK, NQB = (SQ + BM - 1) / BM, NKT = (SK + BN - 1) / BN;
    constexpr float SCALE_LOG2 = $SCALE_LOG2;             // scores in base 2: scale · log2(e)
    constexpr float LN2 = 0.6931471805599453f;
    constexpr bool CAUSAL = $CAUSAL;
    constexpr int WINDOW = $WINDOW;                       // row i keeps keys i - WINDOW + 1 .. i (0: all to i)
    const float NEG_INF = __int_as_float(0xff800000);

    extern __shared__ __align__(16) unsigned char fa_smem[];
    $ELEM* q_s = ($ELEM*)fa_smem;                         // [BM][D]
    $ELEM* k_s = q_s + BM * D;                            // [STAGES][BN][D]

    // a head's query blocks side by side, causal ones longest first (as the forward kernels)
    const int qb = CAUSAL ? NQB - 1 - (int)(blockIdx.x % NQB) : (int)(blockIdx.x % NQB), bh = blockIdx.x / NQB;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;               // mma fragment: row in 8, column pair in 4
    const int q0 = qb * BM, row0 = q0 + warp * 16;
    const long long q_off = (long long)bh * SQ * D;
$MASK_OFFSET
    // causal stops at the block's last row; a window starts at key key0, where its first row's band does
    const int end_tile = CAUSAL ? min(NKT, (q0 + BM + BN - 1) / BN) : NKT;
    const int key0 = WINDOW ? min(max(0, q0 - WINDOW + 1) / BN, end_tile - 1) * BN : 0;
    const int n_tiles = end_tile - key0 / BN;
    const $ELEM* kp = k + (long long)bh * SK * D + (long long)key0 * D;

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
        const $ELEM* kt = k_s + (t % STAGES) * BN * D;
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
                $MMA(s[2 * j], qf[kk], b);
                $MMA(s[2 * j + 1], qf[kk], b + 2);
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
            sum += $TO_F32(($ELEM)(ov & 0xffffu)) * $TO_F32(($ELEM)(dv & 0xffffu))
                 + $TO_F32(($ELEM)(ov >> 16)) * $TO_F32(($ELEM)(dv >> 16));
        }
        sum = warp_sum(sum);
        if (lane == 0) stats[((long long)bh * SQ + row) * 2 + 1] = sum;
    }
}
"""
