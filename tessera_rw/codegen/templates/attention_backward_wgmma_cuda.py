"""The Hopper attention backward kernel: the fixed-order form (jobs of keys, jobs of queries) with
every product on warpgroup MMAs (wgmma, sm_90a).

Blocks are (batch·head, job) as in attention_backward_cuda.py's BWD_KERNEL_JOBS, and each 128-thread
warpgroup owns 64 of a job's ROWS rows. All seven products take the two shapes the forward's wgmma
kernel (attention_wgmma_cuda.py) uses:

- scores, both operands K-major in shared memory, over D: the key jobs' Sᵀ = K Qᵀ and dPᵀ = V dOᵀ,
  the query jobs' S = Q Kᵀ and dP = dO Vᵀ, m64 x COLS;
- accumulations, A from registers and B N-major in shared memory, over the COLS rows of the tile:
  the key jobs' dV += Pᵀ dO and dK += dSᵀ Q, the query jobs' dQ += dS K, m64 x D. The scores'
  accumulators, packed to 16 bits, are already laid out as the register A operand.

A job's own rows (K and V, or Q and dO) are loaded once; the other side streams through `stages`
cp.async buffers in wgmma's 128-byte swizzled layout (attention_wgmma_cuda.TILE_LOADER). Each
thread fences the proxies after its copies land, before the barrier that also tells every
warpgroup has retired the products on the stage the refill behind it overwrites. The per-score
work (P recomputed from the row statistics, dS) is the mma.sync kernel's text: the accumulator
layout per warp is mma.sync's m16n8.
"""

from __future__ import annotations

from string import Template as Text
from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.arch import WARP_SIZE
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.prelude import ATOM_BYTES, HOPPER_TARGET, ROW_BYTES, wgmma_name, wgmma_rs_name
from tessera_rw.codegen.templates.attention_backward_cuda import (BWD_COMMON, KEY_JOB_BOUNDS, KEY_JOB_START,
                                                                  KEY_TILE_GRADIENTS, MASK_HELPER, QUERY_JOB_BOUNDS,
                                                                  QUERY_JOB_START, QUERY_TILE_GRADIENTS,
                                                                  backward_constants, kernel_name, operand_constants)
from tessera_rw.codegen.templates.attention_wgmma_cuda import TILE_LOADER

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.attention_backward import BackwardShape, GradientSchedule


def emit_wgmma_bwd(op: KernelOp, shape: BackwardShape, s: GradientSchedule, smem: int) -> KernelSource:
    """The wgmma backward kernel for `op` under `s` (`smem` bytes of dynamic shared memory, the
    alignment slack included)."""
    name = kernel_name(f"{op.op}_wg", shape, s)
    blocks = shape.backward_blocks(s.rows, atomic=False)
    header = (f"// {op}\n// schedule: {s.describe()}\n"
              f"// launch: {name}<<<{blocks}, {WARP_SIZE * s.warps}, {smem}>>>(q, k, v, do, stats, "
              f"{'mask, ' if shape.mask else ''}out); dynamic shared memory {smem} bytes\n"
              "// out = [dQ | dK | dV], each [B·H][S][D]; blocks per head: the dK/dV jobs, then the dQ jobs\n")
    kind = "bf16" if shape.dtype is DType.bfloat16 else "f16"
    body = Text(MASK_HELPER + BWD_COMMON + WG_HELPERS + WG_KEY_JOB + WG_QUERY_JOB + WG_ENTRY)
    source = body.substitute(NAME=name, LOAD="fa_load_wg_tile", WG_S=wgmma_name(s.cols, kind),
                             WG_ACC=wgmma_rs_name(shape.d, kind), **backward_constants(shape, s),
                             **operand_constants(op, shape))
    return KernelSource(name, header + TILE_LOADER + source, threads=WARP_SIZE * s.warps, grid=(blocks, 1, 1),
                        dynamic_smem=smem, fast_math=op.numerics is Numerics.FAST, target=HOPPER_TARGET)


