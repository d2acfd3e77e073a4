"""Slices read in place: an elementwise or row kernel reads the views it is given, not copies of them.

A gated unit, `silu(h[..., :d]) * h[..., d:]`, is three kernels as extracted: two copies writing
each half of h dense, then the product reading them back. But a slice (or a chain of slices,
transposes, reshapes and broadcasts, layout_chains.strided_view) is a strided view of the value
under it, and an elementwise kernel already walks each operand by its own index math (that is how
it broadcasts), so it can read the view where it lies. A fused_elementwise node whose operands are
such copies, read by it alone, becomes a strided_elementwise over the values under them, and the
copies are gone. A view is read in place only where it keeps the storage's innermost elements
contiguous along the result's inner axis (or repeats one value along it), so the reads stay
coalesced; a transpose that moves the innermost axis keeps its copy kernel, whose shared-memory
tile reads and writes both coalesced. A row-wise normalization over its trailing axes reads its rows
the same way (a strided_normalization): the queries and keys of QK-norm, RMS-normalized per head,
are normalized where the projection wrote them.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> h = make_input("h", (8, 64), DType.float32)
>>> gate, up = (make("slice", h, starts=(0, s), stops=(8, s + 32), steps=(1, 1)) for s in (0, 32))
>>> y = make("fused_elementwise", gate, up, expr="mul(silu($0),$1)")
>>> [(n.op, n.attr_map.get("strides"), n.attr_map.get("offsets"))
...  for n in read_views_in_place(Graph("g", (h,), (y,))).nodes if n.op != "input"]
[('strided_elementwise', (64, 1, 64, 1), (0, 32))]
"""

from __future__ import annotations

from dataclasses import replace

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.fused_norm import prologue_inputs
from tessera_rw.lower.layout_chains import COPIES, StridedView, dense_view, strided_view

LAYOUT_OPS = COPIES | {"reshape", "strided_copy"}      # what strided_view sees through


def read_views_in_place(graph: Graph) -> Graph:
    """`graph` with each fused_elementwise node that reads copies of views (which nothing else
    reads) a strided_elementwise reading the views in place, and each row-wise normalization whose
    rows are such copies a strided_normalization."""
    users, outputs = graph.users, set(graph.outputs)
    views: dict[Node, StridedView] = {}
    new: dict[Node, Node] = {}
    for node in graph.nodes:
        rebuilt = node.replace(args=tuple(new[a] for a in node.args))
        rows = _row_attrs(node)
        if node.op == "fused_elementwise" or rows is not None:
            viewed = node.args if rows is None else node.args[:_prologue_inputs(node)]
            reads = [_read_in_place(arg, node, users[arg], arg in outputs, views) for arg in viewed]
            reads = [r and replace(r, root=new[r.root]) for r in reads]
            if any(reads):
                rebuilt = _strided(rebuilt, reads) if rows is None else _strided_rows(rebuilt, reads, rows)
        new[node] = rebuilt
    if all(new[n] is n for n in graph.nodes):
        return graph
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _read_in_place(arg: Node, reader: Node, readers: tuple[Node, ...], is_output: bool,
                   views: dict[Node, StridedView]) -> StridedView | None:
    """The view `reader` may read instead of `arg`: a chain of layout ops holding a copy, which only
    `reader` reads, whose view runs along the result's inner axis."""
    if is_output or readers != (reader,) or arg.op not in LAYOUT_OPS:
        return None
    view = strided_view(arg, views)
    if view.root is arg or not view.copies:       # nothing copied: already a view the plan aliases
        return None
    return view if coalesced(view.shape, view.strides, reader.shape) else None


def coalesced(shape: tuple[int, ...], strides: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether a view of `shape` read as `out` runs along the result's inner axis (stride 1) or
    repeats one value along it (0): lanes next to each other read next to each other."""
    inner = [s for s, n in zip(in_rank(shape, strides, out), out) if n > 1]
    return not inner or inner[-1] in (0, 1)


def in_rank(shape: tuple[int, ...], strides: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...]:
    """The strides that read a view of `shape` as the broadcast `out`: 0 along the axes it repeats.

    >>> in_rank((4, 1), (10, 3), (2, 4, 5))
    (0, 10, 0)
    """
    lead = len(out) - len(shape)
    return (0,) * lead + tuple(0 if n == 1 and m != 1 else s for n, m, s in zip(shape, out[lead:], strides))


def _views_of(node: Node, reads: list[StridedView | None]) -> tuple[list[Node], tuple[int, ...], tuple[int, ...]]:
    """The nodes `node` reads for its first len(reads) operands (each view's storage, where it has
    one, else the operand itself, dense and broadcast) and their strides and offsets."""
    args, strides, offsets = [], [], []
    for arg, view in zip(node.args, reads):
        view = view or dense_view(arg)
        args.append(view.root)
        strides += in_rank(view.shape, view.strides, node.shape)
        offsets.append(view.offset)
    return args, tuple(strides), tuple(offsets)


def _strided(node: Node, reads: list[StridedView | None]) -> Node:
    """`node` (a fused_elementwise) as a strided_elementwise."""
    args, strides, offsets = _views_of(node, reads)
    strided = make("strided_elementwise", *args, expr=node.attr_map["expr"], shape=node.shape, strides=strides,
                   offsets=offsets)
    return strided if strided.type == node.type else node


NORMS = frozenset({"softmax", "log_softmax", "layernorm", "rmsnorm"})


def _row_attrs(node: Node) -> dict | None:
    """A row-wise normalization's attributes as a fused_normalization's, where it normalizes its
    trailing axes (the row kernels read no other), else None."""
    a = node.attr_map
    if node.op == "fused_normalization":
        found = dict(a)
    elif node.op in ("softmax", "log_softmax"):
        found = dict(expr="$0", norm=node.op, axes=(a["axis"],), eps=0.0, has_weight=False, has_bias=False, post="$0")
    elif node.op in NORMS:
        found = dict(expr="$0", norm=node.op, axes=tuple(a["axes"]), eps=a["eps"], has_weight=a["has_weight"],
                     has_bias=a["has_bias"], post="$0")
    else:
        return None
    rank = len(node.shape)
    axes = tuple(found["axes"])
    return found if axes == tuple(range(rank - len(axes), rank)) else None


def _prologue_inputs(node: Node) -> int:
    """How many of a normalization's operands are its rows' inputs (the rest: weight, bias, epilogue)."""
    if node.op != "fused_normalization":
        return 1
    a = node.attr_map
    return prologue_inputs(len(node.args), a["has_weight"], a["has_bias"], a["post"])


def _strided_rows(node: Node, reads: list[StridedView | None], attrs: dict) -> Node:
    """`node` (a normalization) as a strided_normalization reading its rows' inputs as views."""
    args, strides, offsets = _views_of(node, reads)
    strided = make("strided_normalization", *args, *node.args[len(reads):], **attrs, shape=node.shape,
                   strides=strides, offsets=offsets)
    return strided if strided.type == node.type else node
