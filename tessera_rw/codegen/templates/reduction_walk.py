"""The CUDA text of a reduction kernel's reads: its input parameters, each input's base pointer at
an output, its loads at a step of the reduced walk (a vector, or one value where it is broadcast
along the vector), and each vector lane's value. A plain reduction reads one tensor `x`; a
fused_reduction reads its operands `in0…` and computes its expression on each lane in each
operand's compute type (fp32 for 16-bit floats, double, int), rounding the result to the
expression's dtype as writing it would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tessera_rw.algebra.ops.fused_expr import parse_expr
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.cuda_scalar import STORAGE, ctype, emit_tree, load, offset_expr, store
from tessera_rw.codegen.templates.reduction_reads import Layout, Read, expressions, operand_reads, values_type


@dataclass(frozen=True)
class Walk:
    op: KernelOp
    lay: Layout
    vec: int
    acc: str                  # the accumulator's C type

    @property
    def fused(self) -> bool:
        return bool(expressions(self.op))

    @cached_property
    def reads(self) -> tuple[Read, ...]:
        return operand_reads(self.op)

    def params(self) -> str:
        if not self.fused:
            return f"const {STORAGE[self.op.operands[0].dtype]}* __restrict__ x"
        return ", ".join(f"const {STORAGE[r.dtype]}* __restrict__ in{i}" for i, r in enumerate(self.reads))

    def bases(self, kept: str) -> list[str]:
        """Each input's pointer at the output (or first output) `kept` indexes."""
        if not self.fused:
            x = STORAGE[self.op.operands[0].dtype]
            return [f"const {x}* base = x + ({offset_expr(kept, self.lay.kept, self.lay.kept_strides)});"]
        return [f"const {STORAGE[r.dtype]}* base{i} = in{i} + ({offset_expr(kept, self.lay.kept, r.kept_strides)});"
                for i, r in enumerate(self.reads)]

    def loads(self, red: str) -> list[str]:
        """Each input's vector (or broadcast value) at reduced position `red`."""
        v = self.vec
        if not self.fused:
            x = STORAGE[self.op.operands[0].dtype]
            return [f"const vec_t<{x}, {v}> c = *reinterpret_cast<const vec_t<{x}, {v}>*>(base + "
                    f"({offset_expr(red, self.lay.red, self.lay.red_strides)}));"]
        lines = []
        for i, r in enumerate(self.reads):
            at = offset_expr(red, self.lay.red, r.red_strides)
            if r.vector(self.lay.row):
                t = STORAGE[r.dtype]
                lines.append(f"const vec_t<{t}, {v}> c{i} = *reinterpret_cast<const vec_t<{t}, {v}>*>(base{i} + ({at}));")
            else:
                lines.append(f"const {ctype(r.dtype)} s{i} = {load(r.dtype, f'base{i}[{at}]')};")
        return lines

    def lanes(self) -> tuple[list[str], list[str]]:
        """(statements, the accumulator-typed value of each expression) of vector lane `j`."""
        if not self.fused:
            return [], [f"({self.acc}){load(self.op.operands[0].dtype, 'c.v[j]')}"]
        lines = [f"const {ctype(r.dtype)} x{i} = {load(r.dtype, f'c{i}.v[j]') if r.vector(self.lay.row) else f's{i}'};"
                 for i, r in enumerate(self.reads)]     # each in its own compute type: double, int, or float
        leaves = [(f"x{i}", r.dtype) for i, r in enumerate(self.reads)]
        values = values_type(self.op).dtype
        exprs = expressions(self.op)
        found = []
        for k, expr in enumerate(exprs):
            var, _ = emit_tree(parse_expr(expr), leaves, lines, "e" if len(exprs) == 1 else f"e{k}_")
            found.append(f"({self.acc}){load(values, store(values, var))}")
        return lines, found

    def per_lane(self, *adds) -> str:
        """The loop body applying each of `adds` (accumulator-typed value -> statement) to its
        expression's value at each lane."""
        lines, found = self.lanes()
        applied = [add(value) for add, value in zip(adds, found, strict=True)]
        return applied[0] if not lines and len(applied) == 1 else "{ " + " ".join([*lines, *applied]) + " }"
