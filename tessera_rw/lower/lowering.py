"""Lowering: a chosen Graph → KernelPlan (which nodes launch, into which buffers).

Every node but inputs, constants and reshapes is one kernel. A reshape is a view: every value in a
plan is dense row-major, so the reshaped value is the same bytes. Other layout ops (transpose,
broadcast_to, slice) are kernels here — copies that make their result dense, since the kernels
reading them take dense operands.

Temporaries are assigned by a linear scan in execution order: a value's buffer is released after
the last kernel that reads it (through any reshape of it), and the next temporary takes the
smallest released buffer it fits in (or grows the largest one) before a new buffer is made. A
kernel never writes a buffer one of its own operands sits in, so no kernel runs in place. Every
graph output gets a buffer of its own that a kernel writes: an output that is an input, a constant
or a value already returned is copied out (an identity transpose, which the copy kernel runs).

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (1024,), DType.float32)
>>> y = make("exp", make("tanh", make("exp", make("tanh", x))))
>>> plan = lower(Graph("chain", (x,), (y,)))
>>> [b.role.value for b in plan.buffers]   # two temporaries take turns, then the output
['input', 'temp', 'temp', 'output']
"""

from __future__ import annotations

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.lower.plan import Buffer, BufferRole, KernelPlan, Step, ValueRef

SOURCE_OPS = frozenset({"input", "constant", "literal"})   # values that are in memory before any launch
VIEW_OPS = frozenset({"reshape"})                            # the same bytes at another shape


def base_of(node: Node) -> Node:
    """The node whose buffer `node`'s value lives in (itself unless it is a view)."""
    while node.op in VIEW_OPS:
        node = node.args[0]
    return node


class _Buffers:
    """Buffers as the scan hands them out, and the temporaries free for reuse."""

    def __init__(self) -> None:
        self.specs: list[list] = []          # [name, role, nbytes] per buffer id, sizes grow
        self.free: list[int] = []

    def new(self, name: str, role: BufferRole, nbytes: int) -> int:
        self.specs.append([name, role, nbytes])
        return len(self.specs) - 1

    def temp(self, name: str, nbytes: int) -> int:
        fitting = [b for b in self.free if self.specs[b][2] >= nbytes]
        if fitting:
            chosen = min(fitting, key=lambda b: (self.specs[b][2], b))
        elif self.free:
            chosen = max(self.free, key=lambda b: (self.specs[b][2], -b))
            self.specs[chosen][2] = nbytes
        else:
            return self.new(name, BufferRole.TEMP, nbytes)
        self.free.remove(chosen)
        return chosen

    def release(self, buffer: int) -> None:
        if self.specs[buffer][1] is BufferRole.TEMP:
            self.free.append(buffer)

    def frozen(self) -> tuple[Buffer, ...]:
        return tuple(Buffer(i, name, role, nbytes) for i, (name, role, nbytes) in enumerate(self.specs))


def _last_uses(steps: list[Node]) -> dict[Node, int]:
    """For each buffer-owning node, the index of the last kernel reading it (through views)."""
    last: dict[Node, int] = {}
    for i, node in enumerate(steps):
        for arg in node.args:
            last[base_of(arg)] = i
    return last


def lower(graph: Graph) -> KernelPlan:
    """The KernelPlan of `graph`: kernels in the graph's order, buffers assigned and reused."""
    nodes = graph.nodes
    steps_nodes = [n for n in nodes if n.op not in SOURCE_OPS and n.op not in VIEW_OPS]
    outputs = {base_of(o) for o in graph.outputs}
    last_use = _last_uses(steps_nodes)
    buffers = _Buffers()
    owner: dict[Node, int] = {}            # buffer-owning node -> buffer id

    for node in graph.inputs:                  # unused inputs too: a caller still passes them
        owner[node] = buffers.new(node.attr("name"), BufferRole.INPUT, node.type.nbytes)
    for node in nodes:
        if node.op in ("constant", "literal"):
            owner[node] = buffers.new(f"c{len(owner)}", BufferRole.CONSTANT, node.type.nbytes)

    def ref(node: Node) -> ValueRef:
        base = base_of(node)
        if base not in owner:
            raise TesseraError(f"node {node!r} is read before it is computed", op=node.op,
                               hint="the graph is not in topological order; build it with Graph(...)")
        return ValueRef(owner[base], node.type)

    steps = []
    for i, node in enumerate(steps_nodes):
        inputs = tuple(ref(a) for a in node.args)
        if node in outputs:
            owner[node] = buffers.new(f"out{len(steps)}", BufferRole.OUTPUT, node.type.nbytes)
        else:
            owner[node] = buffers.temp(f"t{len(steps)}", node.type.nbytes)
        steps.append(Step(node, inputs, ValueRef(owner[node], node.type)))
        for base in {base_of(a) for a in node.args}:
            if last_use.get(base) == i and base not in outputs:
                buffers.release(owner[base])

    outputs = _output_refs(graph, ref, buffers, steps)
    return KernelPlan(
        name=graph.name, graph=graph, buffers=buffers.frozen(),
        inputs=tuple((n.attr("name"), ref(n)) for n in graph.inputs),
        constants=tuple((n, ref(n)) for n in nodes if n.op in ("constant", "literal")),
        steps=tuple(steps), outputs=outputs)


def _output_refs(graph: Graph, ref, buffers: _Buffers, steps: list[Step]) -> tuple[ValueRef, ...]:
    """Each output's value in a buffer of its own; copies (appended to `steps`) where one is not."""
    seen: set[Node] = set()
    refs = []
    for out in graph.outputs:
        base = base_of(out)
        if base.op in SOURCE_OPS or base in seen:
            copy = Node("transpose", (out,), (("axes", tuple(range(out.type.ndim))),), out.type)
            target = ValueRef(buffers.new(f"out{len(steps)}", BufferRole.OUTPUT, out.type.nbytes), out.type)
            steps.append(Step(copy, (ref(out),), target))
            refs.append(target)
        else:
            seen.add(base)
            refs.append(ref(out))
    return tuple(refs)
