"""The CUDA text of the attention backward kernel and the function that fills it in, with the
pieces the row-statistics kernel (attention_row_stats_cuda.py) shares: the mask term and the
sizes both kernels are specialized to.

BWD_KERNEL: FlashAttention-2's backward with no atomics. Blocks are (batch·head, job): the first
⌈Sk/ROWS⌉ jobs own ROWS keys each and walk the query tiles accumulating dK and dV in registers
(Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, so each warp's accumulators are already the A fragments of Pᵀ dO and
dSᵀ Q); the other ⌈Sq/ROWS⌉ jobs own ROWS queries each and walk the key tiles accumulating dQ
(S = Q Kᵀ, dP = dO Vᵀ, then dS K). P = exp(S − lse) is recomputed in both; no score reaches memory.
dQ, dK, dV are written into one packed buffer: dQ at 0, dK after all of dQ, dV after all of dK.

With `dq="atomic"` (the `fast` policy only: the sum's order then depends on timing) there are only
the key blocks, as in FlashAttention-2: each also writes its dS tile to shared memory and adds its
share dS K of the tile's dQ into an fp32 workspace with atomics, five products per score instead
of seven. The workspace (KernelSource.workspace_bytes, zeroed before each launch) holds that dQ sum
and one arrival counter per query tile; the key block that arrives last at a tile (the counters
say which, after a fence) scales and converts the tile's dQ into the packed buffer.

The templates in attention_backward.py choose schedules and model resources; this module only
writes the chosen kernel out.
"""

from __future__ import annotations

from string import Template as Text
from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.arch import WARP_SIZE
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.attention_backward_atomic_cuda import (BWD_KERNEL_ATOMIC, DQ_FINISH, DQ_HELPERS,
                                                                        DQ_SMEM, DQ_STEP, DS_STORE, workspace_bytes)
from tessera_rw.codegen.templates.attention_cuda import (LOG2E, MASK_LOAD, MASK_TYPES, TILE_HELPERS,
                                                         mask_strides, offset_statements)
from tessera_rw.codegen.templates.attention_problem import RowLayout, operand_layout, reads_views
from tessera_rw.codegen.templates.attention_backward_problem import gradient_layouts
from tessera_rw.codegen.templates.cuda_scalar import float_literal

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.attention_backward import BackwardSchedule, BackwardShape, GradientSchedule


# a bool mask's term is 0 or -inf; a float mask's is its value in base 2
MASK_TERM = {dtype: f"{load} * LOG2E" for dtype, load in MASK_LOAD.items()} | {
    DType.bool: "mv ? 0.f : __int_as_float(0xff800000)"}

# The mask's term of score (query, key) in base 2, the same in both kernels. Without a mask operand
# HAS_MASK is false and every use compiles away.
MASK_HELPER = r"""
constexpr bool HAS_MASK = $HAS_MASK;
constexpr long long MASK_ROW = $MASK_ROW, MASK_COL = $MASK_COL;
__device__ __forceinline__ float fab_mask(const $MASK_T* mp, int query, int key) {
    constexpr float LOG2E = 1.4426950408889634f;
    const $MASK_T mv = mp[query * MASK_ROW + key * MASK_COL];
    return $MASK_TERM;                                    // -inf where a bool mask is false
}
"""


def backward_constants(shape: BackwardShape, s: BackwardSchedule) -> dict[str, object]:
    tag = "bf16" if shape.dtype is DType.bfloat16 else "f16"
    mask = shape.mask
    if mask is None:
        masking = dict(HAS_MASK="false", MASK_T="float", MASK_ARG="", MASK_ROW=0, MASK_COL=0, MASK_TERM="0.f",
                       MASK_OFFSET="    const float* mp = nullptr;")
    else:
        mshape = (1,) * (len(shape.batch) + 2 - mask.ndim) + mask.shape
        rows, cols = mask_strides(mshape)
        offset = offset_statements(shape.batch, [("m_off", RowLayout.dense(mshape, len(shape.batch)))])
        mask_type = MASK_TYPES[mask.dtype]
        masking = dict(HAS_MASK="true", MASK_T=mask_type, MASK_ROW=rows, MASK_COL=cols,
                       MASK_TERM=MASK_TERM[mask.dtype], MASK_ARG=f"const {mask_type}* __restrict__ mask, ",
                       MASK_OFFSET=f"{offset}\n    const {mask_type}* mp = mask + m_off;")
    return dict(ELEM=f"{tag}_t", MMA=f"mma_{tag}_16816", PACK=f"pack_{tag}x2", TO_F32=f"{tag}_to_f32",
                ROWS=s.rows, COLS=s.cols, D=shape.d, WARPS=s.warps, STAGES=s.stages, SQ=shape.sq, SK=shape.sk,
                BH=shape.bh, SCALE=float_literal(shape.scale), SCALE_LOG2=float_literal(shape.scale * LOG2E),
                CAUSAL="true" if shape.causal else "false", WINDOW=shape.window, **masking)


