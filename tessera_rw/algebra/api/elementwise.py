"""Elementwise op functions: numpy names (add, multiply, ...) plus the activations torch has.

>>> import numpy as np
>>> maximum(np.array([1.0, -2.0], np.float32), 0.0), sigmoid(np.float32([0.0]))
(array([1., 0.], dtype=float32), array([0.5], dtype=float32))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera_rw.algebra.api.dispatch import apply, op_context, type_of
from tessera_rw.algebra.builder import user_site
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError, DTypeError


def add(a, b): return apply("add", (a, b))
def subtract(a, b): return apply("sub", (a, b))
def multiply(a, b): return apply("mul", (a, b))
def divide(a, b): return apply("div", (a, b))
def power(a, b):
    """aᵇ. An integer tensor to a negative integer constant raises, as numpy and torch do: the result
    is no integer (a tensor exponent follows torch: 1 / aⁿ truncated)."""
    if isinstance(b, (int, np.integer)) and not isinstance(b, (bool, np.bool_)) and b < 0 \
            and (t := type_of(a)) is not None and t.dtype.is_integer:
        raise DTypeError(f"an integer tensor ({t}) to the negative power {b} is not an integer", op="pow",
                         site=user_site(), hint="cast the base to a float dtype first (op.cast(x, 'float32'))")
    return apply("pow", (a, b))
def maximum(a, b): return apply("maximum", (a, b))
def minimum(a, b): return apply("minimum", (a, b))
def equal(a, b): return apply("eq", (a, b))
def not_equal(a, b): return apply("ne", (a, b))
def less(a, b): return apply("lt", (a, b))
def less_equal(a, b): return apply("le", (a, b))
def greater(a, b): return apply("gt", (a, b))
def greater_equal(a, b): return apply("ge", (a, b))
def logical_and(a, b): return apply("logical_and", (a, b))
def logical_or(a, b): return apply("logical_or", (a, b))
def logical_not(x): return apply("logical_not", (x,))

def negative(x): return apply("neg", (x,))
def abs(x): return apply("abs", (x,))  # noqa: A001  (numpy's name)
def exp(x): return apply("exp", (x,))
def log(x): return apply("log", (x,))
def sqrt(x): return apply("sqrt", (x,))
def rsqrt(x): return apply("rsqrt", (x,))
def reciprocal(x): return apply("reciprocal", (x,))
def tanh(x): return apply("tanh", (x,))
def sin(x): return apply("sin", (x,))
def cos(x): return apply("cos", (x,))
def erf(x): return apply("erf", (x,))
def sigmoid(x): return apply("sigmoid", (x,))
def relu(x): return apply("relu", (x,))
def silu(x): return apply("silu", (x,))
def stop_gradient(x): return apply("stop_gradient", (x,))  # x, through which no gradient flows (jax's name)


# what each one-line function above computes, for help(): numpy's meaning, broadcasting included
_MEANINGS = {
    add: "a + b", subtract: "a - b", multiply: "a * b", divide: "a / b", power: "a ** b",
    maximum: "the larger of a and b", minimum: "the smaller of a and b", equal: "a == b (bool)",
    not_equal: "a != b (bool)", less: "a < b (bool)", less_equal: "a <= b (bool)", greater: "a > b (bool)",
    greater_equal: "a >= b (bool)", logical_and: "a and b, of bools", logical_or: "a or b, of bools",
    logical_not: "not x, of bools (also ~x)", negative: "-x", abs: "|x|", exp: "e ** x", log: "the natural log",
    sqrt: "the square root", rsqrt: "1 / sqrt(x)", reciprocal: "1 / x", tanh: "tanh", sin: "sine", cos: "cosine",
    erf: "the error function", sigmoid: "1 / (1 + exp(-x))", relu: "max(x, 0)", silu: "x * sigmoid(x) (swish)",
}
for _fn, _meaning in _MEANINGS.items():
    _fn.__doc__ = (f"{_meaning}, elementwise, broadcast as numpy broadcasts; a Python number takes the "
                   "dtype of the tensor it meets.")


def gelu(x, approximate: str = "none"):
    """GELU, exact (erf) or with torch's tanh approximation: `op.gelu(x, approximate="tanh")`."""
    with op_context("gelu", (x,), ("x",)):
        if approximate not in ("none", "tanh"):
            raise AttributeValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return apply("gelu", (x,), approximate=approximate)


def where(cond, x, y):
    """x where cond is True, else y (broadcast), as numpy.where: `op.where(mask, s, -float("inf"))`."""
    return apply("where", (cond, x, y))


def cast(x, dtype: Any):
    """Convert to `dtype` (a name such as "bf16", a DType, or a numpy dtype)."""
    with op_context("cast", (x,), ("x",)):
        target = DType.parse(dtype)
    return apply("cast", (x,), dtype=target)


def complex_mul(a, b):
    """Elementwise complex product (a spectrum times a filter's spectrum)."""
    return apply("mul", (a, b))
