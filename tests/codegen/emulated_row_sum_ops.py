"""reduced_normalization ops for the CPU emulator: rows normalized and added up, on each of the
row kernel's walks (a block per row, a warp per row, ragged, looped), summed and averaged, with
and without kahan_sum, kept dims and a layer norm's weight and bias; and logsumexps of rows, of
a tensor and of an expression, on the same walks."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tests.codegen.ragged_ops import of

BF16, F32 = DType.bfloat16, DType.float32


def row_sum(norm, rows, cols, dtype, post="neg(mul($0,$1))", reduce="sum", params=0, numerics=None,
            keepdims=False) -> KernelOp:
    """reduce(post(norm(x), labels), rows): a cross-entropy by default (labels the epilogue's $1)."""
    x, w = TensorType((rows, cols), dtype), TensorType((cols,), dtype)
    epilogue = (x,) if "$1" in post else ()
    op = of("reduced_normalization", x, *(w,) * params, *epilogue, expr="$0", norm=norm, axes=(1,),
            eps=1e-5 if params else 0.0, has_weight=params > 0, has_bias=params > 1, post=post, reduce=reduce,
            keepdims=keepdims)
    return op if numerics is None else KernelOp.of(op.op, op.operands, op.result, numerics=numerics, **op.attr_map)


def lse(rows, cols, dtype, numerics=None, keepdims=False, scaled=False) -> KernelOp:
    """logsumexp over the last axis, of x or (scaled) of x times a per-row scale."""
    x = TensorType((rows, cols), dtype)
    if scaled:
        op = of("fused_reduction", x, TensorType((rows, 1), F32), expr="mul($0,$1)", reduce="logsumexp", axes=(1,),
                keepdims=keepdims)
    else:
        op = of("logsumexp", x, axes=(1,), keepdims=keepdims)
    return op if numerics is None else KernelOp.of(op.op, op.operands, op.result, numerics=numerics, **op.attr_map)


ROW_SUM_OPS: dict[str, KernelOp] = {
    "logsumexp rows of 8000 bf16": lse(6, 8000, BF16),
    "logsumexp rows of 1000 bf16 ragged kept dims": lse(5, 1000, BF16, keepdims=True),
    "logsumexp rows of 512 f32 warp per row": lse(24, 512, F32),
    "logsumexp rows of 65536 f32 looped": lse(2, 65536, F32),
    "logsumexp rows of 8000 bf16 kahan": lse(6, 8000, BF16, numerics=Numerics.KAHAN_SUM),
    "logsumexp of scaled rows of 3000 bf16": lse(7, 3000, BF16, scaled=True),
    "cross-entropy rows of 8000 bf16": row_sum("log_softmax", 6, 8000, BF16),
    "cross-entropy rows of 1000 bf16 ragged": row_sum("log_softmax", 5, 1000, BF16),
    "mean log_softmax rows of 512 f32 warp per row": row_sum("log_softmax", 24, 512, F32, "mul($0,$1)", "mean"),
    "sum of squared layernorm rows of 100 f32 kept dims": row_sum("layernorm", 20, 100, F32, "mul($0,$0)",
                                                                  params=2, keepdims=True),
    "softmax rows of 65536 f32 weighted sum looped": row_sum("softmax", 2, 65536, F32, "mul($0,$1)"),
    "cross-entropy rows of 8000 bf16 kahan": row_sum("log_softmax", 6, 8000, BF16, numerics=Numerics.KAHAN_SUM),
    "mean rmsnorm rows of 65536 f32 kahan looped": row_sum("rmsnorm", 2, 65536, F32, "$0", "mean", params=1,
                                                           numerics=Numerics.KAHAN_SUM),
}