WG_HELPERS = f"""constexpr unsigned ATOM = {ATOM_BYTES}, ROW_BYTES = {ROW_BYTES};""" + r"""
static_assert(ROWS == 16 * WARPS && WARPS % 4 == 0, "64 rows per warpgroup");
static_assert(STAGES >= 2 && D % 64 == 0, "a refill overlaps the products; whole 64-value column blocks");

// Two score products sharing their B tiles: x = A_x Bᵀ and y = A_y Cᵀ over D, this warpgroup's 64
// rows of a_s / c_s ([D/64][ROWS][64]) against the COLS rows of bt / ct ([D/64][COLS][64])
__device__ __forceinline__ void fab_wg_scores(float* x, float* y, const $ELEM* a_s, const $ELEM* c_s,
                                              const $ELEM* bt, const $ELEM* ct, int warpgroup) {
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int a_at = (kk / 4) * ROWS * 64 + warpgroup * 64 * 64 + (kk % 4) * 16;
        const int b_at = (kk / 4) * COLS * 64 + (kk % 4) * 16;
        $WG_S<0, 0>(x, wgmma_desc(a_s + a_at, 16, ATOM), wgmma_desc(bt + b_at, 16, ATOM));
        $WG_S<0, 0>(y, wgmma_desc(c_s + a_at, 16, ATOM), wgmma_desc(ct + b_at, 16, ATOM));
    }
}

// acc += A t over the tile's COLS rows: A's 16-bit pairs (packed scores) as the register operand,
// t ([D/64][COLS][64]) N-major: its rows are k, its head dim n
__device__ __forceinline__ void fab_wg_accumulate(float* acc, const unsigned (*a)[4], const $ELEM* t) {
    #pragma unroll
    for (int kk = 0; kk < COLS / 16; ++kk)
        $WG_ACC<1>(acc, a[kk], wgmma_desc(t + kk * 16 * 64, COLS * ROW_BYTES, ATOM));
}

// m16n8 accumulators (COLS/8 of them) packed to the register A operand of COLS/16 k-steps
__device__ __forceinline__ void fab_wg_pack(unsigned (*a)[4], const float (*x)[4]) {
    #pragma unroll
    for (int kk = 0; kk < COLS / 16; ++kk) {
        a[kk][0] = $PACK(x[2 * kk][0], x[2 * kk][1]);
        a[kk][1] = $PACK(x[2 * kk][2], x[2 * kk][3]);
        a[kk][2] = $PACK(x[2 * kk + 1][0], x[2 * kk + 1][1]);
        a[kk][3] = $PACK(x[2 * kk + 1][2], x[2 * kk + 1][3]);
    }
}

// the score products of one tile, issued and retired: x and y are written by the tensor cores
__device__ __forceinline__ void fab_wg_score_tile(float (*x)[4], float (*y)[4], const $ELEM* a_s, const $ELEM* c_s,
                                                  const $ELEM* bt, const $ELEM* ct, int warpgroup) {
    fab_zero(x, COLS / 8);
    fab_zero(y, COLS / 8);
    wgmma_hold<COLS / 2>(&x[0][0]);
    wgmma_hold<COLS / 2>(&y[0][0]);
    wgmma_fence();
    fab_wg_scores(&x[0][0], &y[0][0], a_s, c_s, bt, ct, warpgroup);
    wgmma_commit();
    wgmma_hold<COLS / 2>(&x[0][0]);                       // no copy of them is taken while they are written
    wgmma_hold<COLS / 2>(&y[0][0]);
    wgmma_wait<0>();
    wgmma_hold<COLS / 2>(&x[0][0]);
    wgmma_hold<COLS / 2>(&y[0][0]);
}

"""

