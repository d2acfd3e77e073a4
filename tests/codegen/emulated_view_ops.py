"""The strided_elementwise ops of emulated_ops.EMULATED: elementwise kernels reading slices where
they lie (lower/view_reads.py), vector loads where the views keep them aligned, scalar ones where not."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tests.codegen.ragged_ops import of

BF16, F32 = DType.bfloat16, DType.float32


def strided(expr: str, operands: tuple[tuple[int, ...], ...], dtype: DType, shape: tuple[int, ...],
            strides: tuple[int, ...], offsets: tuple[int, ...]):
    return of("strided_elementwise", *(TensorType(s, dtype) for s in operands), expr=expr, shape=shape,
              strides=strides, offsets=offsets)


VIEW_OPS = {
    # both halves of a gated unit's projection: vector loads
    "strided gated halves bf16": strided("mul(silu($0),$1)", ((2, 64, 512),) * 2, BF16, (2, 64, 256),
                                         (64 * 512, 512, 1) * 2, (0, 256)),
    # a misaligned ragged slice beside one column repeated along the rows: scalar loads
    "strided ragged slice and column f32": strided("sub($0,mul($1,0.5:float32))", ((50, 37),) * 2, F32, (45, 33),
                                                   (37, 1, 37, 0), (3, 36)),
    # an operand read across its rows: a load per lane
    "strided transposed operand f32": strided("add($0,$1)", ((96, 64), (64, 96)), F32, (64, 96), (1, 64, 96, 1),
                                              (0, 0)),
    # a column of a batch of rows: a view with an offset in every batch
    "strided batch of columns bf16": strided("exp($0)", ((3, 40, 24),), BF16, (3, 40, 8), (960, 24, 1), (16,)),
}
