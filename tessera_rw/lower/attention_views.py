"""Attention reads q, k and v where the projection wrote them, and writes O where the next one reads it.

Multi-head attention cut from one fused projection is, as extracted, a copy kernel bringing each
head's rows together (`transpose(reshape(qkv, (B, S, 3, H, D)), (2, 0, 3, 1, 4))`, q, k and v its
slices), the attention kernel, and a copy putting the heads back side by side for the output
projection (`transpose(o, (0, 2, 1, 3))`). The attention kernel loads and stores one row of D values
at a time, so neither copy is needed: a row of q is D contiguous values of the projection wherever
it lies, and a row of O can be stored where the transpose would have put it. A flash_attention node
whose q, k or v are copies of views, or whose only reader is a copy permuting its axes that keeps
the head dim innermost, becomes a strided_attention reading and writing those views, and the
copies are gone.

A training step reads the same copies twice more: q, k and v in the forward that writes the
logsumexps and in the backward, and dO (arriving with the heads side by side) in the row
statistics and the backward. Those kernels load rows too, so each becomes its strided form
(algebra/ops/strided_attention_backward.py) reading the views. A copy goes only where every
reader is such a kernel reading it as a view; one other reader keeps it for all. K and V repeated
for the query heads sharing them (GQA, `reshape(broadcast_to(...))`: no view) are read as their
own heads, which the kernels find for each query head's group. The forward's O,
copied with the heads side by side for the output projection, is written so (the row statistics
read it there), and the backward's dQ, dK and dV, joined by one copy into the projection's
gradient, are written there instead (lower/attention_writes.py).

A view is read in place where each row's D values are contiguous, every row starts 16 bytes
aligned (the kernels copy rows in 16-byte pieces) and rows lie at most 2^23 elements apart (a
tile's rows are indexed in 32 bits); the rows it writes are contiguous and aligned likewise.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> qkv = make_input("qkv", (2, 128, 3 * 4 * 64), DType.bfloat16)
>>> heads = make("transpose", make("reshape", qkv, shape=(2, 128, 3, 4, 64)), axes=(2, 0, 3, 1, 4))
>>> q, k, v = (make("reshape", make("slice", heads, starts=(i, 0, 0, 0, 0), stops=(i + 1, 2, 4, 128, 64),
...                                 steps=(1,) * 5), shape=(2, 4, 128, 64)) for i in range(3))
>>> o = make("flash_attention", q, k, v, scale=0.125, causal=True, has_mask=False)
>>> merged = make("transpose", o, axes=(0, 2, 1, 3))
>>> (node,) = [n for n in read_attention_views(Graph("g", (qkv,), (merged,))).nodes if n.op != "input"]
>>> node.op, node.attr_map["strides"][:4], node.attr_map["offsets"], node.attr_map["out_strides"]
('strided_attention', (98304, 64, 768, 1), (0, 256, 512), (32768, 64, 256, 1))
"""

from __future__ import annotations

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.strided_attention_backward import VIEWED_OPERANDS
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.lower.attention_writes import (gradient_runs_written_in_place, gradients_written_in_place,
                                               o_written_in_place, rows_fit, written_in_place)
from tessera_rw.lower.layout_chains import StridedView, dense_view, strided_view
from tessera_rw.lower.view_reads import LAYOUT_OPS

KV_READERS = frozenset({"flash_attention", "flash_attention_lse", "flash_attention_bwd"})   # k, v at 1, 2
# the ops whose kernels read operands row by row -> those operands (q, k, v; dO)
VIEWED = {"flash_attention": (0, 1, 2)} | {op: viewed for op, (_, viewed) in VIEWED_OPERANDS.items()}