WG_KEY_JOB = r"""// ROWS keys from kr0: dV = Σ Pᵀ dO and dK = scale Σ dSᵀ Q over the query tiles (this head's pointers)
__device__ __forceinline__ void fab_wg_dk_dv(const $ELEM* q, const $ELEM* k, const $ELEM* v, const $ELEM* dout,
                                             const float* st, const $MASK_T* mp, $ELEM* dk_out, $ELEM* dv_out,
                                             int kr0, unsigned char* smem) {
    $ELEM* k_s = ($ELEM*)smem;                            // [D/64][ROWS][64]
    $ELEM* v_s = k_s + ROWS * D;                          // [D/64][ROWS][64]
    $ELEM* q_s = v_s + ROWS * D;                          // [STAGES][D/64][COLS][64]
    $ELEM* o_s = q_s + STAGES * COLS * D;                 // [STAGES][D/64][COLS][64], dO
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int warpgroup = tid >> 7, key0 = kr0 + warp * 16;
""" + KEY_JOB_BOUNDS + KEY_JOB_START + r"""    for (int t = t0; t < t_end; ++t) {
        const int i = t - t0, next = t + STAGES - 1;
        cp_async_wait<STAGES - 2>();                      // K, V and tile t have landed
        fence_proxy_async();                              // where the tensor cores read them
        __syncthreads();                                  // for every thread; and tile t - 1 is retired everywhere
        if (next < t_end) {                               // into the stage tile t - 1 held
            const int st_next = (i + STAGES - 1) % STAGES;
            fa_load_wg_tile<COLS, D, THREADS, Q_ROW>(q_s + st_next * COLS * D, q + (long long)next * COLS * Q_ROW, SQ - next * COLS, tid);
            fa_load_wg_tile<COLS, D, THREADS, DO_ROW>(o_s + st_next * COLS * D, dout + (long long)next * COLS * DO_ROW, SQ - next * COLS, tid);
        }
        cp_async_commit();                                // an empty group keeps the wait count uniform
        const $ELEM* qt = q_s + (i % STAGES) * COLS * D;
        const $ELEM* ot = o_s + (i % STAGES) * COLS * D;
        const int c0 = t * COLS;
        float s[COLS / 8][4], dp[COLS / 8][4];            // Sᵀ and dPᵀ: rows are keys, columns queries
        fab_wg_score_tile(s, dp, k_s, v_s, qt, ot, warpgroup);
""" + KEY_TILE_GRADIENTS + r"""        unsigned pa[COLS / 16][4], da[COLS / 16][4];       // Pᵀ and dSᵀ, the accumulations' A operands
        fab_wg_pack(pa, s);
        fab_wg_pack(da, dp);
        wgmma_hold<D / 2>(&dv[0][0]);
        wgmma_hold<D / 2>(&dk[0][0]);
        wgmma_fence();
        fab_wg_accumulate(&dv[0][0], pa, ot);
        fab_wg_accumulate(&dk[0][0], da, qt);
        wgmma_commit();
        wgmma_hold<D / 2>(&dv[0][0]);
        wgmma_hold<D / 2>(&dk[0][0]);
        wgmma_hold<COLS / 4>(&pa[0][0]);
        wgmma_hold<COLS / 4>(&da[0][0]);
        wgmma_wait<0>();                                  // before the next barrier lets this stage refill
        wgmma_hold<D / 2>(&dv[0][0]);
        wgmma_hold<D / 2>(&dk[0][0]);
        wgmma_hold<COLS / 4>(&pa[0][0]);
        wgmma_hold<COLS / 4>(&da[0][0]);
    }
    fab_store<DK_ROW>(dk, SCALE, dk_out, key0, SK, lane);
    fab_store<DV_ROW>(dv, 1.f, dv_out, key0, SK, lane);
}

"""

