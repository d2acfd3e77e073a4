"""An expression respelled over a merged program's values (lower/elementwise_merge.py): each input a
constant, an elementwise producer taken in as its own expression, or a leaf the kernel reads.

A producer read through a reshape is taken in over its operands reshaped alike (views), where each
spans the runs of axes the reshape regroups whole or not at all; a tiny one (a per-channel or
per-row value, a scalar) read spread far wider is computed again by each reader that way too.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (4, 8), DType.float32)
>>> y = make("fused_elementwise", x, expr="exp($0)")
>>> spelling = Spelling({y}, (4, 8), [], frozenset(), frozenset(), None, set(), set())
>>> spelling.of(("add", 0, 1), (y, x)), spelling.leaves == [x]
(('add', ('exp', 0), 0), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import Node, TensorType
from tessera_rw.algebra.ops.fused_expr import Scalar, expression_name, infer_fused, parse_expr
from tessera_rw.algebra.ops.strided import EXPRESSION_OPS
from tessera_rw.algebra.shapes import reshaped_broadcast

EXPANSION = 8           # an elementwise result this many times larger than what it reads is recomputed by its readers


def is_elementwise(node: Node) -> bool:
    """Whether `node` is one elementwise computation an expression spells (fused or a single op)."""
    return node.op == "fused_elementwise" or expression_name(node.op, node.attr_map) is not None


def expression_tree(node: Node):
    """What an elementwise node computes, parsed, over its operands: a fused (or strided) node's
    expression, a single op over $0, $1, …"""
    if node.op in EXPRESSION_OPS:
        return parse_expr(node.attr_map["expr"])
    return (expression_name(node.op, node.attr_map), *range(len(node.args)))


def values_of(node: Node) -> TensorType:
    """What a fused_reduction's expression computes before it is reduced."""
    return infer_fused(*(a.type for a in node.args), expr=node.attr_map["expr"])


def spreads_to(small: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a value of shape `small` broadcasts to `shape`."""
    try:
        return np.broadcast_shapes(small, shape) == shape
    except ValueError:
        return False


def reshaped_operand(operand: Node, producer: Node, shape: tuple[int, ...]) -> Node:
    """`operand` of `producer` as the producer reshaped to `shape` reads it (a view; a constant as it is)."""
    if Scalar.of(operand) is not None:
        return operand
    view = _regrouped(operand, producer, shape)
    return operand if view == operand.shape else make("reshape", operand, shape=view)


def _regrouped(operand: Node, producer: Node, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape `operand` of `producer` takes where the producer is read reshaped to `shape`."""
    return reshaped_broadcast(operand.shape, producer.shape, shape)


def reads_reshaped(producer: Node, shape: tuple[int, ...]) -> bool:
    """Whether each operand of `producer` spans the runs of axes a reshape to `shape` regroups whole
    or not at all (a constant always), so the producer can be computed over them reshaped."""
    return all(Scalar.of(a) is not None or _regrouped(a, producer, shape) is not None for a in producer.args)


class TooBig(Exception):
    """An expression nesting more than its budget of ops."""


@dataclass
class Spelling:
    """Respelling an expression over the merged program's values: each input a constant's Scalar,
    an absorbable producer (of the expression's `shape`) its own expression, or the index of the
    input node in `leaves` (appended when first read). Producers in `again` are computed again
    wherever they are read, inside the expressions of those taken in too, and those of them the
    caller reads (`returned`) rounded to their dtype as the caller sees them (a float16 product
    that overflowed is inf in every reader). Past `budget` ops it stops (TooBig): producers read
    several times nest exponentially many. A reshape in `reshaped` of a producer taken in is that
    producer over its operands reshaped (views of them); a value in `tiny` is computed again
    wherever it is read spread far wider."""
    absorbable: set[Node]
    shape: tuple[int, ...]
    leaves: list[Node]
    again: frozenset[Node]
    returned: frozenset[Node]
    budget: int | None
    reshaped: set[Node]
    tiny: set[Node]

    def of(self, tree, args: tuple[Node, ...], absorbable: set[Node] | None = None):
        """`tree` over `args` respelled; producers in `absorbable` (the spelling's own by default)
        taken in."""
        absorbable = self.absorbable if absorbable is None else absorbable
        if isinstance(tree, Scalar):
            return tree
        if isinstance(tree, int):
            return self._leaf(args[tree], absorbable)
        return self._op(tree[0], *(self.of(a, args, absorbable) for a in tree[1:]))

    def _tiny(self, arg: Node) -> Node | None:
        """The tiny producer `arg` is (or a reshape of, which its operands can follow) that the
        expression computes again wherever it reads it spread far wider (a per-channel scale over
        the activations), if any."""
        source = arg.args[0] if arg.op == "reshape" else arg
        if source not in self.tiny or not spreads_to(arg.shape, self.shape) \
                or arg.type.numel * EXPANSION > math.prod(self.shape):
            return None
        return source if reads_reshaped(source, arg.shape) else None

    def _over_views(self, producer: Node, shape: tuple[int, ...]):
        """`producer`'s expression over its operands reshaped as `producer` reshaped to `shape`
        reads them."""
        return self.of(expression_tree(producer), tuple(reshaped_operand(a, producer, shape) for a in producer.args),
                       set())

    def _op(self, name: str, *operands):
        if self.budget is not None:
            self.budget -= 1
            if self.budget < 0:
                raise TooBig
        return (name, *operands)

    def _leaf(self, arg: Node, absorbable: set[Node]):
        if (scalar := Scalar.of(arg)) is not None:
            return scalar
        if (tiny := self._tiny(arg)) is not None:
            return self._over_views(tiny, arg.shape)
        if arg in self.reshaped and arg.shape == self.shape and arg.args[0] in absorbable:
            return self._over_views(arg.args[0], self.shape)
        if (arg in absorbable or arg in self.again) and arg.shape == self.shape:
            if arg.op == "fused_elementwise":      # merged already: it took in what it could
                tree = self.of(parse_expr(arg.attr_map["expr"]), arg.args, set())
            else:
                tree = self._op(expression_name(arg.op, arg.attr_map), *(self._leaf(a, absorbable) for a in arg.args))
            if arg in self.again and arg in self.returned and arg.dtype in (DType.bfloat16, DType.float16):
                return self._op(expression_name("cast", {"dtype": arg.dtype}), tree)
            return tree
        if arg not in self.leaves:                 # nodes are interned: equal is the same node
            self.leaves.append(arg)
        return self.leaves.index(arg)
