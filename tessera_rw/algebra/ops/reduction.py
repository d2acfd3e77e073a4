"""Reductions (sum, max, min, mean, logsumexp) and the row-wise normalizations built on them.

softmax / log_softmax normalize along one axis; layernorm / rmsnorm along trailing axes, with an
optional weight and bias of the normalized shape (`has_weight` / `has_bias` say which operands
follow x).
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import expand_reduced, scaled, unbroadcast
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AxisError, DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.shapes import fmt_shape
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _check_axes(x: TensorType, axes: tuple[int, ...]) -> None:
    if any(not 0 <= a < x.ndim for a in axes):
        raise AxisError(f"axes {axes} do not fit a tensor of rank {x.ndim}")


def _reduction(name: str, fn, result_dtype, vjp, per_element: int = 1) -> OpDef:
    def infer(x: TensorType, axes: tuple[int, ...], keepdims: bool) -> TensorType:
        _check_axes(x, axes)
        if x.dtype.is_complex and name in ("max", "min"):
            raise DTypeError("complex values have no order")
        if name in ("max", "min") and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"{name} over an empty axis has no identity")
        return TensorType(reduced_shape(x.shape, axes, keepdims), result_dtype(x.dtype))

    def reference(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return fn(x, axis=axes, keepdims=keepdims)

    def flops(out: TensorType, x: TensorType, **attrs) -> int:
        return per_element * x.numel

    return OpDef(name, ("x",), OpKind.REDUCTION, infer, reference, flops, vjp=vjp)


def _sum_dtype(dtype: DType) -> DType:
    return DType.int64 if dtype in (DType.bool, DType.int32) else dtype  # as numpy: no silent overflow


def _mean_dtype(dtype: DType) -> DType:
    return dtype if (dtype.is_float or dtype.is_complex) else DType.float32


def _sum_vjp(g, y, x, axes, keepdims):
    return (unbroadcast(expand_reduced(g, x.shape, axes), x),)


def _mean_vjp(g, y, x, axes, keepdims):
    count = int(np.prod([x.shape[a] for a in axes]))
    return (unbroadcast(scaled(expand_reduced(g, x.shape, axes), 1.0 / max(count, 1)), x),)


def _extremum_vjp(g, y, x, axes, keepdims):
    """The cotangent goes to the elements that attained the max (or min), shared equally by ties.
    A 16-bit x is compared as stored, rounded to its dtype: a fused kernel computes it wide (x·s in
    float32), where the max it is compared with was rounded as it was written."""
    stored = api.cast(api.cast(x, "float32"), x.dtype.value) if x.dtype.is_low_precision and x.dtype.is_float else x
    hit = api.cast(api.equal(stored, expand_reduced(y, x.shape, axes)), g.dtype)
    ties = expand_reduced(api.sum(hit, axis=axes, keepdims=True), x.shape, axes)
    return (unbroadcast(expand_reduced(g, x.shape, axes) * hit / ties, x),)


def _logsumexp(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """log Σ exp(x) from x - max, as scipy.special.logsumexp: an infinite peak shifts by 0, so a row
    of -inf gives -inf and one holding +inf gives +inf (NaN where it holds NaN too)."""
    peak = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    peak = np.where(np.isfinite(peak), peak, 0).astype(x.dtype)
    with np.errstate(divide="ignore", over="ignore"):
        total = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True)) + peak
    return total if keepdims else np.squeeze(total, axis)


def _logsumexp_dtype(dtype: DType) -> DType:
    if not dtype.is_float:
        raise DTypeError(f"needs a floating-point operand, got {dtype}",
                         hint="op.logsumexp casts bools and integers to float32 itself")
    return dtype


def _logsumexp_vjp(g, y, x, axes, keepdims):
    # ∂y/∂x_i = exp(x_i - y): dx = g · softmax(x) over the reduced axes
    return (expand_reduced(g, x.shape, axes) * api.exp(x - expand_reduced(y, x.shape, axes)),)


REDUCTIONS = (
    _reduction("sum", np.sum, _sum_dtype, _sum_vjp),
    _reduction("mean", np.mean, _mean_dtype, _mean_vjp),
    _reduction("max", np.max, lambda d: d, _extremum_vjp),
    _reduction("min", np.min, lambda d: d, _extremum_vjp),
    _reduction("logsumexp", _logsumexp, _logsumexp_dtype, _logsumexp_vjp, per_element=4),   # max, sub, exp, add
)


# ---- row-wise normalizations ---------------------------------------------------------------

def _infer_row(x: TensorType, axis: int) -> TensorType:
    if not 0 <= axis < x.ndim:
        raise AxisError(f"axis {axis} does not fit a tensor of rank {x.ndim}")
    if not x.dtype.is_float:
        raise DTypeError(f"needs a floating-point operand, got {x.dtype}", hint="cast first")
    return x


def _row_max(x: np.ndarray, axis: int) -> np.ndarray:
    """The max along `axis`, kept as a size-1 axis (−inf over an empty one, whose softmax is empty)."""
    return np.max(x, axis=axis, keepdims=True, initial=-np.inf)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - _row_max(x, axis)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - _row_max(x, axis)
    with np.errstate(divide="ignore"):            # an empty row's log Σ is −inf, over nothing
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def infer_norm(x: TensorType, *params: TensorType, axes: tuple[int, ...], eps: float,
                has_weight: bool, has_bias: bool) -> TensorType:
    if len(params) != has_weight + has_bias:
        raise ShapeError(f"expected {has_weight + has_bias} parameter operands, got {len(params)}")
    _check_axes(x, axes)
    if axes != tuple(range(x.ndim - len(axes), x.ndim)) or not axes:
        raise AxisError(f"normalizes over trailing axes only, got axes {axes} of a rank-{x.ndim} tensor",
                        hint="move the axes to the end with op.transpose first")
    if not x.dtype.is_float:
        raise DTypeError(f"needs a floating-point operand, got {x.dtype}", hint="cast first")
    if not 0 <= eps < math.inf:
        raise ShapeError(f"eps must be a finite number >= 0, got {eps}")
    normalized = tuple(x.shape[a] for a in axes)
    names = [n for n, present in (("weight", has_weight), ("bias", has_bias)) if present]
    for name, p in zip(names, params):
        if p.shape != normalized:
            raise ShapeError(f"{name} has shape {fmt_shape(p.shape)}, expected the normalized "
                             f"shape {fmt_shape(normalized)}")
    return x


def _affine(y: np.ndarray, params: tuple[np.ndarray, ...], has_weight: bool, has_bias: bool) -> np.ndarray:
    it = iter(params)
    if has_weight:
        y = y * next(it)
    if has_bias:
        y = y + next(it)
    return y


def _layernorm(x: np.ndarray, *params: np.ndarray, axes, eps, has_weight, has_bias) -> np.ndarray:
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    return _affine(centered / np.sqrt(var + np.asarray(eps, x.dtype)), params, has_weight, has_bias)


def _rmsnorm(x: np.ndarray, *params: np.ndarray, axes, eps, has_weight, has_bias) -> np.ndarray:
    ms = np.mean(x * x, axis=axes, keepdims=True)
    return _affine(x / np.sqrt(ms + np.asarray(eps, x.dtype)), params, has_weight, has_bias)


def _norm_flops(per_element: int):
    def flops(out: TensorType, x: TensorType, *params: TensorType, **attrs) -> int:
        return per_element * x.numel + sum(2 * x.numel for _ in params)
    return flops


# ---- their VJPs ------------------------------------------------------------------------------

def _softmax_vjp(g, y, x, axis):
    # ∂y_i/∂x_j = y_i (δ_ij - y_j): dx = y · (g - Σ g y)
    return (y * (g - api.sum(g * y, axis=axis, keepdims=True)),)


def _log_softmax_vjp(g, y, x, axis):
    # ∂y_i/∂x_j = δ_ij - softmax_j: dx = g - exp(y) Σ g
    return (g - api.exp(y) * api.sum(g, axis=axis, keepdims=True),)


def norm_input_grad(gxhat, x, *, norm: str, axes: tuple[int, ...], eps: float):
    """(dx, x̂, r) of a layernorm or rmsnorm over `axes` given the cotangent of x̂, in ops: the VJPs
    below, and the pattern the `gradient` ruleset fuses into one norm_backward (norm_backward.py).

    layernorm: x̂ = (x - μ) r with r = 1/sqrt(var + eps): dx = r (gx̂ - mean(gx̂) - x̂ mean(gx̂ x̂))
    rmsnorm:   x̂ = x r with r = 1/sqrt(mean(x²) + eps):   dx = r (gx̂ - x̂ mean(gx̂ x̂))
    """
    def mean(t):
        return api.mean(t, axis=axes, keepdims=True)
    if norm == "layernorm":
        centered = x - mean(x)
        rstd = api.rsqrt(mean(centered * centered) + eps)
        xhat = centered * rstd
        return rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)), xhat, rstd
    rstd = api.rsqrt(mean(x * x) + eps)
    xhat = x * rstd
    return rstd * (gxhat - xhat * mean(gxhat * xhat)), xhat, rstd


def _norm_vjp(norm: str):
    def vjp(g, y, x, *params, axes, eps, has_weight, has_bias):
        it = iter(params)
        weight = next(it) if has_weight else None
        gxhat = g * weight if has_weight else g
        dx, xhat, _ = norm_input_grad(gxhat, x, norm=norm, axes=axes, eps=eps)
        grads = [unbroadcast(g * xhat, weight)] if has_weight else []
        if has_bias:
            grads.append(unbroadcast(g, next(it)))
        return (unbroadcast(dx, x), *grads)
    return vjp


NORMALIZATIONS = (
    OpDef("softmax", ("x",), OpKind.NORMALIZATION, _infer_row, _softmax, lambda out, x, axis: 5 * x.numel,
          vjp=_softmax_vjp),
    OpDef("log_softmax", ("x",), OpKind.NORMALIZATION, _infer_row, _log_softmax,
          lambda out, x, axis: 5 * x.numel, vjp=_log_softmax_vjp),
    OpDef("layernorm", ("x", "weight", "bias"), OpKind.NORMALIZATION, infer_norm, _layernorm,
          _norm_flops(7), variadic=True, vjp=_norm_vjp("layernorm")),
    OpDef("rmsnorm", ("x", "weight", "bias"), OpKind.NORMALIZATION, infer_norm, _rmsnorm,
          _norm_flops(4), variadic=True, vjp=_norm_vjp("rmsnorm")),
)

DEFS = REDUCTIONS + NORMALIZATIONS
