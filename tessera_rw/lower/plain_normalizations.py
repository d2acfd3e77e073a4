"""A fused normalization that fuses nothing is the plain normalization it lifts.

The epilogue rules lift `softmax(x)` (and log_softmax, layer and RMS norms, their weight and bias
too) into a `fused_normalization` reading x as it is, so that elementwise ops after it can join its
row kernel. Where extraction takes such a node with nothing joined (prologue and epilogue `$0`),
the program runs the plain op instead: the same row kernel, the one its name and the benchmarks
speak of.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (4, 8), DType.float32)
>>> lifted = make("fused_normalization", x, expr="$0", norm="softmax", axes=(1,), eps=0.0,
...               has_weight=False, has_bias=False, post="$0")
>>> [n.op for n in plain_normalizations(Graph("g", (x,), (lifted,))).nodes]
['input', 'softmax']
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.fused import NO_EPILOGUE


def lifts_nothing(op: str, attrs: Mapping[str, Any]) -> bool:
    """Whether a node of `op` with `attrs` is a lifted normalization that fused nothing."""
    return op == "fused_normalization" and attrs.get("expr") == NO_EPILOGUE and attrs.get("post") == NO_EPILOGUE


def _lifts_nothing(node: Node) -> bool:
    return lifts_nothing(node.op, node.attr_map)


def _plain(node: Node, args: tuple[Node, ...]) -> Node:
    attrs = node.attr_map
    if attrs["norm"] in ("softmax", "log_softmax"):
        return make(attrs["norm"], *args, axis=attrs["axes"][0])
    return make(attrs["norm"], *args, axes=attrs["axes"], eps=attrs["eps"], has_weight=attrs["has_weight"],
                has_bias=attrs["has_bias"])


def plain_normalizations(graph: Graph) -> Graph:
    """`graph` with every fused_normalization that fuses nothing its plain normalization."""
    if not any(_lifts_nothing(n) for n in graph.nodes):
        return graph
    new: dict[Node, Node] = {}
    for node in graph.nodes:
        args = tuple(new[a] for a in node.args)
        if _lifts_nothing(node):
            new[node] = _plain(node, args)
        elif any(a is not b for a, b in zip(args, node.args)):
            new[node] = make(node.op, *args, **node.attr_map)
        else:
            new[node] = node
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()
