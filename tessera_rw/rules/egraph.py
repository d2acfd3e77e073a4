"""A read-only view of a saturated e-graph (from egglog's serialization) and decoding back to nodes.

Each e-class lists its e-nodes as (op name, operand classes, attrs); `decode` turns a choice of
one e-node per class into graph nodes through the ops' own shape rules, so whatever is extracted
passes the verifier or fails loudly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

from tessera_rw.algebra.builder import make, python_scalar
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import ArrayLiteral, Node
from tessera_rw.algebra.ops import OPS
from tessera_rw.rules.schema import attr_names, camel, codec, constructor_name



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


def _primitive(nodes: Mapping[str, dict], node_id: str) -> Any:
    node = nodes[node_id]
    op = node["op"]
    if op == "vec-of":
        return tuple(_primitive(nodes, c) for c in node["children"])
    if op in ("vec-empty", "[]"):
        return ()
    if op.startswith('"'):
        return json.loads(op)
    if op in ("true", "false"):
        return op == "true"
    try:
        return int(op)
    except ValueError:
        return float(op)


class EGraphView:
    """E-classes of terms, each with its e-nodes, built from egglog's JSON serialization."""

    def __init__(self, serialized_json: str, literals: Mapping[str, ArrayLiteral]):
        data = json.loads(serialized_json)
        nodes = data["nodes"]
        self.literals = dict(literals)
        by_constructor = _Constructors()
        self.ids: dict[int, str] = {}          # encoder Id -> e-class
        self.classes: dict[str, list[ENode]] = {}
        for nid, node in nodes.items():
            if node["op"] == "Id":
                self.ids[_primitive(nodes, node["children"][0])] = node["eclass"]
                continue
            found = by_constructor.get(node["op"])
            if found is None or not nid.startswith("function-"):
                continue
            op_name, arity = found
            children = node["children"]
            operand_classes = tuple(nodes[c]["eclass"] for c in children[:arity])
            names = attr_names(op_name)
            values = [_primitive(nodes, c) for c in children[arity:arity + len(names)]]
            attrs = tuple((n, codec(op_name, n).decode(v)) for n, v in zip(names, values))
            self.classes.setdefault(node["eclass"], []).append(
                ENode(nid, op_name, node["eclass"], operand_classes, attrs,
                      tuple(_primitive(nodes, children[-2])), _primitive(nodes, children[-1])))

    @cached_property
    def enode_count(self) -> int:
        return sum(len(ns) for ns in self.classes.values())

    def root(self, node_id: int) -> str:
        """The e-class of the encoded graph's node number `node_id`."""
        return self.ids[node_id]

    def ops_in(self, eclass: str) -> set[str]:
        return {n.op for n in self.classes[eclass]}

    def decode(self, choice: Mapping[str, ENode], root: str) -> Node:
        """Rebuild the term chosen from `root` (one e-node per class in `choice`) as graph nodes."""
        built: dict[str, Node] = {}
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