def read_attention_views(graph: Graph) -> Graph:
    """`graph` with each attention-family node that reads copies of views a strided form reading
    those views in place; each flash_attention whose output is only copied into another layout a
    strided_attention writing it there, and likewise the O of a flash_attention_lse (o_strides,
    its row statistics reading it there); and each flash_attention_bwd whose gradients are only
    joined into one projection's gradient a strided_attention_bwd writing them there, or whose
    gradients, some each copied into another layout alone, one writing those so in their runs."""
    users, outputs = graph.users, set(graph.outputs)
    views: dict[Node, StridedView] = {}
    written: dict[Node, tuple[Node, dict]] = {}     # copy of an attention's result -> (it, its write attributes)
    layouts: dict[Node, dict] = {}                  # attention -> its layout attributes (o_strides, a run's writes)
    view_copies: dict[Node, tuple[Node, int]] = {}  # copy -> (the attention writing its value, where it starts)
    reads: dict[Node, list[StridedView]] = {}
    for node in graph.nodes:
        if node.op not in VIEWED or not node.type.numel:
            continue
        # a copy an earlier attention now writes (attention of attention) is read as that writes it
        reads[node] = [(node.args[i] not in written and _read_in_place(node.args[i], users, outputs, views))
                       or dense_view(node.args[i]) for i in VIEWED[node.op]]
        copy, write = _write_in_place(node, reads[node], users, outputs, views)
        if write:
            written[copy] = (node, write)
        else:
            _write_runs_in_place(node, reads[node], users, outputs, views, layouts, view_copies)
            if all(r.copies == 0 for r in reads[node]) and node not in layouts:
                del reads[node]
    if not reads:
        return graph
    writes = {attention for attention, _ in written.values()}     # computed where their copy was
    new: dict[Node, Node] = {}
    for node in graph.nodes:
        rebuilt = node.replace(args=tuple(new[a] for a in node.args))
        if node in written:
            attention, write = written[node]
            rebuilt = _strided(attention, reads[attention], new, write)
        elif node in view_copies:                 # as its attention wrote it: a view of its result
            attention, start = view_copies[node]
            rebuilt = make("reshape", make("slice", new[attention], starts=(start,), stops=(start + node.type.numel,),
                                           steps=(1,)), shape=node.shape)
        elif node in reads and node not in writes:
            rebuilt = _strided(node, reads[node], new, layouts.get(node))
        new[node] = rebuilt
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _write_runs_in_place(node: Node, reads: list[StridedView], users: dict[Node, tuple[Node, ...]],
                         outputs: set[Node], views: dict[Node, StridedView], layouts: dict[Node, dict],
                         view_copies: dict[Node, tuple[Node, int]]) -> None:
    """Where `node` (a flash_attention_lse or flash_attention_bwd) writes a part of its result that
    one copy alone reads in that copy's layout: its layout attributes (and its row statistics',
    for the forward's O) into `layouts`, the copies it stands in for into `view_copies`."""
    if node.op == "flash_attention_lse" and (found := o_written_in_place(node, users, outputs, views)) \
            and not any(u.op in VIEWED for u in users[found[0]]):   # O's copy read as itself, not a view
        copy, o_strides = found
        layouts[node] = dict(o_strides=o_strides)
        layouts.update((u, dict(o_strides=o_strides)) for u in users[node] if u.op == "attention_row_stats_from_lse")
        view_copies[copy] = (node, 0)
    elif node.op == "flash_attention_bwd" and _keeps_rank(node, reads) \
            and (found := gradient_runs_written_in_place(node, users, outputs, views)) \
            and not any(u.op in VIEWED for copy in found[1] for u in users[copy]):
        layouts[node], runs = found
        view_copies.update((copy, (node, start)) for copy, start in runs.items())


def _write_in_place(node: Node, reads: list[StridedView], users: dict[Node, tuple[Node, ...]], outputs: set[Node],
                    views: dict[Node, StridedView]) -> tuple[Node | None, dict | None]:
    """The copy `node`'s strided form writes in place of, and how (its write attributes); or None's.
    Only a forward's or a backward's result read by one copy alone: a backward's when its views
    keep their rank (the gradients' shapes are then the kernel's)."""
    readers = set(users[node])
    if node in outputs or len(readers) != 1:
        return None, None
    (copy,) = readers
    if node.op == "flash_attention":
        return copy, written_in_place(copy, node, views)
    if node.op == "flash_attention_bwd" and _keeps_rank(node, reads):
        return copy, gradients_written_in_place(copy, node)
    return None, None


