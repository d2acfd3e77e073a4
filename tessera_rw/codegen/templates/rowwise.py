"""Row-wise normalizations: softmax, log_softmax, layernorm, rmsnorm, and fused_normalization.

A row is the trailing normalized axes (accepts() refuses any other axes). One warp owns a row
when the row is short, one block when it is long (warps meet through shared memory). When a
thread's share of the row (`elements_per_thread`) fits MAX_RESIDENT values, the row is read from
HBM once into registers, the statistics are reduced over the registers and the result is written
from them. A longer row is walked in passes instead (softmax: an online max/sum pass then the
write; layernorm: mean, variance, write; rmsnorm: mean square, write), each pass re-reading the
row; the re-reads hit L2 while the rows in flight fit in it.

fused_normalization adds a prologue expression over its leading inputs (applied as the row is
loaded) and an epilogue `post` ($0 the normalized value) applied as it is written (or, for a
reduced_normalization, added to the row's sum: rowwise_reduced.py, through `write_values`). Operands
broadcast to the row; one constant per row is loaded once. strided_normalization reads its prologue
inputs as strided views (a normalized slice read where it lies), its rows' vectors where the view's
offset and row strides keep them aligned. Statistics are fp32; under the
`kahan_sum` numerics policy every sum among them (softmax's denominator, the mean, the variance,
the mean square) carries a Neumaier compensation per thread, and threads merge (sum,
compensation) pairs. Maxima are exact and stay as they are.

>>> from tessera_rw.algebra.dtypes import DType
>>> x = TensorType((8192, 8192), DType.bfloat16)
>>> op = KernelOp.of("softmax", (x,), x, axis=1)
>>> s = RowwiseTemplate().schedules(op, arch_named("h100"))[0]
>>> (s.describe(), RowwiseTemplate().elements_per_thread(op, s))
('threads=512 vec=8 rows_per_block=1', 16)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType  # noqa: F401  (doctest)
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.reduced_norm import rows_of
from tessera_rw.codegen.arch import ArchSpec, MathUnit, WARP_SIZE, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.cuda_scalar import (MAX_ACCESS_BYTES, STORAGE, SUPPORTED, VEC_STRUCT, coalesce,
                                                      ctype, emit_tree, expr_ops, index_type, kernel_name, load,
                                                      offset_expr, store, vector_widths)
from tessera_rw.codegen.templates.rowwise_samples import rowwise_samples
from tessera_rw.codegen.templates.rowwise_spec import row_spec, row_views
from tessera_rw.codegen.templates.rowwise_stats import Sums, block_helpers, kahan_helpers, looped_statistics, \
    resident_statistics

MAX_INDEX = 2**31        # row and offset math is 32-bit
MAX_RESIDENT = 32         # fp32 row values a thread may hold in registers (beyond: the looped variant)
NORMS = {"softmax": "softmax", "log_softmax": "softmax", "layernorm": "layernorm", "rmsnorm": "layernorm"}
LOOPED_PASSES = {"softmax": 2, "log_softmax": 2, "layernorm": 3, "rmsnorm": 2}
# The tuning grid (space()): block sizes and vector widths, each as a warp per row and a block per row
GRID_THREADS, GRID_VECS = (64, 128, 256, 512, 1024), (1, 2, 4, 8)


@dataclass(frozen=True)
class RowwiseSchedule(Schedule):
    threads: int = 256
    vec: int = 4
    rows_per_block: int = 1     # threads // 32: one warp per row; 1: the block shares a row


# the row's statistics (max, Σ exp, mean, variance) are kept in float: float64 rows would lose
# their precision there, so they run on the host
ROW_DTYPES = SUPPORTED - {DType.float64}
# the ops whose rows have an elementwise prologue and epilogue
FUSED_ROWS = ("fused_normalization", "strided_normalization", "reduced_normalization")


class RowwiseTemplate(Template):
    """softmax / log_softmax (kind 'softmax'), layernorm / rmsnorm (kind 'layernorm'), fused_normalization."""

    kind = "softmax"
    ops = frozenset({"softmax", "log_softmax", "layernorm", "rmsnorm", "fused_normalization", "strided_normalization"})
    rows_held = 1             # rows of values a thread keeps in registers when resident

    def kind_of(self, op: KernelOp) -> str:
        return NORMS[row_spec(op).norm]

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops or not all(t.dtype in ROW_DTYPES for t in op.operands + (op.result,)):
            return False
        spec = row_spec(op)
        return spec.k > 0 and 0 < op.result.numel < MAX_INDEX and all(t.numel < MAX_INDEX for t in op.operands)

    def refusal(self, op: KernelOp) -> str | None:
        if self.accepts(op) or op.op not in self.ops or row_spec(op).k:
            return super().refusal(op)
        return (f"the {self.kind_of(op)} kernel normalizes rows along the trailing axes, not the axes of {op} "
                "(the plan transposes the rows there and back)")

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        if op.op not in FUSED_ROWS:
            return ()
        spec = row_spec(op)
        reads = ("strided_read",) if op.op == "strided_normalization" else ()
        return tuple(dict.fromkeys(expr_ops(spec.expr) + expr_ops(spec.post))) + reads

    # -- geometry -----------------------------------------------------------------------------

    def row_shape(self, op: KernelOp) -> tuple[int, ...]:
        """The shape the rows are laid out in: the result's, a reduced_normalization's rows' (an op
        whose result also holds more than its rows says otherwise)."""
        return rows_of(op.op, op.operands, op.attr_map, op.result).shape

    def _row(self, op: KernelOp) -> tuple[int, int]:
        k, shape = row_spec(op).k, self.row_shape(op)
        length = math.prod(shape[len(shape) - k:])
        return math.prod(shape) // length, length

    def elements_per_thread(self, op: KernelOp, s: RowwiseSchedule) -> int:
        _, length = self._row(op)
        return math.ceil(length / (s.threads // s.rows_per_block * s.vec)) * s.vec

    def row_values(self, op: KernelOp, s: RowwiseSchedule) -> int:
        """The fp32 values a thread holds when its share of the row stays in registers."""
        return self.rows_held * self.elements_per_thread(op, s)

    def resident(self, op: KernelOp, s: RowwiseSchedule) -> bool:
        return self.row_values(op, s) <= MAX_RESIDENT

    def _vec_ok(self, op: KernelOp, v: int) -> bool:
        _, length = self._row(op)
        widest = max(t.dtype.itemsize for t in op.operands + (op.result,))
        offsets = [off for _, off in row_views(op, self.row_shape(op))]
        return length % v == 0 and v * widest <= MAX_ACCESS_BYTES and all(
            acc[0] != "vector" or (acc[2][-1] % v == 0 and off % v == 0 and all(r % v == 0 for r in acc[4]))
            for acc, off in zip(self._accesses(op), offsets))         # a view's rows start aligned too

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[RowwiseSchedule, ...]:
        _, length = self._row(op)
        v = next(v for v in (8, 4, 2, 1) if self._vec_ok(op, v))
        block = [RowwiseSchedule(t, v, 1) for t in (128, 256, 512, 1024)]
        if length <= WARP_SIZE * MAX_RESIDENT // self.rows_held:
            # a warp per row, loading the widest vectors the row fills (a row shorter than the warp
            # leaves lanes idle, which a block per row would do for all but one of its warps)
            u = next((u for u in (8, 4, 2) if u <= v and self._vec_ok(op, u) and length >= WARP_SIZE * u), 1)
            return tuple(RowwiseSchedule(t, u, t // WARP_SIZE) for t in (256, 128))
        # The widest blocks whose threads each load at least two vectors of the row: with one, the
        # loads in flight are too few (on an H200, 4096-long bf16 rows ran 1.2x slower at one vector
        # per thread than at two or four, tests/data/tuning_logs/; 8192-long rows 1.3x).
        for vectors in (2, 1):
            fits = [s for s in block if self.resident(op, s) and length >= vectors * s.threads * v
                    and self.valid(op, s, arch)]
            if fits:
                return tuple(fits[-2:][::-1])
        looped = (block[3], block[2])        # looped: a row does not fit in registers (or its epilogue's)
        return tuple(s for s in looped if self.valid(op, s, arch)) or looped

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[RowwiseSchedule, ...]:
        # a row shorter than one vector per thread would leave lanes idle in every pass
        _, length = self._row(op)
        vecs = vector_widths(GRID_VECS, lambda v: self._vec_ok(op, v))
        grid = (RowwiseSchedule(t, v, rows) for t in GRID_THREADS for v in vecs
                for rows in (t // WARP_SIZE, 1) if length >= (t // rows) * v)
        return grid_space(self.schedules(op, arch), grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        """A warp (shuffles only) or the whole block (warps meet in shared memory) per row; the
        block's warps are at most a warp's lanes, as the block reduction reads one partial per lane."""
        s = schedule
        if not (isinstance(s, RowwiseSchedule) and self.accepts(op) and s.threads % WARP_SIZE == 0
                and 0 < s.threads <= min(arch.max_threads_per_block, WARP_SIZE * WARP_SIZE)
                and s.rows_per_block in (1, s.threads // WARP_SIZE) and s.vec >= 1 and self._vec_ok(op, s.vec)):
            return False
        return self._registers(op, s, arch) <= arch.register_limit(s.threads)

    # -- resources ----------------------------------------------------------------------------

    def resources(self, op: KernelOp, s: RowwiseSchedule, arch: ArchSpec) -> Resources:
        rows, length = self._row(op)
        spec = row_spec(op)
        blocks = math.ceil(rows / s.rows_per_block)
        reads = sum(t.nbytes for t in spec.prologue)
        n_pro = len(spec.prologue)
        hbm = reads + sum(t.nbytes for t in op.operands[n_pro:]) + op.result.nbytes
        if not self.resident(op, s):
            # Each extra pass re-reads the row; rows in flight (one per resident warp or block)
            # that fit in L2 are re-read from there, otherwise from HBM.
            in_flight = min(rows, arch.sm_count * (arch.max_warps_per_sm * WARP_SIZE // s.threads) * s.rows_per_block)
            row_bytes = reads // rows
            if in_flight * row_bytes > arch.l2_bytes:
                hbm += self.reread_bytes(op)
        # block mode: one fp32 partial per warp for each statistic reduced across the block (a sum
        # under kahan_sum is a pair)
        sums = 2 if op.numerics is Numerics.KAHAN_SUM else 1
        smem = 4 * (s.threads // WARP_SIZE) * (sums + (spec.norm in ("softmax", "log_softmax"))) \
            if s.rows_per_block == 1 else 0
        heavy = spec.norm in ("softmax", "log_softmax") or "exp" in expr_ops(spec.post)
        regs = self._registers(op, s, arch)
        limit = arch.register_limit(s.threads)
        return Resources(threads=s.threads, blocks=blocks, registers=regs, smem_bytes=smem, hbm_bytes=hbm,
                         flops=op.flops, unit=MathUnit.FP32, efficiency=0.9 if heavy else 1.0,
                         spill_bytes=4 * max(0, regs - limit))

    def _registers(self, op: KernelOp, s: RowwiseSchedule, arch: ArchSpec) -> int:
        # Calibrated against ptxas on samples(): the row's values held live, the loaded (still
        # packed) vectors, and a pointer plus index per operand beyond x.
        loaded = sum(max(1, s.vec * op.operands[i].dtype.itemsize // 4)
                     for i, acc in enumerate(self._accesses(op)) if acc[0] == "vector")
        regs = REG_PER_LOADED_WORD * loaded + REG_PER_OPERAND * (len(op.operands) - 1)
        if op.numerics is Numerics.KAHAN_SUM:
            regs += REG_KAHAN
        if self.resident(op, s):
            return round(REG_BASE + REG_PER_VALUE * self.row_values(op, s) + regs)
        return round(REG_LOOPED_BASE + regs)

    # -- emission -----------------------------------------------------------------------------

    def _accesses(self, op: KernelOp) -> list[tuple]:
        """Per operand: (how it is read, row offset in `row`, col sizes, col strides, row strides)."""
        spec = row_spec(op)
        out = self.row_shape(op)
        lead = out[:len(out) - spec.k]
        found = []
        for st, off in row_views(op, out):
            rs, (rst,) = coalesce(lead, [st[:len(lead)]])
            cs, (cst,) = coalesce(out[len(lead):], [st[len(lead):]])
            rs, rst, cs, cst = rs or (1,), rst or (0,), cs or (1,), cst or (0,)
            how = "vector" if cst[-1] == 1 else "row" if not any(cst) else "gather"
            row_off = offset_expr("row", rs, rst) + (f" + {off}u" if off else "")
            found.append((how, f"({row_off})" if off else row_off, cs, cst, rst))
        return found

    def read(self, op: KernelOp, acc: list[tuple], i: int, which: str, v: int) -> tuple[list[str], str]:
        """Lines loading operand i's vector at column c (named `which`i), and its lane-j value."""
        how, row_off, cs, cst, _ = acc[i]
        t = op.operands[i].dtype
        if how == "row":
            return [], f"r{i}"
        if how == "gather":
            return [], load(t, f"in{i}[{row_off} + {offset_expr('(c + j)', cs, cst)}]")
        col = offset_expr("c", cs, cst)
        vt = f"vec_t<{STORAGE[t]}, {v}>"
        return [f"const {vt} {which}{i} = *reinterpret_cast<const {vt}*>(in{i} + {row_off} + {col});"], \
            load(t, f"{which}{i}.v[j]")

    def emit(self, op: KernelOp, s: RowwiseSchedule, arch: ArchSpec) -> KernelSource:
        spec = row_spec(op)
        rows, length = self._row(op)
        v, tpr = s.vec, s.threads // s.rows_per_block
        acc = self._accesses(op)
        n_pro, has_w = len(spec.prologue), spec.weight is not None
        w_i = n_pro if has_w else None
        b_i = n_pro + has_w if spec.bias is not None else None
        epi = list(range(n_pro + has_w + (spec.bias is not None), len(op.operands)))
        sums, red_max = self.reductions(op, s)

        def gather(i: int, which: str) -> tuple[list[str], str]:
            return self.read(op, acc, i, which, v)

        def prologue(target: str) -> list[str]:
            lines, lanes = [], []
            for i in range(n_pro):
                pre, val = gather(i, "p")
                lines += pre
                lanes.append((val, spec.prologue[i].dtype))
            body = [f"const {ctype(d)} x{i} = {val};" for i, (val, d) in enumerate(lanes)]   # int32 indices exact
            var, _ = emit_tree(spec.expr, [(f"x{i}", d) for i, (_, d) in enumerate(lanes)], body, "u")
            return lines + ["#pragma unroll", f"for (int j = 0; j < {v}; ++j) {{",
                            *("    " + b for b in body), f"    {target} = {var};",
                            *("    " + b for b in self.loaded(op, target)), "}"]

        def epilogue(value: str) -> list[str]:
            lines, body = [], [f"float y = {value};"]
            if has_w:
                pre, val = gather(w_i, "w")
                lines += pre
                body.append(f"y = y * {val};")
            if b_i is not None:
                pre, val = gather(b_i, "b")
                lines += pre
                body.append(f"y = y + {val};")
            normed = (OPS["fused_elementwise"].infer(*spec.prologue, expr=op.attr_map["expr"]).dtype
                      if op.op in FUSED_ROWS else op.operands[0].dtype)
            leaves = [("y", normed)]
            for i in epi:
                pre, val = gather(i, "e")
                lines += pre
                body.append(f"const {ctype(op.operands[i].dtype)} z{i} = {val};")
                leaves.append((f"z{i}", op.operands[i].dtype))
            var, _ = emit_tree(spec.post, leaves, body, "q")
            return lines + self.write_values(op, s, body, var)

        stats = (resident_statistics if self.resident(op, s) else looped_statistics)(
            spec, length, v, tpr, sums, red_max, prologue, epilogue)
        return self.kernel_source(op, s, arch, acc, self.before_rows(op, s) + stats + self.after_rows(op, s))

    def write_values(self, op: KernelOp, s: RowwiseSchedule, body: list[str], value: str) -> list[str]:
        """The lines computing a vector's epilogue (`body`, lane j's result `value`) and storing it
        at column c of `row`."""
        _, length = self._row(op)
        ot = f"vec_t<{STORAGE[op.result.dtype]}, {s.vec}>"
        idx = index_type(op.result.numel)
        return [f"{ot} o;", "#pragma unroll", f"for (int j = 0; j < {s.vec}; ++j) {{",
                *("    " + b for b in body), f"    o.v[j] = {store(op.result.dtype, value)};", "}",
                f"*reinterpret_cast<{ot}*>(out + ({idx})row * {length}u + c) = o;"]

    def loaded(self, op: KernelOp, target: str) -> list[str]:
        """Lines after each row value is loaded into `target` (none: a subclass may watch the values)."""
        return []

    def before_rows(self, op: KernelOp, s: RowwiseSchedule) -> list[str]:
        """Lines before a row's statistics (none: a subclass that adds the row up declares its sum)."""
        return []

    def after_rows(self, op: KernelOp, s: RowwiseSchedule) -> list[str]:
        """Lines after the row is written (none: a subclass that adds the row up stores its total)."""
        return []

    def reductions(self, op: KernelOp, s: RowwiseSchedule) -> tuple[Sums, str]:
        """How a row's sums are spelled (compensated under kahan_sum) and the function taking its max."""
        block = s.rows_per_block == 1
        red_sum, red_max = ("rowwise_block_sum", "rowwise_block_max") if block else ("warp_sum", "warp_max")
        if op.numerics is Numerics.KAHAN_SUM:
            return Sums("rowwise_block_sum_kahan" if block else "rowwise_warp_sum_kahan", True), red_max
        return Sums(red_sum, False), red_max

    def kernel_source(self, op: KernelOp, s: RowwiseSchedule, arch: ArchSpec, acc: list[tuple],
                      stats: list[str]) -> KernelSource:
        """The kernel around a row's statement lines `stats`: its helpers, row and lane, the operands
        constant along the row loaded once (r<i>)."""
        rows, length = self._row(op)
        name = kernel_name(self.kind_of(op), op, s)
        params = [f"const {STORAGE[t.dtype]}* __restrict__ in{i}" for i, t in enumerate(op.operands)]
        params.append(f"{STORAGE[op.result.dtype]}* __restrict__ out")
        block = s.rows_per_block == 1
        hoisted = [f"const {ctype(t.dtype)} r{i} = {load(t.dtype, f'in{i}[{acc[i][1]}]')};"
                   for i, t in enumerate(op.operands) if acc[i][0] == "row"]
        helpers = ((block_helpers(s.threads // WARP_SIZE) if block else "")
                   + (kahan_helpers(block, s.threads // WARP_SIZE) if op.numerics is Numerics.KAHAN_SUM else ""))
        guard = "" if block or rows % s.rows_per_block == 0 else f"    if (row >= {rows}u) return;  // whole warps\n"
        mode = "resident (one read)" if self.resident(op, s) else f"looped ({self.looped_passes(op)} passes)"
        body = "\n".join("    " + line for line in hoisted + stats)
        blocks = self.resources(op, s, arch).blocks
        header = "\n".join("    " + line for line in self.row_and_lane(op, s))
        source = f"""// {op}
// {self.describe_norm(op)} over rows of {length}, {rows} rows; {self.describe_walk(op, s)}, {mode};
// schedule {s.describe()}, {self.elements_per_thread(op, s)} elements per thread.
// launch: {name}<<<{blocks}, {s.threads}>>>({', '.join(f'in{i}' for i in range(len(op.operands)))}, out)
{VEC_STRUCT}
{helpers}
extern "C" __global__ void __launch_bounds__({s.threads}) {name}({', '.join(params)}) {{
{header}
{guard}{body}
}}
"""
        return KernelSource(name, source, s.threads, grid=(blocks, 1, 1), fast_math=op.numerics is Numerics.FAST)

    def row_and_lane(self, op: KernelOp, s: RowwiseSchedule) -> list[str]:
        """The kernel's first lines: the row a thread works on and its lane along it."""
        tpr = s.threads // s.rows_per_block
        return [f"const unsigned row = blockIdx.x * {s.rows_per_block}u + threadIdx.x / {tpr}u;",
                f"const unsigned lane = threadIdx.x % {tpr}u;"]

    def describe_walk(self, op: KernelOp, s: RowwiseSchedule) -> str:
        return "one block per row" if s.rows_per_block == 1 else "one warp per row"

    def describe_norm(self, op: KernelOp) -> str:
        return row_spec(op).norm

    def looped_passes(self, op: KernelOp) -> int:
        """How many times the looped walk reads a row."""
        return LOOPED_PASSES[row_spec(op).norm]

    def reread_bytes(self, op: KernelOp) -> int:
        """What the looped walk reads beyond one pass over its rows."""
        return (self.looped_passes(op) - 1) * sum(t.nbytes for t in row_spec(op).prologue)

    def samples(self) -> tuple[KernelOp, ...]:
        return rowwise_samples()


# The register model (fit to ptxas 12.x on samples(), within 23% on sm_80 and sm_90).
REG_BASE = 13             # row, lane, row address, statistics, reduction temporaries
REG_PER_VALUE = 1.25      # a row value held in registers, with its share of the expression temporaries
REG_PER_LOADED_WORD = 0.25
REG_PER_OPERAND = 3       # a 64-bit pointer and an offset per operand beyond x
REG_LOOPED_BASE = 29      # the looped walk: online statistics, one vector in flight, loop state
REG_KAHAN = 1             # kahan_sum: the compensation (the compensated add's temporaries die at once)
