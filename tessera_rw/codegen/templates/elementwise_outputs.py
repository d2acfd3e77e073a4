"""multi_elementwise: k elementwise results of one shape from one read of their operands.

The walk is ElementwiseTemplate's over the results' shape S (a grid-stride loop, `vec` elements per
thread, each operand loaded once per vector, broadcast ones as scalars); each lane computes every
expression from the loaded values and the k vectors are stored at result m's block, m·|S| on. An
AdamW step (parameter, gradient and two moments in, the parameter and the moments out) reads 4 and
writes 3 tensors, where three kernels read 7 and write 3.

>>> from tessera_rw.algebra.dtypes import DType
>>> p = TensorType((4096, 4096), DType.float32)
>>> op = MultiElementwiseTemplate().samples()[0]
>>> t = MultiElementwiseTemplate()
>>> t.resources(op, t.schedules(op, arch_named("h100"))[0], arch_named("h100")).hbm_bytes == 7 * p.nbytes
True
"""

from __future__ import annotations

import math
import textwrap

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.fused_expr import parse_expr
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources
from tessera_rw.codegen.templates.cuda_scalar import (READABLE, STORAGE, SUPPORTED, VEC_STRUCT, broadcast_strides,
                                                      coalesce, ctype, emit_tree, expr_ops, index_type, kernel_name,
                                                      load, store, words)
from tessera_rw.codegen.templates.elementwise import GRID_WAVES, ElementwiseSchedule, ElementwiseTemplate


class MultiElementwiseTemplate(ElementwiseTemplate):
    """multi_elementwise: several expressions over the same operands, one pass."""

    ops = frozenset({"multi_elementwise"})

    def accepts(self, op: KernelOp) -> bool:
        return (op.op in self.ops and all(t.dtype in READABLE for t in op.operands) and op.result.dtype in SUPPORTED
                and op.result.numel > 0)

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for tree in self._trees(op) for n in expr_ops(tree))) + ("multi_output",)

    def _trees(self, op: KernelOp) -> list:
        return [parse_expr(e) for e in op.attr_map["exprs"].split(";")]

    def _expr(self, op: KernelOp):
        return ("multi", *self._trees(op))        # every expression's ops, for the register and FLOP weights

    @staticmethod
    def each(op: KernelOp) -> tuple[int, ...]:
        """The shape of one result."""
        return op.result.shape[1:]

    def _layout(self, op: KernelOp) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        out = self.each(op)
        sizes, strides = coalesce(out, [contiguous_strides(out)] + [st for st, _ in self._views(op)])
        return sizes or (1,), [s or (1,) for s in strides]

    def _views(self, op: KernelOp) -> list[tuple[tuple[int, ...], int]]:
        return [(broadcast_strides(self.each(op), t.shape), 0) for t in op.operands]

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[ElementwiseSchedule, ...]:
        # the widest vectors at either block size: narrower ones leave ptxas more of the expressions'
        # temporaries live than the register model counts (a third more on sm_90)
        widest = ElementwiseTemplate.schedules(self, op, arch)[0].vec
        return (ElementwiseSchedule(256, widest), ElementwiseSchedule(128, widest))

    def resources(self, op: KernelOp, schedule: ElementwiseSchedule, arch: ArchSpec) -> Resources:
        v, k = schedule.vec, op.result.shape[0]
        units = math.prod(self.each(op)) // v
        resident = min(arch.max_blocks_per_sm, arch.max_warps_per_sm * 32 // schedule.threads)
        blocks = max(1, min(math.ceil(units / schedule.threads), arch.sm_count * resident * GRID_WAVES))
        regs = self._registers(op, v, self._layout(op)[1], arch) + REG_PER_RESULT_WORD * (k - 1) * max(
            1, v * op.result.dtype.itemsize // 4) * words(op.result.dtype)
        return Resources(threads=schedule.threads, blocks=blocks, registers=round(regs), smem_bytes=0,
                         hbm_bytes=op.operand_bytes + op.result.nbytes, flops=op.flops, unit=MathUnit.FP32)

    def emit(self, op: KernelOp, schedule: ElementwiseSchedule, arch: ArchSpec) -> KernelSource:
        v, k, n = schedule.vec, op.result.shape[0], math.prod(self.each(op))
        idx = index_type(max([op.result.numel] + [t.numel for t in op.operands]))
        name = kernel_name(self.kind, op, schedule)
        out_t = STORAGE[op.result.dtype]
        params = [f"const {STORAGE[t.dtype]}* __restrict__ in{i}" for i, t in enumerate(op.operands)]
        params.append(f"{out_t}* __restrict__ out")
        body, leaves = self.loads(op, range(len(op.operands)), "i", v)
        lane = [f"const {ctype(d)} {x} = {load(d, src)};" for x, d, src in leaves]
        for m, tree in enumerate(self._trees(op)):
            var, _ = emit_tree(tree, [(x, d) for x, d, _ in leaves], lane, f"e{m}_")
            lane.append(f"r{m}.v[j] = {store(op.result.dtype, var)};")
        compute = "\n".join(body + [f"vec_t<{out_t}, {v}> {', '.join(f'r{m}' for m in range(k))};", "#pragma unroll",
                                    f"for (int j = 0; j < {v}; ++j) {{", *("    " + x for x in lane), "}"]
                            + [f"*reinterpret_cast<vec_t<{out_t}, {v}>*>(out + {m * n}u + i) = r{m};"
                               for m in range(k)])
        source = f"""// {op}
// elementwise, {k} results of {n} elements from one read of the operands; schedule {schedule.describe()}.
// launch: {name}<<<grid, {schedule.threads}>>>({', '.join(f'in{i}' for i in range(len(op.operands)))}, out)
{VEC_STRUCT}

extern "C" __global__ void __launch_bounds__({schedule.threads}) {name}({', '.join(params)}) {{
    const {idx} step = gridDim.x * blockDim.x * {v}u;
    for ({idx} i = ((({idx})blockIdx.x) * blockDim.x + threadIdx.x) * {v}u; i < {n}u; i += step) {{
        {textwrap.indent(compute, " " * 8).lstrip()}
    }}
}}
"""
        return KernelSource(name, source, schedule.threads, grid=(self.resources(op, schedule, arch).blocks, 1, 1),
                            fast_math=op.numerics is Numerics.FAST)

    def samples(self) -> tuple[KernelOp, ...]:
        f32, bf = DType.float32, DType.bfloat16

        def multi(xs: tuple[TensorType, ...], exprs: str) -> KernelOp:
            return KernelOp.of("multi_elementwise", xs, OPS["multi_elementwise"].infer(*xs, exprs=exprs), exprs=exprs)
        p = TensorType((4096, 4096), f32)
        m_new = "add(mul($2,0.9:float32),mul($1,0.1:float32))"
        v_new = "add(mul($3,0.999:float32),mul(mul($1,$1),0.001:float32))"
        adamw = f"sub(mul($0,0.9999:float32),mul(div({m_new},add(sqrt({v_new}),1e-08:float32)),0.0001:float32))"
        x = TensorType((4096, 4096), bf)
        return (
            multi((p, p, p, p), f"{m_new};{v_new};{adamw}"),                      # an AdamW step
            multi((x, TensorType((4096,), bf)), "add($0,$1);mul($0,$1)"),         # two results of a broadcast
        )


# The register model: ElementwiseTemplate's, and each further result's vector (fit to ptxas 12.x on samples()).
REG_PER_RESULT_WORD = 0.75
