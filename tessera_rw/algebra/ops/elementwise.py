"""Elementwise ops: arithmetic, comparisons, logic, unary math, activations, where, cast.

Binary ops broadcast like numpy. Transcendental unary ops on integers give float32.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.errors import DTypeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.shapes import broadcast_shapes


def _per_element(cost: int):
    def flops(out: TensorType, *operands: TensorType, **attrs) -> int:
        return cost * out.numel
    return flops


# ---- binary arithmetic --------------------------------------------------------------------

def _infer_arith(a: TensorType, b: TensorType) -> TensorType:
    return TensorType(broadcast_shapes(a.shape, b.shape), promote(a.dtype, b.dtype))


def _infer_true_div(a: TensorType, b: TensorType) -> TensorType:
    out = _infer_arith(a, b)
    dtype = out.dtype if (out.dtype.is_float or out.dtype.is_complex) else DType.float32
    return TensorType(out.shape, dtype)


def _infer_real_arith(a: TensorType, b: TensorType) -> TensorType:
    if a.dtype.is_complex or b.dtype.is_complex:
        raise DTypeError("complex operands have no order", hint="take op.real / op.abs first")
    return _infer_arith(a, b)


def _binary(name: str, infer, fn, cost: int = 1) -> OpDef:
    return OpDef(name, ("a", "b"), OpKind.ELEMENTWISE, infer, lambda a, b: fn(a, b), _per_element(cost))


ARITHMETIC = (
    _binary("add", _infer_arith, np.add),
    _binary("sub", _infer_arith, np.subtract),
    _binary("mul", _infer_arith, np.multiply),
    _binary("div", _infer_true_div, np.true_divide),
    _binary("pow", _infer_arith, np.power, cost=4),
    _binary("maximum", _infer_real_arith, np.maximum),
    _binary("minimum", _infer_real_arith, np.minimum),
)


# ---- comparisons and logic --------------------------------------------------------------

def _infer_compare(a: TensorType, b: TensorType) -> TensorType:
    return TensorType(broadcast_shapes(a.shape, b.shape), DType.bool)


def _infer_logical(a: TensorType, b: TensorType) -> TensorType:
    if a.dtype is not DType.bool or b.dtype is not DType.bool:
        raise DTypeError("logical ops take bool operands", hint="compare first, e.g. (x > 0)")
    return _infer_compare(a, b)


def _infer_not(x: TensorType) -> TensorType:
    if x.dtype is not DType.bool:
        raise DTypeError("logical_not takes a bool operand", hint="compare first, e.g. (x > 0)")
    return x


COMPARISONS = tuple(_binary(name, _infer_compare, fn) for name, fn in (
    ("eq", np.equal), ("ne", np.not_equal), ("lt", np.less),
    ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal)))

LOGIC = (
    _binary("logical_and", _infer_logical, np.logical_and),
    _binary("logical_or", _infer_logical, np.logical_or),
    OpDef("logical_not", ("x",), OpKind.ELEMENTWISE, _infer_not, np.logical_not, _per_element(1)),
)


# ---- unary math -----------------------------------------------------------------------

def _infer_same(x: TensorType) -> TensorType:
    if x.dtype is DType.bool:
        raise DTypeError("bool operands have no negation", hint="use ~x (logical_not) for bool masks")
    return x


def _infer_floating(x: TensorType) -> TensorType:
    if x.dtype.is_float or x.dtype.is_complex:
        return x
    return TensorType(x.shape, DType.float32)


def _infer_real_floating(x: TensorType) -> TensorType:
    if x.dtype.is_complex:
        raise DTypeError("this op is defined for real operands only")
    return _infer_floating(x)


def _infer_abs(x: TensorType) -> TensorType:
    if x.dtype.is_complex:
        return TensorType(x.shape, DType.float64 if x.dtype is DType.complex128 else DType.float32)
    return x


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return special.expit(x)


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    x = x if x.dtype.kind == "f" else x.astype(np.float32)
    if approximate == "tanh":
        c = np.sqrt(2.0 / np.pi).astype(x.dtype)
        return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0).astype(x.dtype)))


def _unary(name: str, infer, fn, cost: int = 1) -> OpDef:
    return OpDef(name, ("x",), OpKind.ELEMENTWISE, infer, fn, _per_element(cost))


UNARY = (
    _unary("neg", _infer_same, np.negative),
    _unary("abs", _infer_abs, np.abs),
    _unary("exp", _infer_floating, np.exp),
    _unary("log", _infer_floating, np.log),
    _unary("sqrt", _infer_floating, np.sqrt),
    _unary("rsqrt", _infer_floating, lambda x: 1.0 / np.sqrt(x), cost=2),
    _unary("reciprocal", _infer_floating, lambda x: 1.0 / x),
    _unary("tanh", _infer_floating, np.tanh),
    _unary("sin", _infer_floating, np.sin),
    _unary("cos", _infer_floating, np.cos),
    _unary("erf", _infer_real_floating, special.erf),
    _unary("sigmoid", _infer_real_floating, _sigmoid, cost=4),
    _unary("relu", _infer_real_floating, lambda x: np.maximum(x, 0).astype(x.dtype)),
    _unary("silu", _infer_real_floating, lambda x: x * _sigmoid(x), cost=5),
    OpDef("gelu", ("x",), OpKind.ELEMENTWISE, lambda x, approximate: _infer_real_floating(x),
          _gelu, lambda out, x, approximate: 8 * out.numel),
)


# ---- select and convert -------------------------------------------------------------------

def _infer_where(cond: TensorType, x: TensorType, y: TensorType) -> TensorType:
    if cond.dtype is not DType.bool:
        raise DTypeError(f"the condition must be bool, got {cond.dtype}", hint="compare first, e.g. (mask > 0)")
    return TensorType(broadcast_shapes(cond.shape, x.shape, y.shape), promote(x.dtype, y.dtype))


def _infer_cast(x: TensorType, dtype: DType) -> TensorType:
    if x.dtype.is_complex and not dtype.is_complex:
        raise DTypeError(f"casting {x.dtype} to {dtype} would drop the imaginary part",
                         hint="take op.real or op.abs first")
    return TensorType(x.shape, dtype)


SELECT = (
    OpDef("where", ("cond", "x", "y"), OpKind.ELEMENTWISE, _infer_where, np.where, _per_element(1)),
    OpDef("cast", ("x",), OpKind.ELEMENTWISE, _infer_cast, lambda x, dtype: x, exact=True),
)

DEFS = ARITHMETIC + COMPARISONS + LOGIC + UNARY + SELECT
