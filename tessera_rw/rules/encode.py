"""Graph -> egglog program: declarations for the ops it uses, then one `let` per node.

>>> from tessera_rw import op
>>> g = op.kernel(lambda x: op.exp(x) * 2.0).trace(op.tensor((3,), "float32"))
>>> print(encode(g).program.splitlines()[-1])
(let $out0 $n3)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import ArrayLiteral, Node
from tessera_rw.algebra.ops import OPS
from tessera_rw.rules.schema import attr_names, codec, constructor_name, egg_dims, egg_string


@dataclass
class Encoding:
    """The program that builds a graph in an e-graph, and what decoding needs to come back."""
    program: str
    outputs: tuple[str, ...]                     # the `let` names of the graph's outputs
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
    lines, constructors = [], set()
    for i, node in enumerate(graph.nodes):
        names[node] = f"$n{i}"
        constructors.add((node.op, len(node.args)))
        lines.append(f"(let {names[node]} {term_text(node, names, literals)})")
    outputs = tuple(f"$out{i}" for i in range(len(graph.outputs)))
    lines += [f"(let {o} {names[n]})" for o, n in zip(outputs, graph.outputs)]
    return Encoding("\n".join(lines), outputs, literals, constructors)


def all_arities(op_name: str) -> tuple[int, ...]:
    """The arities an op's constructors are declared for (variadic ops get a range)."""
    op = OPS[op_name]
    if not op.variadic:
        return (len(op.operands),)
    if op.name == "concatenate":
        return tuple(range(1, 9))
    return tuple(range(1, len(op.operands) + 1))
