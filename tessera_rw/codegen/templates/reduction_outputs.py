"""multi_reduction: k reductions of expressions over the same operands, one walk of the values.

The walk is ReductionTemplate's row reduce (a warp, a block, or `blocks` blocks per output, the
innermost group reduced: per-channel sums over N, H and W of NCHW); each lane computes every
expression from the loaded values and adds it to that expression's accumulator. The shuffles,
the warps' meeting in shared memory and a grid split's parts (the workspace holds every
accumulator's, in part order, so the result is the same bits on every run) carry the k
accumulators side by side, and result m's outputs are written to row m of the result (then zeros
to the row's aligned end). A batch norm's
backward reads x once for Σdy·x̂ and Σdy (x̂ and dy computed from x), where two kernels read it twice.

>>> from tessera_rw.codegen.arch import arch_named
>>> t = MultiReductionTemplate()
>>> op, h100 = t.samples()[0], arch_named("h100")
>>> t.resources(op, t.schedules(op, h100)[0], h100).hbm_bytes == op.operand_bytes + 3 * 64 * 4     # x read once
True
"""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.fused_expr import parse_expr
from tessera_rw.algebra.ops.multi_output import multi_reduction_attrs
from tessera_rw.codegen.arch import ArchSpec, WARP_SIZE
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.cuda_scalar import expr_ops, store, words
from tessera_rw.codegen.templates.reduction import REG_KAHAN_ROW, UNROLL, ReductionSchedule, ReductionTemplate
from tessera_rw.codegen.templates.reduction_reads import Layout, expressions, operand_reads
from tessera_rw.codegen.templates.reduction_walk import Walk


