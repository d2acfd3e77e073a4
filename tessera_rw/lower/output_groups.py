"""Elementwise results returned side by side computed by one kernel (multi_elementwise).

An optimizer step returns the new parameter and moments: m' = f(m, g), v' = h(v, g) and
p' = u(p, m', v'), three kernels as extracted, the third reading m' and v' back and each reading g.
Where a program returns several elementwise results (fused or single ops) of one shape and dtype
that share what they read, one kernel reads their operands once and writes them all, each result a
view of its block of the stacked output; a result another of them reads is computed again in that
one's expression from its own operands (the registers hold them anyway), rounded to its dtype as
the one returned is. The group is taken only where it moves fewer bytes than the kernels it replaces, where
each block starts aligned (a view, not a copy), and within MERGED_INPUTS tensors read and
MAX_FUSED_OPS ops per expression.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> p, g = (make_input(n, (64, 64), DType.float32) for n in "pg")
>>> m = make("fused_elementwise", g, expr="mul($0,0.1:float32)")
>>> p2 = make("fused_elementwise", p, m, expr="sub($0,$1)")
>>> [n.op for n in computed_together(Graph("step", (p, g), (m, p2))).nodes if n.op != "input"]
['multi_elementwise', 'slice', 'reshape', 'slice', 'reshape']
"""

from __future__ import annotations

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.ops.fused_expr import MAX_FUSED_OPS, Scalar, count_ops, expression_name, respelled, spell_expr
from tessera_rw.lower.elementwise_merge import MERGED_INPUTS
from tessera_rw.lower.expression_spelling import expression_tree, is_elementwise
from tessera_rw.lower.plan import VIEW_ALIGNMENT


def computed_together(graph: Graph) -> Graph:
    """`graph` with each group of its elementwise results of one type that pays off as one kernel."""
    by_type: dict[tuple, list[Node]] = {}
    for out in dict.fromkeys(graph.outputs):
        if is_elementwise(out):
            by_type.setdefault((out.shape, out.dtype), []).append(out)
    groups = [g for members in by_type.values() for g in _sharing(members) if len(g) > 1]
    if not groups:
        return graph
    grouped = {m for members in groups for m in members}
    after = _reading(graph, grouped)
    replaced: dict[Node, Node] = {}
    for members in groups:
        if (merged := _merged(members, after)) is not None:
            replaced.update(merged)
    if not replaced:
        return graph
    return with_replacements(graph, replaced)


def _reading(graph: Graph, grouped: set[Node]) -> set[Node]:
    """The grouped results and every node that reads one of them, however far up: one walk of the
    program, which is in order."""
    found = set(grouped)
    for node in graph.nodes:
        if any(a in found for a in node.args):
            found.add(node)
    return found


def _sharing(members: list[Node]) -> list[list[Node]]:
    """`members` split into the groups that share what they read (or read one another): the
    parameters of a model, each with its own gradient and moments, are groups of their own."""
    def reads(m: Node) -> set[Node]:          # what it reads at its own size (a shared 0-d rate joins nothing)
        direct = {a for a in m.args if a.shape == m.shape}
        return direct | {b for a in direct if a in members for b in a.args if b.shape == m.shape}
    groups: list[tuple[set[Node], list[Node]]] = []
    for m in members:
        own = reads(m) | {m}
        touching = [g for g in groups if g[0] & own]
        merged = (own.union(*(g[0] for g in touching)), [n for g in touching for n in g[1]] + [m])
        groups = [g for g in groups if g not in touching] + [merged]
    return [sorted(g[1], key=members.index) for g in groups]


def _merged(members: list[Node], after: set[Node]) -> dict[Node, Node] | None:
    """Each member's view of the one kernel computing them all, or None where it does not pay (or
    where what it reads is, or reads, a result of any group: `after`)."""
    leaves: list[Node] = []

    def leaf_of(arg: Node, inline: bool):
        if (scalar := Scalar.of(arg)) is not None:
            return scalar
        if inline and arg in members:           # a member another reads: computed again from its operands,
            tree = respelled(expression_tree(arg), lambda i: leaf_of(arg.args[i], False))
            # rounded to its dtype as the returned one is (a float16 that overflowed reads as inf)
            narrow = arg.dtype in (DType.bfloat16, DType.float16)       # what computes wider than it is stored
            return (expression_name("cast", {"dtype": arg.dtype}), tree) if narrow else tree
        if arg not in leaves:
            leaves.append(arg)
        return leaves.index(arg)
    trees = [respelled(expression_tree(m), lambda i, m=m: leaf_of(m.args[i], True)) for m in members]
    if len(leaves) > MERGED_INPUTS or any(count_ops(t) > MAX_FUSED_OPS for t in trees) \
            or any(leaf in after for leaf in leaves):
        return None
    before = sum(a.type.nbytes for m in members for a in m.args if Scalar.of(a) is None)
    if sum(leaf.type.nbytes for leaf in leaves) >= before:
        return None                              # nothing shared: the kernels read what one would
    if members[0].type.nbytes % VIEW_ALIGNMENT:
        return None                              # a block starting unaligned would be a copy, not a view
    try:
        together = make("multi_elementwise", *leaves, exprs=";".join(spell_expr(t) for t in trees))
    except TesseraError:
        return None
    flat = members[0].shape
    return {m: make("reshape", make("slice", together, starts=(k,) + (0,) * len(flat),
                                    stops=(k + 1,) + tuple(flat), steps=(1,) * (len(flat) + 1)), shape=flat)
            for k, m in enumerate(members)}


def with_replacements(graph: Graph, replaced: dict[Node, Node]) -> Graph:
    """`graph` with each replaced node's readers reading its replacement (the members themselves are
    left out: their views read the one kernel). A replacement is built over the nodes of `graph`,
    and those may be replaced too (a batch norm's backward sums read what the next layer's sums
    feed): it reads what they became. Walked without recursion, as deep programs are."""
    done: dict[Node, Node] = {}
    waiting: set[Node] = set()                      # nodes whose operands are being rebuilt
    for root in graph.outputs:
        stack = [root]
        while stack:
            node = stack[-1]
            if node in done:
                stack.pop()
                continue
            source = replaced.get(node, node)
            pending = [a for a in ((source,) if source is not node else node.args) if a not in done]
            if pending:
                if node in waiting or any(p in waiting for p in pending):
                    raise TesseraError(f"replacements that need one another at {node!r}", op=node.op,
                                       hint="a group of kernels was built that reads its own results")
                waiting.add(node)
                stack.extend(pending)
                continue
            done[node] = done[source] if source is not node else node.replace(args=tuple(map(done.get, node.args)))
            waiting.discard(node)
            stack.pop()
    return Graph(graph.name, graph.inputs, tuple(done[o] for o in graph.outputs)).verify()
