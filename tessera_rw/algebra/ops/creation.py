"""Sources: graph inputs, scalar constants, array literals, full / arange, and tril / triu.

Scalars in user code (`x * 0.125`) become 0-d `constant` nodes typed like the tensor they meet.
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import no_cotangents
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs


def _infer_input(*, name: str, shape: tuple[int, ...], dtype: DType) -> TensorType:
    if any(d < 0 for d in shape):
        raise ShapeError(f"input {name!r} has a negative dimension in {shape}")
    return TensorType(shape, dtype)


def _input_reference(*, name: str, shape, dtype) -> np.ndarray:
    raise LookupError(f"input {name!r} has no value: it is fed by the caller")


def _infer_full(*, shape: tuple[int, ...], value, dtype: DType) -> TensorType:
    if any(d < 0 for d in shape):
        raise AttributeValueError(f"shape {shape} has a negative dimension")
    return TensorType(shape, dtype)


def _infer_arange(*, start, stop, step, dtype: DType) -> TensorType:
    if step == 0:
        raise AttributeValueError("arange step must not be 0")
    return TensorType((max(0, math.ceil((stop - start) / step)),), dtype)


def _infer_tri(x: TensorType, k: int) -> TensorType:
    if x.ndim < 2:
        raise ShapeError(f"needs rank >= 2, got a rank-{x.ndim} operand")
    return x


# Sources have no operands, so nothing to pass a cotangent back to; tril / triu keep the
# cotangent where they kept the values.
DEFS = (
    OpDef("input", (), OpKind.SOURCE, _infer_input, _input_reference, vjp=no_cotangents),
    OpDef("constant", (), OpKind.SOURCE, lambda *, value, dtype: TensorType((), dtype),
          lambda *, value, dtype: np.asarray(value, dtype=dtype.compute.numpy), vjp=no_cotangents),
    OpDef("literal", (), OpKind.SOURCE, lambda *, value, dtype: TensorType(value.array.shape, dtype),
          lambda *, value, dtype: value.array, vjp=no_cotangents),
    OpDef("full", (), OpKind.SOURCE, _infer_full,
          lambda *, shape, value, dtype: np.full(shape, value, dtype=dtype.compute.numpy), vjp=no_cotangents),
    OpDef("arange", (), OpKind.SOURCE, _infer_arange,
          lambda *, start, stop, step, dtype: np.arange(start, stop, step, dtype=dtype.compute.numpy),
          vjp=no_cotangents),
    OpDef("tril", ("x",), OpKind.ELEMENTWISE, _infer_tri, lambda x, k: np.tril(x, k), exact=True,
          vjp=lambda g, y, x, k: (api.tril(g, k),)),
    OpDef("triu", ("x",), OpKind.ELEMENTWISE, _infer_tri, lambda x, k: np.triu(x, k), exact=True,
          vjp=lambda g, y, x, k: (api.triu(g, k),)),
)


