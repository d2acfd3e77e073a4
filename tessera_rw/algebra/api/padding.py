"""numpy.pad: a constant border is the `pad` op; the edge, reflect, symmetric and wrap borders are
slices of the array itself (flipped where mirrored), concatenated on each side axis by axis, so
they need no op of their own and differentiate through slice, flip and concatenate."""

from __future__ import annotations

import math
import numbers

import numpy as np

from tessera_rw.algebra.api.dispatch import apply, op_context, tensor_operand, type_of
from tessera_rw.algebra.api.layout import int_tuple, broadcast_to, concatenate, flip, getitem
from tessera_rw.algebra.builder import beyond_double, python_scalar
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError

PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def pad(x, pad_width, mode: str = "constant", constant_values: float = 0):
    """numpy.pad: `pad_width` an int, (before, after), or one pair per axis; `mode` "constant" (with
    `constant_values`), "edge", "reflect", "symmetric" or "wrap".

    >>> pad(np.arange(4.0), (2, 1), mode="reflect").tolist()
    [2.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0]
    """
    x = tensor_operand(x)
    with op_context("pad", (x,), ("x",)):
        ndim = type_of(x).ndim
        if isinstance(pad_width, numbers.Integral):
            pairs = ((int(pad_width), int(pad_width)),) * ndim
        else:
            try:
                items = tuple(pad_width)
            except TypeError:
                raise AttributeValueError(f"pad_width must be an int, a (before, after) pair or a pair per axis, "
                                          f"got {pad_width!r}") from None
            if len(items) == 2 and all(isinstance(v, numbers.Integral) for v in items):
                pairs = (tuple(int_tuple(items, "pad_width")),) * ndim
            else:
                pairs = tuple(tuple(int_tuple(p, "pad_width")) for p in items)
            if len(pairs) != ndim or any(len(p) != 2 for p in pairs):
                raise AttributeValueError(f"pad_width {pad_width!r} must give (before, after) for each of {ndim} axes")
        if any(n < 0 for p in pairs for n in p):
            raise AttributeValueError(f"pad_width {pad_width!r} has a negative width")
        if mode not in PAD_MODES:
            raise AttributeValueError(f"mode {mode!r} is not a padding mode", hint=f"use one of {list(PAD_MODES)}")
        if mode != "constant":
            if np.any(np.asarray(constant_values) != 0):
                raise AttributeValueError(f"constant_values applies to mode 'constant', not {mode!r}")
            _check_widths(type_of(x).shape, pairs, mode)
    if mode != "constant":
        return _pad_from_the_array(x, pairs, mode)
    value = constant_values.item() if isinstance(constant_values, np.generic) else constant_values
    if not isinstance(value, (int, float)):
        raise AttributeValueError(f"pad: constant_values must be a number, got {constant_values!r}")
    dtype = type_of(x).dtype
    with op_context("pad", (x,), ("x",)):
        scalar = python_scalar(value, dtype)
    if beyond_double(scalar, dtype):    # the e-graph's doubles would round it: the border is a literal
        inside = apply("pad", (apply("full", (), shape=type_of(x).shape, value=True, dtype=DType.bool),), pads=pairs,
                       value=False)
        return apply("where", (inside, apply("pad", (x,), pads=pairs, value=0), np.array(scalar, dtype.numpy)))
    return apply("pad", (x,), pads=pairs, value=scalar)


def _check_widths(shape: tuple[int, ...], pairs: tuple[tuple[int, int], ...], mode: str) -> None:
    """A mirrored or wrapped border is at most as wide as what it copies: n − 1 for reflect (the
    edge is not repeated), n for symmetric and wrap; an edge border is a broadcast of any width,
    from an axis that has an edge."""
    for axis, ((before, after), n) in enumerate(zip(pairs, shape)):
        if not (before or after):
            continue
        limit = math.inf if mode == "edge" else n - 1 if mode == "reflect" else n
        if n == 0 or max(before, after) > limit:
            raise AttributeValueError(f"mode {mode!r} pads axis {axis} of length {n} by ({before}, {after}): "
                                      + ("an empty axis has nothing to copy" if n == 0 else
                                         f"at most {limit} on each side"),
                                      hint="pad in several calls, or use mode='constant'")


def _along(x, axis: int, start: int, stop: int):
    """x[start:stop] along `axis`."""
    return getitem(x, (slice(None),) * axis + (slice(start, stop),))


def _border(x, axis: int, width: int, mode: str, before: bool):
    """The `width` values `mode` puts before (or after) x along `axis`."""
    n = type_of(x).shape[axis]
    if mode == "edge":
        edge = _along(x, axis, 0, 1) if before else _along(x, axis, n - 1, n)
        shape = list(type_of(x).shape)
        shape[axis] = width
        return broadcast_to(edge, tuple(shape))
    if mode == "wrap":
        return _along(x, axis, n - width, n) if before else _along(x, axis, 0, width)
    skip = 1 if mode == "reflect" else 0        # reflect mirrors about the edge, symmetric repeats it
    return flip(_along(x, axis, skip, skip + width) if before else _along(x, axis, n - skip - width, n - skip), axis)


def _pad_from_the_array(x, pairs: tuple[tuple[int, int], ...], mode: str):
    for axis, (before, after) in enumerate(pairs):
        if before or after:
            parts = ([_border(x, axis, before, mode, True)] if before else []) + [x] + (
                [_border(x, axis, after, mode, False)] if after else [])
            x = concatenate(parts, axis)
    return x
