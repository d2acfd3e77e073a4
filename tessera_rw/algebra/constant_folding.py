"""Constant folding while tracing: an elementwise op whose operands are all constants (or `full`
tensors, or broadcast constants), or a reshape, broadcast or transpose of one, becomes one
constant, broadcast to its shape (which elementwise consumers absorb, so nothing is materialized).

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

KEEPS_UNIFORM = ("reshape", "broadcast_to", "transpose")
BY_POSITION = ("tril", "triu")       # elementwise in kind, but an element's value depends on where it is


def uniform_value(node: Node) -> np.ndarray | None:
    """The one value (0-d) of a node whose elements all hold it, as the reference evaluates it: a
    constant (in its compute type, as a kernel's literal), a `full` or a broadcast constant (in
    their dtype); else None."""
    if node.op == "constant":
        return evaluate_node(node, [])
    if node.op == "broadcast_to" and node.args[0].op == "constant":
        return evaluate_node(node.args[0], []).astype(node.dtype.numpy)
    if node.op == "full":
        return np.asarray(node.attr("value")).astype(node.dtype.numpy)
    return None


def folded(node: Node) -> Node:
    """`node`, or the constant it computes (broadcast to its shape) when its operands are all
    uniform. Only one element is computed, whatever the shape."""
    if not node.args or node.dtype.is_complex:     # the e-graph holds no complex constants
        return node
    if node.op == "where" and (chosen := _settled_branch(node)) is not None:
        return chosen
    if (OPS[node.op].kind is not OpKind.ELEMENTWISE or node.op in BY_POSITION) and node.op not in KEEPS_UNIFORM:
        return node
    values = [uniform_value(a) for a in node.args]
    if any(v is None for v in values):
        return node
    value = values[0] if node.op in KEEPS_UNIFORM else evaluate_node(node, values)
    scalar = python_scalar(np.asarray(value).astype(node.dtype.numpy).item(), node.dtype)
    if scalar != scalar or beyond_double(scalar, node.dtype):
        return node                                # NaN, which no rule should see, or an int a double cannot hold
    constant = make_constant(scalar, node.dtype)
    return constant if not node.shape else make("broadcast_to", constant, shape=node.shape)


def _settled_branch(where: Node) -> Node | None:
    """The branch a `where` whose condition is one value for all elements takes, where that branch
    is already of the where's type (a derivative's guard against 0·∞ that a constant exponent settles)."""
    condition = uniform_value(where.args[0])
    if condition is None:
        return None
    branch = where.args[1] if bool(condition) else where.args[2]
    return branch if branch.type == where.type else None