class MultiReductionTemplate(ReductionTemplate):
    """multi_reduction: several sums (means, maxima, minima) over the same walk, row reduces."""

    ops = frozenset({"multi_reduction"})

    def accepts(self, op: KernelOp) -> bool:
        return super().accepts(op) and self._layout(op).row

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for e in expressions(op) for n in expr_ops(parse_expr(e)))) + ("multi_output",)

    @staticmethod
    def outputs(op: KernelOp) -> int:
        return op.result.shape[0]

    def _smem(self, op: KernelOp, s: ReductionSchedule, lay: Layout) -> int:
        return super()._smem(op, s, lay) * self.outputs(op)

    def _part_bytes(self, op: KernelOp) -> int:
        return super()._part_bytes(op) * self.outputs(op)

    def _registers(self, op: KernelOp, s: ReductionSchedule, lay: Layout, arch: ArchSpec) -> int:
        # ReductionTemplate's fused row walk, less what ptxas spends on a row's constants (a
        # channel's scale is loaded once per row, not per vector) and on the compensations, which
        # it keeps beside the loads; plus each further expression's accumulator and temporaries, and
        # a warp per row's deeper unrolled walk
        constants = sum(1 for r in operand_reads(op) if not r.vector(lay.row))
        kahan = REG_KAHAN_ROW if self.compensated(op) else 0
        warp = REG_WARP_ROW if s.split == WARP_SIZE else 0
        more = (self.outputs(op) - 1) * REG_PER_EXTRA_EXPRESSION * words(self._acc(op))
        return super()._registers(op, s, lay, arch) - constants * REG_ROW_CONSTANT - kahan + warp + more

    def _row(self, op, s: ReductionSchedule, lay: Layout, walk: Walk, ident, value, kahan: bool) -> str:
        k_out, v, tpr, a, parts = self.outputs(op), s.vec, s.split, walk.acc, s.blocks
        ks = range(k_out)
        if kahan:
            adds = [lambda e, k=k: f"kahan_add(acc{k}, comp{k}, {e});" for k in ks]
            steps = [f"{{ const {a} s2 = __shfl_xor_sync(0xffffffffu, acc{k}, o), c2 = __shfl_xor_sync(0xffffffffu, "
                     f"comp{k}, o); kahan_merge(acc{k}, comp{k}, s2, c2); }}" for k in ks]
        else:
            adds = [lambda e, k=k: f"acc{k} = reduction_combine(acc{k}, {e});" for k in ks]
            steps = [f"acc{k} = reduction_combine(acc{k}, __shfl_xor_sync(0xffffffffu, acc{k}, o));" for k in ks]
        shuffle = f"    for (int o = {WARP_SIZE // 2}; o > 0; o >>= 1) {{ {' '.join(steps)} }}"
        first = f"(part * {tpr}u + lane) * {v}u" if parts > 1 else f"lane * {v}u"
        row = f"blockIdx.x / {parts}u" if parts > 1 else f"blockIdx.x * {s.threads // tpr}u + threadIdx.x / {tpr}u"
        lines = [f"    const unsigned row = {row};",
                 *([f"    const unsigned part = blockIdx.x % {parts}u;"] if parts > 1 else []),
                 f"    const unsigned lane = threadIdx.x % {tpr}u;",
                 *(f"    {a} acc{k} = {ident};" + (f" {a} comp{k} = {ident};" if kahan else "") for k in ks),
                 f"    if (row < {lay.n_out}u) {{",
                 *(f"        {line}" for line in walk.bases("row")),
                 f"        #pragma unroll {UNROLL}",
                 f"        for (unsigned r = {first}; r < {lay.n_red}u; r += {parts * tpr * v}u) {{",
                 *(f"            {line}" for line in walk.loads("r")),
                 "            #pragma unroll",
                 f"            for (int j = 0; j < {v}; ++j) {walk.per_lane(*adds)}",
                 "        }",
                 "    }",
                 shuffle]
        if tpr > WARP_SIZE:   # one block per output: the warps meet in shared memory
            lines += _warps_met(k_out, tpr // WARP_SIZE, a, ident, kahan, shuffle)
        if parts > 1:
            lines += _parts_met(k_out, lay.n_out, parts, a, ident, kahan, shuffle)
        if kahan:
            lines += [f"    acc{k} = kahan_total(acc{k}, comp{k});" for k in ks]
        width = op.result.shape[1]       # each result's row: its values, then zeros to an aligned end
        stores = " ".join(f"out[{k * width}u + row] = {store(op.result.dtype, value.replace('acc', f'acc{k}'))};"
                          for k in ks)
        lines.append(f"    if (lane == 0 && row < {lay.n_out}u) {{ {stores} }}")
        if width > lay.n_out:
            zero = store(op.result.dtype, "0")
            pads = " ".join(f"out[{k * width}u + i] = {zero};" for k in ks)
            lines.append(f"    if (lane == 0 && row == 0u) for (unsigned i = {lay.n_out}u; i < {width}u; ++i) {{ {pads} }}")
        return "\n".join(lines)

    def samples(self) -> tuple[KernelOp, ...]:
        f32, bf = DType.float32, DType.bfloat16

        def multi(shapes_dtypes, exprs, reduce, axes, keepdims=False, numerics=Numerics.DEFAULT):
            xs = tuple(TensorType(shape, dtype) for shape, dtype in shapes_dtypes)
            attrs = multi_reduction_attrs(*xs, exprs=exprs, reduce=reduce, axes=axes, keepdims=keepdims)
            return KernelOp.of("multi_reduction", xs, OPS["multi_reduction"].infer(*xs, **attrs), numerics=numerics,
                               **attrs)
        channel = (1, 64, 1, 1)
        x_hat = "div(sub($0,$1),$2)"
        dy = f"where(gt(add(mul({x_hat},$3),$4),0.0:float32),1.0:float32,0.0:float32)"
        bn = [((32, 64, 56, 56), f32)] + [(channel, f32)] * 4
        return (
            # a batch norm's backward through a relu: Σdy·x̂, Σdy, Σdy·g/σ per channel (blocks share each)
            multi(bn, f"mul({dy},{x_hat});{dy};div(mul({dy},$3),$2)", "sum", (0, 2, 3)),
            multi([((8, 256, 28, 28), bf), ((1, 256, 1, 1), f32)], "mul(sub($0,$1),sub($0,$1));cast_float32($0)", "sum",
                  (0, 2, 3)),
            # rows of a (tokens, features) tensor: a warp, then a block per row, keepdims
            multi([((8192, 512), bf), ((8192, 512), bf)], "mul($0,$1);$1", "sum", (1,), True),
            multi([((4096, 4096), f32)], "$0;mul($0,$0)", "mean", (1,), True),
            multi([((4096, 4096), f32)], "$0;neg($0)", "max", (1,)),
            multi(bn, f"mul({dy},{x_hat});{dy}", "sum", (0, 2, 3), numerics=Numerics.KAHAN_SUM),   # compensated
        )


def _warps_met(k_out: int, warps: int, a: str, ident: str, kahan: bool, shuffle: str) -> list[str]:
    """A block's warps' accumulators met in shared memory and in warp 0's shuffles."""
    ks = range(k_out)
    lines = [f"    __shared__ {a} partial[{k_out}][{warps}];",
             *([f"    __shared__ {a} partial_comp[{k_out}][{warps}];"] if kahan else []),
             f"    if (lane % {WARP_SIZE}u == 0) {{",
             *(f"        partial[{k}][lane / {WARP_SIZE}u] = acc{k};"
               + (f" partial_comp[{k}][lane / {WARP_SIZE}u] = comp{k};" if kahan else "") for k in ks),
             "    }",
             "    __syncthreads();",
             f"    if (lane >= {WARP_SIZE}u) return;",
             *(f"    acc{k} = lane < {warps}u ? partial[{k}][lane] : {ident};"
               + (f" comp{k} = lane < {warps}u ? partial_comp[{k}][lane] : {ident};" if kahan else "") for k in ks),
             shuffle]
    return lines


def _parts_met(k_out: int, n_out: int, parts: int, a: str, ident: str, kahan: bool, shuffle: str) -> list[str]:
    """The ending of a grid split (reduction_split.parts_met's, for k accumulators): each block parks
    its parts at [m][row][part] (then their compensations), arrives, and the last to arrive combines
    every part of the row in part order."""
    n, ks = n_out * parts, range(k_out)
    if kahan:
        merges = [f"kahan_merge(acc{k}, comp{k}, ((volatile {a}*)parts)[{k * n}u + q], "
                  f"((volatile {a}*)comps)[{k * n}u + q]);" for k in ks]
    else:
        merges = [f"acc{k} = reduction_combine(acc{k}, ((volatile {a}*)parts)[{k * n}u + q]);" for k in ks]
    park = " ".join(f"parts[{k * n}u + at] = acc{k};" + (f" comps[{k * n}u + at] = comp{k};" if kahan else "")
                    for k in ks)
    words_parked = k_out * n * (2 if kahan else 1)
    return [
        f"    {a}* parts = reinterpret_cast<{a}*>(work);",
        *([f"    {a}* comps = parts + {k_out * n}u;"] if kahan else []),
        f"    unsigned* arrived = reinterpret_cast<unsigned*>(parts + {words_parked}u);",
        f"    if (lane == 0) {{ const unsigned at = row * {parts}u + part; {park} __threadfence(); }}",
        "    unsigned last = 0;",
        f"    if (lane == 0) last = atomicAdd(&arrived[row], 1u) == {parts - 1}u;",
        "    if (!__shfl_sync(0xffffffffu, last, 0)) return;       // another block of the row comes later",
        "    __threadfence();",
        *(f"    acc{k} = {ident};" + (f" comp{k} = {ident};" if kahan else "") for k in ks),
        f"    for (unsigned q = row * {parts}u + lane; q < (row + 1u) * {parts}u; q += {WARP_SIZE}u) "
        f"{{ {' '.join(merges)} }}",
        shuffle,
    ]


# The register model's changes to ReductionTemplate's (fit to ptxas 12.x on samples(), sm_80 and sm_90).
REG_PER_EXTRA_EXPRESSION = 2      # each further expression's accumulator and temporaries (per word)
REG_ROW_CONSTANT = 1              # an operand constant along the row: one value, not a pointer and a vector
REG_WARP_ROW = 4                  # a warp per row unrolls a longer walk than a block per row
