"""Fused ops that rewrites produce: a GEMM with its epilogue.

gemm(a, b, [bias], [residual]) = act(scale · (a @ b) + bias) + residual, cast to `dtype`:
cuBLASLt's epilogue, one kernel instead of a matmul and a train of elementwise passes.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.elementwise import _gelu, _sigmoid
from tessera_rw.algebra.ops.linalg import _flops_matmul, _infer_matmul
from tessera_rw.algebra.shapes import broadcast_shapes, fmt_shape

ACTIVATIONS = {
    "none": lambda y: y,
    "relu": lambda y: np.maximum(y, 0).astype(y.dtype),
    "gelu": lambda y: _gelu(y, "none"),
    "gelu_tanh": lambda y: _gelu(y, "tanh"),
    "silu": lambda y: y * _sigmoid(y),
}


def _infer_gemm(a: TensorType, b: TensorType, *extra: TensorType, scale: float, activation: str,
                has_bias: bool, has_residual: bool, accum_dtype: DType | None, dtype: DType) -> TensorType:
    if activation not in ACTIVATIONS:
        raise AttributeValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if len(extra) != has_bias + has_residual:
        raise ShapeError(f"expects {has_bias + has_residual} epilogue operands, got {len(extra)}")
    mm = _infer_matmul(a, b, accum_dtype)
    for name, t in zip([n for n, on in (("bias", has_bias), ("residual", has_residual)) if on], extra):
        if broadcast_shapes(mm.shape, t.shape) != mm.shape:
            raise ShapeError(f"the {name} {fmt_shape(t.shape)} does not broadcast to the product {fmt_shape(mm.shape)}")
    return TensorType(mm.shape, dtype)


def _gemm(a: np.ndarray, b: np.ndarray, *extra: np.ndarray, scale: float, activation: str, has_bias: bool,
          has_residual: bool, accum_dtype, dtype) -> np.ndarray:
    y = np.matmul(a, b)
    if scale != 1.0:
        y = y * np.asarray(scale, y.dtype)
    rest = iter(extra)
    if has_bias:
        y = y + next(rest)
    y = ACTIVATIONS[activation](y)
    if has_residual:
        y = y + next(rest)
    return y


def _gemm_flops(out: TensorType, a: TensorType, b: TensorType, *extra: TensorType, activation: str,
                accum_dtype, **attrs) -> int:
    per_element = 1 + len(extra) + (8 if activation.startswith("gelu") else 4 if activation == "silu" else 1)
    return _flops_matmul(out, a, b, accum_dtype) + per_element * out.numel


DEFS = (
    OpDef("gemm", ("a", "b", "bias", "residual"), OpKind.MATMUL, _infer_gemm, _gemm, _gemm_flops, variadic=True,
          doc="act(scale · a @ b + bias) + residual in one kernel"),
)
