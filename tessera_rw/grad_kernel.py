"""`op.grad(fn, argnums)`: the gradient of a scalar-valued tensor function, as a kernel object.

It is a Kernel whose graph for a signature is the reverse-mode derivative of fn's traced graph
(`algebra.autodiff.reverse.grad_graph`), so calling, `.explain`, `.trace`, `.program`,
placeholders, tuning and the per-signature cache all work as for `@op.kernel`; the backward graph
goes through the same rewrites (gradient-reduction fusion among them) and lowering.

>>> import numpy as np
>>> from tessera_rw import op
>>> def loss(x, w, b):
...     return op.mean((x @ w + b) ** 2)
>>> dw, db = op.grad(loss, argnums=(1, 2))(np.ones((4, 3)), np.ones((3, 2)), np.zeros(2))
>>> dw
array([[3., 3.],
       [3., 3.],
       [3., 3.]])
>>> db
array([3., 3.])
>>> op.grad(loss)(op.tensor((4, 3), "bf16"), op.tensor((3, 2), "bf16"), op.tensor((2,), "bf16"))
tensor((4, 3), bfloat16)
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import replace
from typing import Any, Callable, Iterator

from tessera_rw.algebra.api.dispatch import array_node
from tessera_rw.algebra.autodiff.reverse import grad_graph
from tessera_rw.algebra.builder import user_site
from tessera_rw.algebra.captures import function_name, note_nested
from tessera_rw.algebra.errors import ArgumentError, ResultError, TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.tensor import SymbolicTensor
from tessera_rw.algebra.trace import Traced, trace
from tessera_rw.bound_call import BoundCall
from tessera_rw.kernel import Kernel
from tessera_rw.method_kernels import BoundKernel

Argnums = int | tuple[int, ...]


def _normalized_argnums(argnums: Any, params: tuple[str, ...], fn_name: str) -> tuple[int, ...]:
    items = argnums if isinstance(argnums, tuple) else (argnums,)
    if not items or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in items):
        raise ArgumentError(f"op.grad({fn_name}): argnums must be an int or a non-empty tuple of ints, got {argnums!r}")
    count = len(params)
    bad = [i for i in items if not -count <= i < count]
    if bad:
        raise ArgumentError(f"op.grad({fn_name}): argnums {bad} out of range for {count} parameter(s) {list(params)}",
                            hint=f"use positions in [0, {count - 1}]" if count else "the function takes no arguments")
    return tuple(int(i) % count for i in items)


def _substitute(graph: Graph, values: dict[Node, Node]) -> tuple[Node, ...]:
    """graph's outputs rebuilt with its inputs replaced by `values` (types equal, so no re-check)."""
    new = dict(values)
    for node in graph.nodes:
        if node not in new:
            new[node] = node.replace(args=tuple(new[a] for a in node.args)) if node.args else node
    return tuple(new[o] for o in graph.outputs)


def _traced_function(fn: Callable | Kernel) -> Callable:
    """What a gradient traces: a kernel's function, or for a gradient kernel (a second derivative,
    `op.grad(op.grad(f))`) a function calling it, which inlines its gradient graph."""
    if isinstance(fn, GradKernel):
        inner = fn

        def differentiated(*args: Any, **kwargs: Any) -> Any:
            return inner(*args, **kwargs)
        functools.update_wrapper(differentiated, inner.fn, updated=())
        differentiated.__name__ = differentiated.__qualname__ = inner.name
        return differentiated
    return fn.fn if isinstance(fn, Kernel) else fn


