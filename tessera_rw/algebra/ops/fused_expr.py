"""A chain of elementwise ops as one node, fused_elementwise(xs; expr): `expr` is a tree of the
FUSIBLE ops over the inputs ('mul(relu(add($0,$1)),$2)'), computed in one pass. The expression
language (parse_expr, expr_leaves) is shared with the fused reductions and normalizations and
with the kernels that compute them."""

from __future__ import annotations

import functools

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind

# Elementwise ops without attributes that a fused expression may use, by arity.
FUSIBLE = {1: ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sin", "cos", "erf",
               "sigmoid", "relu", "silu"),
           2: ("add", "sub", "mul", "div", "pow", "maximum", "minimum")}
_ARITY = {name: n for n, names in FUSIBLE.items() for name in names}
MAX_FUSED_INPUTS = 4


@functools.lru_cache(maxsize=1024)          # a plan evaluates the same expressions on every call
def parse_expr(text: str) -> tuple:
    """'add(exp($0),$1)' -> ('add', ('exp', 0), 1): input positions are ints, ops are tuples."""
    pos = 0

    def parse() -> tuple | int:
        nonlocal pos
        if text.startswith("$", pos):
            end = pos + 1
            while end < len(text) and text[end].isdigit():
                end += 1
            index, pos = int(text[pos + 1:end]), end
            return index
        open_ = text.index("(", pos)
        name, pos = text[pos:open_], open_ + 1
        args = [parse()]
        while text[pos] == ",":
            pos += 1
            args.append(parse())
        if text[pos] != ")":
            raise ValueError(f"expected ')' at {pos}")
        pos += 1
        return (name, *args)

    try:
        tree = parse()
        if pos != len(text):
            raise ValueError(f"trailing text at {pos}")
    except (ValueError, IndexError) as e:
        raise AttributeValueError(f"malformed fused expression {text!r}: {e}") from None
    return tree


def fold(tree, leaf, apply):
    if isinstance(tree, int):
        return leaf(tree)
    name, *args = tree
    if _ARITY.get(name) != len(args):
        raise AttributeValueError(f"{name!r} with {len(args)} operands cannot be fused (fusible: {sorted(_ARITY)})")
    return apply(name, [fold(a, leaf, apply) for a in args])


def infer_fused(*xs: TensorType, expr: str) -> TensorType:
    from tessera_rw.algebra.ops import OPS  # the registry holds this module's own ops

    def leaf(i: int) -> TensorType:
        if not 0 <= i < len(xs):
            raise AttributeValueError(f"the expression reads input ${i} of {len(xs)}")
        return xs[i]
    return fold(parse_expr(expr), leaf, lambda name, args: OPS[name].infer(*args))


def fused(*xs: np.ndarray, expr: str) -> np.ndarray:
    from tessera_rw.algebra.ops import OPS
    return fold(parse_expr(expr), lambda i: xs[i], lambda name, args: OPS[name].reference(*args))


def fused_flops(out: TensorType, *xs: TensorType, expr: str) -> int:
    from tessera_rw.algebra.ops import OPS
    return fold(parse_expr(expr), lambda i: 0,
                 lambda name, args: sum(args) + OPS[name].flops(out, out, out))


DEFS = (
    OpDef("fused_elementwise", ("xs",), OpKind.ELEMENTWISE, infer_fused, fused, fused_flops, variadic=True,
          doc="a tree of elementwise ops over its inputs in one pass, e.g. expr='mul(relu(add($0,$1)),$2)'",
          vjp=before_fusion("fused_elementwise")),
)


def expr_leaves(tree) -> set[int]:
    """The operand indices a parsed expression reads."""
    return {tree} if isinstance(tree, int) else set().union(*(expr_leaves(a) for a in tree[1:]))
