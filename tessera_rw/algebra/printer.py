"""Print a Graph as the Python it came from: infix operators, inlined constants, types as comments.

    def attention(q: f32[2,8,16], k: f32[2,8,16], v: f32[2,8,16]):
        t0 = transpose(k, axes=(0, 2, 1))      # f32[2,16,8]
        t1 = q @ t0                            # f32[2,8,8]
        t2 = softmax(t1, axis=2)               # f32[2,8,8]
        t3 = t2 @ v                            # f32[2,8,16]
        return t3
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import Node

if TYPE_CHECKING:
    from tessera_rw.algebra.graph import Graph

INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "matmul": "@",
         "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
         "logical_and": "&", "logical_or": "|"}
_HIDDEN_ATTRS = {"has_weight", "has_bias", "has_mask"}
_SHOWN_UNLESS = {"window": 0}         # attributes shown only where they differ from this value


def _constant_text(node: Node) -> str:
    value = node.attr("value")
    text = repr(value) if node.dtype.is_float or node.dtype.is_complex else str(value)
    return f"({text})" if text.startswith("-") else text


def print_graph(graph: Graph) -> str:
    names: dict[Node, str] = {n: n.attr("name") for n in graph.inputs}

    def ref(node: Node) -> str:
        return _constant_text(node) if node.op == "constant" else names[node]

    params = ", ".join(f"{n.attr('name')}: {n.type}" for n in graph.inputs)
    lines = [f"def {graph.name}({params}):"]
    body = [n for n in graph.nodes if n.op not in ("input", "constant")]
    width = len(str(len(body)))
    for i, node in enumerate(body):
        names[node] = f"t{i:0{width}d}" if width > 1 else f"t{i}"
        args = [ref(a) for a in node.args]
        if node.op in INFIX and len(args) == 2:
            expr = f"{args[0]} {INFIX[node.op]} {args[1]}"
        elif node.op == "neg":
            expr = f"-{args[0]}"
        elif node.op == "logical_not":
            expr = f"~{args[0]}"
        else:
            shown = [f"{k}={v}" if isinstance(v, DType) else f"{k}={v!r}"
                     for k, v in node.attrs
                     if k not in _HIDDEN_ATTRS and v is not None and (k not in _SHOWN_UNLESS or v != _SHOWN_UNLESS[k])]
            expr = f"{node.op}({', '.join(args + shown)})"
        stmt = f"    {names[node]} = {expr}"
        lines.append(f"{stmt:<48} # {node.type}")
    outs = ", ".join(ref(o) for o in graph.outputs)
    lines.append(f"    return {outs}")
    return "\n".join(lines)
