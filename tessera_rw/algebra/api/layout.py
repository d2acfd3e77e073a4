"""Layout op functions: transpose, swapaxes, reshape, broadcast_to, concatenate, flip, indexing."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable

import numpy as np

from tessera_rw.algebra.api.dispatch import apply, op_context, tensor_operand, type_of
from tessera_rw.algebra.dtypes import promote
from tessera_rw.algebra.errors import ArgumentError, AttributeValueError, AxisError, ShapeError
from tessera_rw.algebra.shapes import fmt_shape, normalize_axes, normalize_axis


def int_tuple(values, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints as a tuple of ints; anything else is an error naming `what`."""
    try:
        values = (values,) if isinstance(values, numbers.Integral) else tuple(values)
    except TypeError:
        raise AttributeValueError(f"{what} must be an int or ints, got {values!r}") from None
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        raise AttributeValueError(f"{what} must be ints, got {values!r}")
    return tuple(int(v) for v in values)


def transpose(x, axes=None, *more):
    """Permute axes (numpy: None reverses them all): `op.transpose(x, (0, 2, 1, 3))`."""
    x = tensor_operand(x)
    with op_context("transpose", (x,), ("x",)):
        if more:
            raise ArgumentError(f"takes the permutation as one tuple, got {(axes, *more)} as separate arguments",
                                hint=f"op.swapaxes(x, {axes}, {more[0]}) swaps two axes (torch's transpose)"
                                if len(more) == 1 else f"op.transpose(x, {(axes, *more)})")
        ndim = type_of(x).ndim
        perm = tuple(reversed(range(ndim))) if axes is None else tuple(normalize_axis(a, ndim) for a in int_tuple(axes, "axes"))
        if sorted(perm) != list(range(ndim)):
            swap = len(perm) == 2 and ndim > 2
            raise AttributeValueError(f"axes {axes} are not a permutation of {ndim} axes",
                                      hint=f"torch's transpose{tuple(axes)} swaps two axes: x.swapaxes{tuple(axes)} "
                                           "does (x.mT the last two)" if swap else None)
    if perm == tuple(range(ndim)):
        return x
    return apply("transpose", (x,), axes=perm)