WG_QUERY_JOB = r"""// ROWS queries from qr0: dQ = scale Σ dS K over the key tiles (this head's pointers)
__device__ __forceinline__ void fab_wg_dq(const $ELEM* q, const $ELEM* k, const $ELEM* v, const $ELEM* dout,
                                          const float* st, const $MASK_T* mp, $ELEM* dq_out, int qr0,
                                          unsigned char* smem) {
    $ELEM* q_s = ($ELEM*)smem;                            // [D/64][ROWS][64]
    $ELEM* o_s = q_s + ROWS * D;                          // [D/64][ROWS][64], dO
    $ELEM* k_s = o_s + ROWS * D;                          // [STAGES][D/64][COLS][64]
    $ELEM* v_s = k_s + STAGES * COLS * D;                 // [STAGES][D/64][COLS][64]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int warpgroup = tid >> 7, row0 = qr0 + warp * 16;
""" + QUERY_JOB_BOUNDS + QUERY_JOB_START + r"""    for (int t = t1; t < n_tiles; ++t) {
        const int i = t - t1, next = t + STAGES - 1, st_next = (i + STAGES - 1) % STAGES;
        cp_async_wait<STAGES - 2>();                      // Q, dO and tile t have landed
        fence_proxy_async();
        __syncthreads();                                  // and tile t - 1 is retired everywhere
        if (next < n_tiles) {
            fa_load_wg_tile<COLS, D, THREADS, K_ROW>(k_s + st_next * COLS * D, k + (long long)next * COLS * K_ROW,
                                                     SK - next * COLS, tid);
            fa_load_wg_tile<COLS, D, THREADS, V_ROW>(v_s + st_next * COLS * D, v + (long long)next * COLS * V_ROW,
                                                     SK - next * COLS, tid);
        }
        cp_async_commit();
        const $ELEM* kt = k_s + (i % STAGES) * COLS * D;
        const $ELEM* vt = v_s + (i % STAGES) * COLS * D;
        const int k0 = t * COLS;
        float s[COLS / 8][4], dp[COLS / 8][4];            // S and dP: rows are queries, columns keys
        fab_wg_score_tile(s, dp, q_s, o_s, kt, vt, warpgroup);
""" + QUERY_TILE_GRADIENTS + r"""        unsigned da[COLS / 16][4];                         // dS, the A operand of dQ += dS K
        fab_wg_pack(da, dp);
        wgmma_hold<D / 2>(&dq[0][0]);
        wgmma_fence();
        fab_wg_accumulate(&dq[0][0], da, kt);
        wgmma_commit();
        wgmma_hold<D / 2>(&dq[0][0]);
        wgmma_hold<COLS / 4>(&da[0][0]);
        wgmma_wait<0>();
        wgmma_hold<D / 2>(&dq[0][0]);
        wgmma_hold<COLS / 4>(&da[0][0]);
    }
    fab_store<DQ_ROW>(dq, SCALE, dq_out, row0, SQ, lane);
}

"""

WG_ENTRY = r"""extern "C" __global__ void __launch_bounds__(THREADS, 1)
$NAME(const $ELEM* __restrict__ q, const $ELEM* __restrict__ k, const $ELEM* __restrict__ v,
      const $ELEM* __restrict__ dout, const float* __restrict__ stats, $MASK_ARG$ELEM* __restrict__ out) {
    // tiles start on 1024-byte atoms: the swizzle is a function of the shared address
    extern __shared__ __align__(16) unsigned char fa_smem[];
    unsigned char* smem = fa_smem + ((ATOM - (smem_addr(fa_smem) & (ATOM - 1))) & (ATOM - 1));
    const int bh = blockIdx.x / (NKB + NQB), job = blockIdx.x % (NKB + NQB);
$OFFSETS
    const float* st = stats + (long long)bh * SQ * 2;
$MASK_OFFSET
    if (job < NKB)
        fab_wg_dk_dv(q + q_off, k + k_off, v + v_off, dout + do_off, st, mp, out + dk_off, out + dv_off,
                     job * ROWS, smem);
    else
        fab_wg_dq(q + q_off, k + k_off, v + v_off, dout + do_off, st, mp, out + dq_off, (job - NKB) * ROWS, smem);
}
"""
