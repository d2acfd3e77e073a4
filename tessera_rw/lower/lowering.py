"""Lowering: a chosen Graph → KernelPlan (which nodes launch, into which buffers).

Every node but inputs, constants and views is one kernel. A view is a value made of bytes that
are already in memory: a reshape (every value in a plan is dense row-major, so the reshaped value
is the same bytes) and a slice that selects one contiguous run of its operand (rows 0:M of a
matrix, x[3] of a stack: the same bytes at an offset, `view_offset`). Views of views add their
offsets. Other layout ops (transpose, broadcast_to, strided slices) are kernels here — copies that
make their result dense, since the kernels reading them take dense operands.

Temporaries are assigned by a linear scan in execution order: a value's buffer is released after
the last kernel that reads it or any view of it, and the next temporary takes the smallest
released buffer it fits in (or grows the largest one) before a new buffer is made. A kernel never
writes a buffer one of its own operands sits in, so no kernel runs in place.

Outputs: a computed output is handed back where it lies, even as a view — its base value is then
written straight into an output buffer, and several outputs that are disjoint views of one value
share that buffer (a packed GEMM result returned as dW = packed[:M], db = packed[M] costs no copy).
An output is copied into a buffer of its own (an identity transpose, which the copy kernel runs)
when it is an input or a constant or a view of one, when it overlaps an output already handed
back, or when the outputs viewing its base cover less than half of it (so a small slice does not
keep a large value alive in the caller's hands; a base of SMALL_BASE bytes or less is handed back
whole, which costs less than a launch: a batch norm's weight and bias gradients, rows of the
multi_reduction that also holds Σdy·g/σ). A computed base's copies run right after it, so
it can be released as usual; copies of inputs and constants run last.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (1024,), DType.float32)
>>> y = make("exp", make("tanh", make("exp", make("tanh", x))))
>>> plan = lower(Graph("chain", (x,), (y,)))
>>> [b.role.value for b in plan.buffers]   # two temporaries take turns, then the output
['input', 'temp', 'temp', 'output']
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node, TensorType
from tessera_rw.algebra.shapes import contiguous_slice_offset
from tessera_rw.lower.plan import VIEW_ALIGNMENT, Buffer, BufferRole, KernelPlan, Step, ValueRef

SOURCE_OPS = frozenset({"input", "constant", "literal"})   # values that are in memory before any launch
VIEW_OPS = frozenset({"reshape"})                            # always views: the same bytes at another shape
SMALL_BASE = 64 * 1024                                       # bytes an output's base may hold beside it


def view_offset(op: str, operand: TensorType, attrs: Mapping[str, Any]) -> int | None:
    """The byte offset into its operand's value at which a view op's value starts; None when the
    op is a kernel. A reshape is a view at 0; a slice is a view when it selects one contiguous run
    starting at a multiple of VIEW_ALIGNMENT (a less aligned start would misalign the vector loads
    of the kernels reading it, so such a slice stays a copy).

    >>> from tessera_rw.algebra.dtypes import DType
    >>> t = TensorType((9, 64), DType.float32)
    >>> rows = dict(starts=(8, 0), stops=(9, 64), steps=(1, 1))
    >>> view_offset("slice", t, rows), view_offset("reshape", t, {"shape": (576,)})
    (2048, 0)
    >>> view_offset("slice", t, dict(starts=(0, 0), stops=(9, 32), steps=(1, 1))) is None   # strided
    True
    """
    if op in VIEW_OPS:
        return 0
    if op == "slice":
        offset = contiguous_slice_offset(operand, attrs["starts"], attrs["stops"], attrs["steps"])
        if offset is not None and offset % VIEW_ALIGNMENT == 0:
            return offset
    return None


def _own_offset(node: Node) -> int | None:
    if node.op not in VIEW_OPS and node.op != "slice":
        return None
    return view_offset(node.op, node.args[0].type, node.attr_map)


def is_view(node: Node) -> bool:
    """Whether `node` launches nothing: its value is bytes of its operand's."""
    return _own_offset(node) is not None


def located(node: Node) -> tuple[Node, int]:
    """(the node whose buffer `node`'s value lives in, the byte offset there): itself at 0 unless
    it is a view."""
    offset = 0
    while (own := _own_offset(node)) is not None:
        offset += own
        node = node.args[0]
    return node, offset


class _Buffers:
    """Buffers as the scan hands them out, and the temporaries free for reuse."""

    def __init__(self) -> None:
        self.specs: list[list] = []          # [name, role, nbytes] per buffer id, sizes grow
        self.free: list[int] = []

    def new(self, name: str, role: BufferRole, nbytes: int) -> int:
        self.specs.append([name, role, nbytes])
        return len(self.specs) - 1

    def temp(self, nbytes: int) -> int:
        """A temporary of `nbytes`: a released one where one is free (the smallest that fits, else
        the largest, grown), or a new one, named tmp0, tmp1, ... (it holds several values in turn)."""
        fitting = [b for b in self.free if self.specs[b][2] >= nbytes]
        if fitting:
            chosen = min(fitting, key=lambda b: (self.specs[b][2], b))
        elif self.free:
            chosen = max(self.free, key=lambda b: (self.specs[b][2], -b))
            self.specs[chosen][2] = nbytes
        else:
            return self.new(f"tmp{sum(spec[1] is BufferRole.TEMP for spec in self.specs)}", BufferRole.TEMP, nbytes)
        self.free.remove(chosen)
        return chosen

    def release(self, buffer: int) -> None:
        if self.specs[buffer][1] is BufferRole.TEMP:
            self.free.append(buffer)

    def frozen(self) -> tuple[Buffer, ...]:
        return tuple(Buffer(i, name, role, nbytes) for i, (name, role, nbytes) in enumerate(self.specs))


