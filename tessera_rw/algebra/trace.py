"""Tracing: call a Python function on symbolic tensors and collect the Graph it builds.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> t = trace(lambda x: x * 2.0, {"x": TensorType((3,), DType.float32)}, {}, name="double")
>>> print(t.graph)
def double(x: f32[3]):
    t0 = x * 2.0                                 # f32[3]
    return t0
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tessera_rw.algebra.api.dispatch import tracing
from tessera_rw.algebra.builder import make_input
from tessera_rw.algebra.captures import Guard, capturing, function_name, function_of, guards_of
from tessera_rw.algebra.errors import ArgumentError, ResultError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.pytree import TreeDef, flatten, is_container
from tessera_rw.algebra.schedule_pin import SchedulePin, collecting_pins
from tessera_rw.algebra.tensor import SymbolicTensor


@dataclass(frozen=True)
class Traced:
    """A traced function: its graph, how its outputs were structured (one, or a container), the
    schedules its matmuls pinned (`op.matmul(..., tile_shape=...)`), the arrays it captured (inputs
    of the graph after its arguments, by name) and the guards that say whether the trace still holds."""
    graph: Graph
    structure: Callable[[tuple], Any] | None  # None: a single tensor; else builds the container from the outputs
    pins: tuple[SchedulePin, ...] = ()
    captured: Mapping[str, Any] = field(default_factory=dict)
    guards: tuple[Guard, ...] = ()

    def holds(self) -> bool:
        """Whether every name the function read still holds what it held when traced."""
        return all(g.holds() for g in self.guards)

    def changed(self) -> list[str]:
        """The names whose values changed since the trace."""
        return [g.name for g in self.guards if not g.holds()]

    def feeds(self, values: Mapping[str, Any]) -> Mapping[str, Any]:
        """The graph's input values: the arguments' `values` and the captured arrays as they are now."""
        return {**values, **self.captured} if self.captured else values


def _definition_site(fn: Callable) -> str:
    try:
        code = inspect.unwrap(function_of(fn))     # a wrapper's source is its wrapped function's
        return f"{inspect.getsourcefile(code)}:{inspect.getsourcelines(code)[1]} in {function_name(fn)}"
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


def _rebuild(tree: TreeDef, nones: tuple[bool, ...], outputs: tuple) -> Any:
    it = iter(outputs)
    return tree.build(None if none else next(it) for none in nones)


def _collect(fn: Callable, result: Any, has_tensors: bool) -> tuple[tuple[SymbolicTensor, ...],
                                                                     Callable[[tuple], Any] | None]:
    """The output tensors of `result` (one tensor, or a dict / list / tuple of them, nested), and
    how to build the result back from them; `has_tensors`: whether any argument was a tensor."""
    if isinstance(result, SymbolicTensor):
        return (result,), None
    got = type(result).__name__
    if is_container(result):
        try:
            leaves, tree = flatten(result, "result")
        except ValueError as e:
            leaves, tree = [], None
            got = f"a {got} that {e}"
        else:
            bad = [f"{n} ({type(v).__name__})" for n, v in leaves if not isinstance(v, SymbolicTensor | None)]
            tensors = tuple(v for _, v in leaves if v is not None)
            if tensors and not bad:      # None stays None (a gradient op.grad gave no tensor)
                return tensors, functools.partial(_rebuild, tree, tuple(v is None for _, v in leaves))
            got = f"a {got} holding {', '.join(bad) or 'nothing'}"
    if not has_tensors:
        raise ResultError(f"{function_name(fn)} returned {got}, not tensors: every argument it was called with is a "
                          "Python value or numpy scalar, which a kernel takes as a constant of its trace",
                          site=_definition_site(fn),
                          hint="pass arrays (np.asarray(x) for a numpy scalar x, np.asarray(1.5, np.float32) for "
                               "a number) to compute on tensors")
    if hasattr(result, "shape") and hasattr(result, "dtype"):
        raise ResultError(f"{function_name(fn)} returned {got}, not tensors: an array it captured, or computed with "
                          "numpy from captured arrays while tracing, is a constant of the trace, not a result of it",
                          site=_definition_site(fn),
                          hint="pass the array in as an argument and compute on it with op functions, or return it "
                               "from plain Python outside the kernel")
    raise ResultError(f"{function_name(fn)} returned {got}, not tensors",
                      site=_definition_site(fn),
                      hint="return the result of tessera_rw ops on the inputs: one tensor, or a tuple, list or dict "
                           "of them")


def _number_lists(statics: Mapping[str, Any], trees: Mapping[str, TreeDef]) -> str | None:
    """The first container argument whose leaves are all Python numbers (a list meant as an array), by name."""
    return next((param for param, tree in trees.items() if tree.kind in (list, tuple)
                 and all(isinstance(statics.get(leaf), (int, float, complex)) for leaf in tree.leaf_names(param))), None)


def trace(fn: Callable, tensors: Mapping[str, TensorType], statics: Mapping[str, Any],
          name: str | None = None, trees: Mapping[str, TreeDef] | None = None) -> Traced:
    """Trace `fn` with symbolic tensors for `tensors` and Python values for `statics` (by name);
    a parameter in `trees` gets a container of that structure, its leaves found by their path
    names among the others (`params.w1`)."""
    inputs = tuple(make_input(n, t.shape, t.dtype) for n, t in tensors.items())
    values = {n: SymbolicTensor(node) for n, node in zip(tensors, inputs)} | dict(statics)
    for param, tree in (trees or {}).items():
        values[param] = tree.build(values[leaf] for leaf in tree.leaf_names(param))
    signature = inspect.signature(fn)
    bound = inspect.BoundArguments(signature, {p: values[p] for p in signature.parameters if p in values})
    guards = guards_of(fn)          # what the trace reads: a change during it traces again at the next call
    with tracing(), collecting_pins() as pins, capturing(guards, set(values)) as captures:
        try:
            result = fn(*bound.args, **bound.kwargs)
        except TypeError as e:
            if (listed := _number_lists(statics, trees or {})) is None:
                raise
            raise ArgumentError(f"tracing {function_name(fn)} raised TypeError: {e}; its argument {listed!r} is a "
                                "Python list of numbers, which a kernel takes as a static value, not as a tensor",
                                site=_definition_site(fn), hint="pass numpy.asarray(...) of it") from e
    items, structure = _collect(fn, result, bool(tensors))
    captured = captures.arrays.values()
    graph = Graph(name or function_name(fn), inputs + tuple(node for node, _ in captured),
                  tuple(r.node for r in items))
    return Traced(graph, structure, tuple(pins), {node.attr("name"): value for node, value in captured},
                  guards + tuple(captures.nested))