def operand_constants(op: KernelOp, shape: BackwardShape) -> dict[str, object]:
    """The row strides of q, k, v and dO read and of dQ, dK and dV written (D apart where dense, a
    view's row stride in a strided op's), and the statements placing the flat (batch, head) index
    `bh`'s rows: q_off, k_off, v_off and do_off into the operands, dq_off, dk_off and dv_off into
    the result (packed dQ | dK | dV, or where a strided_attention_bwd writes them)."""
    d = shape.d
    if not reads_views(op):
        offsets = ("    const long long q_off = (long long)bh * SQ * D, k_off = (long long)bh * SK * D;\n"
                   "    const long long v_off = k_off, do_off = q_off, dq_off = q_off, dk_off = NQ + k_off, "
                   "dv_off = NQ + NK + k_off;")
        return dict(OFFSETS=offsets, Q_ROW=d, K_ROW=d, V_ROW=d, DO_ROW=d, DQ_ROW=d, DK_ROW=d, DV_ROW=d)
    names = ("q_off", "k_off", "v_off", "do_off", "dq_off", "dk_off", "dv_off")
    layouts = [operand_layout(op, i, len(shape.batch)) for i in range(4)] + gradient_layouts(op, len(shape.batch))
    return dict(OFFSETS=offset_statements(shape.batch, list(zip(names, layouts))),
                **{f"{name[:-4].upper()}_ROW": layout.row for name, layout in zip(names, layouts)})


def kernel_name(kind: str, shape: BackwardShape, s: BackwardSchedule) -> str:
    tag = "bf16" if shape.dtype is DType.bfloat16 else "f16"
    return (f"{kind}_{tag}_d{shape.d}_{'causal_' if shape.causal else ''}"
            f"{f'win{shape.window}_' if shape.window else ''}{'mask_' if shape.mask else ''}"
            f"r{s.rows}_c{s.cols}_w{s.warps}_s{s.stages}")


def emit_bwd(op: KernelOp, shape: BackwardShape, s: GradientSchedule, smem: int) -> KernelSource:
    """The backward kernel for `op` under `s`: dQ by jobs of its own, or (`s.atomic`) added up by
    the key blocks in a workspace."""
    atomic = s.atomic
    name = kernel_name(op.op, shape, s) + ("_atomic" if atomic else "")
    blocks = shape.backward_blocks(s.rows, atomic)
    work = workspace_bytes(shape, s) if atomic else 0
    header = (f"// {op}\n// schedule: {s.describe()}\n"
              f"// launch: {name}<<<{blocks}, {WARP_SIZE * s.warps}, {smem}>>>(q, k, v, do, stats, "
              f"{'mask, ' if shape.mask else ''}out{', work' if atomic else ''}); dynamic "
              f"shared memory {smem} bytes\n// out = [dQ | dK | dV], each [B·H][S][D]; blocks per head: "
              + (f"the key blocks; work: {work} zeroed bytes (fp32 dQ sum, arrival counters)\n" if atomic
                 else "the dK/dV jobs, then the dQ jobs\n"))
    body = Text(MASK_HELPER + BWD_COMMON + MMA_SYNC_HELPERS + (BWD_KERNEL_ATOMIC if atomic else BWD_KERNEL_JOBS))
    source = Text(body.safe_substitute(dk_dv_steps(atomic))).substitute(
        NAME=name, LOAD="fa_load_tile", **backward_constants(shape, s), **operand_constants(op, shape))
    return KernelSource(name, header + TILE_HELPERS + source, threads=WARP_SIZE * s.warps, grid=(blocks, 1, 1),
                        dynamic_smem=smem, fast_math=op.numerics is Numerics.FAST, workspace_bytes=work)


def dk_dv_steps(atomic: bool) -> dict[str, str]:
    """The pieces of the key blocks' walk that differ between the two forms."""
    if not atomic:
        return dict(DQ_HELPERS="", DQ_PARAMS="", DQ_SMEM="", DS_STORE="", DQ_STEP="", DQ_FINISH="")
    return dict(DQ_HELPERS=DQ_HELPERS,
                DQ_PARAMS=", $ELEM* dq_out, float* work",
                DQ_SMEM=DQ_SMEM, DS_STORE=DS_STORE, DQ_STEP=DQ_STEP, DQ_FINISH=DQ_FINISH)


