"""Layers in torch.nn.functional's names, written with other ops: linear, batch_norm, flatten, and
the bias of conv1d / conv2d (compute.py); the pools are pooling.py's.

Each traces to the ops it is made of, so the rewrites fuse them as they would the ops written out:
a linear's bias joins its GEMM's epilogue, a batch norm's statistics are two reductions over x and
its backward's per-channel sums one multi_reduction kernel.

>>> import numpy as np
>>> x = np.arange(6.0).reshape(2, 3)
>>> linear(x, np.eye(3)[:2], np.array([10.0, 20.0]))
array([[10., 21.],
       [13., 24.]])
>>> flatten(np.zeros((2, 3, 4, 5)), 1).shape
(2, 60)
"""

from __future__ import annotations

from tessera_rw.algebra.api.dispatch import op_context, tensor_operand, type_of
from tessera_rw.algebra.api.elementwise import add, cast, multiply, rsqrt, subtract
from tessera_rw.algebra.api.layout import reshape, swapaxes
from tessera_rw.algebra.api.reduction import mean
from tessera_rw.algebra.errors import AttributeValueError, ShapeError
from tessera_rw.algebra.shapes import normalize_axis


def linear(x, weight, bias=None):
    """x @ weightᵀ + bias, as torch's F.linear: weight is (out_features, in_features)."""
    x, weight = tensor_operand(x), tensor_operand(weight)
    with op_context("linear", (x, weight), ("x", "weight")):
        xt, wt = type_of(x), type_of(weight)
        if wt.ndim != 2 or xt.ndim < 1 or xt.shape[-1] != wt.shape[1]:
            features = xt.shape[-1] if xt.ndim else "?"
            raise ShapeError(f"linear takes weight (out_features, in_features) = (·, {features}) for x {xt.shape}, "
                             f"got {wt.shape}", hint="weight is stored as torch.nn.Linear's: x @ w.T")
    from tessera_rw.algebra.api.compute import matmul
    y = matmul(x, swapaxes(weight, 0, 1))
    return y if bias is None else add(y, bias)


def flatten(x, start_axis: int = 0, end_axis: int = -1):
    """x with axes start_axis..end_axis (inclusive) merged into one, as torch.flatten."""
    x = tensor_operand(x)
    with op_context("flatten", (x,), ("x",)):
        shape = type_of(x).shape
        if not shape:
            return reshape(x, (1,))
        start, end = normalize_axis(start_axis, len(shape)), normalize_axis(end_axis, len(shape))
        if start > end:
            raise ShapeError(f"flatten's start axis {start_axis} comes after its end axis {end_axis} for shape {shape}")
    merged = 1
    for n in shape[start:end + 1]:
        merged *= n
    return reshape(x, shape[:start] + (merged,) + shape[end + 1:])


def batch_norm(x, *, weight=None, bias=None, eps: float = 1e-5, training: bool = True, running_mean=None,
               running_var=None):
    """A batch norm, as torch's F.batch_norm: x (N, C, ...) normalized per channel, then scaled by
    weight (C,) and shifted by bias (C,). In training mode (the default) by the mean and biased
    variance over every other axis; with training=False by running_mean and running_var (C,), an
    elementwise affine that joins the epilogue of the convolution before it. 16-bit x computes in
    float32 and returns its dtype, as cuDNN does. Running statistics are the caller's to keep:
    op.mean(x, axis=(0, 2, 3)) and op.var give them (the statistics are keywords, so torch's
    positional running_mean cannot land in weight's place)."""
    x = tensor_operand(x)
    with op_context("batch_norm", (x,), ("x",)):
        xt = type_of(x)
        if xt.ndim < 2:
            raise ShapeError(f"batch_norm takes x of shape (N, C, ...), got {xt.shape}",
                             hint="add a batch axis: op.expand_dims(x, 0)")
        channels = xt.shape[1]
        given = {"weight": weight, "bias": bias, "running_mean": running_mean, "running_var": running_var}
        for name, param in given.items():
            if param is not None and type_of(tensor_operand(param)).shape != (channels,):
                raise ShapeError(f"batch_norm's {name} has one value per channel, shape ({channels},), got "
                                 f"{type_of(tensor_operand(param)).shape}")
        if not isinstance(training, bool):
            raise AttributeValueError(f"training must be True or False, got {training!r}")
        if training and (running_mean is not None or running_var is not None):
            raise AttributeValueError("in training mode a batch norm normalizes by the batch's statistics; running "
                                      "statistics are the caller's to update",
                                      hint="pass training=False to normalize by running_mean and running_var")
        if not training and (running_mean is None or running_var is None):
            raise AttributeValueError("with training=False a batch norm normalizes by running_mean and running_var: "
                                      "pass both")
    narrow = xt.dtype.is_low_precision and xt.dtype.is_float
    per_channel = (1, channels) + (1,) * (xt.ndim - 2)

    def channel(param):
        return reshape(cast(param, "float32") if narrow else param, per_channel)
    wide = cast(x, "float32") if narrow else x
    if training:
        axes = (0,) + tuple(range(2, xt.ndim))
        centered = subtract(wide, mean(wide, axis=axes, keepdims=True))
        y = multiply(centered, rsqrt(add(mean(multiply(centered, centered), axis=axes, keepdims=True), eps)))
    else:
        y = multiply(subtract(wide, channel(running_mean)), rsqrt(add(channel(running_var), eps)))
    if weight is not None:
        y = multiply(y, channel(weight))
    if bias is not None:
        y = add(y, channel(bias))
    return cast(y, xt.dtype.value) if narrow else y
