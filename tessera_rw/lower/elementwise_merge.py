"""Elementwise kernels of an extracted program merged where only one reads the other.

The e-graph's fusion rules give a fused node at most MAX_FUSED_INPUTS inputs, and a scalar constant
or a tensor read twice each takes one: the derivative of gelu reads x in five places and holds four
constants, so extraction leaves it as several kernels, each writing a tensor the next one reads back.
(Bounding the inputs is what keeps the e-graph small: every way of cutting a chain into kernels is a
node of it.) Once a program is chosen, each fused_elementwise node takes its scalar constants into
its expression ('mul($0,$1)' of x and 0.5 becomes 'mul($0,0.5:float32)' of x), reads each tensor
once, and absorbs the elementwise producers of its own shape that nothing else reads, up to
MERGED_INPUTS distinct tensors and MAX_FUSED_OPS ops (and those that only spread far smaller inputs
over their result, a mask from class indices, whatever reads them: each reader computes them
again). It computes what the kernels it replaces did (in one pass, keeping the intermediates in
registers, as every fused node does), so the cost model prices the program after it, and the plan
runs it.

>>> from tessera_rw.algebra.builder import make, make_constant, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (4, 8), DType.float32)
>>> half = make("fused_elementwise", x, make_constant(0.5, DType.float32), expr="mul($0,$1)")
>>> y = make("fused_elementwise", half, x, expr="add(exp($0),$1)")
>>> [(n.op, n.attr_map.get("expr")) for n in merge_elementwise(Graph("g", (x,), (y,))).nodes if n.op != "input"]
[('fused_elementwise', 'add(exp(mul($0,0.5:float32)),$0)')]
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node, TensorType
from tessera_rw.algebra.ops.fused_expr import (MAX_FUSED_OPS, Scalar, count_ops, expression_name, infer_fused,
                                                parse_expr, spell_expr)
from tessera_rw.algebra.ops.strided import EXPRESSION_OPS

MERGED_INPUTS = 8       # distinct tensors one merged kernel reads (each a pointer and a load per element)
EXPANSION = 8           # an elementwise result this many times larger than what it reads is recomputed by its readers


def is_expansion(node: Node) -> bool:
    """Whether `node` spreads far smaller inputs over its result (a class mask from the indices and
    positions, a per-row value over the row): each reader computes it again from those inputs, which
    stay in cache, rather than read it back from memory."""
    read = sum(a.type.numel for a in node.args if Scalar.of(a) is None)
    return node.type.numel >= EXPANSION * max(read, 1)


def merge_elementwise(graph: Graph) -> Graph:
    """`graph` with each fused_elementwise and fused_reduction node's constants in its expression,
    each tensor it reads read once, and its single-reader elementwise producers of its expression's
    shape absorbed."""
    users, outputs = graph.users, set(graph.outputs)
    new: dict[Node, Node] = {}
    absorbable: set[Node] = set()       # new nodes whose one reader may take them in
    alone: set[Node] = set()            # ...of them, those no other kernel reads spread out again
    for node in graph.nodes:
        rebuilt = node.replace(args=tuple(new[a] for a in node.args))     # node itself where they are its own
        if node.op in ("fused_elementwise", "fused_reduction"):
            new[node] = _merged(node, rebuilt, absorbable, alone)
        elif (spelled := _with_inexact_scalar(node)) is not None:      # the op alone, rounding as it did
            new[node] = _merged(spelled, spelled.replace(args=rebuilt.args), set(), set())
        else:
            new[node] = rebuilt
        spread = is_expansion(new[node])
        if (len(users[node]) == 1 or spread) and node not in outputs and is_elementwise(new[node]):
            absorbable.add(new[node])
            if not spread:
                alone.add(new[node])
    if all(new[n] is n for n in graph.nodes):
        return graph
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _inexact(args: tuple[Node, ...]) -> bool:
    """Whether a scalar constant among `args` is one its 16- or 8-bit dtype does not hold (70000 in
    float16): an expression computes with the value itself, as the reference does, where a constant
    buffer of that dtype would hold it rounded."""
    for arg in args:
        scalar = Scalar.of(arg)
        if scalar is not None and scalar.dtype.is_low_precision:
            with np.errstate(over="ignore", under="ignore"):
                held = float(np.asarray(scalar.value, dtype=np.float64).astype(scalar.dtype.numpy))
            if held != scalar.value and not (math.isnan(held) and math.isnan(scalar.value)):
                return True
    return False


def _with_inexact_scalar(node: Node) -> Node | None:
    """An elementwise op reading a constant its dtype does not hold as the one-op fused_elementwise
    of it, for the constant to go into the expression; None for any other node."""
    name = expression_name(node.op, node.attr_map)
    if name is None or not _inexact(node.args):
        return None
    try:
        operands = ",".join(f"${i}" for i in range(len(node.args)))
        spelled = make("fused_elementwise", *node.args, expr=f"{name}({operands})")
    except TesseraError:        # an op an expression cannot spell over these types: it keeps its kernel
        return None
    return spelled if spelled.type == node.type else None


def is_elementwise(node: Node) -> bool:
    """Whether `node` is one elementwise computation an expression spells (fused or a single op)."""
    return node.op == "fused_elementwise" or expression_name(node.op, node.attr_map) is not None


def expression_tree(node: Node):
    """What an elementwise node computes, parsed, over its operands: a fused (or strided) node's
    expression, a single op over $0, $1, …"""
    if node.op in EXPRESSION_OPS:
        return parse_expr(node.attr_map["expr"])
    return (expression_name(node.op, node.attr_map), *range(len(node.args)))


def _merged(node: Node, rebuilt: Node, absorbable: set[Node], alone: set[Node]) -> Node:
    """The node computing `rebuilt` (`node` over the merged program's values) with what it can take
    in; without producers where taking them in would read too many tensors or nest too many ops. A
    fused_reduction takes in what the expression it reduces reads, at the shape of its values."""
    shape = node.shape if node.op == "fused_elementwise" else values_of(node).shape
    # every producer it may take in; those it alone reads (a spread value others read too costs them
    # little to compute again); none
    for producers in (absorbable, alone, set()):
        leaves: list[Node] = []
        tree = _spelled(parse_expr(node.attr_map["expr"]), rebuilt.args, producers, shape, leaves)
        ops = count_ops(tree)
        if len(leaves) <= MERGED_INPUTS and ops <= MAX_FUSED_OPS:
            break
    expr = spell_expr(tree)
    if tuple(leaves) == rebuilt.args and expr == node.attr_map["expr"]:
        return rebuilt
    if node.op == "fused_elementwise" and ops < 2 and not _inexact(rebuilt.args):
        return rebuilt          # a one-op node is that op's kernel: its constant is not worth a new one
    try:
        merged = make(node.op, *leaves, **(node.attr_map | {"expr": expr}))
    except TesseraError:        # an expression over other types than the kernels it replaces: keep them
        return rebuilt
    return merged if merged.type == node.type else rebuilt


def values_of(node: Node) -> TensorType:
    """What a fused_reduction's expression computes before it is reduced."""
    return infer_fused(*(a.type for a in node.args), expr=node.attr_map["expr"])


def _spelled(tree, args: tuple[Node, ...], absorbable: set[Node], shape: tuple[int, ...], leaves: list[Node]):
    """`tree` over `args` respelled: each input a constant's Scalar, an absorbable producer (of the
    expression's `shape`) its own expression, or the index of the input node in `leaves` (appended
    when first read)."""
    if isinstance(tree, Scalar):
        return tree
    if isinstance(tree, int):
        return _leaf(args[tree], absorbable, shape, leaves)
    return (tree[0], *(_spelled(a, args, absorbable, shape, leaves) for a in tree[1:]))


def _leaf(arg: Node, absorbable: set[Node], shape: tuple[int, ...], leaves: list[Node]):
    if (scalar := Scalar.of(arg)) is not None:
        return scalar
    if arg in absorbable and arg.shape == shape:
        if arg.op == "fused_elementwise":      # merged already: it took in what it could
            return _spelled(parse_expr(arg.attr_map["expr"]), arg.args, set(), shape, leaves)
        return (expression_name(arg.op, arg.attr_map), *(_leaf(a, absorbable, shape, leaves) for a in arg.args))
    if arg not in leaves:                      # nodes are interned: equal is the same node
        leaves.append(arg)
    return leaves.index(arg)
