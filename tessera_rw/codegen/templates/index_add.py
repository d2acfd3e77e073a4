"""index_add: slices summed at their indices (take's gradient, an embedding table's), in a fixed
order, no two blocks adding into one row.

g is walked as (outer, m, inner) for m indices and the result as (outer, n, inner). A block owns
`rows` consecutive result rows of one outer slice, every inner column of them, its threads
striding over the columns `vec` at a time with an fp32 sum per (row, column) in registers. It
walks all m indices in chunks of its thread count: each thread tests one index against the
block's rows, the hits are compacted in index order (a warp scan of the flags through shuffles,
the warps' counts through shared memory), and every thread adds the hit slices' columns to its
sums, in that order. The sums are then written, zeros where no index hit. Each block reads every
index (from L2 after the first blocks) and only the g slices its rows own, so g is read once; no
two blocks write one row, and the order of the additions is the indices', so every run gives the
same bits (the `deterministic` policy) and a result equal to numpy's add.at in fp32.

>>> from tessera_rw.algebra.dtypes import DType
>>> g, tokens = TensorType((8, 1024, 768), DType.bfloat16), TensorType((8, 1024), DType.int32)
>>> op = KernelOp.of("index_add", (g, tokens), TensorType((50257, 768), DType.bfloat16), axis=0, size=50257)
>>> IndexAddTemplate().schedules(op, arch_named("h100"))[0].describe()
'threads=256 vec=2 rows=8'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import WARP_SIZE, ArchSpec, MathUnit, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.cuda_scalar import MAX_ACCESS_BYTES, STORAGE, VEC_STRUCT, kernel_name, load, store
from tessera_rw.codegen.templates.gather import INDEX_DTYPES, take_dims

MAX_INDEX = 2**31
MAX_SUMS = 32             # fp32 sums a thread keeps in registers: rows x its columns
VALUE_DTYPES = (DType.float32, DType.float16, DType.bfloat16)
GRID_THREADS, GRID_VECS, GRID_ROWS = (32, 64, 128, 256, 512), (1, 2, 4, 8), (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class IndexAddSchedule(Schedule):
    threads: int = 128
    vec: int = 2          # consecutive columns a thread sums per step
    rows: int = 4         # result rows a block owns


class IndexAddTemplate(Template):
    """index_add of 16/32-bit floats along any axis, by int32 or int64 indices."""

    kind = "reduction"
    ops = frozenset({"index_add"})

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops:
            return False
        g, indices = op.operands
        return (g.dtype in VALUE_DTYPES and indices.dtype in INDEX_DTYPES and op.result.numel > 0
                and all(t.numel < MAX_INDEX for t in (g, indices, op.result)))

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return ("index_add",)

    def _dims(self, op: KernelOp) -> tuple[int, int, int, int]:
        """(outer, n, inner, m): the result as (outer, n, inner), and the number of indices."""
        return take_dims(op.result, op.operands[1], op.attr_map["axis"])

    def _vec_ok(self, op: KernelOp, v: int) -> bool:
        _, _, inner, _ = self._dims(op)
        return v == 1 or (inner % v == 0 and v * op.result.dtype.itemsize <= MAX_ACCESS_BYTES)

    def _columns(self, op: KernelOp, s: IndexAddSchedule) -> int:
        """The vectors of columns each thread sums: the row's share, or as many as the sums allow
        (the row then split into strips, a block each)."""
        _, _, inner, _ = self._dims(op)
        return max(1, min(math.ceil(inner / (s.threads * s.vec)), MAX_SUMS // (s.rows * s.vec)))

    def _strips(self, op: KernelOp, s: IndexAddSchedule) -> int:
        """The strips of columns a row is split into, a block each."""
        _, _, inner, _ = self._dims(op)
        return math.ceil(inner / (s.threads * s.vec * self._columns(op, s)))

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[IndexAddSchedule, ...]:
        _, n, inner, _ = self._dims(op)
        vecs = [v for v in (4, 2, 1) if self._vec_ok(op, v)]
        found = []
        for vec in (vecs[min(1, len(vecs) - 1)], vecs[0]):
            # the fewest warps that give each thread a vector of the row (at least one warp), up to 256
            threads = min(256, max(WARP_SIZE, math.ceil(inner / vec / WARP_SIZE) * WARP_SIZE))
            per_row = min(math.ceil(inner / (threads * vec)) * vec, MAX_SUMS)
            rows = max(1, min(MAX_SUMS // per_row, n))
            rows = 1 << (rows.bit_length() - 1)            # a power of two
            found.append(IndexAddSchedule(threads, vec, rows))
        return tuple(dict.fromkeys(s for s in found if self.valid(op, s, arch)))

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[IndexAddSchedule, ...]:
        vecs = [v for v in GRID_VECS if self._vec_ok(op, v)]
        grid = (IndexAddSchedule(t, v, r) for t in GRID_THREADS for v in vecs for r in GRID_ROWS)
        return grid_space(self.schedules(op, arch), grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        s = schedule
        return (isinstance(s, IndexAddSchedule) and self.accepts(op) and s.threads % WARP_SIZE == 0
                and 0 < s.threads <= min(arch.max_threads_per_block, WARP_SIZE * WARP_SIZE) and s.rows >= 1
                and self._vec_ok(op, s.vec) and s.rows * self._columns(op, s) * s.vec <= MAX_SUMS)

    def resources(self, op: KernelOp, s: IndexAddSchedule, arch: ArchSpec) -> Resources:
        outer, n, inner, m = self._dims(op)
        g, indices = op.operands
        blocks = outer * math.ceil(n / s.rows) * self._strips(op, s)
        sums = s.rows * self._columns(op, s) * s.vec
        regs = max(REG_FLOOR, REG_BASE + REG_PER_SUM * sums)
        smem = 4 * (s.threads + s.threads // WARP_SIZE + 1)
        # g once, the result once, the indices from HBM once and from L2 by every block
        return Resources(threads=s.threads, blocks=blocks, registers=round(regs), smem_bytes=smem,
                         hbm_bytes=g.nbytes + op.result.nbytes + indices.nbytes, flops=g.numel, unit=MathUnit.FP32,
                         l2_feed_bytes=indices.nbytes * blocks + g.nbytes)

    def emit(self, op: KernelOp, s: IndexAddSchedule, arch: ArchSpec) -> KernelSource:
        name = kernel_name(self.kind, op, s)
        g, indices = op.operands
        outer, n, inner, m = self._dims(op)
        t, it, rows, threads = STORAGE[g.dtype], STORAGE[indices.dtype], s.rows, s.threads
        blocks, strips = self.resources(op, s, arch).blocks, self._strips(op, s)
        source = f"""// {op}
