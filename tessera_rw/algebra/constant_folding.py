"""Constant folding while tracing: an elementwise op whose operands are all constants (or `full`
tensors), or a reshape, broadcast or transpose of one, becomes one constant.

The value is the numpy reference's, in the op's own dtype, so folding changes nothing a program
computes: `bf16(1) + 1e-8 - 1` folds to the 0 that bf16 arithmetic gives. Folding is done here,
where numpy holds every dtype, rather than by e-graph rules, whose f64 arithmetic would skip the
rounding of each step. A gradient's seed (ones, scaled by the loss's factors, reshaped and
broadcast) and an exponent such as `2 - 1` thus cost no kernel.

>>> from tessera_rw.algebra.builder import make, make_constant
>>> from tessera_rw.algebra.dtypes import DType
>>> one = make("full", shape=(), value=1.0, dtype=DType.bfloat16)
>>> nearly = folded(make("add", one, make_constant(1e-8, DType.bfloat16)))
>>> folded(make("sub", nearly, make_constant(1.0, DType.bfloat16)))
Node(constant, 0 args, dtype=<DType.bfloat16: 'bfloat16'>, value=0.0) -> bf16[]
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.builder import beyond_double, make, make_constant, python_scalar
from tessera_rw.algebra.evaluate import evaluate_node
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.opdef import OpKind
from tessera_rw.algebra.ops import OPS

UNIFORM_SOURCES = ("constant", "full")          # nodes whose every element is one value
KEEPS_UNIFORM = ("reshape", "broadcast_to", "transpose")
BY_POSITION = ("tril", "triu")                  # elementwise in kind, but each element's value depends on where it is


def folded(node: Node) -> Node:
    """`node`, or the constant (0-d) or `full` it computes when its operands are all uniform."""
    if not node.args or not all(a.op in UNIFORM_SOURCES for a in node.args):
        return node
    if (OPS[node.op].kind is not OpKind.ELEMENTWISE or node.op in BY_POSITION) and node.op not in KEEPS_UNIFORM:
        return node
    if node.dtype.is_complex:
        return node                                # the e-graph holds no complex constants
    value = evaluate_node(node, [evaluate_node(a, []) for a in node.args])
    flat = value.reshape(-1)
    if flat.size == 0 or not (flat == flat[0]).all():
        return node                                # empty, not one value, or NaN (which no rule should see)
    scalar = python_scalar(flat[0].item(), node.dtype)
    if beyond_double(scalar, node.dtype):
        return node
    if not node.shape:
        return make_constant(scalar, node.dtype)
    return make("full", shape=node.shape, value=scalar, dtype=node.dtype)
