"""The GEMMs rewrites produce: a product with its epilogue, and one that also sums a bias gradient.

gemm(a, b, [bias], [aux], [residual]) = act(scale · (a @ b) + bias) + residual, cast to `dtype`:
cuBLASLt's epilogue, one kernel instead of a matmul and a train of elementwise passes. A backward
pass's activation derivative is an epilogue too (cuBLASLt's DGELU/DRELU): with activation
"d<act>", act is replaced by y · act'(aux), aux being the pre-activation saved or recomputed from
the forward pass. `trans_a` / `trans_b` say an operand is stored transposed: the product reads
a [..., K, M] array as its [..., M, K] A (cuBLAS's op(A) = Aᵀ), so a transpose feeding a GEMM costs
no copy.

gemm_pre_act(a, b, [bias]) = stack(pre, act(pre)), pre = scale · (a @ b) + bias, of shape
[2, …, M, N]: a layer whose pre-activation a backward pass reads (a GELU MLP's dgelu) writes it
and the activation from one epilogue (cuBLASLt's GELU_AUX) instead of the GEMM writing pre and an
elementwise pass reading it back to write act(pre).

gated_gemm(a, b, [bias], gate) = act(scale · (a @ b) + bias) · gate: a gated unit's product times
its gate (SwiGLU's up projection times silu of the gate projection, which the gate's own GEMM
writes), the product never written on its own.

matmul_bias_grad(a, b) = [a; 1ᵀ] @ b, of shape [M+1, N]: rows 0..M-1 are a @ b and row M is
Σ_k b[k, :]. In a linear layer's backward pass (a = Xᵀ, b = dY) that last row is the bias
gradient, which the weight-gradient GEMM produces for one more row of A (a virtual row of ones,
cuBLASLt's BGRADB epilogue) instead of a second pass over dY.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError, DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.elementwise import (ACTIVATION_COTANGENTS, activation_derivative, gelu_reference,
                                                sigmoid_reference)
from tessera_rw.algebra.ops.linalg import matmul_flops, infer_matmul, read_as
from tessera_rw.algebra.shapes import broadcast_shapes, fmt_shape

ACTIVATIONS = {
    "none": lambda y: y,
    "relu": lambda y: np.maximum(y, 0).astype(y.dtype),
    "gelu": lambda y: gelu_reference(y, "none"),
    "gelu_tanh": lambda y: gelu_reference(y, "tanh"),
    "silu": lambda y: y * sigmoid_reference(y),
}
# "d<act>": y · act'(aux), the backward of y = act(aux)
DERIVATIVES = {f"d{name}": name for name in ACTIVATION_COTANGENTS}
_ACTIVATION_FLOPS = {"none": 0, "silu": 4, "gelu": 8, "gelu_tanh": 8}          # per element; others 1


def takes_aux(activation: str) -> bool:
    """Whether a gemm's activation reads an aux operand (the derivatives do)."""
    return activation in DERIVATIVES


def epilogue_operands(has_bias: bool, activation: str, has_residual: bool) -> tuple[str, ...]:
    """The names of a gemm's operands after a and b, in order."""
    return tuple(name for name, on in (("bias", has_bias), ("aux", takes_aux(activation)),
                                       ("residual", has_residual)) if on)


def _infer_gemm(a: TensorType, b: TensorType, *extra: TensorType, scale: float, activation: str,
                has_bias: bool, has_residual: bool, accum_dtype: DType | None, dtype: DType,
                trans_a: bool = False, trans_b: bool = False) -> TensorType:
    if activation not in ACTIVATIONS and activation not in DERIVATIVES:
        raise AttributeValueError(f"activation must be one of {sorted(ACTIVATIONS) + sorted(DERIVATIVES)}, "
                                  f"got {activation!r}")
    return _epilogue_type(read_as(a, trans_a, "a"), read_as(b, trans_b, "b"), extra,
                          epilogue_operands(has_bias, activation, has_residual), accum_dtype, dtype)


def _epilogue_type(a: TensorType, b: TensorType, extra: tuple[TensorType, ...], names: tuple[str, ...],
                   accum_dtype: DType | None, dtype: DType) -> TensorType:
    """The product's type, each epilogue operand (`names`) checked to broadcast to it."""
    if len(extra) != len(names):
        raise ShapeError(f"expects {len(names)} epilogue operand(s) {list(names)}, got {len(extra)}")
    mm = infer_matmul(a, b, accum_dtype)
    for name, t in zip(names, extra):
        try:
            fits = broadcast_shapes(mm.shape, t.shape) == mm.shape
        except ShapeError:
            fits = False
        if not fits:
            raise ShapeError(f"the {name} {fmt_shape(t.shape)} does not broadcast to the product {fmt_shape(mm.shape)}",
                             hint=f"give the {name} the product's shape, or 1 where it repeats")
    return TensorType(mm.shape, dtype)


def _gemm(a: np.ndarray, b: np.ndarray, *extra: np.ndarray, scale: float, activation: str, has_bias: bool,
          has_residual: bool, accum_dtype, dtype, trans_a: bool = False, trans_b: bool = False) -> np.ndarray:
    y = np.matmul(np.swapaxes(a, -1, -2) if trans_a else a, np.swapaxes(b, -1, -2) if trans_b else b)
    if scale != 1.0:
        y = y * np.asarray(scale, y.dtype)
    rest = iter(extra)
    if has_bias:
        y = y + next(rest)
    if takes_aux(activation):
        y = y * activation_derivative(DERIVATIVES[activation], next(rest)).astype(y.dtype)
    else:
        y = ACTIVATIONS[activation](y)
    if has_residual:
        y = y + next(rest)
    return y


