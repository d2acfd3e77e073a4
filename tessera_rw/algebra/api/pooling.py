"""Pools in torch.nn.functional's names: max_pool2d, avg_pool2d, adaptive_avg_pool2d,
adaptive_max_pool2d (output sizes dividing the plane), and the 1-d max_pool1d and avg_pool1d (a
2-d pool of a plane one row high).

An average pool whose windows tile the plane (stride = window, no padding, H and W multiples of it)
is a mean over a reshape, a reduction kernel that computes what x is computed from as it reads it;
any other pool (every max pool: its gradient goes to one of a window's equal elements, as torch's;
a ResNet stem's 3×3 max pool, stride 2, padding 1) is the pooling op of that name (ops/pooling.py),
one kernel walking each window in cache, and its gradient one more.

>>> import numpy as np
>>> x = np.arange(16.0).reshape(1, 1, 4, 4)
>>> avg_pool2d(x, 2)
array([[[[ 2.5,  4.5],
         [10.5, 12.5]]]])
>>> max_pool2d(x, 3, stride=2, padding=1)
array([[[[ 5.,  7.],
         [13., 15.]]]])
"""

from __future__ import annotations

import numbers

import numpy as np

from tessera_rw.algebra.api.dispatch import apply, op_context, tensor_operand, type_of
from tessera_rw.algebra.api.elementwise import cast
from tessera_rw.algebra.api.layout import reshape
from tessera_rw.algebra.api.reduction import mean
from tessera_rw.algebra.errors import AttributeValueError, DTypeError, ShapeError


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
    """The largest element of each kernel_size window of x (N, C, H, W) or (C, H, W), as torch's
    F.max_pool2d: windows `stride` apart (the window by default) over x padded by `padding` (at most
    half the kernel), their positions `dilation` apart. The gradient goes to the element each window
    picked, the first of equals (after a relu, a window of zeros sends it to one zero, not to all)."""
    x = tensor_operand(x)
    with op_context("max_pool2d", (x,), ("x",)):
        kernel = _pair(kernel_size, "kernel_size", least=1)
        window = dict(kernel=kernel, stride=_stride(stride, kernel), pad=_pair(padding, "padding"),
                      dilation=_pair(dilation, "dilation", least=1), ceil_mode=_flag(ceil_mode, "ceil_mode"))
    return apply("max_pool2d", (x,), **window)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None):
    """The mean of each kernel_size window of x (N, C, H, W) or (C, H, W), as torch's
    F.avg_pool2d: windows `stride` apart (the window by default) over x zero-padded by `padding` (at
    most half the kernel); each sum divided by divisor_override if given, else by the window's
    positions, those in the padding counted if count_include_pad."""
    x = tensor_operand(x)
    with op_context("avg_pool2d", (x,), ("x",)):
        kernel = _pair(kernel_size, "kernel_size", least=1)
        window = dict(kernel=kernel, stride=_stride(stride, kernel), pad=_pair(padding, "padding"),
                      ceil_mode=_flag(ceil_mode, "ceil_mode"),
                      count_include_pad=_flag(count_include_pad, "count_include_pad"),
                      divisor=_divisor(divisor_override))
        xt = _floating(x)
        shape = xt.shape
    tiles = (len(shape) >= 3 and window["stride"] == kernel and window["pad"] == (0, 0)
             and not window["divisor"] and shape[-2] % kernel[0] == 0 and shape[-1] % kernel[1] == 0)
    if not tiles:
        return apply("avg_pool2d", (x,), **window)
    h, w = shape[-2:]
    return mean(reshape(x, shape[:-2] + (h // kernel[0], kernel[0], w // kernel[1], kernel[1])),
                axis=(-3, -1))


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
    """max_pool2d along the last axis of x (N, C, L) or (C, L), as torch's F.max_pool1d."""
    x = tensor_operand(x)
    with op_context("max_pool1d", (x,), ("x",)):
        window = [_single(v, name) for v, name in ((kernel_size, "kernel_size"), (stride, "stride"),
                                                  (padding, "padding"), (dilation, "dilation"))]
    kernel, step, pad, spread = window
    return _along_a_row(x, lambda rows: max_pool2d(rows, (1, kernel), None if step is None else (1, step), (0, pad),
                                                   (1, spread), ceil_mode))


def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True):
    """avg_pool2d along the last axis of x (N, C, L) or (C, L), as torch's F.avg_pool1d."""
    x = tensor_operand(x)
    with op_context("avg_pool1d", (x,), ("x",)):
        kernel, step, pad = (_single(v, name) for v, name in ((kernel_size, "kernel_size"), (stride, "stride"),
                                                              (padding, "padding")))
    return _along_a_row(x, lambda rows: avg_pool2d(rows, (1, kernel), None if step is None else (1, step), (0, pad),
                                                   ceil_mode, count_include_pad))


def _along_a_row(x, pool):
    """`pool` (a 2-d pool) of x with a plane of one row, that row."""
    shape = type_of(x).shape
    if len(shape) < 2:
        raise ShapeError(f"a 1-d pool takes x (C, L) or (N, C, L), got {shape}", hint="add a channel axis")
    pooled = pool(reshape(x, shape[:-1] + (1, shape[-1])))
    out = type_of(pooled).shape
    return reshape(pooled, out[:-2] + out[-1:])


def _single(value, name: str) -> int | None:
    """A 1-d pool's size: an int or a 1-tuple (None stays None: the stride's default)."""
    if value is None or (isinstance(value, (tuple, list)) and not value):
        return None
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise AttributeValueError(f"{name} must be an int or a 1-tuple of one, got {value!r}")
    return int(value)


def adaptive_avg_pool2d(x, output_size):
    """x (N, C, H, W) or (C, H, W) averaged down to output_size (an int or a pair), as torch's
    F.adaptive_avg_pool2d: output position i along an axis of n averages positions
    floor(i·n/out) to ceil((i + 1)·n/out). Where out divides n (1: a global average pool) the
    windows tile the plane (a mean over a reshape); else they are unequal, and the pool is two
    products with the averaging matrices (float32 for 16-bit x)."""
    x = tensor_operand(x)
    with op_context("adaptive_avg_pool2d", (x,), ("x",)):
        shape, (oh, ow) = _adaptive(x, output_size, "adaptive_avg_pool2d")
        xt = _floating(x)
    if shape[-2] % oh == 0 and shape[-1] % ow == 0:
        return avg_pool2d(x, (shape[-2] // oh, shape[-1] // ow))
    from tessera_rw.algebra.api.compute import matmul
    narrow = xt.dtype.is_low_precision
    wide = cast(x, "float32") if narrow else x
    compute = "float32" if narrow else xt.dtype.value
    rows, cols = (_averaging(n, out, compute) for n, out in ((shape[-2], oh), (shape[-1], ow)))
    pooled = matmul(rows.T, matmul(wide, cols))                  # (oh, H) @ (…, H, W) @ (W, ow)
    return cast(pooled, xt.dtype.value) if narrow else pooled


def adaptive_max_pool2d(x, output_size):
    """x (N, C, H, W) or (C, H, W) max-pooled down to output_size (an int or a pair), as torch's
    F.adaptive_max_pool2d, where the output size divides the plane (windows that tile it: a max
    pool, its gradient to the first of equals)."""
    x = tensor_operand(x)
    with op_context("adaptive_max_pool2d", (x,), ("x",)):
        shape, (oh, ow) = _adaptive(x, output_size, "adaptive_max_pool2d")
        if shape[-2] % oh or shape[-1] % ow:
            raise ShapeError(f"adaptive_max_pool2d takes output sizes that divide the plane {shape[-2:]}, got "
                             f"{(oh, ow)}", hint="windows of unequal sizes are not supported: pad x to a multiple")
    return max_pool2d(x, (shape[-2] // oh, shape[-1] // ow))


def _adaptive(x, output_size, name: str) -> tuple[tuple[int, ...], tuple[int, int]]:
    """(x's shape, the output size as a pair) of an adaptive pool, or the error naming its rank."""
    shape = type_of(x).shape
    out = _pair(output_size, "output_size", least=1)
    if len(shape) < 3:
        raise ShapeError(f"{name} pools the last two axes of x (C, H, W) or (N, C, H, W), got {shape}",
                         hint="add a channel axis: op.expand_dims(x, 0)")
    return shape, out


def _floating(x):
    """x's type, or the error saying a pool takes floating-point values."""
    xt = type_of(x)
    if not xt.dtype.is_float:
        raise DTypeError(f"pools floating-point values, got {xt.dtype.value}",
                         hint="cast x first: op.cast(x, 'float32')")
    return xt


def _averaging(n: int, out: int, dtype: str) -> np.ndarray:
    """(n, out): column i averages positions floor(i·n/out) to ceil((i + 1)·n/out), as torch's
    adaptive pools window an axis of n."""
    weights = np.zeros((n, out))
    for i in range(out):
        start, stop = (i * n) // out, -((-(i + 1) * n) // out)
        weights[start:stop, i] = 1.0 / (stop - start)
    return weights.astype(np.dtype(dtype))


def _pair(value, name: str, least: int = 0) -> tuple[int, int]:
    """`value` (an int, numpy's too, or a pair of them) as a pair of ints >= `least`."""
    ints = (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool))
    pair = (value, value) if ints(value) else tuple(value) if isinstance(value, (tuple, list)) else ()
    if len(pair) != 2 or not all(ints(v) and v >= least for v in pair):
        raise AttributeValueError(f"{name} must be an int or a pair of ints >= {least}, got {value!r}")
    return int(pair[0]), int(pair[1])


def _stride(stride, kernel: tuple[int, int]) -> tuple[int, int]:
    """The windows' stride: the kernel's size when None or empty, as torch's."""
    return kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        _pair(stride, "stride", least=1)


def _flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise AttributeValueError(f"{name} must be True or False, got {value!r}")
    return value


def _divisor(value) -> int:
    if value is None:
        return 0
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise AttributeValueError(f"divisor_override must be an int >= 1 or None, got {value!r}")
    return int(value)
