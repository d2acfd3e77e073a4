"""A norm's whole backward, norm_backward_grads, as one row kernel: dx, and the weight's and the
bias's gradients as partial sums over the rows.

Block p of `parts` walks the rows p, p + parts, p + 2 parts, … (one block per row at a time, the
row held in registers as NormBackwardTemplate's resident walk holds it). Its threads own the same
columns of every row, so each keeps Σ g x̂ and Σ g for its columns in registers across the rows,
and the weight, the same for every row, is loaded once. dx is written row by row; at the end
each block stores its two partial sums, each as the value in x's dtype and what that rounding
dropped. Summing the 2 · parts rows (a small column reduction over parts · D values, not the
whole x and g again) gives dW and db, so x and g are read from HBM once for all three gradients.

Only the resident walk has this form (a looped row has too many columns per thread to keep), so
the template refuses rows longer than a 1024-thread block holds with its partial sums (8192
elements); the cost model then prices such a node at infinity and extraction keeps the other forms.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.codegen.arch import arch_named
>>> x, w = TensorType((8192, 4096), DType.bfloat16), TensorType((4096,), DType.bfloat16)
>>> attrs = dict(norm="layernorm", axes=(1,), eps=1e-5, has_weight=True, parts=256)
>>> op = KernelOp.of("norm_backward_grads", (x, x, w), OPS["norm_backward_grads"].infer(x, x, w, **attrs), **attrs)
>>> t = NormBackwardGradsTemplate()
>>> s = t.schedules(op, arch_named("h100"))[0]
>>> (s.describe(), t.resources(op, s, arch_named("h100")).blocks)
('threads=256 vec=8 rows_per_block=1', 256)
"""

from __future__ import annotations

import math
from dataclasses import replace

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.norm_backward import grads_layout
from tessera_rw.codegen.arch import ArchSpec, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule
from tessera_rw.codegen.templates.cuda_scalar import STORAGE, float_literal, index_type, load, store
from tessera_rw.codegen.templates.norm_backward import REG_PER_HELD, NormBackwardTemplate, each_vector, lanes
from tessera_rw.codegen.templates.rowwise import REG_KAHAN, RowwiseSchedule, row_spec

BLOCKS = (128, 256, 512, 1024)
# The register model, fit to ptxas on samples(): NormBackwardTemplate's resident base, x and g
# held per element, and per element of a thread's columns the weight and the two partial sums
# (under kahan_sum, their two compensations too).
REG_BASE = 18
REG_PER_COLUMN = 3.0
REG_PER_KAHAN_COLUMN = 2.0
# A block walks its rows one after another: a row's loads are in flight, then its block-wide
# sums (mean, variance, the two gradient sums; an RMS norm's two) run with nothing in flight.
# Each such sum (two shuffle trees and two barriers, ~450 cycles) takes about this share of a
# load's DRAM latency; the cost model's Little's law then sees the loads outstanding for their
# share of the row's cycle.
BLOCK_SUM_PER_LOAD_LATENCY = 0.3
BLOCK_SUMS = {"layernorm": 4, "rmsnorm": 2}


