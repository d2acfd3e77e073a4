"""The CUDA text of the FlashAttention-2 forward kernel and the function that fills it in.

FlashAttentionTemplate (attention.py) picks the schedule and models registers, shared memory and
traffic; this module only writes the chosen kernel out: KERNEL is the source with `$NAME`-style
holes, `emit_kernel` fills them with the op's sizes, dtypes, mask and broadcast offsets. It is a
module of its own so the template's decisions read apart from some 200 lines of kernel text. It
imports nothing from attention.py at run time.

>>> from tessera_rw.codegen.arch import arch_named
>>> from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
>>> from tessera_rw.codegen.templates.attention_problem import AttentionShape
>>> t = FlashAttentionTemplate()
>>> op = t.samples()[0]
>>> arch = arch_named("a100")
>>> s = t.schedules(op, arch)[0]
>>> emit_kernel(op, AttentionShape.of(op), s, t.resources(op, s, arch).smem_bytes).name
'flash_attention_bf16_d64_bm128_bn64_w8_s2'
"""

from __future__ import annotations

from string import Template as Text

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.attention_problem import (AttentionSchedule, AttentionShape, RowLayout, row_layouts,
                                                            writes_lse)
from tessera_rw.codegen.templates.cuda_scalar import float_literal
from tessera_rw.codegen.tensor_map import TensorMapSpec

LOG2E = 1.4426950408889634
# mask dtypes the kernel reads, as their C types; accepts() admits exactly these
MASK_TYPES = {DType.bool: "unsigned char", DType.float32: "float", DType.float16: "f16_t",
              DType.bfloat16: "bf16_t"}
MASK_LOAD = {DType.bool: "(float)mv", DType.float32: "mv", DType.float16: "f16_to_f32(mv)",
              DType.bfloat16: "bf16_to_f32(mv)"}


def emit_kernel(op: KernelOp, shape: AttentionShape, s: AttentionSchedule, smem: int) -> KernelSource:
    """The mma.sync kernel for `op` under schedule `s`, after a comment giving its launch (`smem`
    bytes of dynamic shared memory, as the template counts them)."""
    return fill_kernel(KERNEL, op, shape, s, smem, LAUNCH_BOUNDS=f"{s.warps} * 32", MMA=f"mma_{shape.kind}_16816",
                       RESCALE_O=RESCALE_IN_PLACE)


# ONLINE_SOFTMAX's last step for a row: O's running sum rescaled to the new max at once
RESCALE_IN_PLACE = """#pragma unroll
                for (int n = 0; n < D / 8; ++n) { o[m][n][2 * h] *= corr; o[m][n][2 * h + 1] *= corr; }"""


