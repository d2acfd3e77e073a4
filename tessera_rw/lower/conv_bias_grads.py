"""A convolution layer's bias gradient comes out of its weight gradient's kernel.

A layer's backward pass sums dY over the batch and the positions for db, a reduction kernel reading
all of dY, and convolves x with dY, the batch playing the channels, for dW: a strided_conv reading
xᵀ and dYᵀ where they lie and writing dW swapped (lower/conv_views.py). That convolution already
reads every element of dY against every image of xᵀ; given one more image, all ones, its rows for
that image are Σ dY. So the implicit GEMM computes db in 1/C more rows (a ResNet 3×3 layer's 576
become 585, in the same tiles) and the reduction kernel is gone, as cuBLASLt's BGRADB epilogue and
a linear layer's matmul_bias_grad do it. Once the convolutions read their views, a weight gradient
(written swapped, no epilogue, one group) and a sum of the same dY over all its axes but the
channels become one strided_conv with `bias_grad`, its result dW flattened and then db, both read
as views of it.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x, g = make_input("x", (4, 8, 6, 6), DType.bfloat16), make_input("g", (4, 16, 6, 6), DType.bfloat16)
>>> dw = make("conv2d", *(make("transpose", v, axes=(1, 0, 2, 3)) for v in (x, g)), stride=(1, 1),
...           padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1)
>>> graph = read_conv_views_in_place(Graph("g", (x, g), (make("transpose", dw, axes=(1, 0, 2, 3)),
...                                                      make("sum", g, axes=(0, 2, 3), keepdims=False))))
>>> [(n.op, n.shape) for n in sum_bias_grads_in_weight_grads(graph).nodes if n.op not in ("input", "slice")]
[('strided_conv', (1168,)), ('reshape', (16, 8, 3, 3)), ('reshape', (16,))]
"""

from __future__ import annotations

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.lower.conv_views import read_conv_views_in_place  # noqa: F401  (doctest)


def sum_bias_grads_in_weight_grads(graph: Graph) -> Graph:
    """`graph` with each weight-gradient strided_conv and sum of its dY over all axes but the
    channels one strided_conv computing both."""
    pairs = _pairs(graph)
    new: dict[Node, Node] = {}
    for node in graph.nodes:
        if node in new:                 # the other half of a pair packed already
            continue
        new[node] = node.replace(args=tuple(new[a] for a in node.args))
        if (pair := pairs.get(node)) is None or not all(a in new for p in pair for a in p.args):
            continue
        conv, bias = pair
        new[conv], new[bias] = _packed(new[conv], bias)
    if all(new[n] is n for n in graph.nodes):
        return graph
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _pairs(graph: Graph) -> dict[Node, tuple[Node, Node]]:
    """Each weight gradient and the sum of its dY, (conv, sum), under both."""
    sums: dict[Node, Node] = {}
    for node in graph.nodes:
        rank = len(node.args[0].shape) if node.op == "sum" else 0
        if rank >= 3 and tuple(node.attr_map["axes"]) == (0, *range(2, rank)):
            sums.setdefault(node.args[0], node)
    pairs: dict[Node, tuple[Node, Node]] = {}
    for node in graph.nodes:
        if (bias := sums.get(node.args[1] if len(node.args) == 2 else None)) is not None \
                and _weight_gradient(node) and bias.dtype == node.dtype and bias not in pairs:
            pairs[node] = pairs[bias] = (node, bias)
    return pairs


def _weight_gradient(node: Node) -> bool:
    """Whether `node` convolves a view with dYᵀ, all of it, writing its result swapped."""
    at = node.attr_map
    if node.op != "strided_conv" or not at["out_swapped"] or at.get("bias_grad") or at["post"] != "$0" \
            or at["groups"] != 1:
        return False
    dy = node.args[1].shape
    rank = len(dy)
    strides = contiguous_strides(dy)
    return (tuple(at["shapes"][rank:]) == (dy[1], dy[0], *dy[2:]) and at["offsets"][1] == 0
            and tuple(at["strides"][rank:]) == (strides[1], strides[0], *strides[2:]))


def _packed(conv: Node, bias: Node) -> tuple[Node, Node]:
    """(dW, db) as views of the strided_conv computing both."""
    both = make("strided_conv", *conv.args, **(dict(conv.attr_map) | {"bias_grad": True}))
    weights = conv.type.numel

    def view(start: int, stop: int, shape: tuple[int, ...]) -> Node:
        return make("reshape", make("slice", both, starts=(start,), stops=(stop,), steps=(1,)), shape=shape)
    return view(0, weights, conv.shape), view(weights, both.type.numel, bias.shape)
