"""Reductions (sum, mean, max, min over any axes): a row reduce or a column reduce, of a tensor
or of an elementwise expression computed as its operands are read (fused_reduction: the walk's
reads are reduction_walk.py's, each operand's strides reduction_reads.py's).

Adjacent axes that are both reduced or both kept are coalesced (where every operand walks them
as one), leaving alternating groups.
When the innermost group is reduced (a "row reduce", e.g. sum over the last axis), `split`
threads (a warp, or the whole block for long rows) stride along one output's reduced elements
with vector loads and combine through warp shuffles (and shared memory across warps). When the
innermost group is kept (a "column reduce", e.g. sum over axis 0), consecutive threads own
consecutive outputs, so every load of the walk down the reduced axis is coalesced; `split` rows
of threads walk interleaved parts of the reduced axis and meet in shared memory
(reduction_column.py). A row reduce with too few outputs to fill the GPU a block each has `blocks`
blocks share each output, meeting in a workspace (reduction_split.py): a loss, a norm of a whole
tensor; a column reduce with too few output tiles has `blocks` blocks share each tile's rows
likewise: a layer's weight or bias gradient.

Shapes are baked into the source. 16-bit inputs accumulate in fp32; int32/bool sums in int64,
as numpy (and the op's declared dtype) does. Under the `kahan_sum` numerics policy a float sum or
mean carries a Neumaier compensation beside each accumulator, and threads combine their
(sum, compensation) pairs, through shuffles and shared memory alike; max and min are exact
already and stay as they are.

>>> from tessera_rw.algebra.dtypes import DType
>>> x = TensorType((4096, 4096), DType.bfloat16)
>>> op = KernelOp.of("sum", (x,), TensorType((4096,), DType.bfloat16), axes=(0,), keepdims=False)
>>> ReductionTemplate().strategy(op)
'column'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.fused_expr import parse_expr
from tessera_rw.codegen.arch import ArchSpec, MathUnit, WARP_SIZE
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import COMPENSATED_SUM_CUDA, Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.cuda_scalar import (MAX_ACCESS_BYTES, STORAGE, SUPPORTED, VEC_STRUCT, ctype,
                                                      expr_ops, kernel_name, literal, store, vector_widths, words)
from tessera_rw.codegen.templates.reduction_column import column_body, column_split, column_workspace_bytes
from tessera_rw.codegen.templates.reduction_reads import (Layout, expressions, operand_reads, reduction_layout,
                                                          values_type)
from tessera_rw.codegen.templates.reduction_split import MAX_GRID_SPLIT, grid_split, parts_met, split_workspace_bytes
from tessera_rw.codegen.templates.reduction_walk import Walk

MAX_INDEX = 2**31        # row and offset math is 32-bit
TREE_REDUCES = ("sum", "mean", "max", "min")   # a logsumexp's is a row kernel's (rowwise_logsumexp.py)
UNROLL = 4                # loads of the reduced-axis walk in flight per thread
WARP_ROW_MAX = 2048       # reduced elements up to which one warp per output is enough
STATIC_SMEM = 48 * 1024   # the partials are static __shared__ arrays
# The tuning grid (space()): block sizes, vector widths, and for a column reduce the rows of threads
# sharing an output (a row reduce shares one among a warp or the whole block). Past 8 rows, the
# serial merge of the rows' partials makes ptxas spill (sm_80 and sm_90), so the grid stops there.
GRID_THREADS, GRID_VECS, GRID_SPLITS = (64, 128, 256, 512, 1024), (1, 2, 4, 8), (1, 2, 4, 8)
MIN_COLUMN_LANES = 8      # threads along a column reduce's outputs: at least a 32-byte sector per load


@dataclass(frozen=True)
class ReductionSchedule(Schedule):
    threads: int = 256
    vec: int = 4          # row: elements per load; column: consecutive outputs per thread
    split: int = 32       # threads that share one output (row: 32 or threads; column: rows of threads)
    blocks: int = 1       # blocks sharing one output (row) or one tile of outputs (column); parts meet in a workspace

    quiet_defaults = frozenset({"blocks"})


class ReductionTemplate(Template):
    """sum / mean / max / min over any axes, keepdims or not."""

    kind = "reduction"
    ops = frozenset({"sum", "mean", "max", "min", "fused_reduction"})

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops or not op.operands or self.reduce(op) not in TREE_REDUCES:
            return False
        values = values_type(op)
        return all(t.dtype in SUPPORTED for t in (*op.operands, values, op.result)) and 0 < values.numel < MAX_INDEX

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return tuple(dict.fromkeys(expr_ops(parse_expr(op.attr_map["expr"])))) if op.op == "fused_reduction" else ()

    @staticmethod
    def reduce(op: KernelOp) -> str:
        """sum, mean, max or min."""
        return op.attr_map["reduce"] if expressions(op) else op.op

    def strategy(self, op: KernelOp) -> str:
        return "row" if self._layout(op).row else "column"

    def _layout(self, op: KernelOp) -> Layout:
        return reduction_layout(op)

    def _vecs(self, op: KernelOp, lay: Layout) -> list[int]:
        inner = lay.red[-1] if lay.row else lay.kept[-1]
        contiguous = (lay.red_strides if lay.row else lay.kept_strides)[-1] == 1
        size = max(t.dtype.itemsize for t in op.operands)
        return [v for v in (8, 4, 2, 1) if v == 1 or (contiguous and inner % v == 0 and v * size <= MAX_ACCESS_BYTES)]

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[ReductionSchedule, ...]:
        lay = self._layout(op)
        vecs = self._vecs(op, lay)
        if lay.row:
            warp = ReductionSchedule(256, vecs[0], WARP_SIZE)
            block = ReductionSchedule(512, vecs[0], 512)
            shared = grid_split(lay, block.threads, block.split, block.vec, arch)
            if shared > 1:       # too few outputs to fill the GPU a block each: blocks share each one
                return (replace(block, blocks=shared), block)
            return (warp, block) if lay.n_red <= WARP_ROW_MAX else (block, warp)
        # Column: 32 lanes of outputs per row of threads; fewer outputs per thread keep more blocks,
        # and where even they leave the GPU short of blocks, blocks share each tile's rows.
        narrow = [v for v in vecs if v <= 2][0]
        unsplit = (ReductionSchedule(256, narrow, 8), ReductionSchedule(128, vecs[0], 4))
        wide = ReductionSchedule(256, vecs[0], 8)
        shared = column_split(self._tiles(wide, lay), lay.n_red, wide.split, arch.sm_count)
        return tuple(dict.fromkeys(((replace(wide, blocks=shared),) if shared > 1 else ()) + unsplit))

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[ReductionSchedule, ...]:
        lay = self._layout(op)
        vecs = vector_widths(GRID_VECS, lambda v: v in self._vecs(op, lay))
        if lay.row:   # a block per output only where the row gives each thread a vector
            grid = (ReductionSchedule(t, v, split) for t in GRID_THREADS for v in vecs
                    for split in (WARP_SIZE, t) if split == WARP_SIZE or lay.n_red >= t * v)
        else:
            grid = (ReductionSchedule(t, v, split) for t in GRID_THREADS for v in vecs
                    for split in GRID_SPLITS if t // split >= MIN_COLUMN_LANES)
        return grid_space(self.schedules(op, arch), grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        """Row: a warp (shuffles) or the whole block (its warps' partials, one per lane) per output;
        column: `split` rows of threads; partials within static shared memory, registers within the
        block's share."""
        s = schedule
        if not (isinstance(s, ReductionSchedule) and self.accepts(op) and s.threads % WARP_SIZE == 0
                and 0 < s.threads <= min(arch.max_threads_per_block, WARP_SIZE * WARP_SIZE)):
            return False
        lay = self._layout(op)
        splits = s.split in (WARP_SIZE, s.threads) if lay.row else 0 < s.split <= s.threads and s.threads % s.split == 0
        shared = s.blocks == 1 or (1 < s.blocks <= MAX_GRID_SPLIT and (not lay.row or s.split == s.threads)
                                   and 2 * lay.n_out * s.blocks < MAX_INDEX)     # the parts' 32-bit index
        if not splits or not shared or s.vec not in self._vecs(op, lay):
            return False
        limit = arch.register_limit(s.threads)
        return (self._smem(op, s, lay) <= min(STATIC_SMEM, arch.smem_per_block)
                and self._registers(op, s, lay, arch) <= limit)

    # -- resources ----------------------------------------------------------------------------

    def compensated(self, op: KernelOp) -> bool:
        """Whether the kernel carries a compensation term: float sums under kahan_sum."""
        return (op.numerics is Numerics.KAHAN_SUM and self.reduce(op) in ("sum", "mean")
                and ctype(self._acc(op)) in ("float", "double"))

    def _acc(self, op: KernelOp) -> DType:
        x, out, reduce = values_type(op).dtype, op.result.dtype, self.reduce(op)
        if reduce == "sum":
            return out if out is not DType.bool else DType.int32
        if reduce == "mean":
            return DType.int64 if not x.is_float else out
        return DType.int32 if x is DType.bool else x

    def resources(self, op: KernelOp, schedule: ReductionSchedule, arch: ArchSpec) -> Resources:
        lay = self._layout(op)
        if lay.row:
            blocks = math.ceil(lay.n_out / (schedule.threads // schedule.split)) * schedule.blocks
        else:
            blocks = self._tiles(schedule, lay) * schedule.blocks
        return Resources(threads=schedule.threads, blocks=blocks, registers=self._registers(op, schedule, lay, arch),
                         smem_bytes=self._smem(op, schedule, lay),
                         hbm_bytes=op.operand_bytes + op.result.nbytes,   # every element read once
                         flops=op.flops, unit=MathUnit.FP32, bytes_in_flight=self._in_flight(op, schedule, lay))

    @staticmethod
    def _tiles(s: ReductionSchedule, lay: Layout) -> int:
        """A column reduce's output tiles: a block's row of threads, `vec` outputs each."""
        return math.ceil(lay.n_out / (s.threads // s.split * s.vec))

    def _in_flight(self, op: KernelOp, s: ReductionSchedule, lay: Layout) -> int:
        """The bytes a thread's unrolled walk keeps in flight, on average over the block: every
        operand's vector (a value where it is broadcast along the vector) per step, up to UNROLL
        steps, in the threads that have any."""
        reads = operand_reads(op) if expressions(op) else ()
        step = (sum(s.vec * r.dtype.itemsize if r.vector(lay.row) else r.dtype.itemsize for r in reads) if reads
                else s.vec * op.operands[0].dtype.itemsize)
        # the threads of an output that find work: a row's split reads `vec` elements each, a
        # column's rows of threads a row each; the rest of the block idles
        share = math.ceil(lay.n_red / s.blocks)
        active = min(s.split, math.ceil(share / s.vec) if lay.row else share)
        trips = math.ceil(share / (active * (s.vec if lay.row else 1)))
        return max(1, step * min(trips, UNROLL) * active // s.split)

    def _smem(self, op: KernelOp, s: ReductionSchedule, lay: Layout) -> int:
        acc = words(self._acc(op)) * 4 * (2 if self.compensated(op) else 1)   # (sum, compensation) pairs
        if lay.row:
            return acc * (s.threads // WARP_SIZE) if s.split > WARP_SIZE else 0
        return acc * s.threads * s.vec + (4 if s.blocks > 1 else 0)      # a column split's arrival flag

    def _registers(self, op: KernelOp, s: ReductionSchedule, lay: Layout, arch: ArchSpec) -> int:
        # Calibrated against ptxas on samples(): the walk keeps UNROLL loads in flight, a column
        # reduce also keeps `vec` accumulators; 64-bit accumulation doubles the adds' registers.
        # A fused expression (fit the same way): each operand's pointer and value beside its loads;
        # ptxas keeps fewer of a row walk's several vectors in flight.
        acc = words(self._acc(op))
        fused = bool(expressions(op))
        reads = operand_reads(op) if fused else ()
        loaded = (sum(max(1, s.vec * r.dtype.itemsize // 4) if r.vector(lay.row) else 1 for r in reads) if fused
                  else max(1, s.vec * op.operands[0].dtype.itemsize // 4))
        operands = REG_FUSED_OPERAND * len(reads)
        wide = REG_WIDE_ACC if acc == 2 else 0
        kahan = self.compensated(op)
        if lay.row:
            trips = math.ceil(lay.n_red / (s.split * s.vec))
            if trips < UNROLL:      # a short row: no unrolled pass runs, the remainder loads a vector at a time
                walk = min(loaded, REG_FUSED_LOADS_MAX) + min(trips - 1, 1)
            else:
                walk = min(UNROLL * loaded // 2, REG_FUSED_LOADS_MAX) + REG_FUSED_ROW if fused else UNROLL * loaded
            return REG_ROW_BASE + walk + operands + wide // 2 + (REG_KAHAN_ROW if kahan else 0)
        trips = math.ceil(lay.n_red / s.split)
        index_math = sum(1 for st in lay.red_strides[:-1] + lay.kept_strides[:-1] if st)
        walk = (REG_COL_BASE + (min(trips, UNROLL) * loaded) // 2 + s.vec * acc * (2 if kahan else 1) + wide
                + REG_INDEX_AXIS * index_math + operands + (REG_KAHAN_COL if kahan else 0))
        # A split's ending (fit to ptxas 12.x, sm_80 and sm_90): a plain walk's registers, plus one
        # per output for the parts being combined; a fused or compensated walk, or a 64-bit one,
        # holds more already than the ending adds.
        ending = REG_COL_SPLIT_PER_VEC * s.vec if s.blocks > 1 and not (fused or kahan or wide) else 0
        return walk + ending

    # -- emission -----------------------------------------------------------------------------

    def emit(self, op: KernelOp, schedule: ReductionSchedule, arch: ArchSpec) -> KernelSource:
        lay = self._layout(op)
        out = op.result.dtype
        acc = self._acc(op)
        a = ctype(acc)
        name = kernel_name(self.kind, op, schedule)
        ident, combine = self._monoid(self.reduce(op), acc)
        value = "acc" if self.reduce(op) != "mean" else f"(({ctype(out)})acc / ({ctype(out)}){lay.n_red})"
        kahan = self.compensated(op)
        walk = Walk(op, lay, schedule.vec, a)
        body = (self._row(op, schedule, lay, walk, ident, value, kahan) if lay.row else
                column_body(op, schedule, lay, walk, ident, value, kahan, UNROLL, self._part_bytes(op)))
        inputs = "x" if not expressions(op) else ", ".join(f"in{i}" for i in range(len(op.operands)))
        blocks = self.resources(op, schedule, arch).blocks
        how = f"{a} with Neumaier compensation" if kahan else a
        work = self.workspace_bytes(op, schedule, lay)
        scratch = ", unsigned char* __restrict__ work" if work else ""
        source = f"""// {op}
// reduction ({'row' if lay.row else 'column'} reduce) of {lay.n_red} elements into each of {lay.n_out} outputs,
// schedule {schedule.describe()}; accumulates in {how}.
// launch: {name}<<<{blocks}, {schedule.threads}>>>({inputs}, out{', work' if work else ''})
{VEC_STRUCT}
{COMPENSATED_SUM_CUDA if kahan else ""}
__device__ __forceinline__ {a} reduction_combine({a} a, {a} b) {{ return {combine}; }}

extern "C" __global__ void __launch_bounds__({schedule.threads}) {name}({walk.params()}, {STORAGE[out]}* __restrict__ out{scratch}) {{
{body}
}}
"""
        return KernelSource(name, source, schedule.threads,
                            grid=(self.resources(op, schedule, arch).blocks, 1, 1),
                            fast_math=op.numerics is Numerics.FAST, workspace_bytes=work)

    def workspace_bytes(self, op: KernelOp, s: ReductionSchedule, lay: Layout) -> int:
        if not lay.row:
            return column_workspace_bytes(lay.n_out, s.blocks, self._part_bytes(op), self._tiles(s, lay))
        return split_workspace_bytes(lay.n_out, s.blocks, self._part_bytes(op))

    def _part_bytes(self, op: KernelOp) -> int:
        """A block's part of an output in a grid split's workspace: its total, and compensation."""
        return words(self._acc(op)) * 4 * (2 if self.compensated(op) else 1)

    @staticmethod
    def _monoid(name: str, acc: DType) -> tuple[str, str]:
        c = ctype(acc)
        if name in ("sum", "mean"):
            return f"({c})0", "a + b"
        is_float = c in ("float", "double")
        big = literal(math.inf, acc) if is_float else {"int": "2147483647", "long long": "9223372036854775807ll"}[c]
        pick = ">" if name == "max" else "<"
        nan = " || a != a" if is_float else ""    # numpy propagates NaN
        ident = f"-{big}" if name == "max" else big
        if name == "max" and not is_float:
            ident = f"(-{big} - 1)"
        return f"({c})({ident})", f"(a {pick} b{nan}) ? a : b"

    def _row(self, op, s: ReductionSchedule, lay: Layout, walk: Walk, ident, value, kahan: bool) -> str:
        v, tpr, rpb, a = s.vec, s.split, s.threads // s.split, walk.acc
        add = (lambda e: f"kahan_add(acc, comp, {e});") if kahan else (lambda e: f"acc = reduction_combine(acc, {e});")
        step = (f"{{ const {a} s2 = __shfl_xor_sync(0xffffffffu, acc, o), c2 = __shfl_xor_sync(0xffffffffu, comp, o); "
                "kahan_merge(acc, comp, s2, c2); }") if kahan else \
            "acc = reduction_combine(acc, __shfl_xor_sync(0xffffffffu, acc, o));"
        shuffle = f"    for (int o = {WARP_SIZE // 2}; o > 0; o >>= 1) {step}"
        parts = s.blocks
        first = f"(part * {tpr}u + lane) * {v}u" if parts > 1 else f"lane * {v}u"
        row = f"blockIdx.x / {parts}u" if parts > 1 else f"blockIdx.x * {rpb}u + threadIdx.x / {tpr}u"
        lines = [f"    const unsigned row = {row};",
                 *([f"    const unsigned part = blockIdx.x % {parts}u;"] if parts > 1 else []),
                 f"    const unsigned lane = threadIdx.x % {tpr}u;",
                 f"    {a} acc = {ident};" + (f" {a} comp = {ident};" if kahan else ""),
                 f"    if (row < {lay.n_out}u) {{",
                 *(f"        {line}" for line in walk.bases("row")),
                 f"        #pragma unroll {UNROLL}",
                 f"        for (unsigned r = {first}; r < {lay.n_red}u; r += {parts * tpr * v}u) {{",
                 *(f"            {line}" for line in walk.loads("r")),
                 "            #pragma unroll",
                 f"            for (int j = 0; j < {v}; ++j) {walk.per_lane(add)}",
                 "        }",
                 "    }",
                 shuffle]
        if tpr > WARP_SIZE:   # one block per output: the warps meet in shared memory
            warps = tpr // WARP_SIZE
            lines += [f"    __shared__ {a} partial[{warps}];",
                      f"    if (lane % {WARP_SIZE}u == 0) partial[lane / {WARP_SIZE}u] = acc;"]
            if kahan:
                lines += [f"    __shared__ {a} partial_comp[{warps}];",
                          f"    if (lane % {WARP_SIZE}u == 0) partial_comp[lane / {WARP_SIZE}u] = comp;"]
            lines += ["    __syncthreads();",
                      f"    if (lane >= {WARP_SIZE}u) return;",
                      f"    acc = lane < {warps}u ? partial[lane] : {ident};"]
            if kahan:
                lines += [f"    comp = lane < {warps}u ? partial_comp[lane] : {ident};"]
            lines += [shuffle]
        if parts > 1:
            lines += parts_met(lay.n_out, parts, self._part_bytes(op), a, ident, kahan, shuffle)
        if kahan:
            lines.append("    acc = kahan_total(acc, comp);")
        lines.append(f"    if (lane == 0 && row < {lay.n_out}u) out[row] = {store(op.result.dtype, value)};")
        return "\n".join(lines)

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32, kahan = DType.bfloat16, DType.float32, Numerics.KAHAN_SUM

        def red(name, shape, dtype, axes, keepdims=False, numerics=Numerics.DEFAULT):
            x = TensorType(shape, dtype)
            return KernelOp.of(name, (x,), OPS[name].infer(x, axes, keepdims), axes=axes, keepdims=keepdims,
                               numerics=numerics)

        def fused(shapes_dtypes, expr, reduce, axes, keepdims=False):
            xs = tuple(TensorType(shape, dtype) for shape, dtype in shapes_dtypes)
            out = OPS["fused_reduction"].infer(*xs, expr=expr, reduce=reduce, axes=axes, keepdims=keepdims)
            return KernelOp.of("fused_reduction", xs, out, expr=expr, reduce=reduce, axes=axes, keepdims=keepdims)

        return (
            red("sum", (4096, 4096), bf, (1,)),               # row reduce, block per row
            red("mean", (8192, 512), f32, (1,), True),        # row reduce, warp per row, keepdims
            red("max", (4096, 4096), bf, (0,)),               # column reduce
            red("sum", (1024, 1024), DType.int32, (0,)),      # int64 accumulation
            red("sum", (16, 1024, 256), f32, (0, 2)),         # two reduced groups
            red("min", (64, 128, 256), f32, (1,), True),      # column reduce under a batch axis
            red("sum", (4096, 4096), bf, (1,), numerics=kahan),           # compensated row reduce, block per row
            red("mean", (8192, 512), f32, (1,), True, numerics=kahan),    # compensated, warp per row
            red("sum", (4096, 4096), f32, (0,), numerics=kahan),          # compensated column reduce
            red("sum", (16, 1024, 256), f32, (0, 2), numerics=kahan),     # compensated, two reduced groups
            red("sum", (1 << 22,), f32, (0,), numerics=kahan),            # one long compensated sum (grid split)
            red("max", (4096, 4096), f32, (1,), numerics=kahan),          # max: the policy changes nothing
            # a layer norm's backward: Σ dy·w·x̂ over each row, and Σ dy·x̂ over the rows (statistics broadcast)
            fused((((8192, 4096), bf), ((4096,), bf), ((8192, 4096), bf)), "mul(mul($0,$1),$2)", "sum", (1,), True),
            fused((((8192, 4096), bf), ((8192, 1), f32), ((8192, 1), f32), ((8192, 4096), bf)),
                  "mul(mul(sub($0,$1),$2),$3)", "sum", (0,)),
            fused((((512, 64), f32), ((512, 64), f32)), "mul(sub($0,$1),sub($0,$1))", "mean", (0, 1)),   # a loss
            # few outputs: blocks share each one (a grid split)
            red("sum", (4, 1024, 768), bf, (0, 1, 2)),                   # to a scalar
            fused((((8192, 4096), bf), ((8192, 4096), bf)), "mul(sub($0,$1),sub($0,$1))", "mean", (0, 1)),
            red("sum", (8192, 4096), bf, (0,)),       # a bias gradient: 16 column tiles, blocks share each
            red("sum", (8192, 4096), bf, (0,), numerics=kahan),   # ... compensated
            # rows shorter than the unrolled walk: a layer norm's statistics over 768 features
            red("mean", (4096, 768), bf, (1,), True),
            fused((((4096, 768), bf), ((4096, 1), bf)), "mul(sub($0,$1),sub($0,$1))", "mean", (1,), True),
        )


# The register model (fit to ptxas 12.x on samples(), within 20% on sm_80 and sm_90).
REG_ROW_BASE = 10         # row, lane, bounds, base address, the accumulator
REG_COL_BASE = 14         # ... plus the shared-memory combine's addresses
REG_WIDE_ACC = 8          # int64 / fp64 accumulation: register pairs and carries
REG_INDEX_AXIS = 1        # each extra coalesced axis needs a division and a multiply
REG_KAHAN_ROW = 4         # kahan_sum: the compensation, and the add's rounded-off term and magnitude test
REG_COL_SPLIT_PER_VEC = 1     # a column split's ending, per output a thread owns (plain walks)
REG_KAHAN_COL = 4         # ... per column thread beyond its `vec` compensations
REG_FUSED_OPERAND = 2     # a fused expression: each operand's base pointer and value
REG_FUSED_ROW = 4         # ... and the expression's temporaries in a row walk
REG_FUSED_LOADS_MAX = 16  # ... whose vectors in flight ptxas caps
