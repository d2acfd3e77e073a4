"""Concatenates computed where an elementwise kernel reads them, not copied first.

Rotary embeddings, `x * cos + cat(-x[..., d:], x[..., :d]) * sin`, are three kernels as extracted:
one negates the second half of x, a copy joins the halves, and the last kernel reads the joined
tensor back. But an elementwise kernel computes each element on its own, so along the concatenated
axis it can compute each piece's elements from that piece's own sources: the first half of the result
from x's first half, cos, sin and the negated second half of x, the second half likewise. A
fused_elementwise or strided_elementwise node that reads a concatenate (or a strided_concatenate)
densely, which nothing else reads, becomes one concatenated_elementwise: per piece, its expression
with the concatenate's piece in place of the concatenate (the piece's own expression where the piece
is an elementwise kernel only the concatenate reads, or a view of the piece's storage), and its other
operands read at the piece's part of them. Rotary embeddings become one kernel.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (8, 64), DType.float32)
>>> halves = [make("slice", x, starts=(0, s), stops=(8, s + 32), steps=(1, 1)) for s in (32, 0)]
>>> rotated = make("concatenate", make("fused_elementwise", halves[0], expr="neg($0)"), halves[1], axis=1)
>>> y = make("fused_elementwise", x, rotated, expr="add($0,$1)")
>>> from tessera_rw.lower.view_reads import read_views_in_place
>>> [(n.op, n.attr_map.get("exprs")) for n in read_concatenates_in_place(read_views_in_place(Graph("g", (x,), (y,))))
...  .nodes if n.op != "input"]
[('concatenated_elementwise', 'add($0,neg($1));add($0,$1)')]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.fused_expr import (MAX_FUSED_OPS, Scalar, count_ops, expression_name, respelled,
                                                spell_expr)
from tessera_rw.algebra.ops.strided import EXPRESSION_OPS, concatenated_views, operand_views, slice_of
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.lower.elementwise_merge import MERGED_INPUTS
from tessera_rw.lower.expression_spelling import expression_tree
from tessera_rw.lower.layout_chains import strided_view
from tessera_rw.lower.view_reads import LAYOUT_OPS, coalesced, in_rank

CONCATENATES = frozenset({"concatenate", "strided_concatenate"})


@dataclass(frozen=True)
class Read:
    """A node read through a view: its storage at offset + Σ iₖ·strides_k, in the reader's rank."""
    node: Node
    strides: tuple[int, ...]
    offset: int


def read_concatenates_in_place(graph: Graph) -> Graph:
    """`graph` with each elementwise node reading a concatenate only it reads computing the
    concatenate's pieces in place."""
    users, outputs = graph.users, set(graph.outputs)
    private = {n for n in graph.nodes if len(users[n]) == 1 and n not in outputs}   # read by one node only
    new: dict[Node, Node] = {}
    old: dict[Node, Node] = {}

    def readers(node: Node) -> set[Node] | None:
        """The (rebuilt) nodes reading `node`; None where one is yet to be rebuilt or it is an output."""
        found = users[old[node]]
        if old[node] in outputs or any(u not in new for u in found):
            return None
        return {new[u] for u in found}

    for node in graph.nodes:
        rebuilt = node.replace(args=tuple(new[a] for a in node.args))
        if node.op in EXPRESSION_OPS:
            mine = {new[n] for n in private if n in new}
            rebuilt = (_computed_in_place(rebuilt, _Sources(mine, readers, recompute=True))
                       or _computed_in_place(rebuilt, _Sources(mine, readers, recompute=False)) or rebuilt)
        new[node], old[rebuilt] = rebuilt, node
    if all(new[n] is n for n in graph.nodes):
        return graph
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _reads(node: Node) -> list[Read]:
    """How an elementwise node reads each operand, in its own rank."""
    if node.op == "strided_elementwise":
        a = node.attr_map
        views = operand_views(node.shape, a["strides"], a["offsets"])
        return [Read(x, st, off) for x, (st, off) in zip(node.args, views)]
    return [Read(x, in_rank(x.shape, contiguous_strides(x.shape), node.shape), 0) for x in node.args]


@dataclass
class _Sources:
    """What a concatenated kernel may take in: nodes read by one node only, and (where `recompute`)
    elementwise nodes it reads slices of, computed again from their own operands, where all their
    readers go into the kernel (`absorbed`: the concatenate, the pieces inlined, the copies read
    through)."""
    private: set[Node]
    readers: Callable[[Node], set[Node] | None]
    recompute: bool
    recomputed: set[Node] = field(default_factory=set)
    absorbed: set[Node] = field(default_factory=set)

    def all_read_here(self) -> bool:
        """Whether every node recomputed is read only by nodes the kernel absorbs."""
        return all((found := self.readers(e)) is not None and found <= self.absorbed for e in self.recomputed)


