"""reduced_normalization: a row-wise normalization whose rows are added up instead of written.

The walk is RowwiseTemplate's (a warp or a block per row, the row resident in registers or walked
in passes); where that kernel stores each vector of the epilogue's values, this one adds them to
the thread's fp32 sum (compensated under `kahan_sum`), and once the row is done the row's threads
reduce their sums and its first thread writes the total (divided by the row's length for a mean).
A cross-entropy over 32,000 classes reads the logits and the labels once and writes one value per
row, where the normalization kernel would write the log-probabilities and a reduction read them.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.codegen.arch import arch_named
>>> x = TensorType((4096, 32000), DType.bfloat16)
>>> op = ReducedRowwiseTemplate().samples()[0]
>>> t = ReducedRowwiseTemplate()
>>> res = t.resources(op, t.schedules(op, arch_named("h100"))[0], arch_named("h100"))
>>> res.hbm_bytes == 2 * x.nbytes + 4096 * 2
True
"""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.cuda_scalar import store
from tessera_rw.codegen.templates.rowwise import RowwiseSchedule, RowwiseTemplate

ROW_SUM = "row_total"       # the thread's share of the row's sum


class ReducedRowwiseTemplate(RowwiseTemplate):
    """reduced_normalization: softmax / layernorm rows (kinds 'softmax' / 'layernorm') summed or averaged."""

    ops = frozenset({"reduced_normalization"})

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return super().fused(op) + (f"row_{op.attr_map['reduce']}",)

    def describe_norm(self, op: KernelOp) -> str:
        return f"{super().describe_norm(op)}, each row's {op.attr_map['reduce']} written"

    def write_values(self, op: KernelOp, s: RowwiseSchedule, body: list[str], value: str) -> list[str]:
        sums, _ = self.reductions(op, s)
        return ["#pragma unroll", f"for (int j = 0; j < {s.vec}; ++j) {{", *("    " + b for b in body),
                f"    {sums.add(ROW_SUM, value)}", "}"]

    def before_rows(self, op: KernelOp, s: RowwiseSchedule) -> list[str]:
        sums, _ = self.reductions(op, s)
        return [sums.init(ROW_SUM)]

    def after_rows(self, op: KernelOp, s: RowwiseSchedule) -> list[str]:
        sums, _ = self.reductions(op, s)
        _, length = self._row(op)
        total = sums.total(ROW_SUM)
        if op.attr_map["reduce"] == "mean":
            total = f"{total} * (1.0f / {length}.0f)"
        return [f"const float total = {total};", f"if (lane == 0u) out[row] = {store(op.result.dtype, 'total')};"]

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32 = DType.bfloat16, DType.float32

        def of(norm: str, rows: TensorType, epilogue: tuple[TensorType, ...], post: str, reduce: str = "sum",
               params: tuple[TensorType, ...] = (), keepdims: bool = False, **kw) -> KernelOp:
            attrs = dict(expr="$0", norm=norm, axes=(rows.ndim - 1,), eps=1e-5 if params else 0.0,
                         has_weight=bool(params), has_bias=len(params) > 1, post=post, reduce=reduce, keepdims=keepdims)
            operands = (rows, *params, *epilogue)
            result = OPS["reduced_normalization"].infer(*operands, **attrs)
            return KernelOp.of("reduced_normalization", operands, result, **attrs, **kw)
        logits = TensorType((4096, 32000), bf)
        small = TensorType((4096, 512), f32)
        wide = TensorType((64, 65536), f32)
        w = TensorType((512,), f32)
        return (
            of("log_softmax", logits, (logits,), "neg(mul($0,$1))"),              # cross-entropy, a block per row
            of("log_softmax", small, (small,), "mul($0,$1)", reduce="mean"),       # a warp per row
            of("layernorm", small, (), "mul($0,$0)", params=(w, w), keepdims=True),
            of("softmax", wide, (wide,), "mul($0,$1)"),                            # looped: rows beyond the registers
            of("log_softmax", logits, (logits,), "neg(mul($0,$1))", numerics=Numerics.KAHAN_SUM),
            of("log_softmax", wide, (wide,), "mul($0,$1)", reduce="mean", numerics=Numerics.KAHAN_SUM),
        )