def fill_kernel(text: str, op: KernelOp, shape: AttentionShape, s: AttentionSchedule, smem: int,
                target: str | None = None, tensor_maps: tuple[TensorMapSpec, ...] = (), suffix: str = "",
                **holes: str) -> KernelSource:
    """`text` (a forward kernel) with its holes filled for `op` under `s`, after its launch comment;
    `holes` are the kernel's own, beyond those every forward kernel has. A kernel loading through
    `tensor_maps` takes them after the output, named tma_q, tma_k, tma_v; `suffix` ends its name."""
    q, k, v = op.operands[:3]
    tag = shape.kind
    elem = f"{tag}_t"
    variant = f"{s.tag}_" if s.tag else ""
    name = (f"{op.op}_{variant}{tag}_d{shape.d}_{'causal_' if shape.causal else ''}"
            f"{f'win{shape.window}_' if shape.window else ''}"
            f"{'mask_' if shape.mask is not None else ''}bm{s.bm}_bn{s.bn}_w{s.warps}_s{s.stages}{suffix}")
    mask = shape.mask
    mask_type = MASK_TYPES[mask.dtype] if mask is not None else "float"
    mshape = (1,) * (len(shape.batch) + 2 - mask.ndim) + mask.shape if mask is not None else ()
    layouts = row_layouts(op)
    offsets, mask_strides = batch_offsets(shape.batch, layouts, mshape)
    maps = ("tma_q", "tma_k", "tma_v") if tensor_maps else ()
    header = (f"// {op}\n// schedule: {s.describe()}\n"
              f"// launch: {name}<<<{shape.bh * -(-shape.sq // s.bm)}, {s.threads}, {smem}>>>"
              f"(q, k, v{', mask' if mask is not None else ''}, out{''.join(', ' + m for m in maps)}); dynamic shared memory {smem} bytes "
              "(raise cudaFuncAttributeMaxDynamicSharedMemorySize above 48 KB)\n"
              f"// rows of {shape.d} contiguous values, {', '.join(str(layout.row) for layout in layouts)} apart "
              "in q, k, v, out; "
              "blocks are (batch·head, query block), query block fastest\n"
              + ("// out = [O | each row's logsumexp, high parts | their remainders]\n"
                 if writes_lse(op) else ""))
    source = Text(text).substitute(
        NAME=name, ELEM=elem, STORE_LSE=store_lse(op, shape), PACK="pack_bf16x2" if tag == "bf16" else "pack_f16x2",
        BM=s.bm, BN=s.bn, D=shape.d, WARPS=s.warps, STAGES=s.stages, SQ=shape.sq, SK=shape.sk,
        SCALE_LOG2=float_literal(shape.scale * LOG2E), CAUSAL="true" if shape.causal else "false", WINDOW=shape.window,
        HAS_MASK="true" if mask is not None else "false", MASK_T=mask_type,
        MASK_ARG=f"const {mask_type}* __restrict__ mask, " if mask is not None else "",
        MASK_VALUE=MASK_LOAD[mask.dtype] if mask is not None else "0.f",
        MASK_BOOL="true" if mask is not None and mask.dtype is DType.bool else "false",
        MASK_ROW_STRIDE=mask_strides[0], MASK_COL_STRIDE=mask_strides[1],
        MASK_PTR="mask + m_off" if mask is not None else "nullptr", OFFSETS=offsets,
        **{f"{name}_ROW": layout.row for name, layout in zip("QKVO", layouts)},
        TMA_ARGS="".join(f",\n      const __grid_constant__ TmaMap {m}" for m in maps), **holes)
    return KernelSource(name, header + source, threads=s.threads, tensor_maps=tensor_maps,
                        grid=(shape.bh * -(-shape.sq // s.bm), 1, 1), dynamic_smem=smem,
                        fast_math=op.numerics is Numerics.FAST, target=target)


def store_lse(op: KernelOp, shape: AttentionShape) -> str:
    """flash_attention_lse's part of the output store: the row's logsumexp in base e, m + log2(l)
    scaled by ln 2, written by the first lane of its quad as a high part (rounded to bf16) after O
    and the remainder after all rows' high parts, in the element type (fp16: a finite high part
    saturates at ±65504, as split_lse's); a fully masked row's is −∞ with no remainder, as the
    reference's. Nothing for flash_attention."""
    if not writes_lse(op):
        return ""
    to_elem = "f32_to_bf16" if shape.kind == "bf16" else "f32_to_f16"
    rounded = "bf16_to_f32(f32_to_bf16(lse))"
    high = rounded if shape.kind == "bf16" else f"none ? lse : fminf(fmaxf({rounded}, -65504.f), 65504.f)"
    rows = shape.bh * shape.sq
    return f"""            if (t4 == 0 && row < SQ) {{
                const long long at = {rows * shape.d}LL + (long long)bh * SQ + row;
                const bool none = m_run[m][h] == NEG_INF;
                const float lse = none ? NEG_INF : (m_run[m][h] + log2f(l)) * 0.6931471805599453f;
                const float hi = {high};
                out[at] = {to_elem}(hi);
                out[at + {rows}LL] = {to_elem}(none ? 0.f : lse - hi);
            }}
"""


def batch_offsets(batch: tuple[int, ...], layouts: tuple[RowLayout, ...],
                  mask_shape: tuple[int, ...]) -> tuple[str, tuple[int, int]]:
    """CUDA statements turning the flat (batch, head) index `bh` into the element offset of q's,
    k's, v's and O's rows (`layouts`, in that order; a broadcast dim adds nothing, a GQA head axis
    divides), and the mask's row and column strides.

    >>> from tessera_rw.algebra.node import TensorType
    >>> q, kv = TensorType((2, 8, 4, 64), DType.bfloat16), TensorType((2, 2, 4, 64), DType.bfloat16)
    >>> layouts = [RowLayout.dense(t.shape, 2) for t in (q, kv, kv, q)]
    >>> print(batch_offsets((2, 8), layouts, ())[0].splitlines()[2])
            i = rem % 8; rem /= 8; q_off += (long long)i * 256; k_off += (long long)(i / 4) * 256; \
v_off += (long long)(i / 4) * 256; o_off += (long long)i * 256;
    """
    operands = list(zip(("q_off", "k_off", "v_off", "o_off"), layouts))
    strides = (0, 0)
    if mask_shape:
        operands.append(("m_off", RowLayout.dense(mask_shape, len(mask_shape) - 2)))
        strides = mask_strides(mask_shape)
    return offset_statements(batch, operands), strides


def mask_strides(mask_shape: tuple[int, ...]) -> tuple[int, int]:
    """A mask's row and column strides: 0 along an axis it broadcasts over."""
    rows, cols = mask_shape[-2:]
    return (cols if rows != 1 else 0, 1 if cols != 1 else 0)


def offset_statements(batch: tuple[int, ...], operands: list[tuple[str, RowLayout]]) -> str:
    """CUDA declaring each `(name, layout)` operand's offset for the flat (batch, head) index `bh`:
    a broadcast dim adds nothing, a smaller (GQA) one divides the index."""
    lines = ["    long long " + ", ".join(f"{name} = {layout.offset}" for name, layout in operands) + ";",
             "    {  int rem = bh, i;"]
    for axis in reversed(range(len(batch))):
        n = batch[axis]
        terms = []
        for name, layout in operands:
            lead = len(batch) - len(layout.batch)
            dims, strides = (1,) * lead + layout.batch, (0,) * lead + layout.strides
            if dims[axis] == 1 or strides[axis] == 0:
                continue
            index = "i" if dims[axis] == n else f"(i / {n // dims[axis]})"
            terms.append(f"{name} += (long long){index} * {strides[axis]};")
        lines.append(f"        i = rem % {n}; rem /= {n}; " + " ".join(terms))
    lines.append("    }")
    return "\n".join(lines)


# tile loads and exp2, shared with the backward kernels (attention_backward_cuda.py)
TILE_HELPERS = r"""
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

"""

# the pieces both forward kernels share (attention_wgmma_cuda.py writes the other); the names they
# use: S and O as m16n8 accumulator fragments s[MT][BN/8][4] and o[MT][D/8][4] (lane 4g + t4 holds
# rows g and g + 8 of its warp's 16 at columns 2·t4, 2·t4 + 1 of each 8), k0 the tile's first key;
# ONLINE_SOFTMAX ends each row with $RESCALE_O, where `corr` scales the row's O to the new max
SIGNATURE = r"""extern "C" __global__ void __launch_bounds__($LAUNCH_BOUNDS)
$NAME(const $ELEM* __restrict__ q, const $ELEM* __restrict__ k, const $ELEM* __restrict__ v,
      $MASK_ARG$ELEM* __restrict__ out$TMA_ARGS) {
"""

CONSTANTS = r"""    constexpr int BM = $BM, BN = $BN, D = $D, WARPS = $WARPS, STAGES = $STAGES, THREADS = 32 * WARPS;
    constexpr int MT = BM / (16 * WARPS);                 // 16-row MMA tiles per warp
    constexpr int SQ = $SQ, SK = $SK, NQB = (SQ + BM - 1) / BM, NKT = (SK + BN - 1) / BN;
    constexpr float SCALE_LOG2 = $SCALE_LOG2;             // the softmax runs in base 2: scale · log2(e)
    constexpr float LOG2E = 1.4426950408889634f;
    const float NEG_INF = __int_as_float(0xff800000);
    constexpr bool CAUSAL = $CAUSAL, HAS_MASK = $HAS_MASK, MASK_BOOL = $MASK_BOOL;
    constexpr int WINDOW = $WINDOW;                       // row i keeps keys i - WINDOW + 1 .. i (0: all to i)
    constexpr long long MASK_ROW = $MASK_ROW_STRIDE, MASK_COL = $MASK_COL_STRIDE;
    constexpr int Q_ROW = $Q_ROW, K_ROW = $K_ROW, V_ROW = $V_ROW;   // elements from row to row
    constexpr long long O_ROW = $O_ROW;
"""

BLOCK_INDEX = r"""    // a head's query blocks run side by side (they share its K and V in L2); causal ones longest first,
    // so the short blocks fill the last wave
    const int qb = CAUSAL ? NQB - 1 - (int)(blockIdx.x % NQB) : (int)(blockIdx.x % NQB), bh = blockIdx.x / NQB;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;               // mma fragment: row in 8, column pair in 4
$OFFSETS
    const int q0 = qb * BM, row0 = q0 + warp * 16 * MT;
    // causal: key tiles past the block's last row are all masked, so they are never loaded; under a
    // window neither are those before its first row's band: the walk starts at key key0
    const int end_tile = CAUSAL ? min(NKT, (q0 + BM + BN - 1) / BN) : NKT;
    const int key0 = WINDOW ? min(max(0, q0 - WINDOW + 1) / BN, end_tile - 1) * BN : 0;
    const int n_tiles = end_tile - key0 / BN;
    const $ELEM* kp = k + k_off + (long long)key0 * K_ROW;
    const $ELEM* vp = v + v_off + (long long)key0 * V_ROW;
    const $MASK_T* mp = $MASK_PTR;
"""

RUNNING_STATE = r"""    float o[MT][D / 8][4];
    float m_run[MT][2], l_run[MT][2];                     // rows g and g + 8: running max (base 2), partial sum
    #pragma unroll
    for (int m = 0; m < MT; ++m) {
        #pragma unroll
        for (int n = 0; n < D / 8; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.f;
        m_run[m][0] = m_run[m][1] = NEG_INF;
        l_run[m][0] = l_run[m][1] = 0.f;
    }

"""

ONLINE_SOFTMAX = r"""        // online softmax; only the ragged last tile and tiles crossing this warp's diagonal (or
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
                            const $MASK_T mv = mp[row * MASK_ROW + col * MASK_COL];
                            if (MASK_BOOL) x = mv ? x : NEG_INF;
                            else x += $MASK_VALUE * LOG2E;
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
                $RESCALE_O
            }

"""

STORE_OUTPUT = r"""    #pragma unroll
    for (int m = 0; m < MT; ++m)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_run[m][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = 1.f / l;                    // 0 · inf = NaN for an all-masked row, as the reference
            const int row = row0 + m * 16 + g + 8 * h;
            if (row < SQ) {
                $ELEM* dst = out + o_off + (long long)row * O_ROW + 2 * t4;
                #pragma unroll
                for (int n = 0; n < D / 8; ++n)
                    *(unsigned*)(dst + n * 8) = $PACK(o[m][n][2 * h] * inv, o[m][n][2 * h + 1] * inv);
            }
$STORE_LSE        }
}
"""


KERNEL = TILE_HELPERS + SIGNATURE + CONSTANTS + r"""
    extern __shared__ __align__(16) unsigned char fa_smem[];
    $ELEM* q_s = ($ELEM*)fa_smem;                         // [BM][D]
    $ELEM* k_s = q_s + BM * D;                            // [STAGES][BN][D]
    $ELEM* v_s = k_s + STAGES * BN * D;                   // [STAGES][BN][D]

""" + BLOCK_INDEX + r"""
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

""" + RUNNING_STATE + r"""    for (int t = 0; t < n_tiles; ++t) {
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
        const $ELEM* kt = k_s + (t % STAGES) * BN * D;
        const $ELEM* vt = v_s + (t % STAGES) * BN * D;
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
                for (int m = 0; m < MT; ++m) { $MMA(s[m][2 * j], qf[m][kk], b); $MMA(s[m][2 * j + 1], qf[m][kk], b + 2); }
            }

""" + ONLINE_SOFTMAX + r"""        // O += P V: the S accumulators are already laid out as A fragments; V needs transposed ldmatrix
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            unsigned a[MT][4];
            #pragma unroll
            for (int m = 0; m < MT; ++m) {
                a[m][0] = $PACK(s[m][2 * kk][0], s[m][2 * kk][1]);
                a[m][1] = $PACK(s[m][2 * kk][2], s[m][2 * kk][3]);
                a[m][2] = $PACK(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
                a[m][3] = $PACK(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
            }
            #pragma unroll
            for (int n = 0; n < D / 16; ++n) {
                unsigned b[4];
                ldmatrix_x4_trans(b, vt + fa_swizzle(kk * 16 + (lane & 15), n * 16 + (lane >> 4) * 8, D));
                #pragma unroll
                for (int m = 0; m < MT; ++m) { $MMA(o[m][2 * n], a[m], b); $MMA(o[m][2 * n + 1], a[m], b + 2); }
            }
        }
        __syncthreads();                                  // the stage is refilled next iteration
    }

""" + STORE_OUTPUT
