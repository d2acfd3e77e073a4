"""Where the attention kernels may write their results in place of the copy that reads them, and
which rows they can read or write at all: each row's values contiguous and every row aligned.

A flash_attention whose output is only copied into another layout, with the head dim kept
innermost (`transpose(o, (0, 2, 1, 3))`: the heads side by side again), writes each row where the
copy would have put it (`written_in_place`); so does a flash_attention_lse whose O is copied so
and otherwise read only by the row statistics, which then read it there (`o_written_in_place`).
A flash_attention_bwd whose packed dQ | dK | dV is only joined by a strided_concatenate into the
gradient of one q|k|v projection writes each gradient's rows there (`gradients_written_in_place`);
one whose gradients are each moved back from heads for projections of their own writes those so,
each in its own run of the packed result (`gradient_runs_written_in_place`).
Each is a view read by a copy, inverted: where each axis of the value steps in the copy's dense
result.

>>> inverse_strides((2, 4, 3, 8), (96, 8, 32, 1), (2, 3, 4, 8), (96, 32, 8, 1))   # [B, S, H, D] of [B, H, S, D]
(96, 8, 32, 1)
"""

from __future__ import annotations

import math

from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.strided import concatenated_views
from tessera_rw.algebra.ops.strided_attention_backward import gradient_shapes
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.lower.layout_chains import StridedView, strided_view
from tessera_rw.lower.lowering import view_offset
from tessera_rw.lower.view_reads import LAYOUT_OPS

ROW_ALIGNMENT = 16        # bytes: where every row of a view read or written in place must start
MAX_ROW_STRIDE = 2 ** 23  # elements from row to row of a view read: a tile's 256 rows indexed in 32 bits


