"""Elementwise kernels: one pass over the result, every operand broadcast to it, vectorized.

A strided_elementwise reads each operand as a strided view of its storage (an offset, then a stride
per result axis): slices read where they lie, not copied first (lower/view_reads.py). A view whose
inner axis is contiguous is read in vectors where its offset and outer strides keep them aligned.
A concatenated_elementwise computes each piece of a concatenate as such a strided expression of its
own (elementwise_pieces.py), choosing the piece by the element's coordinate along the axis.

Shapes are baked into the emitted source: the kernel is compiled per shape anyway, so each
operand's broadcast index math is specialized there (division by constants becomes a multiply),
and the launch takes only pointers. Adjacent axes that every operand walks the same way are
coalesced first, so `x[4096,4096] + bias[4096]` indexes the bias with one `%`.

16- and 8-bit values are computed in fp32 and rounded once on store. The scalar pieces (types,
conversions, the expression emitter, broadcast offsets) live in cuda_scalar.py, shared with the
row-wise, reduction and copy templates.

>>> from tessera_rw.algebra.dtypes import DType
>>> t = TensorType((1024, 1024), DType.bfloat16)
>>> op = KernelOp.of("add", (t, TensorType((1024,), DType.bfloat16)), t)
>>> ElementwiseTemplate().schedules(op, arch_named("h100"))[0].describe()
'threads=256 vec=8'
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpKind
from tessera_rw.algebra.ops import BUILTIN_OPS, OPS
from tessera_rw.algebra.ops.fused_expr import parse_expr
from tessera_rw.algebra.ops.strided import EXPRESSION_OPS, operand_views
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.cuda_scalar import (MAX_ACCESS_BYTES, READABLE, STORAGE, SUPPORTED, VEC_STRUCT,
                                                      broadcast_strides, coalesce, contiguous_strides, ctype,
                                                      emit_tree, expr_ops, index_type, kernel_name, literal, load,
                                                      offset_expr, scalar_op, store, vector_widths, words)
from tessera_rw.codegen.templates.elementwise_pieces import pieces


@dataclass(frozen=True)
class ElementwiseSchedule(Schedule):
    threads: int = 256
    vec: int = 4          # consecutive result elements per thread per loop trip


THREAD_CHOICES = (256, 128)
# The tuning grid (space()): block sizes, and vector widths up to one 16-byte access
GRID_THREADS, GRID_VECS = (64, 128, 256, 512, 1024), (1, 2, 4, 8, 16)

# The register model (fit to ptxas 12.x on samples(), within 20% on sm_80 and sm_90).
REG_BASE = 10             # loop index, bound, step, output address
REG_SM90 = 1.5            # sm_90 code keeps more 64-bit addresses live
REG_SCALAR = 0.5          # a repeated operand: one value per loop trip
REG_INDEXED = 6           # ...whose offset needs index math (a division, a 64-bit address)
REG_PER_LOADED_WORD = 0.5
REG_PER_LANE = 0.5
REG_PER_BOOL_WORD = 1.25
REG_PER_STORED_WORD = 0.75
REG_PER_MASK_LANE = 0.4   # tril / triu: row and column per lane
MAX_LANES_IN_FLIGHT = 4   # ptxas overlaps the transcendental sequences of about four lanes
# an fp8 operand's software widening (prelude's e4m3_to_f32 / e5m2_to_f32): temporaries per lane in flight
FP8_DECODE_TEMPS = {DType.float8_e4m3: 1.75, DType.float8_e5m2: 1.0}
HEAVY_TEMPS = {"exp": 1, "log": 1, "sigmoid": 1, "silu": 1, "sin": 2, "cos": 2, "pow": 3, "tanh": 3.5,
               "gelu_tanh": 3.5, "erf": 4, "gelu": 4, "sqrt": 0.5, "rsqrt": 0.5}
GRID_WAVES = 4            # grid-stride: this many full waves of resident blocks, then loop
CREATION = frozenset({"full", "arange"})
TRIANGLE = frozenset({"tril", "triu"})

# two or more of these in one expression lower the modeled efficiency (see resources())
TRANSCENDENTAL = frozenset({"exp", "log", "tanh", "sin", "cos", "erf", "sigmoid", "silu", "gelu", "pow"})


class ElementwiseTemplate(Template):
    """Every elementwise op, fused_elementwise, and the creation ops full / arange."""

    kind = "elementwise"
    ops = (frozenset(n for n in BUILTIN_OPS if OPS[n].kind is OpKind.ELEMENTWISE) | CREATION) \
        - {"multi_elementwise"}         # the ops cuda_scalar spells; several results: elementwise_outputs.py

    def accepts(self, op: KernelOp) -> bool:
        return (op.op in self.ops and all(t.dtype in READABLE for t in op.operands) and op.result.dtype in SUPPORTED
                and op.result.numel > 0)

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        if op.op == "concatenated_elementwise":
            names = (n for p in pieces(op) for n in self.fused(p.op) if n != "strided_read")
            return tuple(dict.fromkeys(names)) + ("concatenate", "strided_read")
        if op.op in EXPRESSION_OPS:
            reads = ("strided_read",) if op.op == "strided_elementwise" else ()
            return tuple(dict.fromkeys(expr_ops(parse_expr(op.attr_map["expr"])))) + reads
        return ()

    # -- layout -------------------------------------------------------------------------------

    def _layout(self, op: KernelOp) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        """The result's axes, coalesced, and each one's stride in the result and in every operand."""
        out = op.result.shape
        sizes, strides = coalesce(out, [contiguous_strides(out)] + [st for st, _ in self._views(op)])
        if op.op in TRIANGLE:   # the row and column stay separate axes: the mask needs both
            sizes, strides = out, [contiguous_strides(out)] * 2
        return sizes or (1,), [s or (1,) for s in strides]

    def _views(self, op: KernelOp) -> list[tuple[tuple[int, ...], int]]:
        """Each operand's strides in the result's rank and its offset, in elements."""
        out, a = op.result.shape, op.attr_map
        if op.op == "strided_elementwise":
            return operand_views(out, a["strides"], a["offsets"])
        return [(broadcast_strides(out, t.shape), 0) for t in op.operands]

    def _vec_ok(self, op: KernelOp, vec: int) -> bool:
        if op.op == "concatenated_elementwise":   # no vector straddles two pieces, each piece's loads aligned
            axis, shape = op.attr_map["axis"], op.result.shape
            apart = (math.prod(shape[axis + 1:]) if axis < len(shape) - 1 else math.gcd(*op.attr_map["sizes"]))
            return apart % vec == 0 and all(self._vec_ok(p.op, vec) for p in pieces(op))
        sizes, strides = self._layout(op)
        widest = max(t.dtype.itemsize for t in op.operands + (op.result,))
        offsets = [offset for _, offset in self._views(op)]
        aligned = all(st[-1] != 1 or (off % vec == 0 and all(s % vec == 0 for s in st[:-1]))
                      for st, off in zip(strides[1:], offsets))       # every vector load starts aligned
        return sizes[-1] % vec == 0 and vec * widest <= MAX_ACCESS_BYTES and aligned

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[ElementwiseSchedule, ...]:
        vecs = [v for v in (8, 4, 2, 1) if self._vec_ok(op, v)]
        best, half = vecs[0], vecs[min(1, len(vecs) - 1)]
        return tuple(dict.fromkeys((ElementwiseSchedule(THREAD_CHOICES[0], best),
                                    ElementwiseSchedule(THREAD_CHOICES[1], half))))

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[ElementwiseSchedule, ...]:
        vecs = vector_widths(GRID_VECS, lambda v: self._vec_ok(op, v))
        grid = (ElementwiseSchedule(t, v) for t in GRID_THREADS for v in vecs)
        return grid_space(self.schedules(op, arch), grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        s = schedule
        if not (isinstance(s, ElementwiseSchedule) and self.accepts(op) and s.vec >= 1 and self._vec_ok(op, s.vec)
                and s.threads % 32 == 0 and 0 < s.threads <= arch.max_threads_per_block):
            return False
        return self._register_estimate(op, s.vec, arch) <= arch.register_limit(s.threads)

    # -- resources ----------------------------------------------------------------------------

    def _expr(self, op: KernelOp):
        if op.op in EXPRESSION_OPS:
            return parse_expr(op.attr_map["expr"])
        return (op.op, *range(len(op.operands)))

    def resources(self, op: KernelOp, schedule: ElementwiseSchedule, arch: ArchSpec) -> Resources:
        v = schedule.vec
        units = op.result.numel // v
        resident = min(arch.max_blocks_per_sm, arch.max_warps_per_sm * 32 // schedule.threads)
        blocks = max(1, min(math.ceil(units / schedule.threads), arch.sm_count * resident * GRID_WAVES))
        # A broadcast operand is read at its own size: the repeats hit L1/L2; a view, only its elements.
        parts = [p.op for p in pieces(op)] if op.op == "concatenated_elementwise" else [op]
        reads = (self._pieces_read_bytes(op) if op.op == "concatenated_elementwise"
                 else sum(self._read_bytes(op, i) for i in range(len(op.operands))))
        hbm = reads + op.result.nbytes
        heavy = max(sum(n in TRANSCENDENTAL for n in expr_ops(self._expr(p))) for p in parts)
        return Resources(threads=schedule.threads, blocks=blocks, registers=self._register_estimate(op, v, arch),
                         smem_bytes=0, hbm_bytes=hbm, flops=op.flops, unit=MathUnit.FP32,
                         efficiency=1.0 if heavy < 2 else 0.8)

    def _pieces_read_bytes(self, op: KernelOp) -> int:
        """What a concatenated_elementwise's pieces read: per tensor, the bytes of its views, summed over
        the pieces and the operands holding it (`shared`: rotary embeddings read both halves of x in
        each half), and at most the whole tensor: what one piece's lanes read, the other's find in L1/L2."""
        shared = op.attr_map.get("shared") or tuple(range(len(op.operands)))
        per_tensor: dict[int, int] = {}
        for p in pieces(op):
            for k, i in enumerate(p.operands):
                per_tensor[shared[i]] = per_tensor.get(shared[i], 0) + self._read_bytes(p.op, k)
        return sum(min(read, op.operands[i].nbytes) for i, read in per_tensor.items())

    def _read_bytes(self, op: KernelOp, i: int) -> int:
        t = op.operands[i]
        if op.op != "strided_elementwise":
            return t.nbytes
        strides, _ = self._views(op)[i]
        return t.dtype.itemsize * math.prod(n for n, s in zip(op.result.shape, strides) if s)

    def _register_estimate(self, op: KernelOp, v: int, arch: ArchSpec) -> int:
        if op.op == "concatenated_elementwise":   # one piece runs at a time: the largest
            return max(self._register_estimate(p.op, v, arch) for p in pieces(op))
        return self._registers(op, v, self._layout(op)[1], arch)

    def _registers(self, op: KernelOp, v: int, strides, arch: ArchSpec) -> int:
        # Calibrated against ptxas on samples(); every term is a value the loop keeps live.
        regs = REG_BASE + (REG_SM90 if arch.compute_capability >= (9, 0) else 0)
        for t, st in zip(op.operands, strides[1:]):
            if not st[-1]:   # one value per trip; an indexed one pays a division and its own address
                regs += REG_SCALAR + (REG_INDEXED if any(st) else 0)
            elif st[-1] != 1:    # a gather: an address per lane
                regs += REG_INDEXED + REG_PER_LANE * v * words(t.dtype)
            elif t.dtype is DType.bool:   # bytes stay packed four to a register
                regs += REG_PER_BOOL_WORD * max(1, v // 4)
            else:            # the loaded vector, then its values unpacked to compute type
                regs += REG_PER_LOADED_WORD * max(1, v * t.dtype.itemsize // 4) + REG_PER_LANE * v * words(t.dtype)
        lanes_in_flight = min(v, MAX_LANES_IN_FLIGHT)
        regs += sum(HEAVY_TEMPS.get(n, 0) for n in self._ops_weighted(op)) * lanes_in_flight
        regs += sum(FP8_DECODE_TEMPS.get(t.dtype, 0) for t in op.operands) * lanes_in_flight
        if not op.operands:  # creation ops: only the packed result vector is live
            regs += REG_PER_STORED_WORD * max(1, v * op.result.dtype.itemsize // 4)
        if op.op in TRIANGLE:
            regs += REG_PER_MASK_LANE * v
        return round(regs)

    def _ops_weighted(self, op: KernelOp) -> list[str]:
        names = expr_ops(self._expr(op))
        if op.op == "gelu":
            names = ["gelu_tanh" if op.attr_map.get("approximate") == "tanh" else "gelu"]
        return names

    # -- emission -----------------------------------------------------------------------------

    def emit(self, op: KernelOp, schedule: ElementwiseSchedule, arch: ArchSpec) -> KernelSource:
        v, n = schedule.vec, op.result.numel
        idx = index_type(max([n] + [t.numel for t in op.operands]))     # a view may reach past the result's size
        name = kernel_name(self.kind, op, schedule)
        out_t = STORAGE[op.result.dtype]
        params = [f"const {STORAGE[t.dtype]}* __restrict__ in{i}" for i, t in enumerate(op.operands)]
        params.append(f"{out_t}* __restrict__ out")
        if op.op == "concatenated_elementwise":
            compute = self._pieces_code(op, v, idx)
        else:
            compute = self._compute(op, range(len(op.operands)), "i", v)
        cfg = schedule.describe()
        source = f"""// {op}
