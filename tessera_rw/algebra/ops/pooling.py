"""Windowed pooling over the last two axes (H, W) of x (…, H, W), as torch's max_pool2d and
avg_pool2d, and their gradients.

Every window is `kernel` (kh, kw) positions, `dilation` apart (max only), its corner stepping by
`stride` over x padded by `pad` on both sides of each axis (at most half the kernel, as torch
requires, dilated or not). `ceil_mode` rounds the output size up, keeping a last window that starts inside x or
its leading padding. Attributes are normalized pairs.

max_pool2d picks each window's largest element, the first of equals in row-major window order
(a NaN wins, the last of several): that element alone gets the window's cotangent, as in torch.
A dilated window can miss x altogether: its max is -inf, and it picks nothing.
avg_pool2d divides each window's sum by `divisor` when it is not 0, else by the window's positions
inside x and the padding (`count_include_pad`) or inside x alone; a window running past the padding
(ceil_mode) counts only the positions up to it.

>>> x = np.arange(16.0).reshape(1, 1, 4, 4)
>>> attrs = dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), dilation=(1, 1), ceil_mode=False)
>>> _max_pool2d(x, **attrs)[0, 0]
array([[ 5.,  7.],
       [13., 15.]])
>>> _max_pool2d_grad(x, np.ones((1, 1, 2, 2)), **attrs)[0, 0]
array([[0., 0., 0., 0.],
       [0., 1., 0., 1.],
       [0., 0., 0., 0.],
       [0., 1., 0., 1.]])
>>> _avg_pool2d(x, kernel=(2, 2), stride=(2, 2), pad=(1, 1), ceil_mode=False, count_include_pad=False,
...             divisor=0)[0, 0]
array([[ 0. ,  1.5,  3. ],
       [ 6. ,  7.5,  9. ],
       [12. , 13.5, 15. ]])
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion, zero
from tessera_rw.algebra.errors import AttributeValueError, DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.fused_expr import fused, fused_flops, infer_fused
from tessera_rw.algebra.shapes import fmt_shape
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs

POOL_OPS = frozenset({"max_pool2d", "max_pool2d_grad", "max_pool2d_picked", "avg_pool2d", "avg_pool2d_grad",
                      "fused_max_pool2d_grad"})
NO_DILATION = (1, 1)


def pooled_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """Windows along an axis of `size`, as torch counts them."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:    # a last window starting past the padding
        out -= 1
    return out


def _pooled_plane(plane: tuple[int, ...], kernel, stride, pad, dilation, ceil_mode) -> tuple[int, int]:
    """The output's (Ho, Wo) over x's plane (H, W)."""
    return tuple(pooled_size(plane[a], kernel[a], stride[a], pad[a], dilation[a], ceil_mode) for a in range(2))


def _check_window(x: TensorType, kernel, stride, pad, dilation, ceil_mode) -> tuple[int, int]:
    """The output's (Ho, Wo) for x, or the error saying what is wrong with the window."""
    if x.ndim < 3:
        raise ShapeError(f"pools the last two axes of x (C, H, W) or (N, C, H, W), got {fmt_shape(x.shape)}",
                         hint="add a channel axis: op.expand_dims(x, 0)")
    if not x.dtype.is_float:
        raise DTypeError(f"pools floating-point values, got {x.dtype.value}",
                         hint="cast x first: op.cast(x, 'float32')")
    pairs = {"kernel": kernel, "stride": stride, "pad": pad, "dilation": dilation}
    if any(len(p) != 2 for p in pairs.values()) or min(kernel + stride + dilation) < 1 or min(pad) < 0:
        raise AttributeValueError(f"kernel, stride and dilation are pairs of ints >= 1 and pad a pair >= 0, "
                                  f"got {pairs}")
    if any(2 * pad[axis] > kernel[axis] for axis in range(2)):
        raise AttributeValueError(f"pad {pad} is more than half the window {kernel}, as torch refuses too",
                                  hint="pad x with op.pad first")
    out = _pooled_plane(x.shape[-2:], kernel, stride, pad, dilation, ceil_mode)
    if min(out) < 1:
        spans = tuple(dilation[a] * (kernel[a] - 1) + 1 for a in range(2))
        window = f"{kernel} dilated by {dilation} to {spans}" if dilation != NO_DILATION else f"{kernel}"
        raise ShapeError(f"the window {window} is larger than x's plane {fmt_shape(x.shape[-2:])} padded by "
                         f"{pad}", hint="pad more, or use a smaller window or dilation")
    return out