def _keeps_rank(node: Node, reads: list[StridedView]) -> bool:
    """Whether each view `node` reads has its operand's rank: a backward's gradients are then of the
    shapes its kernel writes."""
    return all(len(r.shape) == a.type.ndim for r, a in zip(reads, node.args))


def _read_in_place(arg: Node, users: dict[Node, tuple[Node, ...]], outputs: set[Node],
                   views: dict[Node, StridedView]) -> StridedView | None:
    """The view attention kernels may read instead of `arg`: a chain of layout ops holding a copy
    whose rows are contiguous and aligned, read only where attention-family kernels read rows (so
    every reader takes the view and the copy is gone)."""
    if arg in outputs or arg.op not in LAYOUT_OPS or not all(_reads_rows(user, arg) for user in users[arg]):
        return None
    view = strided_view(arg, views)
    if view.root is arg:       # K or V repeated for the query heads: read as their own heads, as K and V only
        kv_only = all(u.op in KV_READERS and i in (1, 2) for u in users[arg] for i, a in enumerate(u.args) if a is arg)
        view = _repeated_heads(arg, views) if kv_only else None
    if view is None or not view.copies:
        return None
    return view if rows_fit(view.shape, view.strides, view.offset, arg.type.dtype.itemsize) else None


def _repeated_heads(arg: Node, views: dict[Node, StridedView]) -> StridedView | None:
    """K or V repeated for the query heads sharing each (GQA: `reshape(broadcast_to(k[:, :, None]),
    (B, H, S, D))`, each head `rep` times in a row) as the view of its own heads, which the attention
    kernels read for each query head's group: the reshape merging the heads with their repeats is
    no view, the heads alone are; None where `arg` is not that."""
    if arg.op != "reshape" or len(arg.shape) < 3:
        return None
    inner = strided_view(arg.args[0], views)
    a = len(arg.shape) - 3                                # the head axis, then the rows, then D
    if inner.shape != arg.shape[:a] + inner.shape[a:a + 2] + arg.shape[a + 1:] or inner.strides[a + 1] \
            or inner.shape[a] * inner.shape[a + 1] != arg.shape[a]:
        return None
    drop = a + 1                                          # the repeats, stride 0
    return StridedView(inner.root, inner.shape[:drop] + inner.shape[drop + 1:],
                       inner.strides[:drop] + inner.strides[drop + 1:], inner.offset, inner.copies)


def _reads_rows(user: Node, arg: Node) -> bool:
    """Whether every operand of `user` holding `arg` is one its strided form reads as a view."""
    return (user.op in VIEWED and bool(user.type.numel)
            and all(i in VIEWED[user.op] for i, a in enumerate(user.args) if a is arg))


def _strided(attention: Node, reads: list[StridedView], new: dict[Node, Node], write: dict | None = None) -> Node:
    """`attention` as its strided form reading `reads` (each padded to one rank) in place of the
    operands it reads as views, writing its result as `write` says (a strided_attention's shape
    and out_strides: dense unless given; a strided_attention_bwd's, packed unless given)."""
    rank = max(len(view.shape) for view in reads)
    shapes, strides = [], []
    for view in reads:
        lead = rank - len(view.shape)
        shapes += (1,) * lead + view.shape
        strides += (0,) * lead + view.strides
    roots = dict(zip(VIEWED[attention.op], (r.root for r in reads)))
    args = tuple(new[roots.get(i, arg)] for i, arg in enumerate(attention.args))
    views = dict(shapes=tuple(shapes), strides=tuple(strides), offsets=tuple(r.offset for r in reads))
    if attention.op != "flash_attention":
        return make(VIEWED_OPERANDS[attention.op][0], *args, **attention.attr_map, **views, **(write or {}))
    a = attention.attr_map
    write = write or dict(shape=attention.shape, out_strides=contiguous_strides(attention.shape))
    return make("strided_attention", *args, scale=a["scale"], causal=a["causal"], has_mask=a["has_mask"],
                window=a.get("window", 0), **write, **views)