# The query tiles a key job walks: from the one holding query kr0 (causal: earlier queries see none
# of its keys) to the last a key's window reaches
KEY_JOB_BOUNDS = r"""    const int t0 = CAUSAL ? kr0 / COLS : 0;
    const int t_end = WINDOW ? min(NQT, (kr0 + ROWS + WINDOW - 2) / COLS + 1) : NQT;
"""

# ... and the key tiles a query job walks: from the first its first row's window meets to its last
# row's key (causal)
QUERY_JOB_BOUNDS = r"""    const int n_tiles = CAUSAL ? min(NKT, (qr0 + ROWS + COLS - 1) / COLS) : NKT;
    const int t1 = WINDOW ? min(max(0, qr0 - WINDOW + 1) / COLS, n_tiles - 1) : 0;
"""

# A key job's start (both kernels; $LOAD copies a tile into their shared layout): its K and V rows
# in, the first query tiles on their way, dK and dV zeroed
KEY_JOB_START = r"""    $LOAD<ROWS, D, THREADS, K_ROW>(k_s, k + (long long)kr0 * K_ROW, SK - kr0, tid);
    $LOAD<ROWS, D, THREADS, V_ROW>(v_s, v + (long long)kr0 * V_ROW, SK - kr0, tid);
    cp_async_commit();
    #pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        const int t = t0 + i;
        if (t < t_end) {
            $LOAD<COLS, D, THREADS, Q_ROW>(q_s + i * COLS * D, q + (long long)t * COLS * Q_ROW, SQ - t * COLS, tid);
            $LOAD<COLS, D, THREADS, DO_ROW>(o_s + i * COLS * D, dout + (long long)t * COLS * DO_ROW, SQ - t * COLS, tid);
        }
        cp_async_commit();
    }
    float dk[D / 8][4], dv[D / 8][4];
    fab_zero(dk, D / 8);
    fab_zero(dv, D / 8);
"""

# ... and a query job's: its Q and dO rows in, the first key tiles on their way, its rows'
# statistics read, dQ zeroed
QUERY_JOB_START = r"""    $LOAD<ROWS, D, THREADS, Q_ROW>(q_s, q + (long long)qr0 * Q_ROW, SQ - qr0, tid);
    $LOAD<ROWS, D, THREADS, DO_ROW>(o_s, dout + (long long)qr0 * DO_ROW, SQ - qr0, tid);
    cp_async_commit();
    #pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        const int t = t1 + i;
        if (t < n_tiles) {
            $LOAD<COLS, D, THREADS, K_ROW>(k_s + i * COLS * D, k + (long long)t * COLS * K_ROW, SK - t * COLS, tid);
            $LOAD<COLS, D, THREADS, V_ROW>(v_s + i * COLS * D, v + (long long)t * COLS * V_ROW, SK - t * COLS, tid);
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
"""

# Per score of a key block's query tile (s and dp hold Sᵀ and dPᵀ as m16n8 accumulator fragments,
# rows keys from key0, columns queries from c0): P = exp(S − lse) into s, dS = P (dP − Δ) into dp
KEY_TILE_GRADIENTS = r"""        #pragma unroll
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
                    if (!in || key >= SK || (CAUSAL && key > col) || (WINDOW && key <= col - WINDOW)) p = 0.f;
                    s[j][2 * h + e] = p;
                    dp[j][2 * h + e] = p * (dp[j][2 * h + e] - delta);
                }
            }
"""

# ... and of a query block's key tile (S and dP: rows queries from row0, columns keys from k0, the
# rows' lse2 and delta in registers): dS into dp
QUERY_TILE_GRADIENTS = r"""        #pragma unroll
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
                    if (key >= SK || (CAUSAL && key > row) || (WINDOW && key <= row - WINDOW)) p = 0.f;
                    dp[j][2 * h + e] = p * (dp[j][2 * h + e] - delta[h]);
                }
            }
"""

