"""A chain of elementwise ops as one node, fused_elementwise(xs; expr): `expr` is a tree of the
FUSIBLE ops over the inputs ('mul(relu(add($0,$1)),$2)') and scalar constants written with their
dtype ('mul($0,0.5:float32)'), computed in one pass. The expression language (parse_expr,
expr_leaves) is shared with the fused reductions and normalizations and with the kernels that
compute them."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError, DTypeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind

# Elementwise ops that a fused expression may use, by arity: ops without attributes, and under a name
# of their own gelu per approximation and a cast per float dtype (SPELLED_WITH_ATTRS)
FUSIBLE = {1: ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sin", "cos", "erf",
               "sigmoid", "relu", "silu", "gelu", "gelu_tanh", "cast_float32", "cast_bfloat16", "cast_float16"),
           2: ("add", "sub", "mul", "div", "pow", "maximum", "minimum")}
# ops an expression may hold that no rule lifts alone (rules/library/fusion.py lifts a selection on a
# comparison whole: a relu's gradient, where(x > 0, g, 0)); lifting each would fuse every mask's ops
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
EXPRESSION_ONLY = {2: COMPARISONS, 3: ("where",)}
_ARITY = {name: n for table in (FUSIBLE, EXPRESSION_ONLY) for n, names in table.items() for name in names}
FUSIBLE_OPS = frozenset(_ARITY)
MAX_FUSED_INPUTS = 4
MAX_FUSED_OPS = 48        # ops in one fused expression; far beyond what any written chain reaches
# expression names of ops with attributes: the op and its attributes
SPELLED_WITH_ATTRS = {"gelu": ("gelu", {"approximate": "none"}), "gelu_tanh": ("gelu", {"approximate": "tanh"})} | {
    f"cast_{d.value}": ("cast", {"dtype": d}) for d in (DType.float32, DType.bfloat16, DType.float16)}


def expression_op(name: str) -> tuple[str, dict]:
    """The op (and its attributes) an expression's `name` computes: 'gelu_tanh' is gelu, approximate='tanh'."""
    return SPELLED_WITH_ATTRS.get(name, (name, {}))


def expression_name(op: str, attrs) -> str | None:
    """The name an expression spells a node of `op` with `attrs` (a mapping) by, None where it has none."""
    for name, (spelled, fixed) in SPELLED_WITH_ATTRS.items():
        if op == spelled and dict(attrs) == fixed:
            return name
    return op if op in FUSIBLE_OPS and not attrs else None


@dataclass(frozen=True)
class Scalar:
    """A constant in an expression, 'value:dtype' ('0.5:float32', '-inf:float32'): it computes as
    the 0-d constant of that dtype it stands for, so taking one into an expression changes nothing."""
    value: float
    dtype: DType

    @classmethod
    def of(cls, node) -> Scalar | None:
        """The Scalar a graph node is where it is a scalar constant (a 0-d `constant` of a Python
        number), else None."""
        if node.op == "constant" and isinstance(node.attr_map["value"], (int, float, bool)):
            return cls(float(node.attr_map["value"]), node.dtype)
        return None

    @classmethod
    def parse(cls, token: str) -> Scalar:
        value, sep, dtype = token.partition(":")
        try:
            if not sep:
                raise ValueError("no ':dtype'")
            return cls(float(value), DType.parse(dtype))
        except (ValueError, DTypeError) as e:
            raise ValueError(f"{token!r} is neither $i, op(...) nor a constant 'value:dtype' ({e})") from None

    def __str__(self) -> str:
        return f"{self.value!r}:{self.dtype.value}"

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.value, dtype=self.dtype.compute.numpy)

    @property
    def type(self) -> TensorType:
        return TensorType((), self.dtype)


@functools.lru_cache(maxsize=1024)          # a plan evaluates the same expressions on every call
def parse_expr(text: str) -> tuple:
    """'add(exp($0),0.5:float32)' -> ('add', ('exp', 0), Scalar(0.5, float32)): input positions
    are ints, constants Scalars, ops tuples."""
    pos = 0

    def parse() -> tuple | int | Scalar:
        nonlocal pos
        if text.startswith("$", pos):
            end = pos + 1
            while end < len(text) and text[end].isdigit():
                end += 1
            index, pos = int(text[pos + 1:end]), end
            return index
        end = min((i for i in (text.find(c, pos) for c in "(,)") if i >= 0), default=len(text))
        if end == len(text) or text[end] != "(":
            scalar, pos = Scalar.parse(text[pos:end]), end
            return scalar
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


