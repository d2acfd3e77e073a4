"""logsumexp over trailing axes: a log_softmax's row statistics, and nothing normalized written.

The walk is RowwiseTemplate's (a warp or a block per row, the row resident in registers or walked
once with the online max and rescaled sum); where that kernel writes each value normalized, this
one writes one value per row, max + log Σ exp(x - max), from its first thread. A
fused_reduction with reduce='logsumexp' computes its expression as the row is loaded, so
logsumexp(x * scale + bias) reads x once too. Three kernels (the max, the sum of exps, log + max)
read the rows twice; this reads them once, however long the row.

An infinite max gives itself (scipy's -inf for a row of -inf, +inf for a row holding +inf), as the
statistics cannot shift by it; the max passes NaN over, so the loads note one apart and a row
holding a NaN gives NaN, as scipy's does.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.codegen.arch import arch_named
>>> x = TensorType((4096, 32000), DType.bfloat16)
>>> op = KernelOp.of("logsumexp", (x,), TensorType((4096,), DType.bfloat16), axes=(1,), keepdims=False)
>>> t = LogsumexpRowTemplate()
>>> t.resources(op, t.schedules(op, arch_named("h100"))[0], arch_named("h100")).hbm_bytes == x.nbytes + 4096 * 2
True
"""

from __future__ import annotations

import math

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.cuda_scalar import expr_ops, float_literal, store
from tessera_rw.codegen.templates.rowwise import RowwiseSchedule, RowwiseTemplate
from tessera_rw.codegen.templates.rowwise_spec import LOGSUMEXP_OPS, row_spec


class LogsumexpRowTemplate(RowwiseTemplate):
    """logsumexp over trailing axes, of a tensor or of an elementwise expression (fused_reduction)."""

    ops = frozenset(LOGSUMEXP_OPS)

    def accepts(self, op: KernelOp) -> bool:
        if op.op == "fused_reduction" and op.attr_map["reduce"] != "logsumexp":
            return False
        return super().accepts(op) and math.prod(self.row_shape(op)) > 0       # empty rows: the host's

    def refusal(self, op: KernelOp) -> str | None:
        if op.op == "fused_reduction" and op.attr_map["reduce"] != "logsumexp":
            return None        # the reduction kernel's
        return super().refusal(op)

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        prologue = expr_ops(row_spec(op).expr) if op.op == "fused_reduction" else []
        return tuple(dict.fromkeys(prologue)) + ("logsumexp",)

    def describe_norm(self, op: KernelOp) -> str:
        return "logsumexp (the online softmax statistics), each row's written"

    def looped_passes(self, op: KernelOp) -> int:
        return 1           # the statistics' pass: nothing normalized is written

    def write_values(self, op: KernelOp, s: RowwiseSchedule, body: list[str], value: str) -> list[str]:
        return []

    def loaded(self, op: KernelOp, target: str) -> list[str]:
        return [f"if ({target} != {target}) nan_seen = 1.0f;"]     # the max skips NaN: a NaN is noted apart

    def before_rows(self, op: KernelOp, s: RowwiseSchedule) -> list[str]:
        return ["float nan_seen = 0.0f;"]

    def after_rows(self, op: KernelOp, s: RowwiseSchedule) -> list[str]:
        peak = "m" if self.resident(op, s) else "mx"     # the row's max, as each walk names it
        _, red_max = self.reductions(op, s)
        inf, nan = float_literal(math.inf), float_literal(math.nan)
        return [f"const float any_nan = {red_max}(nan_seen);",
                f"const float total = any_nan > 0.0f ? {nan} : fabsf({peak}) == {inf} ? {peak} "
                f": {peak} + logf(denom);",
                f"if (lane == 0u) out[row] = {store(op.result.dtype, 'total')};"]

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32 = DType.bfloat16, DType.float32

        def lse(x: TensorType, keepdims: bool = False, **kw) -> KernelOp:
            axes = (x.ndim - 1,)
            return KernelOp.of("logsumexp", (x,), OPS["logsumexp"].infer(x, axes, keepdims), axes=axes,
                               keepdims=keepdims, **kw)

        def fused(xs: tuple[TensorType, ...], expr: str, axes: tuple[int, ...]) -> KernelOp:
            attrs = dict(expr=expr, reduce="logsumexp", axes=axes, keepdims=True)
            return KernelOp.of("fused_reduction", xs, OPS["fused_reduction"].infer(*xs, **attrs), **attrs)
        return (
            lse(TensorType((4096, 32000), bf)),                               # a block per row
            lse(TensorType((8192, 512), f32), keepdims=True),                 # a warp per row
            lse(TensorType((64, 65536), f32)),                                # looped: one pass
            lse(TensorType((4096, 32000), bf), numerics=Numerics.KAHAN_SUM),
            fused((TensorType((4096, 8192), bf), TensorType((4096, 1), f32)), "mul($0,$1)",
                  (1,)),                                                      # scaled rows
            fused((TensorType((16, 128, 64, 64), bf),), "$0", (2, 3)),        # two trailing axes
        )

