"""Ops written with other ops, in numpy's names: var, std, clip, stack, split, logsumexp, square.

Each traces to the ops it is made of, so every rewrite, kernel and gradient of those applies, and
nothing new has to be lowered.

>>> import numpy as np
>>> x = np.array([[1.0, 3.0, 2.0], [0.0, 0.0, 3.0]])
>>> var(x, axis=-1)
array([0.66666667, 2.        ])
>>> [part.shape for part in split(x, [1], axis=1)]
[(2, 1), (2, 2)]
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

from tessera_rw.algebra.api.dispatch import apply, flag, op_context, tensor_operand, type_of
from tessera_rw.algebra.api.elementwise import add, cast, exp, log, maximum, minimum, multiply, sqrt, subtract
from tessera_rw.algebra.api.layout import concatenate, expand_dims, getitem, int_tuple, squeeze, tensor_sequence
from tessera_rw.algebra.api.reduction import max as reduce_max
from tessera_rw.algebra.api.reduction import mean, sum as reduce_sum
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ArgumentError, AttributeValueError, ShapeError
from tessera_rw.algebra.shapes import normalize_axes, normalize_axis

# the dtypes whose logsumexp over trailing axes is one op (a row kernel's: fp32 statistics)
ROW_KERNEL_DTYPES = (DType.float16, DType.bfloat16, DType.float32)


def _axes(name: str, x, axis) -> tuple[int, ...]:
    with op_context(name, (x,), ("x",)):
        return normalize_axes(axis, type_of(x).ndim)


def var(x, axis=None, keepdims=False, ddof: int = 0):
    """The variance over `axis` (None: all axes), as numpy.var: mean((x - mean(x))²) · n / (n - ddof).
    A 16-bit x's squares and mean are computed in float32 (as torch does) and the result rounded
    back: an fp16 square of 300 would be inf where the variance is not."""
    x = tensor_operand(x)
    axes = _axes("var", x, axis)
    n = math.prod(type_of(x).shape[a] for a in axes)
    if not isinstance(ddof, numbers.Integral) or not 0 <= ddof < n:
        with op_context("var", (x,), ("x",)):
            raise AttributeValueError(f"ddof must be an int in [0, {n}) for {n} values, got {ddof!r}")
    return _in_float32(x, lambda x: _var(x, axes, keepdims, ddof, n))


def _var(x, axes: tuple[int, ...], keepdims: bool, ddof: int, n: int):
    centered = subtract(x, mean(x, axes, keepdims=True))     # op functions: eager arrays follow our dtypes too
    squares = multiply(centered, centered)
    if ddof == 0:
        return mean(squares, axes, keepdims)
    return multiply(reduce_sum(squares, axes, keepdims), 1.0 / (n - ddof))


def _in_float32(x, fn):
    """fn(x), computed in float32 for a 16-bit float x and rounded back to its dtype."""
    dtype = type_of(x).dtype
    if dtype not in (DType.float16, DType.bfloat16):
        return fn(x)
    return cast(fn(cast(x, "float32")), dtype.value)


def std(x, axis=None, keepdims=False, ddof: int = 0):
    """The standard deviation over `axis`, as numpy.std: sqrt(var(x)), a 16-bit x's in float32."""
    x = tensor_operand(x)
    return _in_float32(x, lambda x: sqrt(var(x, axis, keepdims, ddof)))


def clip(x, a_min=None, a_max=None, *, min=None, max=None):  # noqa: A002  (numpy 2's names, torch's clamp's)
    """x limited to [a_min, a_max] (either may be None), as numpy.clip; `min=` / `max=` as numpy 2
    and torch's clamp name them."""
    if (min is not None and a_min is not None) or (max is not None and a_max is not None):
        with op_context("clip", (x,), ("x",)):
            raise ArgumentError("clip takes each bound once: a_min or min=, a_max or max=",
                                hint="op.clip(x, min=0.0, max=6.0)")
    a_min, a_max = (a_min if min is None else min), (a_max if max is None else max)
    if a_min is None and a_max is None:
        with op_context("clip", (x,), ("x",)):
            raise ArgumentError("clip needs a_min, a_max or both", hint="op.clip(x, 0.0, 6.0)")
    if a_min is not None:
        x = maximum(x, a_min)
    return x if a_max is None else minimum(x, a_max)


