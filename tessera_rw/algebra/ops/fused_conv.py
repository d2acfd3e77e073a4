"""A direct convolution with the elementwise work after it, one kernel.

fused_conv(x, w, epilogue inputs…; stride, padding, dilation, groups, post) =
post(conv(x, w), epilogue inputs), where in `post` $0 is the convolution's output and $1… the
epilogue inputs, broadcast to it: a bias of shape (C, 1, 1), a residual of the output's shape.
conv1d or conv2d by x's rank. A ResNet block's conv → + bias → relu and conv → + bias → + x →
relu are each one kernel, the accumulators taking the epilogue in registers as they are written.

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


DEFS = (
    OpDef("fused_conv", ("x", "w", "extras"), OpKind.CONV, _infer_fused_conv, _fused_conv, _fused_conv_flops,
          variadic=True, vjp=before_fusion("fused_conv"),
          doc="conv1d / conv2d with an elementwise epilogue over its output ($0) and further inputs, "
              "e.g. post='relu(add($0,$1))' for a bias and a relu"),
)