def rows_fit(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, itemsize: int, read: bool = True) -> bool:
    """Whether the attention kernels can read (or write) the rows of the view (shape, strides,
    offset) where they lie: each row's values contiguous, every row starting on ROW_ALIGNMENT bytes
    (axes of one element aside), and rows read at most MAX_ROW_STRIDE elements apart.

    >>> rows_fit((2, 4, 128, 64), (98304, 64, 768, 1), 256, 2), rows_fit((2, 4, 128, 64), (98304, 64, 768, 1), 4, 2)
    (True, False)
    """
    if strides[-1] != 1 and shape[-1] != 1:
        return False
    steps = [s for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    return (all(s * itemsize % ROW_ALIGNMENT == 0 for s in (*steps, offset))
            and (not read or len(shape) < 2 or shape[-2] == 1 or strides[-2] <= MAX_ROW_STRIDE))


def inverse_strides(view_shape: tuple[int, ...], view_strides: tuple[int, ...], own_shape: tuple[int, ...],
                    dense: tuple[int, ...]) -> tuple[int, ...] | None:
    """Where each axis of a dense value of `own_shape` steps in the dense value (strides `dense`) a
    copy fills by reading it through the view (`view_shape`, `view_strides`), when that view
    permutes its axes and keeps the last innermost; else None."""
    own = contiguous_strides(own_shape)
    out = [0] * len(own)
    for n, stride, step in zip(view_shape, view_strides, dense):
        if n == 1:
            continue
        axis = next((j for j, s in enumerate(own) if s == stride and own_shape[j] == n and not out[j]), None)
        if axis is None:
            return None
        out[axis] = step
    if any(not out[j] for j, n in enumerate(own_shape) if n != 1) or out[-1] != 1:
        return None
    return tuple(out)


def written_in_place(copy: Node, attention: Node, views: dict[Node, StridedView]) -> dict | None:
    """strided_attention's write attributes (shape, out_strides) when `copy` is a copy of
    `attention`'s output permuting its axes with the head dim kept innermost, every row aligned;
    else None."""
    if copy.op not in LAYOUT_OPS:
        return None
    view = strided_view(copy, views)
    if view.root is not attention or not view.copies or view.offset:
        return None
    out = inverse_strides(view.shape, view.strides, attention.shape, contiguous_strides(copy.shape))
    if out is None or not rows_fit(attention.shape, out, 0, attention.type.dtype.itemsize, read=False):
        return None
    return dict(shape=copy.shape, out_strides=out)


def through_views(node: Node, users: dict[Node, tuple[Node, ...]], outputs: set[Node]) -> Node:
    """The first node from `node` up its chain of sole readers that launches a kernel (or is read by
    several, or is an output): past the slices and reshapes that are views of what they read."""
    while node.op in LAYOUT_OPS and view_offset(node.op, node.args[0].type, node.attr_map) is not None \
            and node not in outputs and len(set(users[node])) == 1:
        node = users[node][0]
    return node


def o_written_in_place(lse: Node, users: dict[Node, tuple[Node, ...]], outputs: set[Node],
                       views: dict[Node, StridedView]) -> tuple[Node, tuple[int, ...]] | None:
    """(the copy, O's strides) when a flash_attention_lse's O is copied once into another layout,
    heads side by side, and otherwise read only by the row statistics off its result: the forward
    then writes O where the copy would have put it (o_strides), the copy becomes a view of it, and
    the row statistics read O there. None otherwise."""
    if lse in outputs:
        return None
    others = [u for u in dict.fromkeys(users[lse]) if u.op != "attention_row_stats_from_lse"]
    stats = [u for u in users[lse] if u.op == "attention_row_stats_from_lse"]
    if len(others) != 1 or any(u.args[0] is not lse or u.args[1] is lse for u in stats):
        return None
    copy = through_views(others[0], users, outputs)      # past O's slice and its heads' reshape
    if copy in outputs or copy.op not in LAYOUT_OPS:
        return None
    view = strided_view(copy, views)
    o_shape = stats[0].args[1].shape if stats else None
    if view.root is not lse or not view.copies or view.offset or o_shape is None \
            or math.prod(view.shape) != math.prod(o_shape):
        return None
    out = inverse_strides(view.shape, view.strides, o_shape, contiguous_strides(copy.shape))
    if out is None or not rows_fit(o_shape, out, 0, lse.type.dtype.itemsize, read=False):
        return None
    return copy, out


def gradients_written_in_place(concat: Node, bwd: Node) -> dict | None:
    """strided_attention_bwd's write attributes (shape, out_strides, out_offsets) when `concat` is a
    strided_concatenate joining `bwd`'s packed dQ, dK and dV, in that order, each a permutation
    of its gradient with the head dim innermost, every row aligned; else None."""
    if concat.op != "strided_concatenate" or any(a is not bwd for a in concat.args) or len(concat.args) != 3:
        return None
    grads = gradient_shapes(bwd.args)
    if len(set(grads)) != 1:
        return None
    a, dense = concat.attr_map, contiguous_strides(concat.shape)
    pieces = concatenated_views(concat.shape, a["axis"], a["sizes"], a["strides"], a["offsets"])
    strides, offsets, start, at = [], [], 0, 0
    for grad, (shape, view_strides, offset), size in zip(grads, pieces, a["sizes"]):
        out = offset == start and inverse_strides(shape, view_strides, grad, dense)
        if not out or not rows_fit(grad, out, at * dense[a["axis"]], bwd.type.dtype.itemsize, read=False):
            return None
        strides += out
        offsets.append(at * dense[a["axis"]])
        start, at = start + math.prod(grad), at + size
    if len(set(offsets)) != 3 or offsets[2] != 2 * offsets[1]:
        return None
    return dict(shape=concat.shape, out_strides=tuple(strides), out_offsets=tuple(offsets))


def gradient_runs_written_in_place(bwd: Node, users: dict[Node, tuple[Node, ...]], outputs: set[Node],
                                   views: dict[Node, StridedView]) -> tuple[dict, dict[Node, int]] | None:
    """(strided_attention_bwd's write attributes, {copy: where its run starts}) when some of a
    flash_attention_bwd's packed dQ, dK and dV are each copied once into another layout (a
    permutation keeping the head dim innermost: `transpose(dq, (0, 2, 1, 3))` for its projection's
    gradient) and read by nothing else: each such gradient is written so within its own run of the
    packed result, and its copy becomes a view of that run. None where no gradient is."""
    if bwd in outputs:
        return None
    grads = gradient_shapes(bwd.args)
    sizes = [math.prod(g) for g in grads]
    starts = (0, sizes[0], sizes[0] + sizes[1])
    readers: list[list[Node]] = [[], [], []]       # per run, the chains that read it
    copies: dict[int, tuple[Node, StridedView]] = {}
    for user in dict.fromkeys(users[bwd]):
        end = through_views(user, users, outputs)
        view = strided_view(user, views)
        if view.root is not bwd:
            return None
        last = view.offset + sum((n - 1) * st for n, st in zip(view.shape, view.strides))
        runs = [i for i in range(3) if view.offset < starts[i] + sizes[i] and last >= starts[i]]
        for i in runs:
            readers[i].append(end)
        if len(runs) == 1 and end.op in LAYOUT_OPS and end not in outputs:
            copies[runs[0]] = (end, strided_view(end, views))
    strides, offsets, found = [], [], {}
    for i, grad in enumerate(grads):
        out = None
        if i in copies and len(readers[i]) == 1:
            copy, view = copies[i]
            if view.root is bwd and view.copies and view.offset == starts[i] and math.prod(view.shape) == sizes[i]:
                out = inverse_strides(view.shape, view.strides, grad, contiguous_strides(copy.shape))
        if out is not None and rows_fit(grad, out, starts[i], bwd.type.dtype.itemsize, read=False):
            found[copy] = starts[i]
        else:
            out = contiguous_strides(grad)
        strides += out
        offsets.append(starts[i])
    if not found:
        return None
    return dict(shape=(sum(sizes),), out_strides=tuple(strides), out_offsets=tuple(offsets)), found
