"""The strided_elementwise and concatenated_elementwise ops of emulated_ops.EMULATED: elementwise
kernels reading slices where they lie (lower/view_reads.py) and computing the pieces of a concatenate
where it is read (lower/concat_reads.py), vector loads where the views keep them aligned, scalar ones
where not."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tests.codegen.ragged_ops import of

BF16, F32 = DType.bfloat16, DType.float32


def strided(expr: str, operands: tuple[tuple[int, ...], ...], dtype: DType, shape: tuple[int, ...],
            strides: tuple[int, ...], offsets: tuple[int, ...]):
    return of("strided_elementwise", *(TensorType(s, dtype) for s in operands), expr=expr, shape=shape,
              strides=strides, offsets=offsets)


def rope(b: int, s: int, d: int, dtype: DType):
    """x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x[..., d/2:], x[..., :d/2]): per half of the
    last axis, x read at both halves and cos, sin at this one."""
    h, row = d // 2, (s * d, d, 1)
    x, table = TensorType((b, s, d), dtype), TensorType((s, d), dtype)
    strides = (row + (0, d, 1) * 2 + row) * 2
    exprs = "sub(mul($0,$1),mul($3,$2));add(mul($0,$1),mul($3,$2))"
    return of("concatenated_elementwise", x, table, table, x, exprs=exprs, axis=2, sizes=(h, h), shape=(b, s, d),
              strides=strides, offsets=(0, 0, 0, h, h, h, h, 0))


def strided_norm(norm: str, root: tuple[int, ...], dtype: DType, shape: tuple[int, ...], strides: tuple[int, ...],
                 offset: int, weights: int = 0):
    """`norm` of a view of `root` (the last axis), with `weights` of weight, bias."""
    params = (TensorType(shape[-1:], dtype),) * weights
    attrs = dict(expr="$0", norm=norm, axes=(len(shape) - 1,), eps=1e-5 if weights else 0.0,
                 has_weight=weights > 0, has_bias=weights > 1, post="$0")
    return of("strided_normalization", TensorType(root, dtype), *params, **attrs, shape=shape, strides=strides,
              offsets=(offset,))


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
    # concatenates computed where they are read: rotary embeddings (vector loads), a concatenate
    # along an outer axis of a constant piece and a ragged one (scalar loads)
    # normalized slices read in place: k of a q|k|v projection with its heads brought forward (QK-norm,
    # vector loads), a misaligned ragged slice (scalar loads), a softmax over every other column
    "strided rmsnorm k heads bf16": strided_norm("rmsnorm", (2, 64, 3 * 4 * 32), BF16, (2, 4, 64, 32),
                                                 (64 * 384, 32, 384, 1), 128, weights=1),
    "strided layernorm ragged f32": strided_norm("layernorm", (37, 50), F32, (30, 41), (50, 1), 103, weights=2),
    "strided softmax strided columns f32": strided_norm("softmax", (16, 96), F32, (16, 48), (96, 2), 1),
    "concatenated rope bf16": rope(2, 64, 128, BF16),
    "concatenated rope ragged f32": rope(1, 7, 30, F32),
    "concatenated rows f32": of("concatenated_elementwise", TensorType((9, 13), F32), TensorType((13,), F32),
                                exprs="tanh($0);mul($1,2.0:float32)", axis=0, sizes=(5, 4), shape=(9, 13),
                                strides=(13, 1, 0, 0, 0, 0, 0, 1), offsets=(13, 0, 0, 0)),
}
