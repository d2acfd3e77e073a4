"""Reference evaluation: run a Graph on the host with numpy, faithful to each node's dtype.

16- and 8-bit floats are widened to float32 for the arithmetic (as fp32 accumulation on the GPU)
and each result is rounded to its node's dtype, so rounding happens where a kernel would round.

>>> import numpy as np
>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.graph import Graph
>>> x = make_input("x", (3,), DType.float32)
>>> evaluate(Graph("f", (x,), (make("exp", x),)), {"x": np.zeros(3, np.float32)})[0]
array([1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from tessera_rw.algebra.errors import ArgumentError, ResultError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops import BUILTIN_OPS, OPS

# Host types narrower than float32; arithmetic on them is carried out in float32.
_LOW_PRECISION = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"})


def _feed(node: Node, feeds: Mapping[str, np.ndarray], precise: bool) -> np.ndarray:
    name = node.attr("name")
    if name not in feeds:
        raise ArgumentError(f"no value fed for input {name!r}")
    value = np.asarray(feeds[name])
    if value.shape != node.shape:
        raise ArgumentError(f"input {name!r} has shape {value.shape}, the graph expects {node.shape}")
    return value.astype(_held_as(node, precise), copy=False)


def _held_as(node: Node, precise: bool) -> np.dtype:
    """The host type a node's value is kept in: its own, or the widest of its kind when `precise`."""
    if precise and node.dtype.is_float:
        return np.dtype(np.float64)
    if precise and node.dtype.is_complex:
        return np.dtype(np.complex128)
    return np.dtype(node.dtype.numpy)


def widened(args: list[np.ndarray]) -> list[np.ndarray]:
    """`args` with 16- and 8-bit floats widened to float32, the precision kernels compute in."""
    return [a.astype(np.float32) if a.dtype.name in _LOW_PRECISION else a for a in args]


def evaluate_node(node: Node, args: list[np.ndarray], precise: bool = False) -> np.ndarray:
    op = OPS[node.op]
    if not op.exact:
        args = widened(args)
    result = np.asarray(op.reference(*args, **node.attr_map))
    # a plugin op's reference and shape rule disagree: never broadcast its result into place
    # (tessera_rw's own ops may: a filled constant is held as its one value)
    if result.shape != node.shape and node.op not in BUILTIN_OPS:
        raise ResultError(f"its reference returned an array of shape {result.shape}, but its shape rule gives "
                          f"{node.type}", op=node.op, operands=", ".join(str(a.type) for a in node.args) or None,
                          hint=f"make {node.op}'s reference and shape rule (infer) agree")
    if node.op == "constant" and not precise:
        return result  # a Python scalar stays in its compute type (float32), as in a kernel's literal
    return result.astype(_held_as(node, precise), copy=False)


def evaluate(graph: Graph, feeds: Mapping[str, np.ndarray], *, precise: bool = False) -> tuple[np.ndarray, ...]:
    """Values of the graph's outputs for the given inputs (by name), intermediates freed early.

    `precise` keeps every float in float64 instead of rounding to each node's dtype: the value the
    graph's arithmetic approximates, to tell rounding from a wrong result."""
    uses: dict[Node, int] = {}
    for node in graph.nodes:
        for a in node.args:
            uses[a] = uses.get(a, 0) + 1
    keep = set(graph.outputs)
    values: dict[Node, np.ndarray] = {}
    for node in graph.nodes:
        if node.op == "input":
            values[node] = _feed(node, feeds, precise)
            continue
        values[node] = evaluate_node(node, [values[a] for a in node.args], precise)
        for a in node.args:
            uses[a] -= 1
            if uses[a] == 0 and a not in keep:
                values.pop(a, None)
    return tuple(values[o].astype(_held_as(o, precise), copy=False) for o in graph.outputs)
