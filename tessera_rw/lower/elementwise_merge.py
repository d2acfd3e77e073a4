"""Elementwise kernels of an extracted program merged where only one reads the other.

The e-graph's fusion rules give a fused node at most MAX_FUSED_INPUTS inputs, and a scalar constant
or a tensor read twice each takes one: the derivative of gelu reads x in five places and holds four
constants, so extraction leaves it as several kernels, each writing a tensor the next one reads back.
(Bounding the inputs is what keeps the e-graph small: every way of cutting a chain into kernels is a
node of it.) Once a program is chosen, each fused_elementwise node takes its scalar constants into
its expression ('mul($0,$1)' of x and 0.5 becomes 'mul($0,0.5:float32)' of x), reads each tensor
once, and absorbs the elementwise producers of its own shape that nothing else reads, up to
MERGED_INPUTS distinct tensors and MAX_FUSED_OPS ops. It computes what the kernels it replaces did
(in one pass, keeping the intermediates in registers, as every fused node does), so the cost model
prices the program after it, and the plan runs it.

>>> from tessera_rw.algebra.builder import make, make_constant, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (4, 8), DType.float32)
>>> half = make("fused_elementwise", x, make_constant(0.5, DType.float32), expr="mul($0,$1)")
>>> y = make("fused_elementwise", half, x, expr="add(exp($0),$1)")
>>> [(n.op, n.attr_map.get("expr")) for n in merge_elementwise(Graph("g", (x,), (y,))).nodes if n.op != "input"]
[('fused_elementwise', 'add(exp(mul($0,0.5:float32)),$0)')]
"""

from __future__ import annotations

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.fused_expr import FUSIBLE, MAX_FUSED_OPS, Scalar, parse_expr, spell_expr

MERGED_INPUTS = 8       # distinct tensors one merged kernel reads (each a pointer and a load per element)
_FUSIBLE_OPS = frozenset(name for names in FUSIBLE.values() for name in names)


def merge_elementwise(graph: Graph) -> Graph:
    """`graph` with each fused_elementwise node's constants in its expression, each tensor it reads
    read once, and its single-reader elementwise producers of its shape absorbed."""
    users, outputs = graph.users, set(graph.outputs)
    new: dict[Node, Node] = {}
    absorbable: set[Node] = set()       # new nodes whose one reader may take them in
    for node in graph.nodes:
        args = tuple(new[a] for a in node.args)
        if node.op == "fused_elementwise":
            new[node] = _merged(node, args, absorbable)
        elif not _same(args, node.args):
            new[node] = make(node.op, *args, **node.attr_map)
        else:
            new[node] = node
        if len(users[node]) == 1 and node not in outputs and _elementwise(new[node]):
            absorbable.add(new[node])
    if all(new[n] is n for n in graph.nodes):
        return graph
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _elementwise(node: Node) -> bool:
    return node.op == "fused_elementwise" or (node.op in _FUSIBLE_OPS and not node.attr_map)


def _merged(node: Node, args: tuple[Node, ...], absorbable: set[Node]) -> Node:
    """The node computing `node` over `args` with what it can take in; `node` rebuilt over `args`
    where taking in producers would read too many tensors or nest too many ops."""
    for take_producers in (True, False):
        tree = _spelled(parse_expr(node.attr_map["expr"]), args, absorbable if take_producers else set(), node)
        leaves = list({id(leaf): leaf for leaf in _leaves(tree)}.values())
        if len(leaves) <= MERGED_INPUTS and _op_count(tree) <= MAX_FUSED_OPS:
            break
    expr = spell_expr(_numbered(tree, leaves))
    rebuilt = node if _same(args, node.args) else make(node.op, *args, **node.attr_map)
    if (_same(tuple(leaves), args) and expr == node.attr_map["expr"]) or _op_count(tree) < 2:
        return rebuilt          # a one-op node is that op's kernel: its constant is not worth a new one
    try:
        merged = make("fused_elementwise", *leaves, expr=expr)
    except TesseraError:        # an expression over other types than the kernels it replaces: keep them
        return rebuilt
    return merged if merged.type == node.type else rebuilt


def _same(a: tuple[Node, ...], b: tuple[Node, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _spelled(tree, args: tuple[Node, ...], absorbable: set[Node], root: Node):
    """`tree` over Node leaves: each input a constant's Scalar, an absorbable producer's own
    expression, or the input node itself."""
    if isinstance(tree, Scalar):
        return tree
    if isinstance(tree, int):
        return _leaf(args[tree], absorbable, root)
    return (tree[0], *(_spelled(a, args, absorbable, root) for a in tree[1:]))


def _leaf(arg: Node, absorbable: set[Node], root: Node):
    if arg.op == "constant" and isinstance(arg.attr_map["value"], (int, float, bool)):
        return Scalar(float(arg.attr_map["value"]), arg.dtype)
    if arg in absorbable and arg.shape == root.shape:
        if arg.op == "fused_elementwise":      # merged already: it took in what it could
            return _spelled(parse_expr(arg.attr_map["expr"]), arg.args, set(), root)
        return (arg.op, *(_leaf(a, absorbable, root) for a in arg.args))
    return arg


def _op_count(tree) -> int:
    return 0 if isinstance(tree, (Node, Scalar)) else 1 + sum(_op_count(a) for a in tree[1:])


def _leaves(tree) -> list[Node]:
    if isinstance(tree, Node):
        return [tree]
    if isinstance(tree, Scalar):
        return []
    return [leaf for a in tree[1:] for leaf in _leaves(a)]


def _numbered(tree, leaves: list[Node]):
    if isinstance(tree, Node):
        return next(i for i, leaf in enumerate(leaves) if leaf is tree)
    if isinstance(tree, Scalar):
        return tree
    return (tree[0], *(_numbered(a, leaves) for a in tree[1:]))
