"""Elementwise ops: arithmetic, comparisons, logic, unary math, activations, where, cast.

Binary ops broadcast like numpy. Transcendental unary ops on integers give float32.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from tessera_rw.algebra.autodiff.cotangents import conj, no_cotangents, unbroadcast, zero
from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.errors import DTypeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.shapes import broadcast_shapes
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs


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


def _binary(name: str, infer, fn, cost: int = 1, vjp=None) -> OpDef:
    return OpDef(name, ("a", "b"), OpKind.ELEMENTWISE, infer, lambda a, b: fn(a, b), _per_element(cost),
                 vjp=vjp)


# VJPs: g is the result's cotangent, y the result; each cotangent is summed back to its operand's
# shape. Complex operands take g · conj(∂y/∂operand).

def _scalar_value(t) -> float | None:
    """The value of a traced scalar constant (an exponent written as a number), else None."""
    node = getattr(t, "node", None)
    if node is None or node.op != "constant" or not isinstance(node.attr_map["value"], (int, float)):
        return None
    return float(node.attr_map["value"])


def _pow_vjp(g, y, a, b):
    if y.dtype.is_complex:
        raise DTypeError("the VJP of pow is declared for real operands only", hint="write x * x for squares")
    # y = aᵇ: ∂y/∂a = b·aᵇ⁻¹, ∂y/∂b = y·log a (only asked for when the exponent is differentiated);
    # a⁰ = 1 whatever a, and 0ᵇ = 0 for every b > 0: both derivatives are 0 there, not 0·∞ (as JAX has them)
    below = a if _scalar_value(b) == 2.0 else api.power(a, b - 1)      # a square's: a, not a ** 1.0
    da = api.where(b == 0, 0.0, g * b * below)       # g · b first: a seed's constants fold
    db = api.where(a == 0, 0.0, g * y * api.log(a))
    return unbroadcast(da, a), unbroadcast(db, b)


def integer_power(a, b) -> np.ndarray:
    """np.power, but for an integer raised to a negative integer power, where numpy raises: 0, or
    ±1 for a base of ±1, as torch and the generated kernels compute it (1 / aⁿ truncated).

    >>> integer_power(np.array([2, 1, -1, -1, 0, 3], np.int32), np.array([-1, -5, -3, -2, -1, 2], np.int32)).tolist()
    [0, 1, -1, 1, 0, 9]
    """
    a, b = np.asarray(a), np.asarray(b)
    if not (np.issubdtype(np.result_type(a, b), np.integer) and (b < 0).any()):
        return np.power(a, b)
    negative = b < 0
    whole = np.power(a, np.where(negative, 0, b).astype(b.dtype))
    of_unit = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
    return np.where(negative, of_unit, whole).astype(whole.dtype)


def _select_larger(g, a, b):
    """The shares of a max's cotangent: all of it to the larger operand, half to each at a tie (as
    torch and JAX split it); b's is g minus a's, so the shares sum to g exactly."""
    ga = api.where(a > b, g, api.where(a == b, g * 0.5, zero(g)))
    return ga, g - ga


def _maximum_vjp(g, y, a, b):
    ga, gb = _select_larger(g, a, b)
    return unbroadcast(ga, a), unbroadcast(gb, b)


def _minimum_vjp(g, y, a, b):
    ga, gb = _select_larger(g, b, a)        # a wins where b >= a
    return unbroadcast(ga, a), unbroadcast(gb, b)


ARITHMETIC = (
    _binary("add", _infer_arith, np.add, vjp=lambda g, y, a, b: (unbroadcast(g, a), unbroadcast(g, b))),
    _binary("sub", _infer_arith, np.subtract, vjp=lambda g, y, a, b: (unbroadcast(g, a), unbroadcast(-g, b))),
    _binary("mul", _infer_arith, np.multiply,
            vjp=lambda g, y, a, b: (unbroadcast(g * conj(b), a), unbroadcast(g * conj(a), b))),
    # y = a / b: ∂y/∂a = 1/b, ∂y/∂b = -y/b
    _binary("div", _infer_true_div, np.true_divide,
            vjp=lambda g, y, a, b: (unbroadcast(g / conj(b), a), unbroadcast(-(g * conj(y / b)), b))),
    _binary("pow", _infer_arith, lambda a, b: integer_power(a, b), cost=4, vjp=_pow_vjp),
    _binary("maximum", _infer_real_arith, np.maximum, vjp=_maximum_vjp),
    _binary("minimum", _infer_real_arith, np.minimum, vjp=_minimum_vjp),
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


def _in_promoted_type(fn):
    """A comparison made in the type its operands promote to (an int32 tensor against a float literal:
    float32 both, as torch and JAX compare), not numpy's float64 for a mixed pair."""
    def compare(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        common = promote(DType.parse(a.dtype), DType.parse(b.dtype)).numpy
        return fn(a.astype(common, copy=False), b.astype(common, copy=False))
    return compare


COMPARISONS = tuple(_binary(name, _infer_compare, _in_promoted_type(fn), vjp=no_cotangents) for name, fn in (
    ("eq", np.equal), ("ne", np.not_equal), ("lt", np.less),
    ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal)))

