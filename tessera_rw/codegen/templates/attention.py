"""FlashAttention-2 forward on mma.sync: softmax(scale · Q Kᵀ [+ mask] [causal]) V in one pass.

One block owns BM query rows of one (batch, head); each warp owns 16·MT of those rows, keeps its Q
fragment, its O accumulator (fp32) and its running row max / sum in registers, and streams the
head's K/V in BN-key tiles through shared memory with cp.async (`stages` buffers in flight).
Scores never reach memory; only an explicit mask operand moves an Sq×Sk matrix through HBM.

>>> from tessera_rw.codegen.arch import arch_named
>>> t = FlashAttentionTemplate()
>>> op = t.samples()[0]
>>> t.schedules(op, arch_named("h100"))[0].describe()
'bm=128 bn=64 warps=8 stages=2'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from string import Template as Text

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import ArchSpec, MathUnit
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Resources, Schedule, Template

# head_dim 256 keeps a 128-register O accumulator and 64 registers of Q per thread: ptxas reaches
# 255 registers and spills once a mask or causal bounds are added, so it is left unfused
HEAD_DIMS = (64, 128)
MMA_M, MMA_K = 16, 16         # mma.sync m16n8k16: rows per warp tile, keys per k-step
LOG2E = 1.4426950408889634
SFU_PER_SM = 16               # ex2 throughput per SM per clock on sm_80 and sm_90 (4 per partition)
SIMT_OPS_PER_SCORE = 4        # scale-and-subtract FMA, running max, row-sum add, bf16 pack
HIDDEN_SOFTMAX = 0.5          # share of the softmax SIMT time that other warps' MMAs do not hide
MMA_SYNC_EFFICIENCY = {8: 0.7, 9: 0.5}   # mma.sync share of the tensor peak (sm_90's is wgmma's)
_MASK_TYPES = {DType.bool: "unsigned char", DType.float32: "float", DType.float16: "f16_t",
               DType.bfloat16: "bf16_t"}
_MASK_LOAD = {DType.bool: "(float)mv", DType.float32: "mv", DType.float16: "f16_to_f32(mv)",
              DType.bfloat16: "bf16_to_f32(mv)"}


@dataclass(frozen=True)
class AttentionSchedule(Schedule):
    """bm query rows per block (16·warps·MT), bn keys per K/V tile, warps per block, cp.async stages."""
    bm: int = 128
    bn: int = 64
    warps: int = 8
    stages: int = 2

    @property
    def m_tiles(self) -> int:
        """16-row MMA tiles each warp owns."""
        return self.bm // (MMA_M * self.warps)


@dataclass(frozen=True)
class _Shape:
    """The op's sizes as the kernel sees them: heads flattened into one batch index."""
    batch: tuple[int, ...]
    bh: int
    sq: int
    sk: int
    d: int
    dtype: DType
    causal: bool
    scale: float
    mask: TensorType | None

    @classmethod
    def of(cls, op: KernelOp) -> _Shape:
        q, k = op.operands[0], op.operands[1]
        a = op.attr_map
        batch = op.result.shape[:-2]
        scale = a.get("scale")
        return cls(batch, math.prod(batch), q.shape[-2], k.shape[-2], q.shape[-1], q.dtype,
                   bool(a.get("causal")), q.shape[-1] ** -0.5 if scale is None else float(scale),
                   op.operands[3] if a.get("has_mask") else None)

    def key_tiles(self, q0: int, s: AttentionSchedule) -> int:
        """K/V tiles the block starting at query row q0 visits (causal stops at its last row)."""
        tiles = -(-self.sk // s.bn)
        return min(tiles, -(-(q0 + s.bm) // s.bn)) if self.causal else tiles

    def visited_tiles(self, s: AttentionSchedule) -> int:
        """K/V tiles summed over one head's query blocks."""
        return sum(self.key_tiles(q0, s) for q0 in range(0, self.sq, s.bm))


def _round_up(x: int, to: int) -> int:
    return -(-x // to) * to


class FlashAttentionTemplate(Template):
    """flash_attention with bf16/fp16 q, k, v of one dtype, head_dim 64 or 128 and Dv == D; any
    broadcast batch, GQA heads, causal, and a bool or float (fp32/fp16/bf16) mask.

    >>> t = FlashAttentionTemplate()
    >>> [t.accepts(op) for op in t.samples()]
    [True, True, True, True, True, True]
    """
    kind = "flash_attention"
    ops = frozenset({"flash_attention"})

    def accepts(self, op: KernelOp) -> bool:
        """bf16/fp16 only: fp32 (and fp64) attention stays unfused, since its products would run on
        the SIMT pipe or tf32, where the unfused GEMM + softmax plan is as fast and keeps fp32's
        accuracy. head_dim 256 is rejected too (see HEAD_DIMS)."""
        if op.op not in self.ops or len(op.operands) < 3:
            return False
        q, k, v = op.operands[:3]
        if q.dtype not in (DType.bfloat16, DType.float16) or not (q.dtype == k.dtype == v.dtype == op.result.dtype):
            return False
        if q.shape[-1] not in HEAD_DIMS or v.shape[-1] != q.shape[-1] or min(q.ndim, k.ndim, v.ndim) < 2:
            return False
        mask = op.operands[3] if op.attr_map.get("has_mask") else None
        return mask is None or mask.dtype in _MASK_TYPES

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        a = op.attr_map
        return ("scale",) + (("mask",) if a.get("has_mask") else ()) + (("causal",) if a.get("causal") else ()) \
            + ("softmax",)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[AttentionSchedule, ...]:
        # 8 warps × 16 rows share each K/V tile among more rows; 4 warps × 16 rows keep more blocks
        # in flight when Sq is short or B·H small. Both hold D=128's O, Q, S fragments in < 245
        # registers. Short sequences shrink the tiles to what they cover instead of computing padding.
        shape = _Shape.of(op)
        bn = min(64, _round_up(shape.sk, MMA_K))
        found: list[AttentionSchedule] = []
        for warps in (8, 4):
            warps = min(warps, -(-shape.sq // MMA_M))
            s = AttentionSchedule(MMA_M * warps, bn, warps, 2)
            if s not in found and self._valid(op, s, arch):
                found.append(s)
        return tuple(found)

    def _valid(self, op: KernelOp, s: AttentionSchedule, arch: ArchSpec) -> bool:
        shape = _Shape.of(op)
        return (s.m_tiles >= 1 and s.bm == MMA_M * s.warps * s.m_tiles and s.bn % 16 == 0 and s.stages >= 1
                and self._smem(shape, s) <= arch.smem_per_block
                and self._registers(shape, s) <= arch.registers_per_thread
                and 32 * s.warps * self._registers(shape, s) <= arch.registers_per_sm)

    @staticmethod
    def _smem(shape: _Shape, s: AttentionSchedule) -> int:
        return (s.bm + 2 * s.stages * s.bn) * shape.d * 2

    @staticmethod
    def _registers(shape: _Shape, s: AttentionSchedule) -> int:
        mt, d = s.m_tiles, shape.d
        o_acc = mt * d * MMA_M // 32                 # fp32 O rows of this warp, spread over 32 lanes
        scores = mt * s.bn * MMA_M // 32             # fp32 S (then P) fragment of one K tile
        q_frag = mt * d * MMA_M // 64                # bf16 pairs: two elements per register
        row_stats = 4 * mt                           # running max and sum of 2 rows per lane
        v_frags = d // 4                             # one k-step of V's B fragments: D/8 pairs
        k_frags = s.bn // 4                          # ... and of K's: BN/8 pairs, hoisted ahead of the MMAs
        addressing = 24                              # tile pointers, smem addresses, loop counters
        edges = 12 if shape.causal or shape.sk % s.bn or shape.mask is not None else 0   # per-score predicates
        if -(-shape.sk // s.bn) == 1:
            # one key tile: nothing is carried around the loop, so ptxas streams Q's fragments into
            # S and each O column out to memory; only S and one k-step of V stay live together
            return scores + row_stats + v_frags + addressing + edges
        return o_acc + scores + q_frag + row_stats + v_frags + k_frags + addressing + edges

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        s = schedule
        assert isinstance(s, AttentionSchedule)
        shape = _Shape.of(op)
        q, k, v = op.operands[:3]
        q_blocks = -(-shape.sq // s.bm)
        tiles = shape.visited_tiles(s)                   # per (batch, head)
        scores = shape.bh * tiles * s.bm * s.bn          # padded score elements computed
        mma_flops = 4 * scores * shape.d                 # Q Kᵀ and P V, a multiply-add is 2
        flops = mma_flops + 5 * scores                   # scale, max, exp, sum, normalize per score
        regs = self._registers(shape, s)
        threads = 32 * s.warps
        per_sm = max(1, min(arch.registers_per_sm // (threads * regs), arch.smem_per_sm // self._smem(shape, s),
                            arch.max_warps_per_sm // s.warps))
        # Every query block re-reads its head's K/V. The blocks of the heads in flight share them
        # through L2 as long as those heads' K/V fit in half of it; beyond that each block's pass
        # comes from HBM again.
        kv_head = 2 * shape.sk * shape.d * q.dtype.itemsize
        heads_in_flight = -(-arch.sm_count * per_sm // q_blocks)
        kv_bytes = k.nbytes + v.nbytes
        if heads_in_flight * kv_head > arch.l2_bytes // 2:
            kv_bytes = shape.bh * tiles * s.bn * shape.d * 2 * q.dtype.itemsize
        hbm = q.nbytes + op.result.nbytes + kv_bytes
        if shape.mask is not None:
            # each (batch, head) reads its Sq×Sk slice once; a broadcast mask is shared through L2
            # only while all of it fits there
            read = shape.bh * min(tiles * s.bm * s.bn, shape.sq * shape.sk) * shape.mask.dtype.itemsize
            hbm += shape.mask.nbytes if shape.mask.nbytes <= arch.l2_bytes // 2 else read
        spill = max(0, regs - arch.registers_per_thread) * 4 * 2
        return Resources(threads=threads, blocks=shape.bh * q_blocks, registers=regs,
                         smem_bytes=self._smem(shape, s), hbm_bytes=hbm, flops=flops, unit=MathUnit.BF16,
                         efficiency=self._efficiency(shape.d, arch), spill_bytes=spill)

    @staticmethod
    def _efficiency(d: int, arch: ArchSpec) -> float:
        """The share of the bf16 tensor peak reached, per score: the MMA time at mma.sync's share of
        the peak plus the softmax's SIMT/SFU time that overlapping warps leave exposed."""
        clock = arch.sm_count * arch.clock_mhz * 1e6
        tensor_rate = arch.peak_flops(MathUnit.BF16) / clock          # flops per SM per clock
        lanes = arch.peak_flops(MathUnit.FP32) / clock / 2            # fp32 FMA lanes per SM
        base = MMA_SYNC_EFFICIENCY.get(arch.compute_capability[0], 0.5)
        mma = 4 * d / tensor_rate
        softmax = 1 / SFU_PER_SM + SIMT_OPS_PER_SCORE / lanes
        return round((4 * d + 5) / tensor_rate / (mma / base + HIDDEN_SOFTMAX * softmax), 3)

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        s = schedule
        assert isinstance(s, AttentionSchedule)
        if not self.accepts(op):
            raise ValueError(f"flash_attention template cannot implement {op}")
        shape = _Shape.of(op)
        q, k, v = op.operands[:3]
        tag = "bf16" if shape.dtype is DType.bfloat16 else "f16"
        elem = f"{tag}_t"
        name = (f"flash_attention_{tag}_d{shape.d}_{'causal_' if shape.causal else ''}"
                f"{'mask_' if shape.mask is not None else ''}bm{s.bm}_bn{s.bn}_w{s.warps}_s{s.stages}")
        mask = shape.mask
        mask_type = _MASK_TYPES[mask.dtype] if mask is not None else "float"
        mshape = (1,) * (len(shape.batch) + 2 - mask.ndim) + mask.shape if mask is not None else ()
        offsets, mask_strides = batch_offsets(shape.batch, q, k, v, mshape)
        smem = self._smem(shape, s)
        header = (f"// {op}\n// schedule: {s.describe()}\n"
                  f"// launch: {name}<<<{shape.bh * -(-shape.sq // s.bm)}, {32 * s.warps}, {smem}>>>"
                  f"(q, k, v{', mask' if mask is not None else ''}, out); dynamic shared memory {smem} bytes "
                  f"(raise cudaFuncAttributeMaxDynamicSharedMemorySize above 48 KB)\n"
                  f"// contiguous row-major operands; blocks are (batch·head, query block), query block fastest\n")
        source = Text(KERNEL).substitute(
            NAME=name, ELEM=elem, MMA="mma_bf16_16816" if tag == "bf16" else "mma_f16_16816",
            PACK="pack_bf16x2" if tag == "bf16" else "pack_f16x2",
            BM=s.bm, BN=s.bn, D=shape.d, WARPS=s.warps, STAGES=s.stages, SQ=shape.sq, SK=shape.sk,
            SCALE_LOG2=f"{shape.scale * LOG2E!r}f", CAUSAL="true" if shape.causal else "false",
            HAS_MASK="true" if mask is not None else "false", MASK_T=mask_type,
            MASK_ARG=f"const {mask_type}* __restrict__ mask, " if mask is not None else "",
            MASK_VALUE=_MASK_LOAD[mask.dtype] if mask is not None else "0.f",
            MASK_BOOL="true" if mask is not None and mask.dtype is DType.bool else "false",
            MASK_ROW_STRIDE=mask_strides[0], MASK_COL_STRIDE=mask_strides[1],
            MASK_PTR="mask + m_off" if mask is not None else "nullptr", OFFSETS=offsets)
        return KernelSource(name, header + source, threads=32 * s.warps)

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f16 = DType.bfloat16, DType.float16

        def attn(b: int, hq: int, hkv: int, s: int, d: int, dtype: DType, causal: bool = False,
                 mask: DType | None = None, mask_batch: tuple[int, ...] = ()) -> KernelOp:
            q = TensorType((b, hq, s, d), dtype)
            kv = TensorType((b, hkv, s, d), dtype)
            operands = (q, kv, kv) + ((TensorType(mask_batch + (s, s), mask),) if mask else ())
            return KernelOp.of("flash_attention", operands, q, scale=d ** -0.5, causal=causal,
                               has_mask=mask is not None)
        return (attn(4, 16, 16, 4096, 64, bf),
                attn(2, 16, 16, 2048, 128, bf, causal=True),
                attn(2, 8, 8, 1024, 64, f16, mask=f16, mask_batch=(2, 1)),
                attn(2, 16, 4, 2048, 128, bf),
                attn(3, 8, 8, 1000, 64, bf, causal=True),
                attn(1, 2, 2, 16, 128, f16, mask=DType.bool))


def batch_offsets(batch: tuple[int, ...], q: TensorType, k: TensorType, v: TensorType,
                  mask_shape: tuple[int, ...]) -> tuple[str, tuple[int, int]]:
    """CUDA statements turning the flat (batch, head) index `bh` into each operand's element offset
    (broadcast dims add nothing, a GQA head axis divides), and the mask's row and column strides.

    >>> from tessera_rw.algebra.dtypes import DType
    >>> q, kv = TensorType((2, 8, 4, 64), DType.bfloat16), TensorType((2, 2, 4, 64), DType.bfloat16)
    >>> print(batch_offsets((2, 8), q, kv, kv, ())[0].splitlines()[2])
            i = rem % 8; rem /= 8; q_off += (long long)i * 256; k_off += (long long)(i / 4) * 256; v_off += (long long)(i / 4) * 256;
    """
    operands = [(name, t.shape[:-2], t.shape[-2] * t.shape[-1]) for name, t in (("q_off", q), ("k_off", k), ("v_off", v))]
    strides = (0, 0)
    if mask_shape:
        rows, cols = mask_shape[-2:]
        operands.append(("m_off", mask_shape[:-2], rows * cols))
        strides = (cols if rows != 1 else 0, 1 if cols != 1 else 0)
    lines = [f"    long long {' = 0, '.join(name for name, _, _ in operands)} = 0;", "    {  int rem = bh, i;"]
    for axis in reversed(range(len(batch))):
        n = batch[axis]
        terms = []
        for name, dims, per_batch in operands:
            dims = (1,) * (len(batch) - len(dims)) + tuple(dims)
            if dims[axis] == 1:
                continue
            index = "i" if dims[axis] == n else f"(i / {n // dims[axis]})"
            terms.append(f"{name} += (long long){index} * {math.prod(dims[axis + 1:]) * per_batch};")
        lines.append(f"        i = rem % {n}; rem /= {n}; " + " ".join(terms))
    lines.append("    }")
    return "\n".join(lines), strides


KERNEL = r"""
// element offset of (row, col) in a [rows][width] shared tile whose 16-byte chunks are XOR-swizzled
// by row, so the 8 row addresses of one ldmatrix land in 8 different bank groups
__device__ __forceinline__ int fa_swizzle(int row, int col, int width) {
    return row * width + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
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

__device__ __forceinline__ float fa_exp2(float x) {
    float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}

extern "C" __global__ void __launch_bounds__($WARPS * 32)
$NAME(const $ELEM* __restrict__ q, const $ELEM* __restrict__ k, const $ELEM* __restrict__ v,
      $MASK_ARG$ELEM* __restrict__ out) {
    constexpr int BM = $BM, BN = $BN, D = $D, WARPS = $WARPS, STAGES = $STAGES, THREADS = 32 * WARPS;
    constexpr int MT = BM / (16 * WARPS);                 // 16-row MMA tiles per warp
    constexpr int SQ = $SQ, SK = $SK, NQB = (SQ + BM - 1) / BM, NKT = (SK + BN - 1) / BN;
    constexpr float SCALE_LOG2 = $SCALE_LOG2;             // the softmax runs in base 2: scale · log2(e)
    constexpr float LOG2E = 1.4426950408889634f;
    const float NEG_INF = __int_as_float(0xff800000);
    constexpr bool CAUSAL = $CAUSAL, HAS_MASK = $HAS_MASK, MASK_BOOL = $MASK_BOOL;
    constexpr long long MASK_ROW = $MASK_ROW_STRIDE, MASK_COL = $MASK_COL_STRIDE;

    extern __shared__ __align__(16) unsigned char fa_smem[];
    $ELEM* q_s = ($ELEM*)fa_smem;                         // [BM][D]
    $ELEM* k_s = q_s + BM * D;                            // [STAGES][BN][D]
    $ELEM* v_s = k_s + STAGES * BN * D;                   // [STAGES][BN][D]

    const int qb = blockIdx.x % NQB, bh = blockIdx.x / NQB;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;               // mma fragment: row in 8, column pair in 4
$OFFSETS
    const int q0 = qb * BM, row0 = q0 + warp * 16 * MT;
    const $ELEM* kp = k + k_off;
    const $ELEM* vp = v + v_off;
    const $MASK_T* mp = $MASK_PTR;
    // causal: key tiles past the block's last row are all masked, so they are never loaded
    const int n_tiles = CAUSAL ? min(NKT, (q0 + BM + BN - 1) / BN) : NKT;

    fa_load_tile<BM, D, THREADS>(q_s, q + q_off + (long long)q0 * D, SQ - q0, tid);
    cp_async_commit();
    #pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < n_tiles) {
            fa_load_tile<BN, D, THREADS>(k_s + t * BN * D, kp + (long long)t * BN * D, SK - t * BN, tid);
            fa_load_tile<BN, D, THREADS>(v_s + t * BN * D, vp + (long long)t * BN * D, SK - t * BN, tid);
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
            fa_load_tile<BN, D, THREADS>(k_s + st * BN * D, kp + (long long)next * BN * D, SK - next * BN, tid);
            fa_load_tile<BN, D, THREADS>(v_s + st * BN * D, vp + (long long)next * BN * D, SK - next * BN, tid);
        }
        cp_async_commit();                                // an empty group keeps the wait count uniform
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const $ELEM* kt = k_s + (t % STAGES) * BN * D;
        const $ELEM* vt = v_s + (t % STAGES) * BN * D;
        const int k0 = t * BN;

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

        // online softmax; only the ragged last tile and tiles crossing this warp's diagonal need bounds
        const bool edge = (k0 + BN > SK) || (CAUSAL && k0 + BN - 1 > row0);
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
                        if (edge && (col >= SK || (CAUSAL && col > row))) x = NEG_INF;
                        s[m][j][2 * h + e] = x;
                        mx = fmaxf(mx, x);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the 4 lanes of a quad share a row
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m_run[m][h], mx);
                const float base = m_new == NEG_INF ? 0.f : m_new;   // no -inf - -inf while a row is all masked
                const float corr = fa_exp2(m_run[m][h] - base);
                m_run[m][h] = m_new;
                float sum = 0.f;
                #pragma unroll
                for (int j = 0; j < BN / 8; ++j)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float p = fa_exp2(s[m][j][2 * h + e] - base);
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
                $ELEM* dst = out + (long long)bh * SQ * D + (long long)row * D + 2 * t4;
                #pragma unroll
                for (int n = 0; n < D / 8; ++n)
                    *(unsigned*)(dst + n * 8) = $PACK(o[m][n][2 * h] * inv, o[m][n][2 * h + 1] * inv);
            }
        }
}
"""