def _computed_in_place(node: Node, sources: _Sources) -> Node | None:
    """`node` as a concatenated_elementwise over the first concatenate it reads densely and alone, or None."""
    reads = _reads(node)
    dense = contiguous_strides(node.shape)
    at = next((i for i, r in enumerate(reads) if r.node.op in CONCATENATES and r.node in sources.private
               and r.node.shape == node.shape and r.strides == dense and r.offset == 0), None)
    if at is None:
        return None
    joined, tree = reads[at].node, expression_tree(node)
    sources.absorbed.add(joined)
    axis = joined.attr_map["axis"]
    slots: list[Node] = []                       # the operands; one node may fill several slots
    pieces = []                                  # per piece: its expression, each slot's Read, its width
    start = 0
    for source, width in _pieces(joined):
        used: dict[int, Read] = {}
        leaf = {i: _slot(_shifted(r, axis, start), slots, used) for i, r in enumerate(reads) if i != at}
        leaf[at] = _source_tree(source, sources, slots, used)
        expr = respelled(tree, leaf.__getitem__)
        pieces.append((expr, used, width))
        start += width
    if len(slots) > MERGED_INPUTS or any(count_ops(expr) > MAX_FUSED_OPS for expr, _, _ in pieces) \
            or not sources.all_read_here():
        return None
    strides, offsets = [], []
    for _, used, _ in pieces:
        for k, slot in enumerate(slots):
            read = used.get(k, Read(slot, (0,) * len(node.shape), 0))     # a slot the piece leaves unread
            strides += read.strides
            offsets.append(read.offset)
    try:
        computed = make("concatenated_elementwise", *slots, exprs=";".join(spell_expr(e) for e, _, _ in pieces),
                        axis=axis, sizes=tuple(w for _, _, w in pieces), shape=node.shape, strides=tuple(strides),
                        offsets=tuple(offsets), shared=tuple(slots.index(slot) for slot in slots))
    except TesseraError:         # the pieces' expressions type apart from the node: keep it
        return None
    return computed if computed.type == node.type else None


def _pieces(joined: Node) -> list[tuple[Read, int]]:
    """Each piece of a concatenate as a Read in the piece's own coordinates, and its width."""
    a = joined.attr_map
    if joined.op == "concatenate":
        return [(Read(x, contiguous_strides(x.shape), 0), x.shape[a["axis"]]) for x in joined.args]
    views = concatenated_views(joined.shape, a["axis"], a["sizes"], a["strides"], a["offsets"])
    return [(Read(x, st, off), shape[a["axis"]]) for x, (shape, st, off) in zip(joined.args, views)]


def _source_tree(source: Read, sources: _Sources, slots: list[Node], used: dict[int, Read]):
    """A piece's expression: the expression of the elementwise node it is (or a reshape of, that
    only adds or drops axes of size 1, as a stack's pieces are), where only the concatenate reads
    that node and reads it whole, else what _leaf_tree reads for it."""
    e, shape = source.node, source.node.shape
    if not (source.strides == contiguous_strides(shape) and source.offset == 0 and e in sources.private):
        return _leaf_tree(source, shape, sources, slots, used)
    if e.op == "reshape" and _squeezed(shape) == _squeezed(e.args[0].shape) and e.args[0] in sources.private \
            and _elementwise(e.args[0]):
        sources.absorbed.add(e)
        e = e.args[0]
    if not _elementwise(e):
        return _leaf_tree(source, shape, sources, slots, used)
    reads = [_reranked(r, e.shape, shape) for r in _reads(e)]
    sources.absorbed.add(e)
    return respelled(expression_tree(e), lambda i: _leaf_tree(reads[i], shape, sources, slots, used))


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def _reranked(read: Read, shape: tuple[int, ...], to: tuple[int, ...]) -> Read:
    """`read` by a reader of `shape` as the reader reshaped to `to`, which has the same axes but
    for axes of size 1 (whose strides do not matter: 0)."""
    if shape == to:
        return read
    strides = iter(s for s, n in zip(read.strides, shape) if n != 1)
    return Read(read.node, tuple(0 if n == 1 else next(strides) for n in to), read.offset)


def _elementwise(node: Node) -> bool:
    return node.op in EXPRESSION_OPS or expression_name(node.op, node.attr_map) is not None


def _leaf_tree(read: Read, out: tuple[int, ...], sources: _Sources, slots: list[Node], used: dict[int, Read]):
    """What a piece reads for `read`: a slot (through the view under a chain of layout ops only it
    reads), or, where that view slices an elementwise node and recomputing is allowed, the node's
    expression over its own operands read at the slice."""
    through = _through_view(read, out, sources.private)
    e = through.node
    recompute = sources.recompute and _elementwise(e) and len(out) == len(e.shape)
    sliced = slice_of(e.shape, through.strides, through.offset) if recompute else None
    if sliced is None:
        return _slot(through, slots, used)
    starts, steps = sliced
    sources.recomputed.add(e)
    sources.absorbed.add(read.node)
    reads = [Read(r.node, tuple(s * k for s, k in zip(r.strides, steps)),
                  r.offset + sum(s * a for s, a in zip(r.strides, starts))) for r in _reads(e)]
    return respelled(expression_tree(e), lambda i: _slot(reads[i], slots, used))


def _through_view(read: Read, out: tuple[int, ...], private: set[Node]) -> Read:
    """`read` (by a reader of shape `out`) of the storage under it, where it reads a chain of layout
    ops whole (broadcast at most), which only it reads, and the view keeps the reads coalesced."""
    x = read.node
    whole = read.offset == 0 and read.strides == in_rank(x.shape, contiguous_strides(x.shape), out)
    if not (whole and x in private and x.op in LAYOUT_OPS):
        return read
    view = strided_view(x, {})
    if view.root is x or not coalesced(view.shape, view.strides, out):
        return read
    return Read(view.root, in_rank(view.shape, view.strides, out), view.offset)


def _slot(read: Read, slots: list[Node], used: dict[int, Read]) -> int | Scalar:
    """The slot a piece reads `read` from: one of the node's slots already reading it so, or one
    this piece has not used yet, or a new one; a scalar constant goes into the expression."""
    if (scalar := Scalar.of(read.node)) is not None:
        return scalar
    for k, slot in enumerate(slots):
        if slot is read.node and used.get(k, read) == read:
            used[k] = read
            return k
    slots.append(read.node)
    used[len(slots) - 1] = read
    return len(slots) - 1


def _shifted(read: Read, axis: int, start: int) -> Read:
    """`read` at the part of it a piece starting at `start` along `axis` reads."""
    return Read(read.node, read.strides, read.offset + start * read.strides[axis])

