"""multi_reduction ops for the CPU emulator: a batch norm's per-channel sums of NCHW (blocks
sharing each channel, compensated too), rows of a (tokens, features) pair a warp per row with kept
dims, ragged 16-bit rows a block per row, maxima, and results padded to an aligned row (a loss's
total and count, five bf16 sums)."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.multi_output import multi_reduction_attrs
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tests.codegen.ragged_ops import of

BF16, F32 = DType.bfloat16, DType.float32
X_HAT = "div(sub($0,$1),$2)"
DY = f"where(gt(add(mul({X_HAT},$3),$4),0.0:float32),1.0:float32,0.0:float32)"


def channel_sums(shape: tuple[int, ...], numerics=Numerics.DEFAULT) -> KernelOp:
    """Σdy·x̂, Σdy and Σdy·g/σ per channel of a batch norm through a relu (x, μ, σ, g, b)."""
    channel = TensorType((1, shape[1], 1, 1), F32)
    op = multi((TensorType(shape, F32), *(channel,) * 4), f"mul({DY},{X_HAT});{DY};div(mul({DY},$3),$2)", "sum",
               (0, 2, 3))
    return KernelOp.of(op.op, op.operands, op.result, numerics=numerics, **op.attr_map)


def multi(xs: tuple[TensorType, ...], exprs: str, reduce: str, axes: tuple[int, ...], keepdims=False) -> KernelOp:
    return of("multi_reduction", *xs, **multi_reduction_attrs(*xs, exprs=exprs, reduce=reduce, axes=axes,
                                                              keepdims=keepdims))


def rows(shape: tuple[int, ...], dtype: DType, exprs: str, reduce: str, operands: int = 1, keepdims=False) -> KernelOp:
    return multi((TensorType(shape, dtype),) * operands, exprs, reduce, (len(shape) - 1,), keepdims)


MULTI_REDUCTION_OPS: dict[str, KernelOp] = {
    "multi_reduction batch-norm channel sums, blocks sharing each": channel_sums((4, 8, 64, 64)),
    "multi_reduction batch-norm channel sums kahan": channel_sums((4, 8, 64, 64), Numerics.KAHAN_SUM),
    "multi_reduction rows of 512 f32 warp per row kept dims": rows((24, 512), F32, "mul($0,$1);$1", "sum", 2, True),
    "multi_reduction mean and mean square of ragged bf16 rows": rows((5, 3000), BF16,
                                                                     "$0;mul($0,$0)", "mean"),
    "multi_reduction max of x and of -x": rows((6, 1000), F32, "$0;neg($0)", "max"),
    "multi_reduction a loss's total and count, scalars in padded rows": multi(
        (TensorType((3000,), F32), TensorType((3000,), F32)), "mul($0,$1);$1", "sum", (0,)),
    "multi_reduction 5 bf16 row sums padded to 8": rows((5, 700), BF16, "$0;mul($0,$0)", "sum"),
}
