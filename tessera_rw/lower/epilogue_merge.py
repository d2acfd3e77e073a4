"""A kernel with an epilogue takes in the elementwise kernel that alone reads its result.

The e-graph's epilogue rules let a convolution or a row-wise normalization absorb the
fused_elementwise node after it while that node reads at most MAX_FUSED_INPUTS inputs, a scalar
constant and a tensor read twice each taking one. A residual block's loss gradient,
where(pre > 0, 2·(relu(pre) − target), 0) with pre = conv(h, w) + b + x, reads pre twice and holds
two constants: its selection node has four inputs before pre's own three join it, so extraction
leaves it a kernel of its own that reads back what the convolution wrote. Once a program is chosen
and elementwise_merge has spelled each fused node's constants into its expression and read each
tensor once, a fused_conv or fused_normalization (or a max pool's gradient, which becomes a
fused_max_pool2d_grad) whose only reader is a fused_elementwise of its shape and dtype takes that
node's expression as its epilogue: `post` becomes the reader's expression over
the old `post`, the reader's other inputs the kernel's new epilogue inputs (each read once, up to
MERGED_INPUTS). One kernel fewer, and the intermediate never goes through HBM.

The other way round too: an epilogue input of such a kernel (or of a reduced_normalization) that a
fused_elementwise of the rows' shape writes for it alone is computed in the epilogue from that
node's own inputs. A loss's gradient over class indices, softmax(z) − where(c == position, 1, 0)
scaled, then reads the indices and the positions, not a selection the size of the logits.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x, w = make_input("x", (2, 4, 8, 8), DType.float32), make_input("w", (4, 4, 3, 3), DType.float32)
>>> b, t = make_input("b", (4, 1, 1), DType.float32), make_input("t", (2, 4, 8, 8), DType.float32)
>>> conv = make("fused_conv", x, w, b, x, stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1,
...             post="add(add($0,$1),$2)")
>>> g = make("fused_elementwise", conv, t, expr="where(gt($0,0.0:float32),sub(relu($0),$1),0.0:float32)")
>>> [(n.op, n.attr_map.get("post")) for n in merge_epilogues(Graph("g", (x, w, b, t), (g,))).nodes
...  if n.op not in ("input",)]
[('fused_conv', 'where(gt(add(add($0,$1),$2),0.0:float32),sub(relu(add(add($0,$1),$2)),$3),0.0:float32)')]
"""

from __future__ import annotations

from typing import Callable

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.fused_expr import (MAX_FUSED_OPS, Scalar, count_ops, expr_leaves, parse_expr, respelled,
                                                spell_expr)
from tessera_rw.algebra.ops.reduced_norm import rows_of
from tessera_rw.lower.elementwise_merge import MERGED_INPUTS, is_expansion

HOSTS = frozenset({"fused_conv", "fused_normalization", "fused_max_pool2d_grad"})   # kernels whose `post` takes one
# ... and the plain kernels that become one of them with an epilogue: a max pool's gradient, whose
# reader applies the relu's mask (its x is the relu's output, whose elements it reads anyway)
PLAIN_HOSTS = {"max_pool2d_grad": "fused_max_pool2d_grad"}
# ... and those whose epilogue inputs may be computed in it (a reduced_normalization's result is no row)
READING_HOSTS = HOSTS | {"reduced_normalization"}


def merge_epilogues(graph: Graph, keeps: Callable[[Node, Node], bool] = lambda before, after: True) -> Graph:
    """`graph` with each fused_conv and fused_normalization that one fused_elementwise of its type
    alone reads holding that node's expression in its epilogue instead, and each epilogue input that
    a fused_elementwise of the rows' shape writes for that kernel alone, or that normalizes the very
    rows a row kernel does, computed in the epilogue. `keeps(host, merged)` may refuse a merged
    kernel (one no GPU template takes, say: codegen knows)."""
    users, outputs = graph.users, set(graph.outputs)
    new: dict[Node, Node] = {}
    hosts: set[Node] = set()        # new nodes whose one reader may take them in
    inputs: set[Node] = set()       # new fused_elementwise nodes whose one reader may compute them
    for node in graph.nodes:
        rebuilt = node.replace(args=tuple(new[a] for a in node.args))
        if node.op == "fused_elementwise":
            rebuilt = next((m for k, arg in enumerate(rebuilt.args) if arg in hosts and arg.type == rebuilt.type
                            if (m := _with_reader(arg, rebuilt, k)) is not None and keeps(arg, m)), rebuilt)
        elif node.op in READING_HOSTS:
            computing = _computing_inputs(rebuilt, inputs)
            rebuilt = computing if computing is rebuilt or keeps(rebuilt, computing) else rebuilt
        new[node] = rebuilt
        alone = len(users[node]) == 1 and node not in outputs
        if (node.op in HOSTS or node.op in PLAIN_HOSTS) and alone:
            hosts.add(rebuilt)
        if rebuilt.op == "fused_elementwise" and (alone or (node not in outputs and is_expansion(rebuilt))):
            inputs.add(rebuilt)
    if all(new[n] is n for n in graph.nodes):
        return graph
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _epilogue_start(host: Node) -> int:
    """How many of `host`'s operands come before its epilogue inputs."""
    return len(host.args) - max(expr_leaves(parse_expr(host.attr_map["post"])) | {0})