def _infer_max(x: TensorType, kernel, stride, pad, dilation, ceil_mode) -> TensorType:
    out = _check_window(x, kernel, stride, pad, dilation, ceil_mode)
    return TensorType(x.shape[:-2] + out, x.dtype)


def _infer_avg(x: TensorType, kernel, stride, pad, ceil_mode, count_include_pad, divisor) -> TensorType:
    out = _check_window(x, kernel, stride, pad, NO_DILATION, ceil_mode)
    if divisor < 0:
        raise AttributeValueError(f"divisor must be >= 1, or 0 for the window's count, got {divisor}")
    return TensorType(x.shape[:-2] + out, x.dtype)


def _check_cotangent(g: TensorType, pooled: TensorType) -> None:
    if g.shape != pooled.shape:
        raise ShapeError(f"the cotangent is {g} where the pool's result is {pooled}")
    if not g.dtype.is_float:
        raise DTypeError(f"the cotangent is {g.dtype.value}: a gradient is floating point")


def _infer_max_grad(x: TensorType, g: TensorType, kernel, stride, pad, dilation, ceil_mode) -> TensorType:
    _check_cotangent(g, _infer_max(x, kernel, stride, pad, dilation, ceil_mode))
    return TensorType(x.shape, g.dtype)


def _infer_fused_max_grad(x: TensorType, g: TensorType, *extras: TensorType, kernel, stride, pad, dilation,
                          ceil_mode, post: str) -> TensorType:
    dx = _infer_max_grad(x, g, kernel, stride, pad, dilation, ceil_mode)
    out = infer_fused(dx, *extras, expr=post)
    if out != dx:
        raise ShapeError(f"the epilogue {post!r} makes {out} of the gradient {dx}: it keeps its shape and dtype")
    return out


def _infer_max_picked(x: TensorType, v: TensorType, kernel, stride, pad, dilation, ceil_mode) -> TensorType:
    if v.shape != x.shape or not v.dtype.is_float:
        raise ShapeError(f"picks from v of x's shape {fmt_shape(x.shape)} and a float dtype, got {v}")
    return TensorType(_infer_max(x, kernel, stride, pad, dilation, ceil_mode).shape, v.dtype)


def _infer_avg_grad(g: TensorType, plane, kernel, stride, pad, ceil_mode, count_include_pad,
                    divisor) -> TensorType:
    if len(plane) != 2 or min(plane) < 1:
        raise AttributeValueError(f"plane is the pooled (H, W), got {plane}")
    x = TensorType(g.shape[:-2] + tuple(plane), g.dtype)
    _check_cotangent(g, _infer_avg(x, kernel, stride, pad, ceil_mode, count_include_pad, divisor))
    return x


def _taps(plane: tuple[int, int], out: tuple[int, int], kernel, stride, pad, dilation):
    """For each window position, in row-major window order, the (rows, cols) slices of x's plane
    padded by `pad` (and on the high side by whatever ceil_mode's last windows reach) that it reads
    for every window; and those paddings."""
    reach = [(out[a] - 1) * stride[a] + dilation[a] * (kernel[a] - 1) + 1 for a in range(2)]
    high = [max(0, reach[a] - plane[a] - pad[a]) for a in range(2)]
    along = [[slice(i * dilation[a], i * dilation[a] + (out[a] - 1) * stride[a] + 1, stride[a])
              for i in range(kernel[a])] for a in range(2)]
    return [(rows, cols) for rows in along[0] for cols in along[1]], [(pad[0], high[0]), (pad[1], high[1])]


def _padded(x: np.ndarray, widths, value) -> np.ndarray:
    return np.pad(x, [(0, 0)] * (x.ndim - 2) + widths, constant_values=value)


