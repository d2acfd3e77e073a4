"""Reductions over the same axes of the same tensors computed by one kernel (multi_reduction).

A batch norm's backward sums dy·x̂ and dy per channel, and the term of dx's that needs both: each
a column reduce over (N, H, W), each reading x again (merge_elementwise has them compute dy and x̂
from x rather than read them back). Where a program holds several reductions of one kind over the
same axes of values of one type, none reading another (however far back), that stream a tensor in
common, one kernel walks the values once and keeps an accumulator per reduction; each result is a
view of its block of the stacked output. Only reductions whose walk ends on a reduced axis are
grouped (per-channel statistics of NCHW, sums over rows): there each output's values are walked by
one warp, block or set of blocks, which carry the accumulators through their shuffles. A group
reads at most MERGED_INPUTS tensors, each expression at most MAX_FUSED_OPS ops, and each block
starts aligned (a view, not a copy).

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (32, 64, 8, 8), DType.float32)
>>> total = make("sum", x, axes=(0, 2, 3), keepdims=False)
>>> squares = make("fused_reduction", x, expr="mul($0,$0)", reduce="sum", axes=(0, 2, 3), keepdims=False)
>>> [n.op for n in reduced_together(Graph("stats", (x,), (total, squares))).nodes if n.op != "input"]
['multi_reduction', 'slice', 'reshape', 'slice', 'reshape']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.fused_expr import MAX_FUSED_OPS, Scalar, count_ops, parse_expr, respelled, spell_expr
from tessera_rw.lower.elementwise_merge import EXPANSION, MERGED_INPUTS, values_of
from tessera_rw.lower.output_groups import with_replacements
from tessera_rw.lower.plan import VIEW_ALIGNMENT

GROUPED_REDUCES = ("sum", "mean", "max", "min")


@dataclass
class _Group:
    key: tuple
    members: list[Node] = field(default_factory=list)
    leaves: list[Node] = field(default_factory=list)       # what the one kernel reads
    mask: int = 0                                          # the members' bits (see reduced_together)


def reduced_together(graph: Graph) -> Graph:
    """`graph` with each group of its column reductions that share what they stream as one kernel."""
    reductions = [n for n in graph.nodes if _key(n) is not None]
    if len(reductions) < 2:
        return graph
    bit = {n: 1 << i for i, n in enumerate(reductions)}
    after: dict[Node, int] = {}           # the reductions each node reads, however far back, as bits
    for node in graph.nodes:
        after[node] = 0
        for a in node.args:
            after[node] |= after.get(a, 0) | bit.get(a, 0)
    groups: list[_Group] = []
    for node in reductions:
        for group in groups:
            if group.key == _key(node) and not after[node] & group.mask and _joins(group, node):
                break
        else:
            groups.append(_Group(_key(node), [node], list(_read(node)), bit[node]))
            continue
        group.mask |= bit[node]
    replaced: dict[Node, Node] = {}
    for group in groups:
        if len(group.members) > 1 and (views := _views(group)) is not None:
            replaced.update(views)
    return with_replacements(graph, replaced) if replaced else graph


def _key(node: Node) -> tuple | None:
    """What a reduction must share with others to join them (the values' type, axes, kind and
    result), None for nodes that join none: other ops, reductions keeping the innermost axis,
    results that would start a block unaligned."""
    if node.op == "fused_reduction":
        values, reduce = values_of(node), node.attr_map["reduce"]
    elif node.op in GROUPED_REDUCES:
        values, reduce = node.args[0].type, node.op
    else:
        return None
    axes = tuple(sorted(a % values.ndim for a in node.attr_map["axes"]))
    sized = [i for i, n in enumerate(values.shape) if n > 1]
    if reduce not in GROUPED_REDUCES or not sized or sized[-1] not in axes or node.type.nbytes % VIEW_ALIGNMENT:
        return None
    return values, axes, node.attr_map["keepdims"], reduce, node.type


def _tree(node: Node):
    """What a reduction reduces, over its operands."""
    return parse_expr(node.attr_map["expr"]) if node.op == "fused_reduction" else 0


def _read(node: Node) -> list[Node]:
    return list(dict.fromkeys(a for a in node.args if Scalar.of(a) is None))


def _joins(group: _Group, node: Node) -> bool:
    """Whether `node` streams a tensor the group does and the group may take it (its leaves
    included); it joins it if so."""
    values = group.key[0]
    streamed = {a for a in group.leaves if a.type.numel * EXPANSION > values.numel}
    if not streamed & set(_read(node)):
        return False
    leaves = list(dict.fromkeys([*group.leaves, *_read(node)]))
    if len(leaves) > MERGED_INPUTS:
        return False
    group.members.append(node)
    group.leaves = leaves
    return True


def _views(group: _Group) -> dict[Node, Node] | None:
    """Each member's view of the kernel computing the group, None where it cannot be built."""
    leaves = group.leaves
    trees = []
    for m in group.members:
        tree = respelled(_tree(m), lambda i, m=m: Scalar.of(m.args[i]) or leaves.index(m.args[i]))
        trees.append(tree)
    if any(count_ops(t) > MAX_FUSED_OPS for t in trees):
        return None
    _, axes, keepdims, reduce, each = group.key
    try:
        together = make("multi_reduction", *leaves, exprs=";".join(spell_expr(t) for t in trees), reduce=reduce,
                        axes=axes, keepdims=keepdims)
    except TesseraError:
        return None
    flat = each.shape
    return {m: make("reshape", make("slice", together, starts=(k,) + (0,) * len(flat),
                                    stops=(k + 1,) + tuple(flat), steps=(1,) * (len(flat) + 1)), shape=flat)
            for k, m in enumerate(group.members)}