def _input_leaf(arg: Node, extras: list[Node]) -> object:
    """`arg` as a leaf of a merged expression: a constant's Scalar, else its input index (1-based,
    $0 being the host's own value), `extras` holding the inputs in order."""
    if (scalar := Scalar.of(arg)) is not None:
        return scalar
    if arg not in extras:
        extras.append(arg)
    return 1 + extras.index(arg)


def _with_reader(host: Node, reader: Node, k: int) -> Node | None:
    """`host` computing `reader`, which reads it as input k: None where the result would read too
    many tensors, nest too many ops, or compute another type than `reader`."""
    if host.op in PLAIN_HOSTS:
        host = make(PLAIN_HOSTS[host.op], *host.args, **(host.attr_map | {"post": "$0"}))
    start = _epilogue_start(host)
    extras = list(host.args[start:])

    def leaf(i: int):
        return parse_expr(host.attr_map["post"]) if i == k else _input_leaf(reader.args[i], extras)

    tree = respelled(parse_expr(reader.attr_map["expr"]), leaf)
    if len(extras) >= MERGED_INPUTS or count_ops(tree) > MAX_FUSED_OPS:
        return None
    try:
        merged = make(host.op, *host.args[:start], *extras, **(host.attr_map | {"post": spell_expr(tree)}))
    except TesseraError:        # the reader's other inputs do not broadcast to the host's result
        return None
    return merged if merged.type == reader.type else None


def _rows_shape(host: Node) -> tuple[int, ...]:
    """The shape a host's epilogue computes over."""
    return rows_of(host.op, tuple(a.type for a in host.args), host.attr_map, host.type).shape


ROW_ATTRS = ("expr", "norm", "axes", "eps", "has_weight", "has_bias")


def _same_rows(arg: Node, host: Node, start: int) -> bool:
    """Whether `arg` is a fused_normalization of the rows `host` normalizes (its prologue inputs,
    weight, bias and attributes), whose values the host's epilogue can compute from its own $0."""
    if arg.op != "fused_normalization" or not host.op.endswith("normalization") or arg.shape != _rows_shape(host):
        return False
    return (arg.args[:_epilogue_start(arg)] == host.args[:start]
            and all(arg.attr_map[k] == host.attr_map[k] for k in ROW_ATTRS))


def _computing_inputs(host: Node, producers: set[Node]) -> Node:
    """`host` with each epilogue input that is one of `producers`, of the rows' shape, computed in its
    epilogue from that node's own inputs; `host` itself where none is, or where the result would read
    too many tensors or nest too many ops."""
    start, rows = _epilogue_start(host), _rows_shape(host)
    extras: list[Node] = []
    taken = False

    def leaf(i: int):
        nonlocal taken
        if i == 0:
            return 0
        arg = host.args[start + i - 1]
        if arg in producers and arg.shape == rows:
            taken = True
            return respelled(parse_expr(arg.attr_map["expr"]), lambda j: _input_leaf(arg.args[j], extras))
        if _same_rows(arg, host, start):        # its own epilogue over the very rows the host normalizes
            taken = True
            offset = _epilogue_start(arg)
            return respelled(parse_expr(arg.attr_map["post"]),
                              lambda j: 0 if j == 0 else _input_leaf(arg.args[offset + j - 1], extras))
        return _input_leaf(arg, extras)

    tree = respelled(parse_expr(host.attr_map["post"]), leaf)
    if not taken or len(extras) >= MERGED_INPUTS or count_ops(tree) > MAX_FUSED_OPS:
        return host
    try:
        merged = make(host.op, *host.args[:start], *extras, **(host.attr_map | {"post": spell_expr(tree)}))
    except TesseraError:
        return host
    return merged if merged.type == host.type else host