def _gemm_flops(out: TensorType, a: TensorType, b: TensorType, *extra: TensorType, scale: float, activation: str,
                accum_dtype, trans_a: bool = False, trans_b: bool = False, **attrs) -> int:
    """The product's, and per output element the epilogue's: the scale unless 1, an add per bias or
    residual, the activation (its derivative's times the aux it reads)."""
    act = _ACTIVATION_FLOPS.get(DERIVATIVES.get(activation, activation), 1) + takes_aux(activation)
    product = matmul_flops(out, read_as(a, trans_a), read_as(b, trans_b), accum_dtype)
    return product + ((scale != 1.0) + len(extra) + act) * out.numel


def _infer_gemm_pre_act(a: TensorType, b: TensorType, *bias: TensorType, scale: float, activation: str,
                        has_bias: bool, accum_dtype: DType | None, dtype: DType, trans_a: bool = False,
                        trans_b: bool = False) -> TensorType:
    if activation not in ACTIVATIONS or activation == "none":
        raise AttributeValueError(f"activation must be one of {sorted(set(ACTIVATIONS) - {'none'})}, got {activation!r}",
                                  hint="a product without an activation has no pre-activation to keep: use gemm")
    out = _infer_gemm(a, b, *bias, scale=scale, activation="none", has_bias=has_bias, has_residual=False,
                      accum_dtype=accum_dtype, dtype=dtype, trans_a=trans_a, trans_b=trans_b)
    return TensorType((2, *out.shape), out.dtype)


def _gemm_pre_act(a: np.ndarray, b: np.ndarray, *bias: np.ndarray, activation: str, dtype, **attrs) -> np.ndarray:
    pre = _gemm(a, b, *bias, activation="none", has_residual=False, dtype=dtype, **attrs)
    return np.stack([pre, ACTIVATIONS[activation](pre)])


def _gemm_pre_act_flops(out: TensorType, *operands: TensorType, **attrs) -> int:
    return _gemm_flops(TensorType(out.shape[1:], out.dtype), *operands, **attrs)


def _infer_gated_gemm(a: TensorType, b: TensorType, *extra: TensorType, scale: float, activation: str,
                      has_bias: bool, accum_dtype: DType | None, dtype: DType, trans_a: bool = False,
                      trans_b: bool = False) -> TensorType:
    if activation not in ACTIVATIONS:
        raise AttributeValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return _epilogue_type(read_as(a, trans_a, "a"), read_as(b, trans_b, "b"), extra,
                          ("bias", "gate") if has_bias else ("gate",), accum_dtype, dtype)


def _gated_gemm(a: np.ndarray, b: np.ndarray, *extra: np.ndarray, **attrs) -> np.ndarray:
    *bias, gate = extra
    return _gemm(a, b, *bias, has_residual=False, **attrs) * gate


def _infer_matmul_bias_grad(a: TensorType, b: TensorType, accum_dtype: DType | None,
                            trans_a: bool = False, trans_b: bool = False) -> TensorType:
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"takes 2-d operands a [M, K] and b [K, N], got {fmt_shape(a.shape)} "
                         f"and {fmt_shape(b.shape)}",
                         hint="flatten leading batch dims into K first (reshape a to [M, B·K], b to [B·K, N])")
    if a.dtype is not b.dtype or not a.dtype.is_float:
        raise DTypeError(f"takes two operands of one floating-point dtype, got {a.dtype} and {b.dtype}",
                         hint="cast both operands to one float dtype (e.g. op.cast(x, 'bfloat16'))")
    mm = infer_matmul(read_as(a, trans_a, "a"), read_as(b, trans_b, "b"), accum_dtype)
    return TensorType((mm.shape[0] + 1, mm.shape[1]), mm.dtype)


def _matmul_bias_grad(a: np.ndarray, b: np.ndarray, accum_dtype, trans_a: bool = False,
                      trans_b: bool = False) -> np.ndarray:
    a, b = (a.T if trans_a else a), (b.T if trans_b else b)
    return np.matmul(np.concatenate([a, np.ones((1, a.shape[1]), a.dtype)]), b)


def _matmul_bias_grad_flops(out: TensorType, a: TensorType, b: TensorType, accum_dtype,
                            trans_a: bool = False, trans_b: bool = False) -> int:
    (m, k), n = read_as(a, trans_a).shape, read_as(b, trans_b).shape[1]
    return 2 * m * n * k + k * n


DEFS = (
    OpDef("gemm", ("a", "b", "bias", "aux", "residual"), OpKind.MATMUL, _infer_gemm, _gemm, _gemm_flops,
          variadic=True, doc="act(scale · a @ b + bias) + residual in one kernel; act may be a derivative "
                             "d<act>: (…) · act'(aux)", vjp=before_fusion("gemm")),
    OpDef("gemm_pre_act", ("a", "b", "bias"), OpKind.MATMUL, _infer_gemm_pre_act, _gemm_pre_act,
          _gemm_pre_act_flops, variadic=True, vjp=before_fusion("gemm_pre_act"),
          doc="stack(pre, act(pre)), pre = scale · a @ b + bias: a product writing its pre-activation and "
              "its activation from one epilogue"),
    OpDef("gated_gemm", ("a", "b", "bias", "gate"), OpKind.MATMUL, _infer_gated_gemm, _gated_gemm, _gemm_flops,
          variadic=True, vjp=before_fusion("gated_gemm"),
          doc="act(scale · a @ b + bias) · gate in one kernel: a gated unit's product times its gate"),
    OpDef("matmul_bias_grad", ("a", "b"), OpKind.MATMUL, _infer_matmul_bias_grad, _matmul_bias_grad,
          _matmul_bias_grad_flops, doc="[a; 1ᵀ] @ b: a @ b with the column sums of b as one more row",
          vjp=before_fusion("matmul_bias_grad")),
)