# the sizes and the helpers both backward kernels (this one and attention_backward_wgmma_cuda.py) share
BWD_COMMON = r"""
constexpr int ROWS = $ROWS, COLS = $COLS, D = $D, WARPS = $WARPS, STAGES = $STAGES, THREADS = 32 * WARPS;
constexpr int SQ = $SQ, SK = $SK, BH = $BH;
constexpr int NKB = (SK + ROWS - 1) / ROWS, NQB = (SQ + ROWS - 1) / ROWS;
constexpr int NQT = (SQ + COLS - 1) / COLS, NKT = (SK + COLS - 1) / COLS;
constexpr float SCALE = $SCALE, SCALE_LOG2 = $SCALE_LOG2, LOG2E = 1.4426950408889634f;
constexpr bool CAUSAL = $CAUSAL;
constexpr int WINDOW = $WINDOW;                           // query i sees keys i - WINDOW + 1 .. i (0: all to i)
constexpr long long NQ = (long long)BH * SQ * D, NK = (long long)BH * SK * D;
constexpr int Q_ROW = $Q_ROW, K_ROW = $K_ROW, V_ROW = $V_ROW, DO_ROW = $DO_ROW;   // elements from row to row
constexpr int DQ_ROW = $DQ_ROW, DK_ROW = $DK_ROW, DV_ROW = $DV_ROW;

__device__ __forceinline__ void fab_zero(float (*acc)[4], int n) {
    for (int i = 0; i < n; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}

// this warp's 16 rows of acc · factor, rows from `row0`, below `rows`, as $ELEM into dst's rows,
// DST_ROW elements apart
template <int DST_ROW>
__device__ __forceinline__ void fab_store(const float (*acc)[4], float factor, $ELEM* dst, int row0, int rows, int lane) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + (lane >> 2) + 8 * h;
        if (row < rows) {
            #pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *(unsigned*)(dst + (long long)row * DST_ROW + n * 8 + 2 * (lane & 3)) =
                    $PACK(acc[n][2 * h] * factor, acc[n][2 * h + 1] * factor);
        }
    }
}

"""

# the mma.sync products and the key blocks' walk
MMA_SYNC_HELPERS = r"""
// Two products sharing their B tiles' rows: x = A_x Bᵀ and y = A_y Cᵀ over D, for this warp's 16
// rows of a_s / c_s (A fragments) against the COLS rows of the tiles bt / ct (B fragments)
__device__ __forceinline__ void fab_scores(float (*x)[4], float (*y)[4], const $ELEM* a_s, const $ELEM* c_s,
                                           const $ELEM* bt, const $ELEM* ct, int warp, int lane) {
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
            $MMA(x[2 * j], xa, b);
            $MMA(x[2 * j + 1], xa, b + 2);
            ldmatrix_x4(b, ct + at);
            $MMA(y[2 * j], ya, b);
            $MMA(y[2 * j + 1], ya, b + 2);
        }
    }
}

// acc += P t over the tile's COLS rows: P's accumulators repacked as A fragments, t's rows through
// transposed ldmatrix as B fragments (D output columns)
__device__ __forceinline__ void fab_accumulate(float (*acc)[4], const float (*p)[4], const $ELEM* t, int lane) {
    #pragma unroll
    for (int kk = 0; kk < COLS / 16; ++kk) {
        const unsigned a[4] = {$PACK(p[2 * kk][0], p[2 * kk][1]), $PACK(p[2 * kk][2], p[2 * kk][3]),
                               $PACK(p[2 * kk + 1][0], p[2 * kk + 1][1]), $PACK(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        #pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            unsigned b[4];
            ldmatrix_x4_trans(b, t + fa_swizzle(kk * 16 + (lane & 15), n * 16 + (lane >> 4) * 8, D));
            $MMA(acc[2 * n], a, b);
            $MMA(acc[2 * n + 1], a, b + 2);
        }
    }
}

$DQ_HELPERS// ROWS keys from kr0: dV = Σ Pᵀ dO and dK = scale Σ dSᵀ Q over the query tiles (this head's pointers);
// in the form without dQ blocks they also add each tile's dS K share into dQ's sum
__device__ __forceinline__ void fab_dk_dv(const $ELEM* q, const $ELEM* k, const $ELEM* v, const $ELEM* dout,
                                          const float* st, const $MASK_T* mp, $ELEM* dk_out, $ELEM* dv_out, int kr0,
                                          unsigned char* smem$DQ_PARAMS) {
    $ELEM* k_s = ($ELEM*)smem;                            // [ROWS][D]
    $ELEM* v_s = k_s + ROWS * D;                          // [ROWS][D]
    $ELEM* q_s = v_s + ROWS * D;                          // [STAGES][COLS][D]
    $ELEM* o_s = q_s + STAGES * COLS * D;                 // [STAGES][COLS][D], dO
$DQ_SMEM    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int key0 = kr0 + warp * 16;
""" + KEY_JOB_BOUNDS + KEY_JOB_START + r"""    for (int t = t0; t < t_end; ++t) {
        const int i = t - t0, next = t + STAGES - 1;
        if (next < t_end) {
            const int st_next = (i + STAGES - 1) % STAGES;
            fa_load_tile<COLS, D, THREADS, Q_ROW>(q_s + st_next * COLS * D, q + (long long)next * COLS * Q_ROW, SQ - next * COLS, tid);
            fa_load_tile<COLS, D, THREADS, DO_ROW>(o_s + st_next * COLS * D, dout + (long long)next * COLS * DO_ROW, SQ - next * COLS, tid);
        }
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const $ELEM* qt = q_s + (i % STAGES) * COLS * D;
        const $ELEM* ot = o_s + (i % STAGES) * COLS * D;
        const int c0 = t * COLS;
        float s[COLS / 8][4], dp[COLS / 8][4];            // Sᵀ and dPᵀ: rows are keys, columns queries
        fab_zero(s, COLS / 8);
        fab_zero(dp, COLS / 8);
        fab_scores(s, dp, k_s, v_s, qt, ot, warp, lane);
""" + KEY_TILE_GRADIENTS + r"""$DS_STORE        fab_accumulate(dv, s, ot, lane);
        fab_accumulate(dk, dp, qt, lane);
$DQ_STEP        __syncthreads();                                  // the stage is refilled next iteration
    }
    fab_store<DK_ROW>(dk, SCALE, dk_out, key0, SK, lane);
    fab_store<DV_ROW>(dv, 1.f, dv_out, key0, SK, lane);
$DQ_FINISH}

"""

