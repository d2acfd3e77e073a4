"""Values picked by integer indices: take (numpy.take, an embedding lookup) and take_along_axis.

take(x, indices, axis) is one op: a copy kernel reading the slices the indices name, its gradient
their cotangents summed back where they came from (index_add, one kernel that owns its rows and
sums them in a fixed order). `x[indices]` with one integer array (or list) among basic indices is
take along that axis.

take_along_axis (numpy.take_along_axis) is different:
It is written with other ops, a selection summed over the axis: `where(indices == position, arr, 0)`
added up along it. Each pick reads the whole axis (n values for one), which a loss over a softmax
reads anyway: the negative log-likelihood of class indices,
`-mean(take_along_axis(log_softmax(z, -1), labels[:, None], -1))`, is one row kernel over the logits
(the normalization, the selection and the row sum; rules/library/fused_reductions.py). Its gradient
is the selection's, the cotangent put back where each index points. An index out of [-n, n) picks
nothing and gives 0, where numpy raises: torch's `ignore_index` entries cost nothing extra.

>>> import numpy as np
>>> x = np.array([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]], dtype=np.float32)
>>> take_along_axis(x, np.array([[2], [0]]), axis=1)
array([[12.],
       [20.]], dtype=float32)
>>> take_along_axis(x, np.array([[-1, 1], [5, 0]]), axis=1)
array([[12., 11.],
       [ 0., 20.]], dtype=float32)
>>> take(x, np.array([1, 1, 0]), axis=0)[:, 0]
array([20., 20., 10.], dtype=float32)
"""

from __future__ import annotations

from tessera_rw.algebra.api.creation import arange
from tessera_rw.algebra.api.dispatch import apply, op_context, tensor_operand, type_of
from tessera_rw.algebra.api.elementwise import add, cast, equal, less, where
from tessera_rw.algebra.api.layout import expand_dims, listed_indices, reshape
from tessera_rw.algebra.api.reduction import sum as reduce_sum
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import DTypeError, ShapeError
from tessera_rw.algebra.shapes import normalize_axis


def positions_along(n: int, axis: int, ndim: int, dtype: str):
    """0 … n-1 along `axis` of a rank-`ndim` tensor (size 1 elsewhere): what an index is compared with."""
    return reshape(arange(n, dtype=dtype), tuple(n if d == axis else 1 for d in range(ndim)))


def _integers(indices) -> None:
    if not indices.dtype.is_integer:
        raise DTypeError(f"indices must be integers, got {indices.dtype.value}",
                         hint="cast them first: op.cast(indices, 'int32'); a bool mask selects with op.where")


def take(x, indices, axis=None):
    """x's slices at integer `indices` along `axis` (numpy.take): the result's shape is
    x.shape[:axis] + indices.shape + x.shape[axis + 1:]; axis None takes from x flattened. A negative
    index counts from the end; one out of [-n, n) takes zeros (numpy raises). An embedding lookup is
    `op.take(table, tokens, axis=0)`, or `table[tokens]`."""
    x, indices = tensor_operand(x), tensor_operand(listed_indices(indices))       # numpy.take's lists too
    if axis is None:
        x = reshape(x, (-1,))
        axis = 0
    with op_context("take", (x, indices), ("x", "indices")):
        _integers(type_of(indices))
        ax = normalize_axis(axis, type_of(x).ndim)
    return apply("take", (x, indices), axis=ax)


def take_along_axis(arr, indices, axis: int):
    """arr's values at `indices` along `axis` (numpy.take_along_axis): indices have arr's rank, k
    indices along `axis` and the other axes broadcasting against arr's; the result has k there."""
    arr, indices = tensor_operand(arr), tensor_operand(indices)
    with op_context("take_along_axis", (arr, indices), ("arr", "indices")):
        shape, picks = type_of(arr), type_of(indices)
        _integers(picks)
        if picks.ndim != shape.ndim:
            raise ShapeError(f"indices have {picks.ndim} axes and arr {shape.ndim}: they need as many",
                             hint="give one index per row as indices[:, None] (numpy.take_along_axis's rule)")
        ax = normalize_axis(axis, shape.ndim)
        n, k = shape.shape[ax], picks.shape[ax]
    positions = positions_along(n, ax, shape.ndim, picks.dtype.value)
    wrapped = where(less(indices, 0), add(indices, n), indices)     # -1 is the last, as in numpy
    nothing = False if shape.dtype is DType.bool else 0
    if k == 1:            # one pick per row: the selection has arr's shape, a row kernel's epilogue
        picked = reduce_sum(where(equal(wrapped, positions), arr, nothing), ax, keepdims=True)
    else:
        hit = equal(expand_dims(wrapped, ax + 1), expand_dims(positions, ax))        # [..., k, n, ...]
        picked = reduce_sum(where(hit, expand_dims(arr, ax), nothing), ax + 1)
    # a sum of bools or int32 is int64, as numpy's: the one value picked goes back to arr's type
    return picked if type_of(picked).dtype is shape.dtype else cast(picked, shape.dtype.value)