def swapaxes(x, axis1: int, axis2: int):
    """numpy.swapaxes: `op.swapaxes(k, -2, -1)` is k.mT."""
    x = tensor_operand(x)
    with op_context("swapaxes", (x,), ("x",)):
        ndim = type_of(x).ndim
        a, b = normalize_axis(axis1, ndim), normalize_axis(axis2, ndim)
    perm = list(range(ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def reshape(x, shape):
    """numpy.reshape, one -1 allowed: `op.reshape(x, (B, S, H, -1))`."""
    x = tensor_operand(x)
    with op_context("reshape", (x,), ("x",)):
        t = type_of(x)
        dims = int_tuple(shape, "shape")
        if dims.count(-1) > 1 or any(d < -1 for d in dims):
            raise ShapeError(f"invalid target shape {dims}: at most one -1 and no other negative sizes")
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            if known == 0 or t.numel % known:
                raise ShapeError(f"cannot reshape {t.numel} elements {fmt_shape(t.shape)} into {dims}")
            dims = tuple(t.numel // known if d == -1 else d for d in dims)
    if dims == t.shape:
        return x
    return apply("reshape", (x,), shape=dims)


def expand_dims(x, axis):
    """numpy.expand_dims: a new axis of size 1 at `axis`, or at each of a tuple of them (x[:, None] too)."""
    x = tensor_operand(x)
    with op_context("expand_dims", (x,), ("x",)):
        shape = type_of(x).shape
        if axis is None:
            raise AxisError("expand_dims needs the axis (or axes) to add", hint="op.expand_dims(x, 0)")
        rank = len(shape) + (len(axis) if isinstance(axis, (tuple, list)) else 1)
        new = normalize_axes(axis, rank)
    rest = iter(shape)
    return reshape(x, tuple(1 if d in new else next(rest) for d in range(rank)))


def squeeze(x, axis=None):
    """numpy.squeeze: drop the size-1 axes named (None: all of them)."""
    x = tensor_operand(x)
    with op_context("squeeze", (x,), ("x",)):
        shape = type_of(x).shape
        axes = [i for i, d in enumerate(shape) if d == 1] if axis is None else normalize_axes(axis, len(shape))
        if any(shape[a] != 1 for a in axes):
            raise ShapeError(f"cannot squeeze axes {tuple(axes)} of shape {fmt_shape(shape)}: not all of size 1")
    return reshape(x, tuple(d for i, d in enumerate(shape) if i not in axes))


def broadcast_to(x, shape):
    """numpy.broadcast_to: x repeated along new leading axes and its size-1 axes."""
    x = tensor_operand(x)
    with op_context("broadcast_to", (x,), ("x",)):
        dims = int_tuple(shape, "shape")
    if dims == type_of(x).shape:
        return x
    return apply("broadcast_to", (x,), shape=dims)


def tensor_sequence(op_name: str, xs) -> tuple:
    """The tensors of a list (or other iterable) `xs`; one tensor or a number where the list
    should be is an error naming `op_name`."""
    if hasattr(xs, "shape") or not isinstance(xs, Iterable):
        raise ArgumentError(f"xs must be a list of tensors, not a value of type {type(xs).__name__}",
                            op=op_name, hint=f"op.{op_name}([a, b], axis)")
    return tuple(tensor_operand(x) for x in xs)


def concatenate(xs, axis: int = 0):
    """numpy.concatenate: the tensors joined along an existing axis (op.stack adds one), in the dtype
    their types promote to, as numpy's (a bf16 and a float32 tensor join as float32)."""
    xs = tensor_sequence("concatenate", xs)
    with op_context("concatenate", xs, ("xs",)):
        if not xs:
            raise ShapeError("concatenate needs at least one tensor")
        ax = normalize_axis(axis, type_of(xs[0]).ndim)
        joined = functools.reduce(promote, (type_of(x).dtype for x in xs))
    xs = [x if type_of(x).dtype is joined else apply("cast", (x,), dtype=joined) for x in xs]
    return apply("concatenate", xs, axis=ax)


def _index_array(item) -> bool:
    """Whether an index item is an array of indices (a list, an array, a tensor), not an int."""
    return isinstance(item, (list, tuple)) or (hasattr(item, "shape") and not isinstance(item, numbers.Integral))


def _taken(x, items: tuple, arrays: list[int]):
    """x[items] where items[arrays[0]] is an integer array: the basic indices, then take along the
    axis the array's position became. As numpy has it, ints are index arrays too beside one: where
    they and the array are not side by side, the array's axes come first."""
    with op_context("getitem", (x,), ("x",)):
        if len(arrays) > 1:
            raise ShapeError("more than one index array (numpy broadcasts them together) is not supported",
                             hint="take along one axis at a time: op.take(op.take(x, i, axis=0), j, axis=1)")
        items = _without_ellipsis(items, type_of(x).ndim)
        k = next(i for i, item in enumerate(items) if _index_array(item))
        indices = _constant_indices(items[k], type_of(x).shape[sum(1 for i in items[:k] if i is not None)])
        axis = sum(1 for item in items[:k] if item is None or isinstance(item, slice))
        advanced = [i for i, item in enumerate(items) if i == k or _an_int(item)]
        apart = advanced != list(range(advanced[0], advanced[-1] + 1))
    from tessera_rw.algebra.api.gather import take          # gather builds on this module
    taken = take(getitem(x, items[:k] + (slice(None),) + items[k + 1:]), indices, axis=axis)
    if not apart or axis == 0:
        return taken
    picked = list(range(axis, axis + type_of(indices).ndim))
    rest = [d for d in range(type_of(taken).ndim) if d not in picked]
    return transpose(taken, tuple(picked + rest))


def _an_int(item) -> bool:
    return isinstance(item, numbers.Integral) and not isinstance(item, bool)


def _without_ellipsis(items: tuple, rank: int) -> tuple:
    """`items` with an ellipsis spelled out as the slices it stands for."""
    at = next((i for i, item in enumerate(items) if item is Ellipsis), None)
    if at is None:
        return items
    used = sum(1 for i in items if i is not None and i is not Ellipsis)
    return items[:at] + (slice(None),) * (rank - used) + items[at + 1:]


def listed_indices(indices):
    """Indices given as a list or tuple as a numpy array (an empty one of int64), others as they are."""
    if isinstance(indices, (list, tuple)):
        return np.asarray(indices, dtype=np.int64 if not len(indices) else None)
    return indices


def _constant_indices(indices, size: int):
    """An index array as take reads it: a list as a numpy array; a constant one checked against the
    axis's size as numpy checks it (a traced one takes zeros out of range)."""
    indices = listed_indices(indices)
    dtype = getattr(indices, "dtype", None)
    if dtype is not None and str(dtype) in ("bool", "DType.bool"):
        raise ShapeError("a boolean mask index selects a number of elements known only from its values",
                         hint="keep the shape with op.where(mask, x, 0), or sum what the mask selects")
    if isinstance(indices, np.ndarray) and indices.dtype.kind in "iu" and indices.size:
        bad = indices[(indices < -size) | (indices >= size)]
        if bad.size:
            raise ShapeError(f"index {int(bad.flat[0])} is out of bounds for an axis of size {size}")
    return indices


def flip(x, axis=None):
    """numpy.flip: reverse the order of elements along `axis` (an int, a tuple, or None for all axes).

    >>> import numpy as np
    >>> flip(np.arange(6).reshape(2, 3), axis=-1).tolist()
    [[2, 1, 0], [5, 4, 3]]
    """
    x = tensor_operand(x)
    with op_context("flip", (x,), ("x",)):
        shape = type_of(x).shape
        axes = normalize_axes(axis, len(shape))
    reversed_axes = tuple(a for a in axes if shape[a] > 1)      # reversing one element moves nothing
    return apply("flip", (x,), axes=reversed_axes) if reversed_axes else x


def getitem(x, index):
    """Basic indexing: ints, slices (a negative step reads the axis backwards), None and Ellipsis;
    and one integer array (or list) among them, which takes along its axis (op.take): `table[tokens]`,
    `x[:, [0, 2]]`."""
    x = tensor_operand(x)
    items = index if isinstance(index, tuple) else (index,)
    arrays = [k for k, item in enumerate(items) if _index_array(item)]
    if arrays:
        return _taken(x, items, arrays)
    with op_context("getitem", (x,), ("x",)):
        shape = type_of(x).shape
        items = index if isinstance(index, tuple) else (index,)
        if sum(i is Ellipsis for i in items) > 1:
            raise ShapeError("an index can only have a single ellipsis ('...')")
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        if used > len(shape):
            raise ShapeError(f"too many indices ({used}) for a tensor of rank {len(shape)}")
        at = next((k for k, i in enumerate(items) if i is Ellipsis), None)
        if at is not None:
            items = items[:at] + (slice(None),) * (len(shape) - used) + items[at + 1:]
        items = items + (slice(None),) * (len(shape) - sum(1 for i in items if i is not None))
        starts, stops, steps, out_shape, flipped = [], [], [], [], []
        axis = 0
        for item in items:
            if item is None:
                out_shape.append(1)
                continue
            size = shape[axis]
            if isinstance(item, slice):
                if not all(v is None or isinstance(v, numbers.Integral) for v in (item.start, item.stop, item.step)):
                    raise ShapeError(f"slice bounds must be ints or None, got {item}")
                if item.step == 0:
                    raise ShapeError("slice step cannot be zero")
                picked = range(*item.indices(size))
                if picked.step < 0 and len(picked) > 1:   # the same elements read forwards, then flipped
                    picked = picked[::-1]
                    flipped.append(len(out_shape))
                start, step = (picked.start, picked.step) if len(picked) else (0, 1)
                starts.append(start); stops.append(start + step * (len(picked) - 1) + 1 if picked else 0)
                steps.append(abs(step))
                out_shape.append(len(picked))
            elif isinstance(item, numbers.Integral) and not isinstance(item, bool):
                i = int(item)
                if not -size <= i < size:
                    raise ShapeError(f"index {i} is out of bounds for axis {axis} with size {size}")
                i %= size
                starts.append(i); stops.append(i + 1); steps.append(1)
            else:
                raise ShapeError(f"unsupported index {item!r}", hint="use ints, slices, None, ... and one integer array")
            axis += 1
    sliced = x
    if (tuple(starts), tuple(stops), tuple(steps)) != ((0,) * len(shape), shape, (1,) * len(shape)):
        sliced = apply("slice", (x,), starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    return flip(reshape(sliced, tuple(out_shape)), tuple(flipped))      # no axes flipped: flip returns it