// elementwise, schedule {cfg}; shapes are baked in (broadcast index math specialized).
// launch: {name}<<<grid, {schedule.threads}>>>({', '.join(f'in{i}' for i in range(len(op.operands)))}{', ' if op.operands else ''}out)
//   any grid works (grid-stride loop); resources() gives the one the model assumes.
{VEC_STRUCT}

extern "C" __global__ void __launch_bounds__({schedule.threads}) {name}({', '.join(params)}) {{
    const {idx} step = gridDim.x * blockDim.x * {v}u;
    for ({idx} i = ((({idx})blockIdx.x) * blockDim.x + threadIdx.x) * {v}u; i < {n}u; i += step) {{
        vec_t<{out_t}, {v}> r;
        {textwrap.indent(compute, " " * 8).lstrip()}
        *reinterpret_cast<vec_t<{out_t}, {v}>*>(out + i) = r;
    }}
}}
"""
        return KernelSource(name, source, schedule.threads,
                            grid=(self.resources(op, schedule, arch).blocks, 1, 1),
                            fast_math=op.numerics is Numerics.FAST)

    def _pieces_code(self, op: KernelOp, v: int, idx: str) -> str:
        """Each piece's computation, chosen by the element's coordinate c along the axis; `ip` is its
        index in the piece (the vector of `v` elements never straddles two pieces)."""
        axis, shape = op.attr_map["axis"], op.result.shape
        inner, width = math.prod(shape[axis + 1:]), shape[axis]
        parts = pieces(op)
        lines = [f"const {idx} c = {'i' if inner == 1 else f'(i / {inner}u)'} % {width}u;"]
        for k, p in enumerate(parts):
            own = p.op.result.shape[axis]
            test = f"if (c < {p.start + own}u) " if k < len(parts) - 1 else ""
            lines.append(f"{'} else ' if k else ''}{test}{{")
            back = f" - {p.start * inner}u" if p.start else ""
            lines.append(f"    const {idx} ip = (i / {width * inner}u) * {own * inner}u + i % {width * inner}u{back};")
            lines.append(textwrap.indent(self._compute(p.op, p.operands, "ip", v), " " * 4))
        return "\n".join(lines + ["}"])

    def _compute(self, op: KernelOp, pointers, index: str, v: int) -> str:
        """The loads of `op`'s operands (from in<pointers[k]>) at element `index` and the loop over
        the vector's lanes that leaves the results in r."""
        body, leaves = self.loads(op, pointers, index, v)
        lane = [f"const {ctype(d)} {x} = {load(d, src)};" for x, d, src in leaves]
        value = self._value(op, [(x, d) for x, d, _ in leaves], lane)
        lanes = "\n".join("    " + line for line in lane)
        return "\n".join(body + ["#pragma unroll", f"for (int j = 0; j < {v}; ++j) {{", lanes,
                                 f"    r.v[j] = {store(op.result.dtype, value)};", "}"])

    def loads(self, op: KernelOp, pointers, index: str, v: int) -> tuple[list[str], list[tuple[str, DType, str]]]:
        """The lines loading `op`'s operands (from in<pointers[k]>) at element `index`, and per operand
        (lane variable, dtype, what lane j reads)."""
        sizes, strides = self._layout(op)
        body, leaves = [], []
        views = self._views(op)
        for i, (t, st, p) in enumerate(zip(op.operands, strides[1:], pointers)):
            off = offset_expr(index, sizes, st) + (f" + {views[i][1]}u" if views[i][1] else "")
            if st[-1] not in (0, 1):    # strided along the inner axis: each lane its own load
                body.append(f"const {STORAGE[t.dtype]}* a{i} = in{p} + ({off});")
                leaves.append((f"x{i}", t.dtype, f"a{i}[j * {st[-1]}u]"))
            elif st[-1]:   # this operand runs along the result's inner axis: one vector load
                body.append(f"const vec_t<{STORAGE[t.dtype]}, {v}> a{i} = "
                            f"*reinterpret_cast<const vec_t<{STORAGE[t.dtype]}, {v}>*>(in{p} + ({off}));")
                leaves.append((f"x{i}", t.dtype, f"a{i}.v[j]"))
            else:        # repeated along the inner axis: one scalar serves all lanes
                body.append(f"const {STORAGE[t.dtype]} a{i} = in{p}[{off}];")
                leaves.append((f"x{i}", t.dtype, f"a{i}"))
        return body, leaves

    def _value(self, op: KernelOp, leaves: list[tuple[str, DType]], lines: list[str]) -> str:
        a, out = op.attr_map, op.result.dtype
        if op.op == "full":
            return literal(a["value"], out)
        if op.op == "arange":
            c = ctype(out)
            step = f"({c})(i + j) * {literal(a['step'], out)}" if c != "bool" else "(i + j)"
            return f"({literal(a['start'], out)} + {step})"
        if op.op in TRIANGLE:
            rows, cols = op.result.shape[-2:]
            lines.append(f"const int col = (int)((i + j) % {cols}u), row = (int)(((i + j) / {cols}u) % {rows}u);")
            keep = "<=" if op.op == "tril" else ">="
            return f"((col - row {keep} {int(a['k'])}) ? {leaves[0][0]} : {literal(0, leaves[0][1])})"
        if op.op in EXPRESSION_OPS:
            var, _ = emit_tree(parse_expr(a["expr"]), leaves, lines)
            return var
        return scalar_op(op.op, leaves, dict(a), out)

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32, b = DType.bfloat16, DType.float32, DType.bool
        big, row, col = TensorType((4096, 4096), bf), TensorType((4096,), bf), TensorType((4096, 1), bf)
        x32 = TensorType((2048, 1024), f32)

        def ew(name, *xs, **attrs):
            return KernelOp.of(name, xs, OPS[name].infer(*xs, **attrs), **attrs)

        mask = TensorType((1, 1, 1024, 1024), b)
        scores = TensorType((4, 8, 1024, 1024), bf)
        return (
            ew("add", big, row),                                   # bf16 bias broadcast, vec 8
            ew("mul", x32, TensorType((), f32)),                   # fp32 times a scalar
            ew("exp", x32),
            ew("gelu", big, approximate="tanh"),
            ew("gelu", x32, approximate="none"),
            ew("sub", big, col),                                   # inner-broadcast operand
            ew("where", mask, scores, TensorType((), bf)),         # masked fill
            ew("cast", x32, dtype=bf),
            ew("cast", TensorType((4096, 4096), DType.float8_e4m3), dtype=bf),    # fp8 widened in software
            ew("mul", TensorType((2048, 1024), DType.float8_e5m2), TensorType((), f32)),
            ew("lt", x32, TensorType((1024,), f32)),
            ew("logical_and", TensorType((4096, 4096), b), TensorType((4096, 4096), b)),
            ew("tril", big, k=0),
            ew("fused_elementwise", big, row, big, expr="mul(relu(add($0,$1)),$2)"),
            # a relu's gradient: the comparison's mask stays in registers
            ew("fused_elementwise", big, TensorType((), bf), big, TensorType((), bf), expr="where(gt($0,$1),$2,$3)"),
            # a gated unit reading both halves of [4096, 8192] in place, and a strided column of x32
            ew("strided_elementwise", TensorType((4096, 8192), bf), TensorType((4096, 8192), bf),
               expr="mul(silu($0),$1)", shape=(4096, 4096), strides=(8192, 1, 8192, 1), offsets=(0, 4096)),
            ew("strided_elementwise", x32, x32, expr="add($0,$1)", shape=(1024, 1024), strides=(2048, 1, 1, 2048),
               offsets=(1024, 0)),
            # rotary embeddings: x·cos + cat(−x₂, x₁)·sin, each half computed where the concatenate is read
            ew("concatenated_elementwise", TensorType((32, 2048, 128), bf), TensorType((2048, 128), bf),
               TensorType((2048, 128), bf), TensorType((32, 2048, 128), bf), axis=2, sizes=(64, 64),
               exprs="sub(mul($0,$1),mul($3,$2));add(mul($0,$1),mul($3,$2))", shape=(32, 2048, 128),
               strides=((2048 * 128, 128, 1) + (0, 128, 1) * 2 + (2048 * 128, 128, 1)) * 2,
               offsets=(0, 0, 0, 64, 64, 64, 64, 0)),
            KernelOp.of("full", (), TensorType((4096, 4096), bf), shape=(4096, 4096), value=1.5, dtype=bf),
            KernelOp.of("arange", (), TensorType((1 << 20,), f32), start=0, stop=1 << 20, step=1, dtype=f32),
        )