def _served_in_place(outputs: tuple[Node, ...], where: Mapping[Node, tuple[Node, int]]) -> list[bool]:
    """For each output, whether it is handed back where it lies (True) rather than copied out."""
    spans: dict[Node, list[tuple[int, int]]] = {}        # base -> byte ranges of the outputs kept in it
    served = []
    for out in outputs:
        base, offset = where[out]
        start, end = offset, offset + out.type.nbytes
        kept = spans.setdefault(base, [])
        fits = base.op not in SOURCE_OPS and (start == end or all(end <= a or b <= start for a, b in kept))
        if fits and start < end:
            kept.append((start, end))
        served.append(fits)
    thin = {base for base, kept in spans.items()
            if kept and 2 * sum(b - a for a, b in kept) < base.type.nbytes and base.type.nbytes > SMALL_BASE}
    return [ok and where[out][0] not in thin for out, ok in zip(outputs, served)]


def _identity_copy(value: Node) -> Node:
    return Node("transpose", (value,), (("axes", tuple(range(value.type.ndim))),), value.type)


def lower(graph: Graph) -> KernelPlan:
    """The KernelPlan of `graph`: kernels in the graph's order, buffers assigned and reused."""
    nodes = graph.nodes
    where = {n: located(n) for n in (*graph.inputs, *nodes)}     # unused inputs are not in `nodes`
    kernels = [n for n in nodes if n.op not in SOURCE_OPS and where[n][0] is n]
    served = _served_in_place(graph.outputs, where)
    in_output_buffer: dict[Node, int] = {}         # buffer-owning node -> the first output it serves
    for i, (o, ok) in enumerate(zip(graph.outputs, served)):
        if ok:
            in_output_buffer.setdefault(where[o][0], i)

    # Execution order: (node, None) computes a node; (copy, i) copies output i into its own buffer.
    copies_after: dict[Node, list[int]] = {}
    last_copies: list[int] = []
    for i, (out, ok) in enumerate(zip(graph.outputs, served)):
        if not ok:
            base = where[out][0]
            (last_copies if base.op in SOURCE_OPS else copies_after.setdefault(base, [])).append(i)
    order: list[tuple[Node, int | None]] = []
    for node in kernels:
        order.append((node, None))
        order += [(_identity_copy(graph.outputs[i]), i) for i in copies_after.get(node, ())]
    order += [(_identity_copy(graph.outputs[i]), i) for i in last_copies]

    last_use: dict[Node, int] = {}        # buffer-owning node -> the last step reading it (through views)
    for i, (node, _) in enumerate(order):
        for arg in node.args:
            last_use[where[arg][0]] = i

    buffers = _Buffers()
    owner: dict[Node, int] = {}            # buffer-owning node -> buffer id
    for node in graph.inputs:                  # unused inputs too: a caller still passes them
        owner[node] = buffers.new(node.attr("name"), BufferRole.INPUT, node.type.nbytes)
    for node in nodes:
        if node.op in ("constant", "literal"):
            owner[node] = buffers.new(f"c{len(owner)}", BufferRole.CONSTANT, node.type.nbytes)

    def ref(node: Node) -> ValueRef:
        base, offset = where[node]
        if base not in owner:
            raise TesseraError(f"node {node!r} is read before it is computed", op=node.op,
                               hint="the graph is not in topological order; build it with Graph(...)")
        return ValueRef(owner[base], node.type, offset)

    steps: list[Step] = []
    results: dict[int, ValueRef] = {}          # output index -> its copy
    for i, (node, copy_of) in enumerate(order):
        inputs = tuple(ref(a) for a in node.args)
        if copy_of is not None:
            target = results[copy_of] = ValueRef(
                buffers.new(f"out{copy_of}", BufferRole.OUTPUT, node.type.nbytes), node.type)
        else:
            if node in in_output_buffer:
                owner[node] = buffers.new(f"out{in_output_buffer[node]}", BufferRole.OUTPUT, node.type.nbytes)
            else:
                owner[node] = buffers.temp(node.type.nbytes)
            target = ValueRef(owner[node], node.type)
        steps.append(Step(node, inputs, target))
        for base in {where[a][0] for a in node.args}:
            if last_use.get(base) == i:
                buffers.release(owner[base])       # only temporaries return to the pool

    outputs = tuple(results[i] if i in results else ref(out) for i, out in enumerate(graph.outputs))
    return KernelPlan(
        name=graph.name, graph=graph, buffers=buffers.frozen(),
        inputs=tuple((n.attr("name"), ref(n)) for n in graph.inputs),
        constants=tuple((n, ref(n)) for n in nodes if n.op in ("constant", "literal")),
        steps=tuple(steps), outputs=outputs)
