"""A read-only view of a saturated e-graph (read from its frozen rows) and decoding back to nodes.

Each e-class lists its e-nodes as (op name, operand classes, attrs); `decode` turns a choice of
one e-node per class into graph nodes through the ops' own shape rules, so whatever is extracted
passes the verifier or fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any, Callable, Iterable, Mapping

from egglog import bindings

from tessera_rw.algebra.builder import make, python_scalar
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import ArrayLiteral, Node, TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.rules.schema import TERM_SORT, attr_names, camel, codec, constructor_name


class _Constructors:
    """egglog constructor name -> (op, arity), for the ops declared now (plugins add some): a
    fixed-arity op's constructor is its camel-case name, a variadic op's has its arity appended,
    whatever the arity (a concatenation of 40 tensors is `Concatenate40`)."""

    def __init__(self) -> None:
        self.fixed = {constructor_name(op, 0): (op.name, len(op.operands)) for op in OPS.values() if not op.variadic}
        self.variadic = {camel(op.name): op.name for op in OPS.values() if op.variadic}

    def get(self, name: str) -> tuple[str, int] | None:
        if name in self.fixed:
            return self.fixed[name]
        digits = len(name) - len(name.rstrip("0123456789"))
        for cut in range(len(name) - digits, len(name)):     # the op name without digits first
            if name[:cut] in self.variadic:
                return self.variadic[name[:cut]], int(name[cut:])
        return None


class CycleError(TesseraError):
    """A choice of e-nodes that does not form a term (some class reaches itself)."""


@dataclass(frozen=True)
class ENode:
    id: str
    op: str                         # tessera_rw op name
    eclass: str
    operands: tuple[str, ...]       # e-class ids
    attrs: tuple[tuple[str, Any], ...]
    shape: tuple[int, ...]          # the type the e-graph records for it
    dtype: str


class _Reader:
    """Python values of an e-graph's Values, by sort. Shapes, dtype strings and class names are read
    once each: a 48-layer model's rows repeat a few hundred of them thousands of times."""

    def __init__(self, egraph: bindings.EGraph):
        i64, vec = egraph.value_to_i64, egraph.value_to_vec
        self.i64, self.f64, self.bool, self.vec = i64, egraph.value_to_f64, egraph.value_to_bool, vec
        self.string = cache(egraph.value_to_string)
        # no reference back to the reader: a cycle would keep the e-graph alive for the collector to
        # drop, on whichever thread it runs, and egglog's e-graphs must be dropped where they were made
        self.dims = cache(lambda value: tuple(map(i64, vec(value))))
        self.eclass = cache(self._eclass_name)

    @staticmethod
    def _eclass_name(value: bindings.Value) -> str:
        """The name egglog's serialization gives a term's e-class: 'T-' and the number of its
        Value, which prints as 'Value(42)'."""
        return f"{TERM_SORT}-{str(value).removeprefix('Value(').removesuffix(')')}"

    def of_sort(self, sort: str) -> Callable[[bindings.Value], Any]:
        """The reader of an attribute's sort (the sorts `schema.ATTRS` encodes to)."""
        return {"i64": self.i64, "f64": self.f64, "bool": self.bool, "String": self.string, "Dims": self.dims}[sort]