# the jobs form's dQ blocks (ROWS queries each, recomputing S and dP over the key tiles) and its entry
BWD_KERNEL_JOBS = r"""// ROWS queries from qr0: dQ = scale Σ dS K over the key tiles (this head's pointers)
__device__ __forceinline__ void fab_dq(const $ELEM* q, const $ELEM* k, const $ELEM* v, const $ELEM* dout,
                                       const float* st, const $MASK_T* mp, $ELEM* dq_out, int qr0, unsigned char* smem) {
    $ELEM* q_s = ($ELEM*)smem;                            // [ROWS][D]
    $ELEM* o_s = q_s + ROWS * D;                          // [ROWS][D], dO
    $ELEM* k_s = o_s + ROWS * D;                          // [STAGES][COLS][D]
    $ELEM* v_s = k_s + STAGES * COLS * D;                 // [STAGES][COLS][D]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int row0 = qr0 + warp * 16;
""" + QUERY_JOB_BOUNDS + QUERY_JOB_START + r"""    for (int t = t1; t < n_tiles; ++t) {
        const int i = t - t1, next = t + STAGES - 1, st_next = (i + STAGES - 1) % STAGES;
        if (next < n_tiles) {
            fa_load_tile<COLS, D, THREADS, K_ROW>(k_s + st_next * COLS * D, k + (long long)next * COLS * K_ROW,
                                                  SK - next * COLS, tid);
            fa_load_tile<COLS, D, THREADS, V_ROW>(v_s + st_next * COLS * D, v + (long long)next * COLS * V_ROW,
                                                  SK - next * COLS, tid);
        }
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const $ELEM* kt = k_s + (i % STAGES) * COLS * D;
        const $ELEM* vt = v_s + (i % STAGES) * COLS * D;
        const int k0 = t * COLS;
        float s[COLS / 8][4], dp[COLS / 8][4];            // S and dP: rows are queries, columns keys
        fab_zero(s, COLS / 8);
        fab_zero(dp, COLS / 8);
        fab_scores(s, dp, q_s, o_s, kt, vt, warp, lane);
""" + QUERY_TILE_GRADIENTS + r"""        fab_accumulate(dq, dp, kt, lane);
        __syncthreads();
    }
    fab_store<DQ_ROW>(dq, SCALE, dq_out, row0, SQ, lane);
}

extern "C" __global__ void __launch_bounds__(THREADS)
$NAME(const $ELEM* __restrict__ q, const $ELEM* __restrict__ k, const $ELEM* __restrict__ v,
      const $ELEM* __restrict__ dout, const float* __restrict__ stats, $MASK_ARG$ELEM* __restrict__ out) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    const int bh = blockIdx.x / (NKB + NQB), job = blockIdx.x % (NKB + NQB);
$OFFSETS
    const float* st = stats + (long long)bh * SQ * 2;
$MASK_OFFSET
    if (job < NKB)
        fab_dk_dv(q + q_off, k + k_off, v + v_off, dout + do_off, st, mp, out + dk_off, out + dv_off,
                  job * ROWS, fa_smem);
    else
        fab_dq(q + q_off, k + k_off, v + v_off, dout + do_off, st, mp, out + dq_off, (job - NKB) * ROWS, fa_smem);
}
"""
