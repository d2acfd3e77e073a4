"""grad_graph: the reverse-mode derivative of a graph with a scalar output, as another Graph.

The walk visits the forward nodes from the output back to the inputs, asks each node's op for its
VJP (`OpDef.vjp`) and adds up the cotangents of values used more than once. Only the part of the
graph between the requested inputs and the output is differentiated: a value that does not
depend on a requested input (a constant, a mask, another input) gets no cotangent. The backward
nodes are built on the interned forward nodes, so forward values the gradient needs are shared
with, not copied from, the forward pass.

>>> from tessera_rw import op
>>> def loss(x, w):
...     return op.sum(op.tanh(x @ w))
>>> forward = op.kernel(loss).trace(op.tensor((4, 3), "float64"), op.tensor((3, 2), "float64"))
>>> print(grad_graph(forward, (1,)))
def grad_loss(x: f64[4,3], w: f64[3,2]):
    t0 = transpose(x, axes=(1, 0))               # f64[3,4]
    t1 = broadcast_to(1.0, shape=(4, 2))         # f64[4,2]
    t2 = x @ w                                   # f64[4,2]
    t3 = tanh(t2)                                # f64[4,2]
    t4 = t3 * t3                                 # f64[4,2]
    t5 = t1 * t4                                 # f64[4,2]
    t6 = t1 - t5                                 # f64[4,2]
    t7 = t0 @ t6                                 # f64[3,2]
    return t7
"""

from __future__ import annotations

from typing import Sequence

from tessera_rw.algebra.api import full, tracing, zeros
from tessera_rw.algebra.autodiff.cotangents import add_cotangents, to_dtype
from tessera_rw.algebra.builder import describe_operands, user_site
from tessera_rw.algebra.captures import not_capturing
from tessera_rw.algebra.errors import (
    ArgumentError, DTypeError, ResultError, ShapeError, TesseraError, VerifyError)
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops import opdef
from tessera_rw.algebra.shapes import fmt_shape
from tessera_rw.algebra.tensor import SymbolicTensor


def _is_differentiable(node: Node) -> bool:
    return node.dtype.is_float or node.dtype.is_complex


def _loss(graph: Graph, has_aux: bool) -> Node:
    if len(graph.outputs) != 1 and not has_aux:
        raise ResultError(f"{graph.name} returns {len(graph.outputs)} values; a gradient needs one scalar output",
                         hint="return the loss alone, or (loss, aux) with op.grad(..., has_aux=True)")
    loss = graph.outputs[0]
    if loss.type.numel != 1:
        raise ShapeError(f"{graph.name} returns {loss.type}, of shape {fmt_shape(loss.shape)}, not a scalar",
                         hint="reduce it to a scalar loss first, e.g. op.sum(...) or op.mean(...)")
    if not loss.dtype.is_float:
        raise DTypeError(f"{graph.name} returns {loss.type}; a gradient needs a real floating-point loss",
                         hint="cast the loss to a float dtype, or take op.abs of a complex one")
    return loss


def _targets(graph: Graph, wrt: Sequence[int]) -> tuple[Node, ...]:
    count = len(graph.inputs)
    for i in wrt:
        if not isinstance(i, int) or not -count <= i < count:
            raise ArgumentError(f"{graph.name}: cannot differentiate with respect to input {i!r}: it has "
                                f"{count} tensor input(s) {list(graph.input_names)}",
                                hint=f"use input positions in [0, {count - 1}]" if count else None)
    targets = tuple(graph.inputs[i] for i in wrt)
    for t in targets:
        if not t.dtype.is_float:
            raise DTypeError(f"{graph.name}: input {t.attr('name')!r} is {t.type}; gradients are taken "
                             "with respect to real floating-point inputs only",
                             hint="differentiate with respect to the real input it is computed from (move the "
                             "op.rfft / op.fft that makes it inside fn)" if t.dtype.is_complex else
                             "leave integer and bool inputs out of argnums")
    return targets


def _active(graph: Graph, targets: tuple[Node, ...]) -> set[Node]:
    """The floating-point values that depend on a target: the only ones a cotangent flows through."""
    active = set(targets)
    for node in graph.nodes:
        if _is_differentiable(node) and any(a in active for a in node.args):
            active.add(node)
    return active


def _pull_back(node: Node, g: SymbolicTensor) -> tuple:
    """The cotangents of node's operands, from its op's VJP, with the error naming the op."""
    op = opdef(node.op)
    if op.vjp is None:
        raise TesseraError(f"op {node.op!r} declares no VJP, so it cannot be differentiated",
                           op=node.op, operands=describe_operands(op.operands, [a.type for a in node.args]),
                           site=user_site(), hint="declare one with OpDef(..., vjp=...), or compute this op "
                           "outside the differentiated function")
    args = tuple(SymbolicTensor(a) for a in node.args)
    try:
        cts = op.vjp(g, SymbolicTensor(node), *args, **node.attr_map)
    except TesseraError as e:
        raise e.with_context(op=node.op, operands=describe_operands(op.operands, [a.type for a in node.args])) from None
    if len(cts) != len(args):
        raise VerifyError(f"the VJP of {node.op} returned {len(cts)} cotangents for {len(args)} operands", op=node.op)
    return cts


def _fitted(ct: SymbolicTensor, arg: Node, node: Node) -> SymbolicTensor:
    """A cotangent in its operand's type; a shape mismatch is a wrong VJP rule, not a user error."""
    if ct.shape != arg.shape:
        raise VerifyError(f"the VJP of {node.op} gave a cotangent of shape {fmt_shape(ct.shape)} for an "
                          f"operand of shape {fmt_shape(arg.shape)}", op=node.op)
    return to_dtype(ct, arg.dtype)


def grad_graph(graph: Graph, wrt: tuple[int, ...], keep_outputs: bool = False, has_aux: bool = False) -> Graph:
    """The Graph of the gradients of `graph`'s scalar output with respect to its inputs at positions
    `wrt`: the same inputs, one output per position, each in its input's shape and dtype (zeros
    where the output does not depend on the input). See the module's example. With `has_aux` the
    loss is the first of several outputs (the others are carried along undifferentiated); with
    `keep_outputs`, `graph`'s outputs come first, then the gradients."""
    loss = _loss(graph, has_aux)
    targets = _targets(graph, wrt)
    active = _active(graph, targets)
    cotangents: dict[Node, SymbolicTensor] = {}
    with tracing(), not_capturing():
        if loss in active:
            cotangents[loss] = full(loss.shape, 1.0, loss.dtype)
        for node in reversed(graph.nodes):
            g = cotangents.get(node)
            if g is None or node.op == "input":
                continue
            for arg, ct in zip(node.args, _pull_back(node, g)):
                if ct is None or arg not in active:
                    continue
                ct = _fitted(ct, arg, node)
                cotangents[arg] = ct if arg not in cotangents else add_cotangents(cotangents[arg], ct)
        grads = tuple(cotangents[t] if t in cotangents else zeros(t.shape, t.dtype) for t in targets)
    kept = graph.outputs if keep_outputs else ()
    return Graph(f"grad_{graph.name}", graph.inputs, kept + tuple(g.node for g in grads))