class EGraphView:
    """E-classes of terms, each with its e-nodes, read from a saturated egglog e-graph.

    Classes and e-nodes carry egglog's names (class 'T-42', e-node 'function-3-Add': row 3 of
    constructor Add) in egglog's order, as its serialization writes them: extraction breaks ties by
    e-node order and class name, so both are egglog's, not an artefact of reading.

    >>> from tessera_rw import op
    >>> from tessera_rw.rules.saturate import rewrite
    >>> view = rewrite(op.kernel(lambda x: x * 2.0).trace(op.tensor((2,), "float32")), ()).view
    >>> [(e.id, e.op, [view.classes[c][0].op for c in e.operands]) for e in view.classes[view.root(2)]]
    [('function-0-Mul', 'mul', ['input', 'constant'])]
    """

    def __init__(self, egraph: bindings.EGraph, literals: Mapping[str, ArrayLiteral]):
        self.literals = dict(literals)
        self.ids: dict[int, str] = {}          # encoder Id -> e-class
        self.classes: dict[str, list[ENode]] = {}
        read = _Reader(egraph)
        by_constructor = _Constructors()
        # the frozen rows, not serialize() -> JSON -> json.loads: a quarter of the time (36 ms
        # against 165 ms for 48-layer BERT-base, of a rewrite's 0.9 s)
        for name, function in egraph.freeze().functions.items():
            if name == "Id":
                self.ids.update((read.i64(row.inputs[0]), read.eclass(row.output)) for row in function.rows)
                continue
            found = by_constructor.get(name)
            if found is None:
                continue
            op_name, arity = found
            decoders = [(n, codec(op_name, n).decode, read.of_sort(sort))
                        for n, sort in zip(attr_names(op_name), function.input_sorts[arity:])]
            for k, row in enumerate(function.rows):
                inputs, eclass = row.inputs, read.eclass(row.output)
                attrs = tuple((n, decode(convert(v))) for (n, decode, convert), v in zip(decoders, inputs[arity:]))
                self.classes.setdefault(eclass, []).append(
                    ENode(f"function-{k}-{name}", op_name, eclass, tuple(map(read.eclass, inputs[:arity])), attrs,
                          read.dims(inputs[-2]), read.string(inputs[-1])))

    @cached_property
    def enode_count(self) -> int:
        return sum(len(ns) for ns in self.classes.values())

    @cached_property
    def types(self) -> dict[str, TensorType]:
        """Each class's type (its e-nodes share it)."""
        return {cid: TensorType(tuple(ns[0].shape), DType.parse(ns[0].dtype)) for cid, ns in self.classes.items()}

    def root(self, node_id: int) -> str:
        """The e-class of the encoded graph's node number `node_id`."""
        return self.ids[node_id]

    def ops_in(self, eclass: str) -> set[str]:
        return {n.op for n in self.classes[eclass]}

    def decode(self, choice: Mapping[str, ENode], root: str) -> Node:
        """Rebuild the term chosen from `root` (one e-node per class in `choice`) as graph nodes."""
        return self.decode_all(choice, (root,))[0]

    def decode_all(self, choice: Mapping[str, ENode], roots: Iterable[str]) -> tuple[Node, ...]:
        """decode() of each root, what they share built once: a training step's gradients share the
        forward, and decoding each alone made the work grow with the square of the model's depth."""
        built: dict[str, Node] = {}
        return tuple(self._decoded(choice, root, built) for root in roots)

    def _decoded(self, choice: Mapping[str, ENode], root: str, built: dict[str, Node]) -> Node:
        open_: set[str] = set()
        stack = [(root, False)]
        while stack:  # iterative post-order: deep graphs exceed Python's recursion limit
            cid, ready = stack.pop()
            if cid in built:
                continue
            enode = choice[cid]
            if not ready:
                if cid in open_:
                    raise CycleError(f"the chosen e-nodes form a cycle through e-class {cid}")
                open_.add(cid)
                stack.append((cid, True))
                stack.extend((c, False) for c in enode.operands if c not in built)
                continue
            built[cid] = decode_enode(enode, [built[c] for c in enode.operands], self.literals)
        return built[root]


def decode_enode(enode: ENode, operands: list[Node], literals: Mapping[str, ArrayLiteral]) -> Node:
    attrs = dict(enode.attrs)
    shape, dtype = enode.shape, DType.parse(enode.dtype)
    op = enode.op
    if op == "literal":
        attrs["value"] = literals[attrs["value"]]
    elif op in ("constant", "full"):
        attrs["value"] = python_scalar(attrs["value"], attrs["dtype"])
    elif op == "arange":
        for k in ("start", "stop", "step"):
            attrs[k] = python_scalar(attrs[k], attrs["dtype"])
    elif op == "pad":
        attrs["value"] = python_scalar(attrs["value"], operands[0].dtype)
    node = make(op, *operands, **attrs)
    if node.shape != tuple(shape) or node.dtype is not dtype:
        raise TesseraError(f"decoding {op}: the e-graph typed it {dtype}{list(shape)}, its rule gives {node.type}",
                           hint="a rewrite rule built a term with a wrong type annotation")
    return node


