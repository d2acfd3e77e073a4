"""matmul: numpy semantics (1-d operands, broadcast batch dims), any float or complex dtype.

`accum_dtype` is the accumulator the kernels use (float32 unless set); the host reference always
accumulates at least in float32.
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import conj, unbroadcast
from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.errors import DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.shapes import broadcast_shapes, fmt_shape
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs


def matmul_dims(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], int, int, int]:
    """(batch shape, M, N, K) of a @ b, with numpy's treatment of 1-d operands."""
    if not a or not b:
        raise ShapeError("matmul needs operands of rank >= 1", hint="use * for scalars")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"contraction dims differ: {fmt_shape(a)} @ {fmt_shape(b)} contracts "
                         f"{a2[-1]} with {b2[-2]}",
                         hint="the last axis of a must equal the second-to-last of b; transpose with .mT?")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    return batch, a2[-2], b2[-1], a2[-1]


def read_as(t: TensorType, transposed: bool, role: str = "operand") -> TensorType:
    """The operand a product reads: `t` itself, or with its last two axes swapped when it is stored
    transposed (a gemm's `trans_a` / `trans_b`: the product reads the bytes of xᵀ as x).

    >>> read_as(TensorType((2, 3, 5), DType.float32), True).shape
    (2, 5, 3)
    """
    if not transposed:
        return t
    if t.ndim < 2:
        raise ShapeError(f"a transposed {role} needs rank >= 2, got {fmt_shape(t.shape)}",
                         hint="a vector has no second axis to swap: store it as a [1, n] or [n, 1] matrix")
    return TensorType(t.shape[:-2] + (t.shape[-1], t.shape[-2]), t.dtype)


def infer_matmul(a: TensorType, b: TensorType, accum_dtype: DType | None) -> TensorType:
    for t in (a, b):
        if not (t.dtype.is_float or t.dtype.is_complex):
            raise DTypeError(f"matmul takes floating-point operands, got {a.dtype} @ {b.dtype}",
                             hint="cast integer operands with op.cast")
    batch, m, n, _ = matmul_dims(a.shape, b.shape)
    shape = batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    dtype = promote(a.dtype, b.dtype)
    wide = dtype in (DType.float64, DType.complex128)
    if accum_dtype not in (None, DType.float32) and not (accum_dtype is DType.float64 and wide):
        raise DTypeError(f"accum_dtype={accum_dtype.name} is not an accumulator the products have: they accumulate "
                         "in float32 (float64 ones in float64)",
                         hint="leave accum_dtype out, or pass accum_dtype='fp32'")
    if dtype in (DType.float8_e4m3, DType.float8_e5m2):
        dtype = DType.bfloat16  # an fp8 GEMM writes bf16, as cuBLASLt does by default
    return TensorType(shape, dtype)


def matmul_flops(out: TensorType, a: TensorType, b: TensorType, accum_dtype) -> int:
    batch, m, n, k = matmul_dims(a.shape, b.shape)
    return 2 * math.prod(batch) * m * n * k


def _matmul_vjp(g, y, a, b, accum_dtype):
    """da = g bᴴ, db = aᴴ g over the broadcast batch, then summed back to each operand's batch.
    A 1-d operand is a row (a) or column (b) vector, as numpy treats it."""
    batch, m, n, _ = matmul_dims(a.shape, b.shape)
    a2 = a if a.ndim > 1 else api.reshape(a, (1,) + a.shape)
    b2 = b if b.ndim > 1 else api.reshape(b, b.shape + (1,))
    g2 = api.reshape(g, batch + (m, n))
    da = api.matmul(g2, conj(b2).mT, accum_dtype=accum_dtype)       # batch + (m, k)
    db = api.matmul(conj(a2).mT, g2, accum_dtype=accum_dtype)       # batch + (k, n)
    if a.ndim == 1:
        da = api.reshape(da, batch + a.shape)
    if b.ndim == 1:
        db = api.reshape(db, batch + b.shape)
    return unbroadcast(da, a), unbroadcast(db, b)


DEFS = (
    OpDef("matmul", ("a", "b"), OpKind.MATMUL, infer_matmul,
          lambda a, b, accum_dtype: np.matmul(a, b), matmul_flops, vjp=_matmul_vjp),
)