def square(x):
    return multiply(x, x)


def stack(xs: Sequence, axis: int = 0):
    """The tensors, of one shape, stacked along a new axis, as numpy.stack."""
    xs = tensor_sequence("stack", xs)
    if not xs:
        raise ArgumentError("stack needs at least one tensor", op="stack")
    with op_context("stack", xs, tuple(f"xs[{i}]" for i in range(len(xs)))):
        shapes = {type_of(x).shape for x in xs}
        if len(shapes) > 1:
            raise ShapeError(f"stack needs tensors of one shape, got {sorted(shapes)}",
                             hint="op.concatenate joins tensors along an existing axis")
        ax = normalize_axis(axis, len(shapes.pop()) + 1)
    return concatenate([expand_dims(x, ax) for x in xs], ax)


def split(x, indices_or_sections, axis: int = 0) -> list:
    """x cut along `axis`, as numpy.split: into n equal parts, or before each of the given indices."""
    x = tensor_operand(x)
    with op_context("split", (x,), ("x",)):
        shape = type_of(x).shape
        ax = normalize_axis(axis, len(shape))
        size = shape[ax]
        if isinstance(indices_or_sections, numbers.Integral):
            parts = int(indices_or_sections)
            if parts <= 0 or size % parts:
                raise ShapeError(f"axis {ax} of size {size} does not split into {parts} equal parts",
                                 hint="give the split points instead: op.split(x, [i, j], axis)")
            cuts = [size // parts * i for i in range(1, parts)]
        else:
            at = int_tuple(indices_or_sections, "indices_or_sections")
            cuts = [min(max(i + (size if i < 0 else 0), 0), size) for i in at]
    bounds = zip([0, *cuts], [*cuts, size])
    lead = (slice(None),) * ax
    return [getitem(x, (*lead, slice(start, max(start, stop)))) for start, stop in bounds]


def logsumexp(x, axis=None, keepdims=False):
    """log(Σ exp(x)) over `axis`, computed from x - max as scipy.special.logsumexp is: a row that is
    all -inf gives -inf, one holding +inf gives +inf.

    Over trailing axes of a 16/32-bit float it is one op, which a row kernel computes in one read
    (the online max and sum of a softmax); over other axes, the ops it is made of."""
    x = tensor_operand(x)
    axes = _axes("logsumexp", x, axis)
    if not (type_of(x).dtype.is_float or type_of(x).dtype.is_complex):
        x = cast(x, "float32")          # bools and integers in float32, as exp gives them
    dtype, rank = type_of(x).dtype, type_of(x).ndim
    if axes and axes == tuple(range(rank - len(axes), rank)) and dtype in ROW_KERNEL_DTYPES:
        with op_context("logsumexp", (x,), ("x",)):
            return apply("logsumexp", (x,), axes=axes, keepdims=flag("keepdims", keepdims))
    peak = reduce_max(x, axes, keepdims=True)

    def finite(m):
        # an infinite peak clipped to the dtype's finite range: x - m stays -inf or +inf where scipy's
        # zeroed peak gives them (inf - inf would be NaN), and adding m back keeps the infinity.
        # Clipping, not a where on m == ±inf, reads m once: each side's guard joins the kernel
        # reading it (the sum's prologue, the final add) within its operand limit
        return minimum(maximum(m, dtype.lowest), -dtype.lowest) if dtype.is_float else m
    total = log(reduce_sum(exp(subtract(x, finite(peak))), axes, keepdims=keepdims))
    return add(total, finite(peak if keepdims else squeeze(peak, axes)))
