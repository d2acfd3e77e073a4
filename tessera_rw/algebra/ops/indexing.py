"""Values taken along an axis by integer indices, and the sums that put them back.

take(x, indices; axis) is numpy.take: x's slices at `indices` along `axis`, the result's shape
x.shape[:axis] + indices.shape + x.shape[axis + 1:] (an embedding lookup: take(table, tokens, 0)).
A negative index counts from the end; one out of [-n, n) takes zeros (numpy raises; a kernel
cannot, and zeros are what take_along_axis gives too).

index_add(g, indices; axis, size) is its adjoint: a tensor of g's shape with the indexed axes
replaced by one of length `size`, each position v the sum of g's slices whose index is v (zero
where none is; slices whose index is out of range are dropped): numpy's np.add.at into zeros, an
embedding table's gradient.

>>> x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
>>> _take(x, np.array([2, -3, 7]), axis=0)
array([[5., 6.],
       [1., 2.],
       [0., 0.]], dtype=float32)
>>> _index_add(np.ones((3, 2), np.float32), np.array([1, 1, 0]), axis=0, size=3)
array([[1., 1.],
       [2., 2.],
       [0., 0.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.errors import AttributeValueError, DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.shapes import fmt_shape
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs


def _check(indices: TensorType, rank: int, axis: int) -> None:
    if not indices.dtype.is_integer:
        raise DTypeError(f"indices must be integers, got {indices.dtype.value}",
                         hint="cast them first: op.cast(indices, 'int32')")
    if not 0 <= axis < rank:
        raise AttributeValueError(f"axis {axis} does not fit a tensor of rank {rank}")


def _infer_take(x: TensorType, indices: TensorType, axis: int) -> TensorType:
    _check(indices, x.ndim, axis)
    return TensorType(x.shape[:axis] + indices.shape + x.shape[axis + 1:], x.dtype)


def _infer_index_add(g: TensorType, indices: TensorType, axis: int, size: int) -> TensorType:
    _check(indices, g.ndim - indices.ndim + 1, axis)
    if g.shape[axis:axis + indices.ndim] != indices.shape:
        raise ShapeError(f"the cotangent's axes {axis}… are {fmt_shape(g.shape)}, which do not hold the indices' "
                         f"{fmt_shape(indices.shape)} there")
    if size < 0:
        raise AttributeValueError(f"size must be >= 0, got {size}")
    return TensorType(g.shape[:axis] + (size,) + g.shape[axis + indices.ndim:], g.dtype)


def wrapped(indices: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices counted from the start, whether each is within [0, n))."""
    at = np.where(indices < 0, indices.astype(np.int64) + n, indices.astype(np.int64))
    return at, (at >= 0) & (at < n)


def _take(x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    at, inside = wrapped(np.asarray(indices), x.shape[axis])
    taken = np.take(x, np.where(inside, at, 0), axis=axis)
    mask = inside.reshape((1,) * axis + inside.shape + (1,) * (x.ndim - axis - 1))
    return np.where(mask, taken, np.zeros((), x.dtype))


def _index_add(g: np.ndarray, indices: np.ndarray, axis: int, size: int) -> np.ndarray:
    indices = np.asarray(indices)
    at, inside = wrapped(indices.reshape(-1), size)
    flat = g.reshape(g.shape[:axis] + (at.size,) + g.shape[axis + indices.ndim:])
    out = np.zeros(g.shape[:axis] + (size,) + g.shape[axis + indices.ndim:], g.dtype)
    moved = np.moveaxis(out, axis, 0)                     # a view: np.add.at writes through it
    np.add.at(moved, at[inside], np.moveaxis(flat, axis, 0)[inside])
    return out


def _take_vjp(g, out, x, indices, axis):
    return api.apply("index_add", (g, indices), axis=axis, size=x.shape[axis]), None


def _index_add_vjp(g, out, grads, indices, axis, size):
    return api.apply("take", (g, indices), axis=axis), None


DEFS = (
    OpDef("take", ("x", "indices"), OpKind.LAYOUT, _infer_take, _take, exact=True, vjp=_take_vjp,
          doc="x's slices at integer `indices` along `axis` (numpy.take; out of range: zeros), e.g. an "
              "embedding lookup take(table, tokens, axis=0)"),
    OpDef("index_add", ("g", "indices"), OpKind.REDUCTION, _infer_index_add, _index_add,
          lambda out, g, indices, **attrs: g.numel, vjp=_index_add_vjp,
          doc="take's adjoint: g's slices summed at their indices along an axis of length `size` "
              "(numpy's add.at into zeros), an embedding table's gradient"),
)
