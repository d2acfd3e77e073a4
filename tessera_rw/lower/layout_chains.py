"""Chains of layout ops folded into one copy: the q, k and v of attention cut from one projection.

`q = transpose(reshape(x[..., :C], (B, S, H, D)), (0, 2, 1, 3))` is two copy kernels as written (the
strided slice, then the transpose), each writing a dense tensor the next one reads. But slices,
reshapes, transposes and broadcasts only say where each element comes from: composed, they are one
strided view of x's storage (offset + Σ iₖ·strideₖ), and one `strided_copy` reads it. A chain is
folded where that saves a copy (it holds two copy kernels or more) and the view keeps x's innermost
elements contiguous, so the copy's reads stay vector loads (a transpose that moves the innermost
axis keeps its shared-memory tile instead). A concatenate of such chains (the cotangents of q, k
and v, each transposed back from heads) reads each piece in place: one strided_concatenate. So
does a concatenate of such chains each reshaped to merge its heads (`reshape(transpose(dq),
(B, S, H·D))`, split off along the merged axis): joined unmerged along the heads, then reshaped,
a view. And a copy permuting a concatenate's axes (the cotangent of `qkv[i]` indexed off heads
moved first) writes the pieces in its own layout.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (2, 8, 96), DType.bfloat16)
>>> k = make("transpose", make("reshape", make("slice", x, starts=(0, 0, 32), stops=(2, 8, 64), steps=(1, 1, 1)),
...                              shape=(2, 8, 2, 16)), axes=(0, 2, 1, 3))
>>> folded = fold_layout_chains(Graph("g", (x,), (k,)))
>>> [(n.op, n.attr_map.get("strides"), n.attr_map.get("offset")) for n in folded.nodes if n.op != "input"]
[('strided_copy', (768, 16, 96, 1), 32)]
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.lower.lowering import view_offset

COPIES = frozenset({"transpose", "broadcast_to", "slice"})      # what a folded chain's kernels may be


@dataclass(frozen=True)
class StridedView:
    """A value as elements of `root`'s dense storage, and how many copy kernels made it."""
    root: Node
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    copies: int


def dense_view(node: Node) -> StridedView:
    """`node`'s value as the view of its own dense storage."""
    return StridedView(node, node.shape, contiguous_strides(node.shape), 0, 0)


def _is_copy(node: Node) -> bool:
    return node.op in COPIES and view_offset(node.op, node.args[0].type, node.attr_map) is None


