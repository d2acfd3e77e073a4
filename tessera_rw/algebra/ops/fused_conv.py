"""A direct convolution with the elementwise work after it, one kernel.

fused_conv(x, w, epilogue inputs…; stride, padding, dilation, groups, post) =
post(conv(x, w), epilogue inputs), where in `post` $0 is the convolution's output and $1… the
epilogue inputs, broadcast to it: a bias of shape (C, 1, 1), a residual of the output's shape.
conv1d or conv2d by x's rank. A ResNet block's conv → + bias → relu and conv → + bias → + x →
relu are each one kernel, the accumulators taking the epilogue in registers as they are written.

strided_conv is a fused_conv whose x and w are strided views of its first two operands' storage
(lower/conv_views.py makes it, never users or rules): `shapes`, `strides` (flat, x's then w's, each
of the convolution's rank; a flipped axis's negative) and `offsets` (x's, w's); `out_swapped`
writes the output with its two leading axes swapped (no epilogue inputs then). A layer's weight
gradient convolves x and dY with the batch playing the channels, xᵀ and dYᵀ that the kernel reads
where they lie instead of two transposing copies, and writes dW = (its result)ᵀ so; its input
gradient reads the kernel flipped. With `bias_grad` the result is dW flattened and then, per output
channel, the sum of w's view over its other axes: Σ dY over the batch and the positions, the layer's
bias gradient, which the kernel computes as one more image of x, all ones (cuBLASLt's BGRADB).

>>> from tessera_rw.algebra.dtypes import DType
>>> x, w, b = TensorType((2, 4, 8, 8), DType.float32), TensorType((6, 4, 3, 3), DType.float32), \\
...     TensorType((6, 1, 1), DType.float32)
>>> _infer_fused_conv(x, w, b, stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1,
...                   post="relu(add($0,$1))")
TensorType(shape=(2, 6, 8, 8), dtype=<DType.float32: 'float32'>)
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.conv import DEFS as CONV_DEFS, conv_reference
from tessera_rw.algebra.ops.fused_expr import expr_leaves, fused, fused_flops, infer_fused, parse_expr

CONVOLUTIONS = {d.name: d for d in CONV_DEFS}


def convolution_of(x: TensorType) -> str:
    """The convolution a fused_conv over `x` computes: conv1d for (N, C, L), conv2d for (N, C, H, W)."""
    return {3: "conv1d", 4: "conv2d"}.get(x.ndim, "conv2d")


def _infer_fused_conv(x: TensorType, w: TensorType, *extras: TensorType, stride, padding, dilation, groups,
                      post: str) -> TensorType:
    conv = CONVOLUTIONS[convolution_of(x)].infer(x, w, stride=stride, padding=padding, dilation=dilation,
                                                 groups=groups)
    out = infer_fused(conv, *extras, expr=post)
    if out.shape != conv.shape:
        raise ShapeError(f"the epilogue {post!r} broadcasts the convolution's output {conv.shape} to {out.shape}",
                         hint="give the epilogue's inputs shapes that broadcast to the convolution's output")
    if max(expr_leaves(parse_expr(post)) | {0}) != len(extras):
        raise ShapeError(f"the epilogue {post!r} does not read each of its {len(extras)} input(s) after $0")
    return out


def _fused_conv(x: np.ndarray, w: np.ndarray, *extras: np.ndarray, stride, padding, dilation, groups,
                post: str) -> np.ndarray:
    conv = conv_reference(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return fused(conv, *extras, expr=post)


def _fused_conv_flops(out: TensorType, x: TensorType, w: TensorType, *extras: TensorType, post: str,
                      **attrs) -> int:
    conv = CONVOLUTIONS[convolution_of(x)]
    return conv.flops(out, x, w, **attrs) + fused_flops(out, out, *extras, expr=post)


def conv_views(shapes: tuple[int, ...], strides: tuple[int, ...], offsets: tuple[int, ...]) -> list[tuple]:
    """x's and w's views (shape, strides, offset) of a strided_conv, from its flat attributes."""
    rank = len(shapes) // 2
    return [(tuple(shapes[i * rank:(i + 1) * rank]), tuple(strides[i * rank:(i + 1) * rank]), offsets[i])
            for i in range(2)]


def _viewed(xs: tuple, types: bool, shapes, strides, offsets) -> tuple:
    from tessera_rw.algebra.ops.strided import check_view, view_of
    if len(shapes) != len(strides) or len(shapes) % 2 or len(offsets) != 2:
        raise ShapeError(f"a strided_conv takes two views: {len(shapes)} sizes, {len(strides)} strides and "
                         f"{len(offsets)} offsets do not make them")
    viewed = []
    for x, (shape, st, off) in zip(xs, conv_views(tuple(shapes), tuple(strides), tuple(offsets))):
        if types:
            check_view(x, shape, st, off, signed=True)
            viewed.append(TensorType(shape, x.dtype))
        else:
            viewed.append(view_of(x, shape, st, off))
    return (*viewed, *xs[2:])


def _infer_strided_conv(*xs: TensorType, shapes, strides, offsets, out_swapped: bool, bias_grad: bool = False,
                        **attrs) -> TensorType:
    out = _infer_fused_conv(*_viewed(xs, True, shapes, strides, offsets), **attrs)
    if not out_swapped:
        if bias_grad:
            raise ShapeError("a strided_conv sums a bias gradient only beside a weight gradient (out_swapped)")
        return out
    if len(xs) > 2:
        raise ShapeError("a strided_conv writing its output's leading axes swapped takes no epilogue inputs")
    if bias_grad and attrs["groups"] != 1:
        raise ShapeError(f"a strided_conv sums a bias gradient over one group, not {attrs['groups']}")
    swapped = (out.shape[1], out.shape[0], *out.shape[2:])
    return TensorType((out.numel + out.shape[1],), out.dtype) if bias_grad else TensorType(swapped, out.dtype)


def _strided_conv(*xs: np.ndarray, shapes, strides, offsets, out_swapped: bool, bias_grad: bool = False,
                  **attrs) -> np.ndarray:
    viewed = _viewed(xs, False, shapes, strides, offsets)
    out = _fused_conv(*viewed, **attrs)
    if not bias_grad:
        return np.swapaxes(out, 0, 1) if out_swapped else out
    sums = viewed[1].sum(axis=tuple(range(1, viewed[1].ndim)), dtype=np.float64).astype(out.dtype)
    return np.concatenate([np.swapaxes(out, 0, 1).reshape(-1), sums])


def _strided_conv_flops(out: TensorType, *xs: TensorType, shapes, strides, offsets, out_swapped: bool,
                        bias_grad: bool = False, **attrs) -> int:
    x, w = (TensorType(shape, t.dtype) for t, (shape, _, _) in zip(xs, conv_views(shapes, strides, offsets)))
    conv = _infer_fused_conv(x, w, **attrs) if bias_grad else out
    return _fused_conv_flops(conv, x, w, *xs[2:], **attrs) + bias_grad * w.numel


DEFS = (
    OpDef("fused_conv", ("x", "w", "extras"), OpKind.CONV, _infer_fused_conv, _fused_conv, _fused_conv_flops,
          variadic=True, vjp=before_fusion("fused_conv"),
          doc="conv1d / conv2d with an elementwise epilogue over its output ($0) and further inputs, "
              "e.g. post='relu(add($0,$1))' for a bias and a relu"),
    OpDef("strided_conv", ("x", "w", "extras"), OpKind.CONV, _infer_strided_conv, _strided_conv, _strided_conv_flops,
          variadic=True, vjp=before_fusion("strided_conv"),
          doc="fused_conv reading x and w as strided views of its first two operands' storage (shapes, strides "
              "flat, x's then w's; offsets), as lowering reads transposed operands in place; out_swapped: "
              "the output written with its two leading axes swapped; bias_grad: beside it (flattened), "
              "w's sum over all but its leading axis, a layer's bias gradient from its weight gradient's dY"),
)