def _argmax(x: np.ndarray, kernel, stride, pad, dilation, ceil_mode):
    """(each window's max, the index of its window position picked, the taps and paddings of
    _taps): the first of equals in window order among the positions inside x, a NaN replacing any
    (the last of several NaNs)."""
    out = _pooled_plane(x.shape[-2:], kernel, stride, pad, dilation, ceil_mode)
    taps, widths = _taps(x.shape[-2:], out, kernel, stride, pad, dilation)
    values = _padded(x, widths, np.nan)
    inside = _padded(np.ones(x.shape[-2:], bool), widths, False)
    best = np.full(x.shape[:-2] + out, -np.inf, x.dtype)
    picked = np.full(best.shape, -1, np.int64)
    for k, (rows, cols) in enumerate(taps):
        v, held = values[..., rows, cols], inside[rows, cols]
        take = held & ((v > best) | np.isnan(v) | (picked < 0))
        best, picked = np.where(take, v, best), np.where(take, k, picked)
    return best, picked, taps, widths


def _max_pool2d(x: np.ndarray, kernel, stride, pad, dilation, ceil_mode) -> np.ndarray:
    return _argmax(x, kernel, stride, pad, dilation, ceil_mode)[0]


def _max_pool2d_picked(x: np.ndarray, v: np.ndarray, kernel, stride, pad, dilation, ceil_mode) -> np.ndarray:
    _, picked, taps, widths = _argmax(x, kernel, stride, pad, dilation, ceil_mode)
    values = _padded(v, widths, 0)
    out = np.zeros(picked.shape, v.dtype)
    for k, (rows, cols) in enumerate(taps):
        out = np.where(picked == k, values[..., rows, cols], out)
    return out


def _max_pool2d_grad(x: np.ndarray, g: np.ndarray, kernel, stride, pad, dilation, ceil_mode) -> np.ndarray:
    _, picked, taps, widths = _argmax(x, kernel, stride, pad, dilation, ceil_mode)
    dx = _padded(np.zeros(x.shape, g.dtype), widths, 0)
    for k, (rows, cols) in enumerate(taps):
        dx[..., rows, cols] += np.where(picked == k, g, 0)     # one window per element of a strided view
    return _cropped(dx, x.shape[-2:], pad)


def _fused_max_pool2d_grad(x: np.ndarray, g: np.ndarray, *extras: np.ndarray, kernel, stride, pad, dilation,
                           ceil_mode, post: str) -> np.ndarray:
    return fused(_max_pool2d_grad(x, g, kernel, stride, pad, dilation, ceil_mode), *extras, expr=post)


def _cropped(dx: np.ndarray, plane: tuple[int, int], pad) -> np.ndarray:
    return dx[..., pad[0]:pad[0] + plane[0], pad[1]:pad[1] + plane[1]]


def window_divisors(plane: tuple[int, int], out: tuple[int, int], kernel, stride, pad, count_include_pad,
                    divisor) -> np.ndarray:
    """What each window's sum is divided by, (Ho, Wo), as torch's avg_pool2d divides it."""
    if divisor:
        return np.full(out, float(divisor))
    counts = []
    for a in range(2):
        start = np.arange(out[a]) * stride[a] - pad[a]
        end = np.minimum(start + kernel[a], plane[a] + pad[a])
        counts.append(end - start if count_include_pad else np.minimum(end, plane[a]) - np.maximum(start, 0))
    return np.outer(counts[0], counts[1]).astype(np.float64)


def _avg_pool2d(x: np.ndarray, kernel, stride, pad, ceil_mode, count_include_pad, divisor) -> np.ndarray:
    out = _pooled_plane(x.shape[-2:], kernel, stride, pad, NO_DILATION, ceil_mode)
    taps, widths = _taps(x.shape[-2:], out, kernel, stride, pad, NO_DILATION)
    values = _padded(x, widths, 0)
    total = np.zeros(x.shape[:-2] + out, x.dtype)
    for rows, cols in taps:
        total += values[..., rows, cols]
    divisors = window_divisors(x.shape[-2:], out, kernel, stride, pad, count_include_pad, divisor)
    return (total / divisors.astype(x.dtype)).astype(x.dtype)


