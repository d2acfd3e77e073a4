"""Reductions over the same axes computed by one kernel (multi_reduction).

A batch norm's backward sums dy·x̂ and dy per channel, and the term of dx's that needs both: each
a row reduce over (N, H, W), each reading x again (merge_elementwise has them compute dy and x̂
from x rather than read them back). Where a program holds several reductions of one kind over the
same axes of values of one type, none reading another (however far back), one kernel walks the
values once and keeps an accumulator per reduction: a tensor they read in common is read once, and
reductions reading nothing in common (a loss's total and the count of its rows) save a launch.
Each joins the group sharing the most bytes with it; each result is a view of its row of the
multi_reduction's result (padded to an aligned end). Only reductions whose walk ends on a reduced
axis are grouped (per-channel statistics of NCHW, sums over rows, a loss's total and count): there
each output's values are walked by one warp, block or set of blocks, which carry the accumulators
through their shuffles. A group reads at most MERGED_INPUTS tensors and each expression at most
MAX_FUSED_OPS ops.

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
from tessera_rw.algebra.ops.multi_output import multi_reduction_attrs
from tessera_rw.lower.elementwise_merge import MERGED_INPUTS
from tessera_rw.lower.expression_spelling import values_of
from tessera_rw.lower.output_groups import with_replacements

GROUPED_REDUCES = ("sum", "mean", "max", "min")


@dataclass
class _Group:
    key: tuple
    members: list[Node] = field(default_factory=list)
    leaves: list[Node] = field(default_factory=list)       # what the one kernel reads
    mask: int = 0                                          # the members' bits (see reduced_together)
    needs: int = 0                                         # the reductions the members read, however far back


def reduced_together(graph: Graph) -> Graph:
    """`graph` with each group of its reductions that one kernel can compute as that kernel."""
    keys = {n: key for n in graph.nodes if (key := _key(n)) is not None}
    reductions = list(keys)
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
        fits = [g for g in groups if g.key == keys[node] and not after[node] & g.mask and _fits(g, node)
                and not _closes_a_cycle(groups, g, bit[node], after[node])]
        if not fits:
            groups.append(_Group(keys[node], [node], _read(node), bit[node], after[node]))
            continue
        group = max(fits, key=lambda g: _shared_bytes(g, node))     # first of those sharing the most
        group.members.append(node)
        group.leaves = list(dict.fromkeys([*group.leaves, *_read(node)]))
        group.mask |= bit[node]
        group.needs |= after[node]
    replaced: dict[Node, Node] = {}
    for group in groups:
        if len(group.members) > 1 and (views := _views(group)) is not None:
            replaced.update(views)
    return with_replacements(graph, replaced) if replaced else graph


def _key(node: Node) -> tuple | None:
    """What a reduction must share with others to join them (the values' type, axes, kind and
    result), None for nodes that join none: other ops, reductions keeping the innermost axis."""
    if node.op == "fused_reduction":
        values, reduce = values_of(node), node.attr_map["reduce"]
    elif node.op in GROUPED_REDUCES:
        values, reduce = node.args[0].type, node.op
    else:
        return None
    axes = tuple(sorted(a % values.ndim for a in node.attr_map["axes"]))
    sized = [i for i, n in enumerate(values.shape) if n > 1]
    if reduce not in GROUPED_REDUCES or not sized or sized[-1] not in axes:
        return None
    return values, axes, node.attr_map["keepdims"], reduce, node.type


def _tree(node: Node):
    """What a reduction reduces, over its operands."""
    return parse_expr(node.attr_map["expr"]) if node.op == "fused_reduction" else 0


def _read(node: Node) -> list[Node]:
    return list(dict.fromkeys(a for a in node.args if Scalar.of(a) is None))


def _closes_a_cycle(groups: list[_Group], group: _Group, bit: int, needs: int) -> bool:
    """Whether `group` taking in a reduction (its `bit`, what it `needs`) would need, through other
    groups, a group that needs it: r2 needing r1 and r3 needing r4 cannot be {r1, r3} and {r2, r4}
    (each kernel would wait for the other)."""
    mask, needs = group.mask | bit, group.needs | needs
    frontier = [g for g in groups if g is not group and needs & g.mask]
    seen = set(map(id, frontier))
    while frontier:
        other = frontier.pop()
        if other.needs & mask:
            return True
        for g in groups:
            if g is not group and id(g) not in seen and other.needs & g.mask:
                seen.add(id(g))
                frontier.append(g)
    return False


def _fits(group: _Group, node: Node) -> bool:
    """Whether the group's kernel may take `node` in: what they read together within MERGED_INPUTS."""
    return len(set(group.leaves) | set(_read(node))) <= MERGED_INPUTS


def _shared_bytes(group: _Group, node: Node) -> int:
    """The bytes `node` reads that the group reads already: what joining it saves."""
    return sum(a.type.nbytes for a in set(group.leaves) & set(_read(node)))


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
        attrs = multi_reduction_attrs(*(a.type for a in leaves), exprs=";".join(spell_expr(t) for t in trees),
                                      reduce=reduce, axes=axes, keepdims=keepdims)
        together = make("multi_reduction", *leaves, **attrs)
    except TesseraError:
        return None
    return {m: make("reshape", make("slice", together, starts=(k, 0), stops=(k + 1, each.numel), steps=(1, 1)),
                    shape=each.shape)
            for k, m in enumerate(group.members)}