// index_add: {m} slices of {inner} summed into {n} rows ({outer} outer), a block owning {rows} rows,
// the hits taken in index order (the same order every run); schedule {s.describe()}.
// launch: {name}<<<{blocks}, {threads}>>>(in0, in1, out)
{VEC_STRUCT}
extern "C" __global__ void __launch_bounds__({threads}) {name}(const {t}* __restrict__ in0,
        const {it}* __restrict__ in1, {t}* __restrict__ out) {{
    __shared__ int hits[{threads}];                   // (thread of the chunk) * rows + row, in index order
    __shared__ int warp_start[{threads // WARP_SIZE + 1}];
    const unsigned strip = blockIdx.x % {strips}u, rows_at = blockIdx.x / {strips}u;
    const unsigned a = rows_at / {math.ceil(n / rows)}u;
    const long long v0 = (long long)(rows_at % {math.ceil(n / rows)}u) * {rows};
    const unsigned c0 = strip * {threads * s.vec * self._columns(op, s)}u;    // the block's strip of columns
    const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
    float acc[{rows}][{self._columns(op, s)}][{s.vec}];
{_indent(self._zeroed(op, s), 1)}
    for (unsigned base = 0; base < {m}u; base += {threads}u) {{
{_indent(self._hits(op, s), 2)}
{_indent(self._added(op, s), 2)}
        __syncthreads();                              // the next chunk reuses hits and warp_start
    }}
{_indent(self._written(op, s), 1)}
}}
"""
        return KernelSource(name, source, threads, grid=(blocks, 1, 1),
                            fast_math=op.numerics is Numerics.FAST)

    def _zeroed(self, op: KernelOp, s: IndexAddSchedule) -> list[str]:
        return [f"for (int q = 0; q < {s.rows}; ++q)", f"    for (int k = 0; k < {self._columns(op, s)}; ++k)",
                f"        for (int j = 0; j < {s.vec}; ++j) acc[q][k][j] = 0.0f;"]

    def _hits(self, op: KernelOp, s: IndexAddSchedule) -> list[str]:
        """The chunk's indices that fall in the block's rows, compacted into `hits` in index order: a
        warp's inclusive scan of the flags by shuffles, the warps' counts through shared memory."""
        _, n, _, m = self._dims(op)
        rows, warps = s.rows, s.threads // WARP_SIZE
        return ["const unsigned i = base + threadIdx.x;", "int row = -1;",
                f"if (i < {m}u) {{", "    long long at = (long long)in1[i];",
                f"    if (at < 0) at += {n}LL;                    // counted from the end; out of range: no row",
                f"    if (at >= v0 && at < v0 + {rows} && at < {n}LL) row = (int)(at - v0);", "}",
                "unsigned before = row >= 0 ? 1u : 0u;         // inclusive scan of the hits over the warp",
                "#pragma unroll", "for (int d = 1; d < 32; d <<= 1) {",
                "    const unsigned y = __shfl_sync(0xffffffffu, before, lane >= (unsigned)d ? lane - d : lane);",
                "    if (lane >= (unsigned)d) before += y;", "}",
                "if (lane == 31u) warp_start[warp] = (int)before;", "__syncthreads();",
                "if (threadIdx.x == 0) {", "    int total = 0;",
                f"    for (int w = 0; w < {warps}; ++w) {{ const int c = warp_start[w]; warp_start[w] = total; "
                "total += c; }", f"    warp_start[{warps}] = total;", "}", "__syncthreads();",
                f"if (row >= 0) hits[warp_start[warp] + (int)before - 1] = (int)threadIdx.x * {rows} + row;",
                "__syncthreads();"]

    def _added(self, op: KernelOp, s: IndexAddSchedule) -> list[str]:
        """Each hit's slice added to the sums of its row, hit after hit."""
        g = op.operands[0]
        _, _, inner, m = self._dims(op)
        vt = f"vec_t<{STORAGE[g.dtype]}, {s.vec}>"
        return [f"const int found = warp_start[{s.threads // WARP_SIZE}];", "for (int h = 0; h < found; ++h) {",
                f"    const int hit = hits[h], row = hit % {s.rows};",
                f"    const {STORAGE[g.dtype]}* src = in0 + ((unsigned long long)a * {m}u + base + "
                f"(unsigned)(hit / {s.rows})) * {inner}u;",
                "    #pragma unroll", f"    for (int k = 0; k < {self._columns(op, s)}; ++k) {{",
                f"        const unsigned c = c0 + (k * {s.threads}u + threadIdx.x) * {s.vec}u;",
                f"        if (c < {inner}u) {{", f"            const {vt} x = *reinterpret_cast<const {vt}*>(src + c);",
                "            #pragma unroll", f"            for (int q = 0; q < {s.rows}; ++q)",
                f"                if (q == row) {{ for (int j = 0; j < {s.vec}; ++j) acc[q][k][j] += "
                f"{load(g.dtype, 'x.v[j]')}; }}", "        }", "    }", "}"]

    def _written(self, op: KernelOp, s: IndexAddSchedule) -> list[str]:
        """The sums stored, the block's rows within the axis (zeros where no index hit)."""
        _, n, inner, _ = self._dims(op)
        t = STORAGE[op.result.dtype]
        vt = f"vec_t<{t}, {s.vec}>"
        return ["#pragma unroll", f"for (int q = 0; q < {s.rows}; ++q) {{", f"    if (v0 + q >= {n}LL) break;",
                f"    {t}* dst = out + ((unsigned long long)a * {n}u + (unsigned long long)(v0 + q)) * {inner}u;",
                "    #pragma unroll", f"    for (int k = 0; k < {self._columns(op, s)}; ++k) {{",
                f"        const unsigned c = c0 + (k * {s.threads}u + threadIdx.x) * {s.vec}u;",
                f"        if (c < {inner}u) {{", f"            {vt} o;", "            #pragma unroll",
                f"            for (int j = 0; j < {s.vec}; ++j) o.v[j] = {store(op.result.dtype, 'acc[q][k][j]')};",
                f"            *reinterpret_cast<{vt}*>(dst + c) = o;", "        }", "    }", "}"]

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32 = DType.bfloat16, DType.float32

        def index_add(g: TensorType, indices: TensorType, size: int, axis: int = 0) -> KernelOp:
            out = OPS["index_add"].infer(g, indices, axis=axis, size=size)
            return KernelOp.of("index_add", (g, indices), out, axis=axis, size=size)
        return (
            index_add(TensorType((8, 1024, 768), bf), TensorType((8, 1024), DType.int32), 50257),   # GPT-2's table
            index_add(TensorType((4096, 4096), bf), TensorType((4096,), DType.int64), 32000),
            index_add(TensorType((64, 500, 3), f32), TensorType((500,), DType.int32), 1000, axis=1),   # ragged
            index_add(TensorType((16, 2048), f32), TensorType((2048,), DType.int32), 4096, axis=1),    # scalar rows
        )


def _indent(lines: list[str], depth: int) -> str:
    return "\n".join("    " * depth + line for line in lines)


# The register model (fit to ptxas 12.x on samples(), sm_80 and sm_90).
REG_FLOOR = 30            # the chunk walk, the scan, the hit's address, with few sums
REG_BASE = 18             # ...which share registers with the sums once those are many
REG_PER_SUM = 1           # an fp32 sum held