def _avg_pool2d_grad(g: np.ndarray, plane, kernel, stride, pad, ceil_mode, count_include_pad, divisor):
    plane = tuple(plane)
    taps, widths = _taps(plane, g.shape[-2:], kernel, stride, pad, NO_DILATION)
    shared = g / window_divisors(plane, g.shape[-2:], kernel, stride, pad, count_include_pad,
                                 divisor).astype(g.dtype)
    dx = _padded(np.zeros(g.shape[:-2] + plane, g.dtype), widths, 0)
    for rows, cols in taps:
        dx[..., rows, cols] += shared
    return _cropped(dx, plane, pad)


def _window_flops(out: TensorType, *operands: TensorType, kernel, **attrs) -> int:
    """A compare or add per position of each window."""
    return out.numel * math.prod(kernel)


def _cotangent_flops(out: TensorType, *operands: TensorType, kernel, **attrs) -> int:
    """An add per position of each window of the cotangent (the last operand); a max's picks found
    again, a compare per position of each window covering each element."""
    scans = math.prod(kernel) if len(operands) == 2 else 1
    return operands[-1].numel * math.prod(kernel) * scans


def _fused_grad_flops(out: TensorType, x: TensorType, g: TensorType, *extras: TensorType, kernel, post: str,
                      **attrs) -> int:
    return _cotangent_flops(out, x, g, kernel=kernel) + fused_flops(out, *extras, expr=post)


def _max_vjp(g, y, x, **attrs):
    return (api.apply("max_pool2d_grad", (x, g), **attrs),)


def _max_grad_vjp(gg, dx, x, g, **attrs):
    """max_pool2d_grad is linear in g, sending each window's share to its pick: its adjoint reads
    each window's pick back. The picks do not move with x (almost everywhere): x's is zero."""
    return _still(x), api.apply("max_pool2d_picked", (x, gg), **attrs)


def _max_picked_vjp(g, y, x, v, **attrs):
    return _still(x), api.apply("max_pool2d_grad", (x, g), **attrs)


def _still(x):
    """The zero cotangent of x, on which a result depends only through which element is picked."""
    return api.broadcast_to(zero(x), x.shape)


def _avg_vjp(g, y, x, **attrs):
    return (api.apply("avg_pool2d_grad", (g,), plane=x.shape[-2:], **attrs),)


def _avg_grad_vjp(gg, dx, g, plane, **attrs):
    """avg_pool2d_grad is avg_pool2d's adjoint, a linear map: its own adjoint is the pool."""
    return (api.apply("avg_pool2d", (gg,), **attrs),)


DEFS = (
    OpDef("max_pool2d", ("x",), OpKind.REDUCTION, _infer_max, _max_pool2d, _window_flops, exact=True, vjp=_max_vjp,
          doc="the largest element of each window of x's last two axes (torch's max_pool2d)"),
    OpDef("max_pool2d_grad", ("x", "g"), OpKind.REDUCTION, _infer_max_grad, _max_pool2d_grad, _cotangent_flops,
          vjp=_max_grad_vjp, doc="max_pool2d's input gradient: each window's cotangent at the element it picked"),
    OpDef("max_pool2d_picked", ("x", "v"), OpKind.REDUCTION, _infer_max_picked, _max_pool2d_picked, _window_flops,
          exact=True, vjp=_max_picked_vjp,
          doc="v's element at each window's max_pool2d pick in x (the adjoint of max_pool2d_grad)"),
    OpDef("fused_max_pool2d_grad", ("x", "g", "extras"), OpKind.REDUCTION, _infer_fused_max_grad,
          _fused_max_pool2d_grad, _fused_grad_flops, variadic=True, vjp=before_fusion("fused_max_pool2d_grad"),
          doc="max_pool2d_grad with an elementwise epilogue over its result ($0) and further inputs (a relu's "
              "mask), which lowering makes"),
    OpDef("avg_pool2d", ("x",), OpKind.REDUCTION, _infer_avg, _avg_pool2d, _window_flops, vjp=_avg_vjp,
          doc="the mean of each window of x's last two axes (torch's avg_pool2d)"),
    OpDef("avg_pool2d_grad", ("g",), OpKind.REDUCTION, _infer_avg_grad, _avg_pool2d_grad, _cotangent_flops,
          vjp=_avg_grad_vjp, doc="avg_pool2d's input gradient: each window's cotangent shared by its positions"),
)
