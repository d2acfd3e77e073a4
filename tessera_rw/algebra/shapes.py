"""Shape arithmetic shared by the ops' shape rules: broadcasting, axis normalization, and where a
slice's elements lie in its operand's dense row-major bytes."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from tessera_rw.algebra.errors import AxisError, ShapeError

if TYPE_CHECKING:
    from tessera_rw.algebra.node import TensorType


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting; raises ShapeError naming the first axis that does not fit."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        dims = {s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(f"shapes {' and '.join(map(str, shapes))} do not broadcast: "
                             f"axis {i - ndim} has sizes {sorted(dims)}",
                             hint="make the sizes equal, or 1 where a value is to be repeated")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def normalize_axis(axis: int, ndim: int) -> int:
    if not isinstance(axis, numbers.Integral) or isinstance(axis, (bool, np.bool_)):
        raise AxisError(f"axis must be an int, got {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise AxisError(f"axis {axis} is out of range for a tensor of rank {ndim}",
                        hint=f"use an axis in [{-ndim}, {ndim - 1}]" if ndim else "a 0-d tensor has no axes")
    return axis % ndim


def normalize_axes(axis: int | Iterable[int] | None, ndim: int) -> tuple[int, ...]:
    """None means every axis; the result is sorted and free of repeats."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, numbers.Integral):
        axes = (axis,)
    elif isinstance(axis, (tuple, list)):
        axes = tuple(axis)
    else:
        tensor = hasattr(axis, "shape") and hasattr(axis, "dtype")
        raise AxisError(f"axis must be an int, a tuple of ints or None, got {axis!r}",
                        hint="a tensor in the axis's place: for the elementwise maximum or minimum of two tensors "
                             "use op.maximum(x, y) / op.minimum(x, y)" if tensor else None)
    norm = tuple(normalize_axis(a, ndim) for a in axes)
    if len(set(norm)) != len(norm):
        raise AxisError(f"axis {axes} repeats an axis")
    return tuple(sorted(norm))


def fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + (",)" if len(shape) == 1 else ")")


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The element strides of a dense row-major tensor of `shape`.

    >>> contiguous_strides((2, 3, 4))
    (12, 4, 1)
    """
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def contiguous_slice_offset(operand: TensorType, starts: Sequence[int], stops: Sequence[int],
                            steps: Sequence[int]) -> int | None:
    """The byte offset at which slice `starts:stops:steps` of a dense row-major `operand` begins, when
    the slice is one contiguous run of the operand's bytes (so it is the same bytes, dense at its
    own shape); None when it is strided. An empty slice is a run at 0. Bounds are the slice
    op's normalized attributes.

    The run is contiguous exactly when numpy's view of it would be C-contiguous: every axis with
    more than one result element steps by the size of everything after it. So the rows a:b of a
    matrix, one row, or x[3] of an [8, 64, 64] array are runs; a column block or a stepped slice is not.

    >>> from tessera_rw.algebra.dtypes import DType
    >>> from tessera_rw.algebra.node import TensorType
    >>> t = TensorType((5, 4), DType.float32)
    >>> contiguous_slice_offset(t, (0, 0), (4, 4), (1, 1)), contiguous_slice_offset(t, (4, 0), (5, 4), (1, 1))
    (0, 64)
    >>> contiguous_slice_offset(t, (0, 0), (5, 2), (1, 1)) is None    # two columns of every row
    True
    """
    extents = [max(0, -(-(b - a) // s)) for a, b, s in zip(starts, stops, steps)]
    if 0 in extents:                              # no bytes: an empty value lies anywhere
        return 0
    itemsize = operand.dtype.itemsize
    strides, run = [], itemsize                   # the operand's byte strides, innermost last
    for size in reversed(operand.shape):
        strides.append(run)
        run *= size
    strides.reverse()
    expected = itemsize
    for extent, step, stride in zip(reversed(extents), reversed(steps), reversed(strides)):
        if extent != 1 and step * stride != expected:
            return None
        expected *= extent
    return sum(a * stride for a, stride in zip(starts, strides))


def reshape_groups(source: tuple[int, ...], target: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """The axes of `source` and of `target` (a reshape of it) that hold the same elements, as pairs
    of consecutive runs whose sizes multiply alike; None for empty shapes or sizes.

    >>> reshape_groups((2, 3, 8, 6), (6, 2, 4, 6))
    [([0, 1], [0]), ([2], [1, 2]), ([3], [3])]
    """
    if not source or not target or 0 in source or 0 in target or math.prod(source) != math.prod(target):
        return None
    groups, i, j = [], 0, 0
    while i < len(source) and j < len(target):
        ours, theirs, here, there = [i], [j], source[i], target[j]
        i, j = i + 1, j + 1
        while here != there:
            if here < there:
                ours.append(i)
                here, i = here * source[i], i + 1
            else:
                theirs.append(j)
                there, j = there * target[j], j + 1
        groups.append((ours, theirs))
    groups[-1][0].extend(range(i, len(source)))      # trailing axes of size 1
    groups[-1][1].extend(range(j, len(target)))
    return groups


def reshaped_broadcast(operand: tuple[int, ...], source: tuple[int, ...], target: tuple[int, ...]):
    """The shape `operand` (broadcasting to `source`) takes so that it broadcasts to `target` as
    it did to `source` reshaped there: each run of axes it spans whole or not at all (a
    per-channel (1, C, 1, 1) under x (N, C, H, W) split into windows (N, C, H/2, 2, W/2, 2) is
    (1, C, 1, 1, 1, 1)); None where it spans part of one.

    >>> reshaped_broadcast((1, 3, 1, 1), (2, 3, 8, 6), (2, 3, 4, 2, 3, 2))
    (1, 3, 1, 1, 1, 1)
    >>> reshaped_broadcast((8, 1), (2, 3, 8, 6), (6, 48)) is None
    True
    >>> reshaped_broadcast((), (), (1,)), reshaped_broadcast((1,), (1,), (1, 1))
    ((), (1, 1))
    """
    if math.prod(operand) == 1 and 0 not in target:       # one value (a scalar's): it broadcasts to anything
        return () if not operand else (1,) * len(target)
    groups = reshape_groups(source, target)
    if groups is None or len(operand) > len(source):
        return None
    aligned = (1,) * (len(source) - len(operand)) + tuple(operand)
    shape = [1] * len(target)
    for ours, theirs in groups:
        spans = [aligned[k] for k in ours]
        if spans == [source[k] for k in ours]:
            for k in theirs:
                shape[k] = target[k]
        elif any(n != 1 for n in spans):
            return None
    return tuple(shape)