def spell_expr(tree) -> str:
    """The text parse_expr reads back as `tree`.

    >>> spell_expr(parse_expr("add(exp($0),-0.5:float32)"))
    'add(exp($0),-0.5:float32)'
    """
    if isinstance(tree, int):
        return f"${tree}"
    if isinstance(tree, Scalar):
        return str(tree)
    return f"{tree[0]}({','.join(spell_expr(a) for a in tree[1:])})"


def fold(tree, leaf, apply, scalar):
    """`tree` computed bottom-up: `leaf(i)` for input $i, `scalar(s)` for a constant, `apply(name,
    args)` for an op."""
    if isinstance(tree, int):
        return leaf(tree)
    if isinstance(tree, Scalar):
        return scalar(tree)
    name, *args = tree
    if _ARITY.get(name) != len(args):
        raise AttributeValueError(f"{name!r} with {len(args)} operands cannot be fused (fusible: {sorted(_ARITY)})")
    return apply(name, [fold(a, leaf, apply, scalar) for a in args])


def respelled(tree, leaf):
    """A parsed expression with each input $i replaced by `leaf(i)` (a subtree or another index;
    constants kept).

    >>> respelled(parse_expr("add($0,$1)"), lambda i: 1 - i)
    ('add', 1, 0)
    """
    return fold(tree, leaf, lambda name, args: (name, *args), lambda c: c)


def count_ops(tree) -> int:
    """The ops in a parsed expression.

    >>> count_ops(parse_expr("add(exp($0),mul($0,2.0:float32))"))
    3
    """
    return fold(tree, lambda i: 0, lambda name, args: 1 + sum(args), lambda c: 0)


def infer_fused(*xs: TensorType, expr: str) -> TensorType:
    from tessera_rw.algebra.ops import OPS  # the registry holds this module's own ops

    def leaf(i: int) -> TensorType:
        if not 0 <= i < len(xs):
            raise AttributeValueError(f"the expression reads input ${i} of {len(xs)}")
        return xs[i]
    return fold(parse_expr(expr), leaf, lambda name, args: _op(name, OPS).infer(*args, **expression_op(name)[1]),
                lambda c: c.type)


def fused(*xs: np.ndarray, expr: str) -> np.ndarray:
    from tessera_rw.algebra.ops import OPS

    def apply(name: str, args: list) -> np.ndarray:
        op, attrs = expression_op(name)
        if op == "cast":            # the op's reference leaves converting to the evaluator
            return np.asarray(args[0]).astype(attrs["dtype"].numpy)
        return OPS[op].reference(*args, **attrs)
    return fold(parse_expr(expr), lambda i: xs[i], apply, lambda c: c.array)


def _op(name: str, ops):
    return ops[expression_op(name)[0]]


def fused_flops(out: TensorType, *xs: TensorType, expr: str) -> int:
    from tessera_rw.algebra.ops import OPS
    return fold(parse_expr(expr), lambda i: 0,
                lambda name, args: sum(args) + _op(name, OPS).flops(out, *(out,) * len(args), **expression_op(name)[1]),
                lambda c: 0)


DEFS = (
    OpDef("fused_elementwise", ("xs",), OpKind.ELEMENTWISE, infer_fused, fused, fused_flops, variadic=True,
          doc="a tree of elementwise ops over its inputs in one pass, e.g. expr='mul(relu(add($0,$1)),$2)'",
          vjp=before_fusion("fused_elementwise")),
)


def read_once(operands: tuple, expr: str) -> tuple[tuple, str]:
    """`operands` each once and `expr` over them (operands compare equal when they are one value):
    what an expression reading a tensor in two places reads.

    >>> read_once(("x", "y", "x"), "mul(add($0,$1),$2)")
    (('x', 'y'), 'mul(add($0,$1),$0)')
    """
    distinct = tuple(dict.fromkeys(operands))
    if len(distinct) == len(operands):
        return tuple(operands), expr
    at = [distinct.index(o) for o in operands]
    tree = respelled(parse_expr(expr), lambda i: at[i])
    return distinct, spell_expr(tree)


def expr_leaves(tree) -> set[int]:
    """The operand indices a parsed expression reads."""
    if isinstance(tree, int):
        return {tree}
    if isinstance(tree, Scalar):
        return set()
    return set().union(*(expr_leaves(a) for a in tree[1:]))