def reshaped_strides(shape: tuple[int, ...], strides: tuple[int, ...],
                     new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides that read a strided view as `new_shape` without a copy, or None where none do
    (numpy's no-copy reshape: each group of old axes merged or split must be contiguous in itself).

    >>> reshaped_strides((4, 6), (12, 1), (4, 2, 3)), reshaped_strides((4, 6), (1, 4), (24,))
    ((12, 3, 1), None)
    """
    if 0 in shape:
        return None
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    dims, steps = [n for n, _ in old], [s for _, s in old]
    new = [0] * len(new_shape)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new_shape) and oi < len(dims):
        n_new, n_old = new_shape[ni], dims[oi]
        while n_new != n_old:
            if n_new < n_old:
                n_new *= new_shape[nj]
                nj += 1
            else:
                n_old *= dims[oj]
                oj += 1
        if any(steps[k] != dims[k + 1] * steps[k + 1] for k in range(oi, oj - 1)):
            return None
        new[nj - 1] = steps[oj - 1]
        for k in range(nj - 1, ni, -1):
            new[k - 1] = new[k] * new_shape[k]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    return tuple(new)           # axes past the old ones are of size 1: stride 0


def strided_view(node: Node, views: dict[Node, StridedView]) -> StridedView:
    """`node`'s value as a strided view of the dense value under its chain of layout ops."""
    if node in views:
        return views[node]
    op, a = node.op, node.attr_map
    inner = strided_view(node.args[0], views) if op in COPIES | {"reshape"} else None
    found = dense_view(node)
    if op == "strided_copy":        # a chain folded already: a view of its operand, which it copies
        found = StridedView(node.args[0], node.shape, tuple(a["strides"]), a["offset"], 1)
    elif op == "transpose":
        found = StridedView(inner.root, node.shape, tuple(inner.strides[p] for p in a["axes"]), inner.offset,
                            inner.copies)
    elif op == "slice" and all(step > 0 for step in a["steps"]):
        offset = inner.offset + sum(start * s for start, s in zip(a["starts"], inner.strides))
        found = StridedView(inner.root, node.shape, tuple(step * s for step, s in zip(a["steps"], inner.strides)),
                            offset, inner.copies)
    elif op == "broadcast_to":
        lead = len(node.shape) - len(inner.shape)
        strides = (0,) * lead + tuple(0 if n == 1 and m != 1 else s
                                      for n, m, s in zip(inner.shape, node.shape[lead:], inner.strides))
        found = StridedView(inner.root, node.shape, strides, inner.offset, inner.copies)
    elif op == "reshape":
        strides = reshaped_strides(inner.shape, inner.strides, node.shape)
        if strides is not None:
            found = StridedView(inner.root, node.shape, strides, inner.offset, inner.copies)
    if found.root is not node and _is_copy(node):
        found = StridedView(found.root, found.shape, found.strides, found.offset, found.copies + 1)
    views[node] = found
    return found


def _foldable(node: Node, view: StridedView) -> bool:
    """A copy whose chain holds another copy, read along the root's contiguous innermost elements."""
    return (_is_copy(node) and view.root is not node and view.copies >= 2 and bool(node.shape)
            and view.strides[-1] == 1 and node.shape[-1] > 1)


def _read_in_place(parts: tuple[StridedView, ...]) -> bool:
    """Whether a concatenate may read these pieces where they lie: one of them saves a copy kernel,
    and every one is read along contiguous innermost elements (vector loads)."""
    return any(p.copies for p in parts) and all(p.strides[-1] == 1 and p.shape[-1] >= 2 for p in parts)


def _folded_concatenate(node: Node, views: dict[Node, StridedView]) -> tuple[StridedView, ...] | None:
    """The views a concatenate's operands are, where reading them in place saves a copy kernel."""
    parts = tuple(strided_view(arg, views) for arg in node.args)
    return parts if _read_in_place(parts) else None


def _copied_concatenate(node: Node, view: StridedView, views: dict[Node, StridedView], users: dict,
                        outputs: set[Node]) -> tuple[tuple[StridedView, ...], int] | None:
    """A copy whose chain permutes the axes of a concatenate read by nothing else (the cotangent of
    q, k and v cut by `qkv[i]` from heads, `transpose(concatenate(dq, dk, dv), …)`) as the
    concatenate of its pieces in the copy's layout: the pieces' views and the copy's axis they are
    joined along; None where it is not that."""
    concat = view.root
    if concat.op != "concatenate" or concat in outputs or not concat.shape or view.offset:
        return None
    link = node                                  # nothing on the way down reads the chain's values
    while link is not concat:
        link = link.args[0]
        if len(set(users[link])) != 1:
            return None
    dense, a = contiguous_strides(concat.shape), concat.attr_map["axis"]
    axes = [next((j for j, s in enumerate(dense) if s == st and concat.shape[j] == n), None) if n != 1 else -1
            for n, st in zip(node.shape, view.strides)]
    if None in axes or a not in axes or sorted(j for j in axes if j >= 0) != [j for j, n in enumerate(concat.shape)
                                                                             if n != 1]:
        return None
    parts = []
    for piece in (strided_view(arg, views) for arg in concat.args):
        strides = tuple(piece.strides[j] if j >= 0 else 0 for j in axes)
        shape = tuple(piece.shape[j] if j >= 0 else 1 for j in axes)
        parts.append(StridedView(piece.root, shape, strides, piece.offset, piece.copies + 1))
    return (tuple(parts), axes.index(a)) if _read_in_place(tuple(parts)) else None


def _merged_concatenate(node: Node, views: dict[Node, StridedView]) -> tuple[tuple[StridedView, ...], int,
                                                                             tuple[int, ...]] | None:
    """A concatenate whose pieces are each a copy reshaped by merging axes into the joined one (the
    cotangents of q, k and v split off one projection, `reshape(transpose(dq), (B, S, H·D))`) as
    the concatenate of the unmerged pieces along the first merged axis, then reshaped (a view): the
    pieces' views, the axis, the unmerged shape; None where it is not that."""
    a, shape = node.attr_map["axis"], node.shape
    if any(arg.op != "reshape" for arg in node.args):
        return None
    unmerged = [arg.args[0].shape for arg in node.args]
    rank, tail = len(unmerged[0]), shape[a + 1:]
    merged = [t[a:rank - len(tail)] for t in unmerged]       # the axes each piece merges into axis a
    if len({m[1:] for m in merged}) != 1 or any(len(t) != rank or t[:a] != shape[:a] or t[rank - len(tail):] != tail
                                                or len(m) < 2 for t, m in zip(unmerged, merged)):
        return None
    parts = tuple(strided_view(arg.args[0], views) for arg in node.args)
    if not _read_in_place(parts):
        return None
    return parts, a, shape[:a] + (sum(m[0] for m in merged),) + merged[0][1:] + tail


def _folded(node: Node, args: dict[Node, Node], fold) -> Node:
    if isinstance(fold, StridedView):
        return make("strided_copy", args[fold.root], shape=fold.shape, strides=fold.strides, offset=fold.offset)
    parts, axis, shape = fold
    if len(parts) == 1:                          # one piece: a copy of its view
        (part,) = parts
        joined = make("strided_copy", args[part.root], shape=part.shape, strides=part.strides, offset=part.offset)
    else:
        joined = make("strided_concatenate", *(args[p.root] for p in parts), axis=axis, shape=shape,
                      sizes=tuple(p.shape[axis] for p in parts), strides=tuple(s for p in parts for s in p.strides),
                      offsets=tuple(p.offset for p in parts))
    return joined if shape == node.shape else make("reshape", joined, shape=node.shape)


def fold_layout_chains(graph: Graph) -> Graph:
    """`graph` with each foldable chain of layout ops one strided_copy of the value under it, a
    concatenate of such chains one strided_concatenate (of their unmerged values, reshaped, where
    each piece merges axes into the joined one), and so is a copy permuting the axes of a
    concatenate nothing else reads (the copies they replace go where nothing else reads them)."""
    views: dict[Node, StridedView] = {}
    users, outputs = graph.users, set(graph.outputs)
    folds = {}
    for node in graph.nodes:
        if node.op in COPIES:
            view = strided_view(node, views)
            if _foldable(node, view):
                folds[node] = view
            elif view.root not in folds and (joined := _copied_concatenate(node, view, views, users, outputs)):
                folds[node] = (*joined, node.shape)
        elif node.op == "concatenate" and node.shape:
            if merged := _merged_concatenate(node, views):        # every piece read in place
                folds[node] = merged
            elif (parts := _folded_concatenate(node, views)) is not None:
                folds[node] = (parts, node.attr_map["axis"], node.shape)
    if not folds:
        return graph
    new: dict[Node, Node] = {}
    for node in graph.nodes:
        if node in folds:
            new[node] = _folded(node, new, folds[node])
        elif any(new[arg] is not arg for arg in node.args):
            new[node] = make(node.op, *(new[arg] for arg in node.args), **node.attr_map)
        else:
            new[node] = node
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()