class NormBackwardGradsTemplate(NormBackwardTemplate):
    """norm_backward_grads: dx of layernorm / rmsnorm with the weight's and bias's gradient partials
    (kind 'layernorm', fused 'backward', 'weight_grad')."""

    ops = frozenset({"norm_backward_grads"})

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return ("backward", "weight_grad") + (("residual",) if op.attr_map.get("has_residual") else ())

    def accepts(self, op: KernelOp) -> bool:
        """Rows a 1024-thread block holds in registers (where the weight and the partial sums do not
        fit beside them as well, schedules() offers none: the cost model then prices the op at
        infinity)."""
        if not super().accepts(op):
            return False
        v = next((v for v in (8, 4, 2, 1) if self._vec_ok(op, v)), 1)
        return self.resident(op, RowwiseSchedule(BLOCKS[-1], v, 1))

    def _accesses(self, op: KernelOp) -> list[tuple]:
        """As a row kernel reads its operands, but one constant along the row (a row of one column)
        is read where it is used: a block's rows come in its own loop, so there is no one row to
        load it for before the body."""
        return [("gather", *rest) if how == "row" else (how, *rest) for how, *rest in super()._accesses(op)]

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[RowwiseSchedule, ...]:
        _, length = self._row(op)
        # as NormBackwardTemplate's: the widest blocks whose threads each load two vectors, then
        # one; a row shorter than a 128-thread block's vectors takes narrower ones (past the row's
        # end a thread idles, and ptxas spilled such a ragged block: 768 bf16 at 8 per thread)
        for v in (u for u in (8, 4, 2, 1) if self._vec_ok(op, u)):
            fits = [s for s in (RowwiseSchedule(t, v, 1) for t in BLOCKS) if self.valid(op, s, arch)]
            for vectors in (2, 1):
                wide = [s for s in fits if length >= vectors * s.threads * v]
                if wide:
                    return tuple(wide[-2:][::-1])
        fits = [s for s in (RowwiseSchedule(t, 1, 1) for t in BLOCKS) if self.valid(op, s, arch)]
        return tuple(fits[:1])

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        return (isinstance(schedule, RowwiseSchedule) and schedule.rows_per_block == 1
                and self.resident(op, schedule) and super().valid(op, schedule, arch))

    def resources(self, op: KernelOp, s: RowwiseSchedule, arch: ArchSpec) -> Resources:
        x, g = op.operands[:2]
        loads = self.elements_per_thread(op, s) * (x.dtype.itemsize + g.dtype.itemsize)
        share = 1 + BLOCK_SUMS[op.attr_map["norm"]] * BLOCK_SUM_PER_LOAD_LATENCY
        return replace(super().resources(op, s, arch), blocks=op.attr_map["parts"],
                       bytes_in_flight=max(1, round(loads / share)))

    def _registers(self, op: KernelOp, s: RowwiseSchedule, arch: ArchSpec) -> int:
        held = self.elements_per_thread(op, s)
        kahan = REG_KAHAN + REG_PER_KAHAN_COLUMN * held if op.numerics is Numerics.KAHAN_SUM else 0
        return round(REG_BASE + REG_PER_HELD * self.row_values(op, s) + REG_PER_COLUMN * held + kahan)

    def row_and_lane(self, op: KernelOp, s: RowwiseSchedule) -> list[str]:
        return ["const unsigned lane = threadIdx.x;"]           # the rows: the walk's loop

    def describe_walk(self, op: KernelOp, s: RowwiseSchedule) -> str:
        return f"block p of {op.attr_map['parts']} walks the rows p, p + {op.attr_map['parts']}, …"

    def describe_norm(self, op: KernelOp) -> str:
        return f"{op.attr_map['norm']} input, weight and bias gradients"

    def emit(self, op: KernelOp, s: RowwiseSchedule, arch: ArchSpec) -> KernelSource:
        spec = row_spec(op)
        rows, length = self._row(op)
        v = s.vec
        acc = self._accesses(op)
        sums, _ = self.reductions(op, s)
        centered = spec.norm == "layernorm"
        chunks = math.ceil(length / (s.threads * v))
        ragged = length % (s.threads * v) != 0
        inv = f"(1.0f / {length}.0f)"

        def each(lines: list[str], guarded: bool = True) -> list[str]:
            return each_vector(chunks, length, v, s.threads, lines, guarded)

        def zero_past_the_end(*arrays: str) -> list[str]:
            if not ragged:
                return []
            zeros = " ".join(f"{a}[k][j] = 0.0f;" for a in arrays)
            return [f"if (c >= {length}u) {{ for (int j = 0; j < {v}; ++j) {{ {zeros} }} continue; }}"]

        x_lines, x_val = self.read(op, acc, 0, "x", v)
        g_lines, g_val = self.read(op, acc, 1, "g", v)
        weight = "w[k][j]" if spec.weight is not None else "1.0f"
        kahan = op.numerics is Numerics.KAHAN_SUM

        def partial(name: str, value: str) -> str:
            return f"kahan_add({name}[k][j], {name}_c[k][j], {value});" if kahan else f"{name}[k][j] += {value};"
        out = [f"float pw[{chunks}][{v}] = {{}}, pb[{chunks}][{v}] = {{}};   // this block's Σ g x̂ and Σ g"]
        if kahan:
            out.append(f"float pw_c[{chunks}][{v}] = {{}}, pb_c[{chunks}][{v}] = {{}};   // their compensations")
        if spec.weight is not None:
            w_lines, w_val = self.read(op, acc, 2, "w", v)
            out += [f"float w[{chunks}][{v}];"] + each(zero_past_the_end("w") + w_lines
                                                        + lanes(f"w[k][j] = {w_val};", v), guarded=False)
        body = [f"float x[{chunks}][{v}], g[{chunks}][{v}];"]
        body += each(zero_past_the_end("x", "g") + x_lines + g_lines
                     + lanes(f"{{ x[k][j] = {x_val}; g[k][j] = {g_val}; }}", v), guarded=False)
        if centered:
            body += [sums.init("s")] + each(lanes(sums.add("s", "x[k][j]"), v), guarded=False)
            body += [f"const float mean = {sums.total('s')} * {inv};"]
            body += each(lanes("x[k][j] -= mean;", v))
        body += [sums.init("q")] + each(lanes(sums.add("q", "x[k][j] * x[k][j]"), v), guarded=False)
        body += [f"const float rstd = rsqrtf({sums.total('q')} * {inv} + {float_literal(spec.eps)});"]
        body += ([sums.init("a")] if centered else []) + [sums.init("b")]
        step = (f"{{ x[k][j] *= rstd; const float gw = g[k][j] * {weight}; "
                + (sums.add("a", "gw") + " " if centered else "") + sums.add("b", "gw * x[k][j]")
                + f" {partial('pw', 'g[k][j] * x[k][j]')} {partial('pb', 'g[k][j]')} }}")
        body += each(lanes(step, v), guarded=False)
        body += [f"const float c1 = {sums.total('a') + ' * ' + inv if centered else '0.0f'};",
                 f"const float c2 = {sums.total('b')} * {inv};"]
        body += each(self.write_dx(op, acc, v, f"rstd * (g[k][j] * {weight} - c1 - x[k][j] * c2)"))
        out += [f"for (unsigned row = blockIdx.x; row < {rows}u; row += {op.attr_map['parts']}u) {{",
                *("    " + line for line in body), "}"]
        out += self._partials_store(op, v, each, kahan)
        return self.kernel_source(op, s, arch, acc, out)

    def _partials_store(self, op: KernelOp, v: int, each, kahan: bool) -> list[str]:
        """Each block's Σ g x̂ and Σ g for its columns, as two rows each: the value (with its
        compensation under kahan_sum) stored in the result's dtype, then value − stored; block 0 also
        zeroes the gaps that align each block."""
        rows, length = self._row(op)
        parts, dtype = op.attr_map["parts"], op.result.dtype
        weight, bias, _ = grads_layout(rows * length, parts, length)
        idx = index_type(op.result.numel)
        vt = f"vec_t<{STORAGE[dtype]}, {v}>"
        lines = []
        for name, first in (("pw", weight), ("pb", bias)):
            at = f"out + ({idx}){first}u + ({idx})blockIdx.x * {2 * length}u + c"
            value = f"({name}[k][j] + {name}_c[k][j])" if kahan else f"{name}[k][j]"
            lines += ["{", f"    {vt} hi, lo;", "    #pragma unroll", f"    for (int j = 0; j < {v}; ++j) {{",
                      f"        const float total = {value};",
                      f"        hi.v[j] = {store(dtype, 'total')};",
                      f"        lo.v[j] = {store(dtype, 'total - ' + load(dtype, 'hi.v[j]'))};", "    }",
                      f"    *reinterpret_cast<{vt}*>({at}) = hi;",
                      f"    *reinterpret_cast<{vt}*>({at} + {length}u) = lo;", "}"]
        gaps = [(start, stop) for start, stop in ((rows * length, weight), (weight + 2 * parts * length, bias))
                if stop > start]
        zero = [f"if (blockIdx.x == 0u && lane < {stop - start}u) out[{start}u + lane] = {store(dtype, '0.0f')};"
                for start, stop in gaps]
        return each(lines) + zero

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32, kahan = DType.bfloat16, DType.float32, Numerics.KAHAN_SUM

        def of(norm: str, shape: tuple[int, ...], dtype: DType, parts: int, weighted: bool = True,
               residual: bool = False, **kw) -> KernelOp:
            x = TensorType(shape, dtype)
            operands = (x, x, *((TensorType(shape[-1:], dtype),) if weighted else ()), *((x,) if residual else ()))
            attrs = dict(norm=norm, axes=(len(shape) - 1,), eps=1e-5, has_weight=weighted, has_residual=residual,
                         parts=parts)
            return KernelOp.of("norm_backward_grads", operands, OPS["norm_backward_grads"].infer(*operands, **attrs),
                               **attrs, **kw)
        return (
            of("layernorm", (8192, 4096), bf, 256),                  # the benchmark's
            of("layernorm", (4096, 768), bf, 256),                   # BERT-base: a ragged 128-thread block
            of("rmsnorm", (4, 1024, 4096), bf, 256),
            of("layernorm", (1000, 1024), f32, 200, residual=True),
            of("rmsnorm", (512, 4096), bf, 128, numerics=kahan),
            of("layernorm", (300, 8192), bf, 256, weighted=False),   # the longest row held
        )