class GradKernel(Kernel):
    """The gradient of `fn` with respect to the parameters at `argnums`: one array per position
    (a tuple when argnums is a tuple), each of its input's shape and dtype; a container argument's
    gradient is a container of its structure. With `has_aux`, fn returns (loss, aux) and a call
    returns (gradients, aux); with `value`, (loss, gradients) — ((loss, aux), gradients) with both."""

    def __init__(self, fn: Callable | Kernel | BoundKernel, argnums: Argnums = 0, *, has_aux: bool = False,
                 value: bool = False):
        self._instance = fn.instance if isinstance(fn, BoundKernel) else None   # kept alive while this is
        fn = fn.kernel if isinstance(fn, BoundKernel) else fn
        super().__init__(_traced_function(fn))
        if isinstance(fn, Kernel):             # a kernel's own tuning settings carry over to its gradient
            self.tuning, self.restriction = fn.tuning, fn.restriction
        self.argnums, self.has_aux, self.value = argnums, has_aux, value
        self._wrt = _normalized_argnums(argnums, self._positional, function_name(self.fn))

    @property
    def name(self) -> str:
        return f"{'value_and_grad' if self.value else 'grad'}_{function_name(self.fn)}"

    def _called_on_instance(self) -> str:
        return f"op.grad(instance.{function_name(self.fn)})(...)"

    def _differentiated(self, call: BoundCall) -> tuple[tuple[int, ...], Callable[[tuple], Any] | None]:
        """The graph inputs to differentiate with respect to (positions among call.tensors), and how
        to build the result from their gradients: one array per argnum, or for a container
        argument a container of the same structure (None at a leaf that is not a floating-point
        tensor: a number, a step counter)."""
        names = list(call.tensors)
        positions: list[int] = []
        parts: list[Callable[[Iterator], Any]] = []
        for i in self._wrt:
            param = self._positional[i]
            if param in call.trees:
                tree, leaves = call.trees[param], call.trees[param].leaf_names(param)
                floats = {leaf for leaf in leaves if leaf in call.tensors and call.tensors[leaf].dtype.is_float}
                positions += [names.index(leaf) for leaf in leaves if leaf in floats]
                parts.append(lambda grads, tree=tree, leaves=leaves, floats=floats: tree.build(
                    next(grads) if leaf in floats else None for leaf in leaves))
            elif param in call.tensors:
                positions.append(names.index(param))
                parts.append(next)
            else:
                given = f"given {call.statics[param]!r}" if param in call.statics else "left at its default"
                raise ArgumentError(f"{self.name}: cannot differentiate with respect to {param!r} (argnum {i}): "
                                    f"it is {given}, not a tensor",
                                    hint="pass an array or op.tensor placeholder there, or leave it out of argnums",
                                    site=user_site())
        if not isinstance(self.argnums, tuple) and parts[0] is next:
            return tuple(positions), None

        def structure(outputs: tuple) -> Any:
            grads = iter(outputs)
            built = tuple(part(grads) for part in parts)
            return built if isinstance(self.argnums, tuple) else built[0]
        return tuple(positions), structure

    def _of(self, fn: Callable) -> Kernel:
        return GradKernel(fn, self.argnums, has_aux=self.has_aux, value=self.value)

    def _trace(self, call: BoundCall) -> Traced:
        forward = trace(self.fn, call.tensors, call.statics, name=function_name(self.fn), trees=call.trees)
        if self.has_aux:
            self._check_aux(forward)
        positions, grads = self._differentiated(call)
        # the forward's pins fix its products where the gradient program computes them again
        try:
            graph = replace(grad_graph(forward.graph, positions, keep_outputs=self.value or self.has_aux,
                                       has_aux=self.has_aux), name=self.name)
        except TesseraError as e:      # a loss that is no scalar: the line taking the gradient says which
            raise e.with_context(site=user_site()) from None
        if not (self.value or self.has_aux):
            return replace(forward, graph=graph, structure=grads)
        kept = len(forward.graph.outputs)

        def structure(outputs: tuple) -> Any:
            value = outputs[0] if forward.structure is None else forward.structure(outputs[:kept])
            gradients = outputs[kept] if grads is None else grads(outputs[kept:])
            return (value, gradients) if self.value else (gradients, value[1])
        return replace(forward, graph=graph, structure=structure)

    def _check_aux(self, forward: Traced) -> None:
        """With has_aux, fn must return (loss, aux): a pair whose first item is one tensor."""
        shape = None if forward.structure is None else forward.structure(tuple(range(len(forward.graph.outputs))))
        if not (isinstance(shape, tuple) and len(shape) == 2 and type(shape[0]) is int):
            got = "one tensor" if shape is None else f"a {type(shape).__name__} of {len(shape)}"
            raise ResultError(f"{self.name}: with has_aux=True, {function_name(self.fn)} must return a pair (loss, aux) "
                              f"whose loss is one tensor; it returned {got}",
                              hint="return (loss, aux), aux any tensor or container of tensors; or drop has_aux")

    def _inline(self, args: tuple, kwargs: dict) -> Any:
        """Called inside another traced function: the gradient graph spliced in on the caller's values."""
        call = self.bind(*args, **kwargs)
        if call.placeholders:
            raise ArgumentError(f"{self.name}: a placeholder cannot be used inside a traced function",
                                hint="pass it as an argument of the kernel instead", site=user_site())
        traced = self.traced(call)
        note_nested(self.fn)               # the outer trace is guarded by what this one reads
        values = {}
        for node, value in zip(traced.graph.inputs, traced.feeds(call.values).values()):
            values[node] = value.node if isinstance(value, SymbolicTensor) else array_node(value, node.type)
        outputs = tuple(SymbolicTensor(n) for n in _substitute(traced.graph, values))
        return outputs[0] if traced.structure is None else traced.structure(outputs)

    def __repr__(self) -> str:
        traced = len(self._traces)
        flags = "".join(f", {f}=True" for f in ("has_aux", "value") if getattr(self, f))
        return f"<tessera_rw gradient kernel {self.name} (argnums={self.argnums}{flags}): {traced} traced signature(s)>"


def grad(fn: Callable | Kernel, argnums: Argnums = 0, has_aux: bool = False) -> GradKernel:
    """The gradient of a function returning a scalar, with respect to its parameters at `argnums`:
    `dw, db = op.grad(loss, argnums=(1, 2))(x, w, b)`. `fn` may be a plain function or a kernel.
    With `has_aux=True`, fn returns (loss, aux) and the call returns (gradients, aux).

    >>> import numpy as np
    >>> from tessera_rw import op
    >>> op.grad(lambda x: op.sum(x * x))(np.array([1.0, -2.0]))      # d/dx Σ x² = 2x
    array([ 2., -4.])
    """
    return GradKernel(fn, argnums, has_aux=has_aux)


def value_and_grad(fn: Callable | Kernel, argnums: Argnums = 0, has_aux: bool = False) -> GradKernel:
    """The loss and its gradient from one program (the forward computed once):
    `loss, (dw, db) = op.value_and_grad(loss_fn, argnums=(1, 2))(x, w, b)`. With `has_aux=True`, fn
    returns (loss, aux) and the call returns ((loss, aux), gradients)."""
    return GradKernel(fn, argnums, has_aux=has_aux, value=True)
