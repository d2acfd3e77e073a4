"""Shape arithmetic shared by the ops' shape rules: broadcasting and axis normalization."""

from __future__ import annotations

import numbers
from typing import Iterable

import numpy as np

from tessera_rw.algebra.errors import AxisError, ShapeError


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
        raise AxisError(f"axis must be an int, a tuple of ints or None, got {axis!r}")
    norm = tuple(normalize_axis(a, ndim) for a in axes)
    if len(set(norm)) != len(norm):
        raise AxisError(f"axis {axes} repeats an axis")
    return tuple(sorted(norm))


def fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + (",)" if len(shape) == 1 else ")")