LOGIC = (
    _binary("logical_and", _infer_logical, np.logical_and, vjp=no_cotangents),
    _binary("logical_or", _infer_logical, np.logical_or, vjp=no_cotangents),
    OpDef("logical_not", ("x",), OpKind.ELEMENTWISE, _infer_not, np.logical_not, _per_element(1),
          vjp=no_cotangents),
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


def _infer_relu(x: TensorType) -> TensorType:
    """An integer tensor's relu keeps its type, as maximum(x, 0) and torch's relu do; a bool one, as
    other float ops, is float32."""
    if x.dtype.is_integer:
        return x
    return _infer_real_floating(x)


def _infer_abs(x: TensorType) -> TensorType:
    if x.dtype.is_complex:
        return TensorType(x.shape, DType.float64 if x.dtype is DType.complex128 else DType.float32)
    return x


def sigmoid_reference(x: np.ndarray) -> np.ndarray:
    return special.expit(x)


def gelu_reference(x: np.ndarray, approximate: str) -> np.ndarray:
    x = x if x.dtype.kind == "f" else x.astype(np.float32)
    if approximate == "tanh":
        c = np.sqrt(2.0 / np.pi).astype(x.dtype)
        return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0).astype(x.dtype)))


def _unary(name: str, infer, fn, cost: int = 1, vjp=None) -> OpDef:
    return OpDef(name, ("x",), OpKind.ELEMENTWISE, infer, fn, _per_element(cost), vjp=vjp)


def _in_float32(fn):
    """`fn` of a bool or integer array computed in float32, the result's type (numpy would compute
    exp of a bool array in float16, and of an int8 one too)."""
    return lambda x: fn(x if x.dtype.kind in "fc" else x.astype(np.float32))


# Unary VJPs from the operand x and the result y; written without scalar constants where the op
# takes complex operands (the cotangent algebra keeps complex constants out of graphs).

def _abs_vjp(g, y, x):
    if x.dtype.is_complex:          # |z| = sqrt(z conj z): the cotangent points along z; 0 at z = 0
        return (api.cast(g, x.dtype) * x / api.cast(api.where(y == 0, 1.0, y), x.dtype),)
    return (api.where(x > 0, g, api.where(x < 0, -g, zero(g))),)   # sign(x), 0 at the kink


def relu_cotangent(g, x):
    return api.where(x > 0, g, zero(g))


def gelu_cotangent(g, x):
    cdf = 0.5 * (1.0 + api.erf(x * float(np.sqrt(0.5))))        # y = x Φ(x): y' = Φ(x) + x φ(x)
    pdf = api.exp(-0.5 * x * x) * float(1 / np.sqrt(2 * np.pi))
    return g * (cdf + x * pdf)


def gelu_tanh_cotangent(g, x):
    c = float(np.sqrt(2.0 / np.pi))  # y = x/2 · (1 + tanh u), u = c (x + 0.044715 x³)
    t = api.tanh(c * (x + 0.044715 * x * x * x))
    du = c * (1.0 + 3 * 0.044715 * x * x)
    return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


def silu_cotangent(g, x):
    s = api.sigmoid(x)              # y = x σ(x): y' = σ (1 + x (1 - σ))
    return g * (s * (1.0 + x * (1.0 - s)))


# g · act'(x), the cotangent of x for y = act(x), exactly as the VJPs below build it: the epilogue
# rules that fold it into a GEMM (rules/library/activation_gradient.py) match this spelling.
ACTIVATION_COTANGENTS = {"relu": relu_cotangent, "gelu": gelu_cotangent, "gelu_tanh": gelu_tanh_cotangent,
                         "silu": silu_cotangent}


