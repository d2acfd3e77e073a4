"""Layout ops: they move or select values and do no arithmetic.

Attributes are stored normalized (full permutations, explicit sizes, per-axis pad pairs and
slice bounds) so that structurally equal layouts intern to the same node.
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import crop, dilate, pad_zeros, unbroadcast
from tessera_rw.algebra.errors import AttributeValueError, AxisError, DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.shapes import fmt_shape
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs


def _infer_transpose(x: TensorType, axes: tuple[int, ...]) -> TensorType:
    if sorted(axes) != list(range(x.ndim)):
        raise AxisError(f"axes {axes} are not a permutation of the {x.ndim} axes of the operand")
    return TensorType(tuple(x.shape[a] for a in axes), x.dtype)


def _infer_reshape(x: TensorType, shape: tuple[int, ...]) -> TensorType:
    if any(d < 0 for d in shape) or math.prod(shape) != x.numel:
        raise ShapeError(f"cannot reshape {x.numel} elements {fmt_shape(x.shape)} into {fmt_shape(shape)}")
    return TensorType(shape, x.dtype)


def _infer_broadcast_to(x: TensorType, shape: tuple[int, ...]) -> TensorType:
    lead = len(shape) - x.ndim
    if any(d < 0 for d in shape) or lead < 0 or any(d not in (1, t) for d, t in zip(x.shape, shape[lead:])):
        raise ShapeError(f"cannot broadcast {fmt_shape(x.shape)} to {fmt_shape(shape)}",
                         hint="each axis must be 1 or equal the target size (aligned from the right)")
    return TensorType(shape, x.dtype)


def _infer_pad(x: TensorType, pads: tuple[tuple[int, int], ...], value: float) -> TensorType:
    if len(pads) != x.ndim:
        raise ShapeError(f"{len(pads)} pad pairs for a rank-{x.ndim} tensor")
    shape = tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, pads))
    if any(d < 0 for d in shape) or any(lo < 0 or hi < 0 for lo, hi in pads):
        raise AttributeValueError(f"pads {pads} must be >= 0", hint="use slicing to crop")
    return TensorType(shape, x.dtype)


def _pad(x: np.ndarray, pads, value) -> np.ndarray:
    if x.ndim == 0:  # numpy.pad refuses an empty pad_width
        return x.copy()
    return np.pad(x, pads, mode="constant", constant_values=np.asarray(value).astype(x.dtype))


def slice_length(start: int, stop: int, step: int) -> int:
    return max(0, -(-(stop - start) // step))


def _infer_slice(x: TensorType, starts: tuple[int, ...], stops: tuple[int, ...],
                 steps: tuple[int, ...]) -> TensorType:
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice bounds for {len(starts)} axes on a rank-{x.ndim} tensor")
    for d, a, b, s in zip(x.shape, starts, stops, steps):
        if s <= 0 or not (0 <= a <= d and 0 <= b <= d):
            raise AttributeValueError(f"slice {a}:{b}:{s} does not fit an axis of size {d}")
    return TensorType(tuple(slice_length(a, b, s) for a, b, s in zip(starts, stops, steps)), x.dtype)


def _slice(x: np.ndarray, starts, stops, steps) -> np.ndarray:
    return x[tuple(slice(a, b, s) for a, b, s in zip(starts, stops, steps))]


def _infer_flip(x: TensorType, axes: tuple[int, ...]) -> TensorType:
    if list(axes) != sorted(set(axes)) or any(not 0 <= a < x.ndim for a in axes):
        raise AxisError(f"flip axes {axes} must be distinct axes of a rank-{x.ndim} tensor, in order")
    return x


def _infer_concatenate(*xs: TensorType, axis: int) -> TensorType:
    if not xs:
        raise ShapeError("needs at least one operand")
    first = xs[0]
    if not 0 <= axis < first.ndim:
        raise AxisError(f"axis {axis} does not fit operands of rank {first.ndim}")
    for x in xs[1:]:
        if x.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != axis):
            raise ShapeError(f"operand shapes {', '.join(fmt_shape(t.shape) for t in xs)} differ "
                             f"off the concatenation axis {axis}")
        if x.dtype is not first.dtype:
            raise DTypeError(f"operands have dtypes {', '.join(str(t.dtype) for t in xs)}",
                             hint="cast them to one dtype first")
    size = sum(x.shape[axis] for x in xs)
    return TensorType(first.shape[:axis] + (size,) + first.shape[axis + 1:], first.dtype)


# ---- VJPs: each moves the cotangent back to where the values came from -----------------------

def _transpose_vjp(g, y, x, axes):
    return (api.transpose(g, tuple(int(i) for i in np.argsort(axes))),)


def _pad_vjp(g, y, x, pads, value):
    index = tuple(slice(lo, lo + d) for (lo, _), d in zip(pads, x.shape))
    return (api.getitem(g, index) if index else g,)


def _slice_vjp(g, y, x, starts, stops, steps):
    # each kept element returns to its place; the skipped ones (and the rest of the axis) get 0
    for axis, step in enumerate(steps):
        g = dilate(g, axis, step)
    return (pad_zeros(g, [(a, d - a - n) for a, d, n in zip(starts, x.shape, g.shape)]),)


def _flip_vjp(g, y, x, axes):
    return (api.flip(g, axes),)


def _concatenate_vjp(g, y, *xs, axis):
    bounds = np.cumsum([0] + [x.shape[axis] for x in xs])
    return tuple(crop(g, axis, int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:]))


DEFS = (
    OpDef("transpose", ("x",), OpKind.LAYOUT, _infer_transpose, lambda x, axes: np.transpose(x, axes), exact=True,
          vjp=_transpose_vjp),
    OpDef("reshape", ("x",), OpKind.LAYOUT, _infer_reshape, lambda x, shape: np.reshape(x, shape), exact=True,
          vjp=lambda g, y, x, shape: (api.reshape(g, x.shape),)),
    OpDef("broadcast_to", ("x",), OpKind.LAYOUT, _infer_broadcast_to,
          lambda x, shape: np.broadcast_to(x, shape), exact=True, vjp=lambda g, y, x, shape: (unbroadcast(g, x),)),
    OpDef("pad", ("x",), OpKind.LAYOUT, _infer_pad, _pad, exact=True, vjp=_pad_vjp),
    OpDef("slice", ("x",), OpKind.LAYOUT, _infer_slice, _slice, exact=True, vjp=_slice_vjp),
    OpDef("flip", ("x",), OpKind.LAYOUT, _infer_flip, lambda x, axes: np.flip(x, axes), exact=True,
          vjp=_flip_vjp, doc="numpy.flip: the elements of each axis in `axes` in reverse order"),
    OpDef("concatenate", ("xs",), OpKind.LAYOUT, _infer_concatenate,
          lambda *xs, axis: np.concatenate(xs, axis=axis), variadic=True, exact=True, vjp=_concatenate_vjp),
)
