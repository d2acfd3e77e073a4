"""Reductions (sum, max, min, mean) and the row-wise normalizations built on them.

softmax / log_softmax normalize along one axis; layernorm / rmsnorm along trailing axes, with an
optional weight and bias of the normalized shape (`has_weight` / `has_bias` say which operands
follow x).
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AxisError, DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.shapes import fmt_shape


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _check_axes(x: TensorType, axes: tuple[int, ...]) -> None:
    if any(not 0 <= a < x.ndim for a in axes):
        raise AxisError(f"axes {axes} do not fit a tensor of rank {x.ndim}")


def _reduction(name: str, fn, result_dtype) -> OpDef:
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
        return x.numel

    return OpDef(name, ("x",), OpKind.REDUCTION, infer, reference, flops)


def _sum_dtype(dtype: DType) -> DType:
    return DType.int64 if dtype in (DType.bool, DType.int32) else dtype  # as numpy: no silent overflow


def _mean_dtype(dtype: DType) -> DType:
    return dtype if (dtype.is_float or dtype.is_complex) else DType.float32


REDUCTIONS = (
    _reduction("sum", np.sum, _sum_dtype),
    _reduction("mean", np.mean, _mean_dtype),
    _reduction("max", np.max, lambda d: d),
    _reduction("min", np.min, lambda d: d),
)


# ---- row-wise normalizations ---------------------------------------------------------------

def _infer_row(x: TensorType, axis: int) -> TensorType:
    if not 0 <= axis < x.ndim:
        raise AxisError(f"axis {axis} does not fit a tensor of rank {x.ndim}")
    if not x.dtype.is_float:
        raise DTypeError(f"needs a floating-point operand, got {x.dtype}", hint="cast first")
    return x


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _infer_norm(x: TensorType, *params: TensorType, axes: tuple[int, ...], eps: float,
                has_weight: bool, has_bias: bool) -> TensorType:
    if len(params) != has_weight + has_bias:
        raise ShapeError(f"expected {has_weight + has_bias} parameter operands, got {len(params)}")
    _check_axes(x, axes)
    if axes != tuple(range(x.ndim - len(axes), x.ndim)) or not axes:
        raise AxisError(f"normalizes over trailing axes only, got axes {axes} of a rank-{x.ndim} tensor",
                        hint="move the axes to the end with op.transpose first")
    if not x.dtype.is_float:
        raise DTypeError(f"needs a floating-point operand, got {x.dtype}", hint="cast first")
    if not eps >= 0:
        raise ShapeError(f"eps must be >= 0, got {eps}")
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


NORMALIZATIONS = (
    OpDef("softmax", ("x",), OpKind.NORMALIZATION, _infer_row, _softmax, lambda out, x, axis: 5 * x.numel),
    OpDef("log_softmax", ("x",), OpKind.NORMALIZATION, _infer_row, _log_softmax,
          lambda out, x, axis: 5 * x.numel),
    OpDef("layernorm", ("x", "weight", "bias"), OpKind.NORMALIZATION, _infer_norm, _layernorm,
          _norm_flops(7), variadic=True),
    OpDef("rmsnorm", ("x", "weight", "bias"), OpKind.NORMALIZATION, _infer_norm, _rmsnorm,
          _norm_flops(4), variadic=True),
)

DEFS = REDUCTIONS + NORMALIZATIONS
