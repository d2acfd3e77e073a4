"""Graph -> egglog commands: one `(union (Id i) term)` per node, operands referring to `(Id j)`.

Naming nodes through an `Id` constructor rather than global `let`s keeps insertion linear: egglog
makes every global a function of its own, and each command then costs more than the last.

>>> from tessera_rw import op
>>> g = op.kernel(lambda x: op.exp(x) * 2.0).trace(op.tensor((3,), "float32"))
>>> print(encode(g).unions[-1])
(union (Id 3) (Mul (Id 1) (Id 2) (vec-of 3) "float32"))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import ArrayLiteral, Node
from tessera_rw.algebra.ops import opdef
from tessera_rw.algebra.ops.fused_expr import MAX_FUSED_INPUTS
from tessera_rw.rules.schema import attr_names, codec, constructor_name, egg_dims, egg_string


ID = "Id"


@dataclass
class Encoding:
    """The commands that build a graph in an e-graph, and what decoding needs to come back."""
    unions: list[str]
    outputs: tuple[int, ...]                     # the Ids of the graph's outputs
    literals: dict[str, ArrayLiteral] = field(default_factory=dict)
    constructors: set[tuple[str, int]] = field(default_factory=set)


def term_text(node: Node, names: dict[Node, str], literals: dict[str, ArrayLiteral]) -> str:
    parts = [constructor_name(node.op, len(node.args))] + [names[a] for a in node.args]
    for attr in attr_names(node.op):
        value = node.attr(attr)
        if isinstance(value, ArrayLiteral):
            key = f"lit{len(literals)}"
            literals[key] = value
            parts.append(egg_string(key))
        else:
            parts.append(codec(node.op, attr).encode(value))
    parts += [egg_dims(node.shape), egg_string(node.dtype.value)]
    return "(" + " ".join(parts) + ")"


def encode(graph: Graph) -> Encoding:
    names: dict[Node, str] = {}
    literals: dict[str, ArrayLiteral] = {}
    unions, constructors = [], set()
    for i, node in enumerate(graph.nodes):
        names[node] = f"({ID} {i})"
        constructors.add((node.op, len(node.args)))
        unions.append(f"(union {names[node]} {term_text(node, names, literals)})")
    index = {node: i for i, node in enumerate(graph.nodes)}
    return Encoding(unions, tuple(index[o] for o in graph.outputs), literals, constructors)


def all_arities(op_name: str) -> tuple[int, ...]:
    """The arities an op's constructors are declared for (variadic ops get a range)."""
    op = opdef(op_name)
    if not op.variadic:
        return (len(op.operands),)
    if op.name in ("concatenate", "fused_elementwise", "fused_normalization", "reduced_normalization",
                   "fused_reduction"):                                                      # operand lists
        return tuple(range(1, 9))
    if op.name == "fused_conv":                 # x, w and up to MAX_FUSED_INPUTS - 1 epilogue inputs
        return tuple(range(2, 2 + MAX_FUSED_INPUTS))
    return tuple(range(1, len(op.operands) + 1))