def activation_derivative(name: str, x: np.ndarray) -> np.ndarray:
    """act'(x) in numpy, for the activations of ACTIVATION_COTANGENTS (relu' is 0 at 0)."""
    x = x if x.dtype.kind == "f" else x.astype(np.float32)
    if name == "relu":
        return (x > 0).astype(x.dtype)
    if name == "silu":
        s = sigmoid_reference(x)
        return s * (1 + x * (1 - s))
    if name == "gelu":
        pdf = np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi).astype(x.dtype)
        return 0.5 * (1 + special.erf(x / np.sqrt(2.0).astype(x.dtype))) + x * pdf
    if name == "gelu_tanh":
        c = np.sqrt(2.0 / np.pi).astype(x.dtype)
        t = np.tanh(c * (x + 0.044715 * x * x * x))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
    raise ValueError(f"no derivative for activation {name!r}; known: {sorted(ACTIVATION_COTANGENTS)}")


def _gelu_vjp(g, y, x, approximate):
    return ((gelu_tanh_cotangent if approximate == "tanh" else gelu_cotangent)(g, x),)


UNARY = (
    _unary("neg", _infer_same, np.negative, vjp=lambda g, y, x: (-g,)),
    _unary("abs", _infer_abs, np.abs, vjp=_abs_vjp),
    _unary("exp", _infer_floating, _in_float32(np.exp), vjp=lambda g, y, x: (g * conj(y),)),
    _unary("log", _infer_floating, _in_float32(np.log), vjp=lambda g, y, x: (g / conj(x),)),
    _unary("sqrt", _infer_floating, _in_float32(np.sqrt), vjp=lambda g, y, x: (g / conj(y + y),)),
    # y = x^(-1/2): y' = -y / (2x)
    _unary("rsqrt", _infer_floating, _in_float32(lambda x: 1.0 / np.sqrt(x)), cost=2,
           vjp=lambda g, y, x: (-(g * conj(y / (x + x))),)),
    _unary("reciprocal", _infer_floating, _in_float32(lambda x: 1.0 / x), vjp=lambda g, y, x: (-(g * conj(y * y)),)),
    _unary("tanh", _infer_floating, _in_float32(np.tanh), vjp=lambda g, y, x: (g - g * conj(y * y),)),
    _unary("sin", _infer_floating, _in_float32(np.sin), vjp=lambda g, y, x: (g * conj(api.cos(x)),)),
    _unary("cos", _infer_floating, _in_float32(np.cos), vjp=lambda g, y, x: (-(g * conj(api.sin(x))),)),
    _unary("erf", _infer_real_floating, special.erf,
           vjp=lambda g, y, x: (g * float(2 / np.sqrt(np.pi)) * api.exp(-(x * x)),)),
    _unary("sigmoid", _infer_real_floating, sigmoid_reference, cost=4, vjp=lambda g, y, x: (g * y * (1.0 - y),)),
    _unary("relu", _infer_relu, lambda x: np.maximum(x, 0).astype(x.dtype),
           vjp=lambda g, y, x: (relu_cotangent(g, x),)),
    _unary("silu", _infer_real_floating, lambda x: x * sigmoid_reference(x), cost=5,
           vjp=lambda g, y, x: (silu_cotangent(g, x),)),
    OpDef("gelu", ("x",), OpKind.ELEMENTWISE, lambda x, approximate: _infer_real_floating(x),
          gelu_reference, lambda out, x, approximate: 8 * out.numel, vjp=_gelu_vjp),
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


def _where_vjp(g, out, cond, x, y):
    return None, unbroadcast(api.where(cond, g, zero(g)), x), unbroadcast(api.where(cond, zero(g), g), y)


SELECT = (
    OpDef("where", ("cond", "x", "y"), OpKind.ELEMENTWISE, _infer_where, np.where, _per_element(1),
          vjp=_where_vjp),
    # the cotangent is converted back to x's dtype (a real x of a complex cast takes the real part)
    OpDef("cast", ("x",), OpKind.ELEMENTWISE, _infer_cast, lambda x, dtype: x, exact=True,
          vjp=lambda g, y, x, dtype: (unbroadcast(g, x),)),
    # x itself, through which no gradient flows (a value the result does not depend on, however it
    # is computed: a batch norm's shift); the rewrites drop it
    OpDef("stop_gradient", ("x",), OpKind.ELEMENTWISE, lambda x: x, lambda x: x, exact=True, vjp=no_cotangents),
)

DEFS = ARITHMETIC + COMPARISONS + LOGIC + UNARY + SELECT
