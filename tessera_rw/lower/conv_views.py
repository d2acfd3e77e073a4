"""A direct convolution reads transposed, sliced or flipped operands where they lie.

Reverse mode writes a layer's weight gradient as a convolution of x with dY in which the batch
plays the channels: xᵀ (C, N, H, W) and dYᵀ (O, N, H', W'), two copy kernels moving whole
activations, then a transpose of the small result. But the implicit-GEMM kernel gathers its x tile
element by element and reads w one k column at a time, so it can walk any strides: a conv1d,
conv2d or fused_conv whose x or w is a copy of a view, which it alone reads, becomes a
strided_conv reading the view, and the copy is gone. It stores its output one element at a time
too, so where a transpose swapping the result's two leading axes is its only reader (dW from the
weight gradient's (C, O, KH, KW)), it writes the result so and the transpose is gone as well.

A flip is a view too, of negative strides: dx's transposed convolution reads the kernel reversed
and its channel axes swapped where the weights lie. A view is read in place where the convolution
is not depthwise (the sliding-window kernel stages dense planes), the storage holds fewer than 2^31
elements (the kernel's in-view offsets are 32-bit), and either its innermost axis is contiguous,
forwards or backwards (the threads gathering one k column read neighbouring positions: coalesced),
or it is the kernel's and its storage small enough to stay in L2 (a strided convolution's input
gradient reads every other tap of it, a phase's).

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x, g = make_input("x", (4, 8, 6, 6), DType.bfloat16), make_input("g", (4, 16, 4, 4), DType.bfloat16)
>>> xt, gt = (make("transpose", v, axes=(1, 0, 2, 3)) for v in (x, g))
>>> dw = make("conv2d", xt, gt, stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1)
>>> (node,) = [n for n in read_conv_views_in_place(Graph("g", (x, g), (dw,))).nodes if n.op not in ("input",)]
>>> node.op, node.attr_map["strides"], node.attr_map["offsets"]
('strided_conv', (36, 288, 6, 1, 16, 256, 4, 1), (0, 0))
"""

from __future__ import annotations

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.lower.layout_chains import StridedView, dense_view, strided_view
from tessera_rw.lower.view_reads import LAYOUT_OPS

CONVOLUTIONS = frozenset({"conv1d", "conv2d", "fused_conv"})
_MAX_ELEMENTS = 2**31
CACHED_KERNEL = 1 << 22     # bytes of a kernel's storage that stay in L2 while the convolution reads it


def read_conv_views_in_place(graph: Graph) -> Graph:
    """`graph` with each convolution whose x or w is a copy of a view (read by it alone) a
    strided_conv reading the view."""
    users, outputs = graph.users, set(graph.outputs)
    views: dict[Node, StridedView] = {}
    new: dict[Node, Node] = {}
    for node in graph.nodes:
        rebuilt = node.replace(args=tuple(new[a] for a in node.args))
        if node.op in CONVOLUTIONS and not _depthwise(node):
            reads = [_read_in_place(arg, node, users[arg], arg in outputs, views, i == 1)
                     for i, arg in enumerate(node.args[:2])]
            if any(reads):
                rebuilt = _strided(rebuilt, [r and StridedView(new[r.root], r.shape, r.strides, r.offset, r.copies)
                                             for r in reads])
        elif _swaps_a_convolution(node, users, outputs):
            conv = new[node.args[0]]
            rebuilt = _strided(conv, [None, None], out_swapped=True) if conv.op != "strided_conv" else \
                make("strided_conv", *conv.args, **(dict(conv.attr_map) | {"out_swapped": True}))
        new[node] = rebuilt
    if all(new[n] is n for n in graph.nodes):
        return graph
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _swaps_a_convolution(node: Node, users: dict, outputs: set) -> bool:
    """A transpose swapping the two leading axes of a convolution's output, its sole reader: the
    kernel writes the output so (no epilogue inputs, not depthwise)."""
    if node.op != "transpose" or tuple(node.attr_map["axes"][:2]) != (1, 0) \
            or tuple(node.attr_map["axes"][2:]) != tuple(range(2, len(node.shape))):
        return False
    conv = node.args[0]
    return (conv.op in CONVOLUTIONS | {"strided_conv"} and users[conv] == (node,) and conv not in outputs
            and len(conv.args) == 2 and not conv.attr_map.get("out_swapped") and not _depthwise(conv))


def _depthwise(node: Node) -> bool:
    """One input channel per group: the sliding-window kernel's, which stages dense planes."""
    return node.args[1].shape[1] == 1


def _read_in_place(arg: Node, reader: Node, readers: tuple[Node, ...], is_output: bool,
                   views: dict[Node, StridedView], kernel: bool) -> StridedView | None:
    if is_output or readers != (reader,) or arg.op not in LAYOUT_OPS | {"flip"}:
        return None
    view = _flipped(arg, views) if arg.op == "flip" else strided_view(arg, views)
    if view.root is arg or not view.copies or view.root.type.numel >= _MAX_ELEMENTS:
        return None
    if kernel and view.root.type.nbytes <= CACHED_KERNEL:      # gathered from L2 whatever its strides
        return view
    return view if view.shape[-1] == 1 or abs(view.strides[-1]) == 1 else None


def _flipped(node: Node, views: dict[Node, StridedView]) -> StridedView:
    """A flip's value as a view with negative strides along its axes, starting at their last
    element: the transposed convolution of dx reads the kernel reversed so."""
    inner = strided_view(node.args[0], views)
    axes = set(node.attr_map["axes"])
    offset = inner.offset + sum((n - 1) * st for a, (n, st) in enumerate(zip(inner.shape, inner.strides)) if a in axes)
    strides = tuple(-st if a in axes else st for a, st in enumerate(inner.strides))
    return StridedView(inner.root, inner.shape, strides, offset, inner.copies + 1)


def _strided(node: Node, reads: list[StridedView | None], out_swapped: bool = False) -> Node:
    """`node` (a convolution) as the strided_conv reading `reads` (None: the operand, dense), its
    output's leading axes swapped where `out_swapped`."""
    views = [r or dense_view(arg) for arg, r in zip(node.args, reads)]
    attrs = dict(node.attr_map, out_swapped=out_swapped)
    attrs.setdefault("post", "$0")
    strided = make("strided_conv", *(v.root for v in views), *node.args[2:], **attrs,
                   shapes=tuple(n for v in views for n in v.shape), strides=tuple(s for v in views for s in v.strides),
                   offsets=tuple(v.offset for v in views))
    return strided if out_swapped or strided.type == node.type else node
