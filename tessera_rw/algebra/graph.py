"""Graph: a function's inputs and outputs over interned nodes, its topological order and verifier.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (4,), DType.float32)
>>> g = Graph("double", (x,), (make("add", x, x),))
>>> len(g.nodes)
2
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

from tessera_rw.algebra.errors import TesseraError, VerifyError
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops import OPS


def topological_order(outputs: tuple[Node, ...]) -> tuple[Node, ...]:
    """Every node reachable from `outputs`, operands before users, in first-visit order."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in outputs:
        if id(root) in seen:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        seen.add(id(root))
        while stack:  # iterative: a 48-layer model is deeper than Python's recursion limit
            node, i = stack[-1]
            if i < len(node.args):
                stack[-1] = (node, i + 1)
                arg = node.args[i]
                if id(arg) not in seen:
                    seen.add(id(arg))
                    stack.append((arg, 0))
            else:
                stack.pop()
                order.append(node)
    return tuple(order)


@dataclass(frozen=True, eq=False)
class Graph:
    """A traced function: named inputs (op `input` nodes, in call order) and output nodes."""
    name: str
    inputs: tuple[Node, ...]
    outputs: tuple[Node, ...]

    @cached_property
    def nodes(self) -> tuple[Node, ...]:
        return topological_order(self.outputs)

    @cached_property
    def users(self) -> dict[Node, tuple[Node, ...]]:
        found: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for a in dict.fromkeys(n.args):
                found[a].append(n)
        return {n: tuple(us) for n, us in found.items()}

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n.attr("name") for n in self.inputs)

    def op_counts(self) -> Counter:
        return Counter(n.op for n in self.nodes if n.op not in ("input", "constant"))

    def replace(self, *, outputs: tuple[Node, ...] | None = None, name: str | None = None) -> Graph:
        return Graph(self.name if name is None else name, self.inputs,
                     self.outputs if outputs is None else outputs)

    def verify(self) -> Graph:
        """Check every node against its op's rule; raise VerifyError naming the first bad node."""
        names = Counter(self.input_names)
        if dupes := [n for n, c in names.items() if c > 1]:
            raise VerifyError(f"graph {self.name!r} has repeated input names {dupes}")
        declared = set(map(id, self.inputs))
        for node in self.nodes:
            op = OPS.get(node.op)
            if op is None:
                raise VerifyError(f"graph {self.name!r}: node {node!r} has an unknown op")
            if node.op == "input" and id(node) not in declared:
                raise VerifyError(f"graph {self.name!r} reads input {node.attr('name')!r} "
                                  f"that is not among its inputs {list(self.input_names)}")
            if not op.variadic and len(node.args) != len(op.operands):
                raise VerifyError(f"{node.op} node has {len(node.args)} operands, expects {len(op.operands)}")
            try:
                expected = op.infer(*(a.type for a in node.args), **node.attr_map)
            except TesseraError as e:
                raise VerifyError(f"graph {self.name!r}: {node.op} node fails its shape rule: {e.detail}",
                                  op=node.op) from None
            if expected != node.type:
                raise VerifyError(f"graph {self.name!r}: {node.op} node is typed {node.type}, "
                                  f"its rule gives {expected}", op=node.op)
        return self

    def __str__(self) -> str:
        from tessera_rw.algebra.printer import print_graph
        return print_graph(self)
