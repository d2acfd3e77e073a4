"""Reductions and row-wise normalizations: sum/mean/max/min, softmax, layernorm, rmsnorm."""

from __future__ import annotations

import math

from tessera_rw.algebra.api.dispatch import apply, flag, op_context, tensor_operand, type_of
from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.shapes import normalize_axes, normalize_axis


def _reduce(name: str, x, axis, keepdims: bool):
    x = tensor_operand(x)
    with op_context(name, (x,), ("x",)):
        axes = normalize_axes(axis, type_of(x).ndim if type_of(x) else 0)
        keepdims = flag("keepdims", keepdims)
    return apply(name, (x,), axes=axes, keepdims=keepdims)


def sum(x, axis=None, keepdims=False):  # noqa: A001  (numpy's name)
    """Sum over `axis` (None: all axes), as numpy.sum: `op.sum(x, axis=-1, keepdims=True)`."""
    return _reduce("sum", x, axis, keepdims)


def mean(x, axis=None, keepdims=False):
    """The mean over `axis` (None: all axes), as numpy.mean; of integers or bools it is float32,
    where numpy's is float64 (cast x to float64 first for that)."""
    return _reduce("mean", x, axis, keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    """The largest value over `axis` (None: all axes), as numpy.max; op.maximum is elementwise."""
    return _reduce("max", x, axis, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    """The smallest value over `axis` (None: all axes), as numpy.min; op.minimum is elementwise."""
    return _reduce("min", x, axis, keepdims)


def _row(name: str, x, axis: int):
    x = tensor_operand(x)
    with op_context(name, (x,), ("x",)):
        ax = normalize_axis(axis, type_of(x).ndim)
    return apply(name, (x,), axis=ax)


def softmax(x, axis: int = -1):
    """exp(x - max) / sum(exp(x - max)) along `axis`: `op.softmax(scores, axis=-1)`."""
    return _row("softmax", x, axis)


def log_softmax(x, axis: int = -1):
    """log(softmax(x)) along `axis`, computed as x − max − log Σ exp(x − max)."""
    return _row("log_softmax", x, axis)


def _norm(name: str, x, weight, bias, axis, eps: float):
    operands = [tensor_operand(x)] + [p for p in (weight, bias) if p is not None]
    with op_context(name, operands, ("x", "weight", "bias")):
        axes = normalize_axes(axis, type_of(operands[0]).ndim)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 <= eps < math.inf:
            raise AttributeValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return apply(name, operands, axes=axes, eps=float(eps),
                 has_weight=weight is not None, has_bias=bias is not None)


def layernorm(x, weight=None, bias=None, axis=-1, eps: float = 1e-5):
    """(x - mean) / sqrt(var + eps) over trailing `axis`, then * weight + bias (each optional)."""
    return _norm("layernorm", x, weight, bias, axis, eps)


def rmsnorm(x, weight=None, bias=None, axis=-1, eps: float = 1e-6):
    """x / sqrt(mean(x²) + eps) over trailing `axis`, then * weight + bias (each optional)."""
    return _norm("rmsnorm", x, weight, bias, axis, eps)
