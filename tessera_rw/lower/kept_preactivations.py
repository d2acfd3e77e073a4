"""A GEMM whose output feeds an activation and is read again later writes both from its epilogue.

A GELU MLP's training step reads the first layer's pre-activation h = x W₁ + b₁ twice: the forward
pass takes gelu(h) to the second GEMM, and the backward pass's dgelu epilogue reads h itself. The
e-graph cannot fold the gelu into the first GEMM's epilogue then, as h would be lost, so extraction
leaves a GEMM writing h and an elementwise pass reading it back to write gelu(h): at 8192 × 4096
bf16, 128 MB through HBM that the GEMM, still compute-bound when it writes twice, can save.
Here, once a program is chosen, such a gemm (no activation, no residual) and its activation
become one gemm_pre_act writing stack(h, act(h)) (cuBLASLt's GELU_AUX epilogue), and the two
values are its halves, read in place as views.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x, w = make_input("x", (64, 32), DType.float32), make_input("w", (32, 16), DType.float32)
>>> h = make("gemm", x, w, scale=1.0, activation="none", has_bias=False, has_residual=False, accum_dtype=None,
...          dtype=DType.float32)
>>> g, dh = make("gelu", h, approximate="none"), make("fused_elementwise", h, expr="tanh($0)")
>>> [n.op for n in keep_preactivations(Graph("g", (x, w), (g, dh))).nodes if n.op != "input"]
['gemm_pre_act', 'slice', 'reshape', 'slice', 'reshape', 'fused_elementwise']
"""

from __future__ import annotations

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.fused_expr import expression_name, parse_expr
from tessera_rw.algebra.ops.fused_gemm import ACTIVATIONS

_GEMM_ATTRS = ("scale", "has_bias", "accum_dtype", "dtype", "trans_a", "trans_b")


def keep_preactivations(graph: Graph) -> Graph:
    """`graph` with each plain gemm that an activation and another kernel (or the caller) both read
    written once, with its activation, by a gemm_pre_act."""
    users, outputs = graph.users, set(graph.outputs)
    new: dict[Node, Node] = {}
    for node in graph.nodes:
        if node in new:                 # an activation that its gemm's gemm_pre_act computes
            continue
        new[node] = node.replace(args=tuple(new[a] for a in node.args))
        readers = users[node]
        if node.op != "gemm" or len(readers) + (node in outputs) < 2 or not _plain(node):
            continue
        for reader in readers:
            if (activation := _activation(reader, node)) is not None:
                new[node], new[reader] = _halves(new[node], activation)
                break
    if all(new[n] is n for n in graph.nodes):
        return graph
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _plain(gemm: Node) -> bool:
    at = gemm.attr_map
    return at["activation"] == "none" and not at["has_residual"]


def _activation(reader: Node, gemm: Node) -> str | None:
    """The gemm activation `reader` applies to `gemm`'s result alone, or None."""
    if reader.args != (gemm,) or reader.type != gemm.type:
        return None
    if reader.op == "fused_elementwise":      # a one-op expression over the product: 'gelu_tanh($0)'
        tree = parse_expr(reader.attr_map["expr"])
        name = tree[0] if isinstance(tree, tuple) and tree[1:] == (0,) else None
    else:                                     # the expression's name of the plain op (gelu_tanh for tanh gelu)
        name = expression_name(reader.op, reader.attr_map)
    return name if name in ACTIVATIONS and name != "none" else None


def _halves(gemm: Node, activation: str) -> tuple[Node, Node]:
    """(the pre-activation, the activation) as views of the gemm_pre_act computing both."""
    at = gemm.attr_map
    both = make("gemm_pre_act", *gemm.args, activation=activation, **{k: at[k] for k in _GEMM_ATTRS if k in at})
    shape = gemm.shape
    zeros, ones = (0,) * len(shape), (1,) * (len(shape) + 1)
    return tuple(make("reshape", make("slice", both, starts=(i, *zeros), stops=(i + 1, *shape), steps=ones),
                      shape=shape) for i in (0, 1))
