"""What a traced function reads from outside its arguments: captured arrays and guarded names.

An array the function reaches through a global, a closure or `self` (a weight kept on a module, a
table built once) is not copied into the graph: it becomes an input of its own, named after where
it was found, and each call reads the array as it is then, so an optimizer step that updates it in
place (`w -= lr * g`) is seen. Rebinding the name to another array, or changing a Python number the
function reads the same way (`scale = 5.0`), is caught by a guard: the next call traces again, as
torch.compile's guards do (a function that rebinds a global it reads therefore traces at each call).

What is read at trace time only: values reached through other objects (`cfg.eps`,
`self.layers[0].w`, a property) or through a plain helper function's globals, and arrays numpy
computes from captured ones while tracing (`w.astype(...)`, `v * 1.0`: a new array, captured under
a generic name). A captured array among the former is still read at each call.

>>> import numpy as np
>>> w = np.ones(2, np.float32)
>>> def f(x):
...     return x * w
>>> [g.name for g in guards_of(f)]
['w']
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import numbers
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from tessera_rw.algebra.builder import make_input
from tessera_rw.algebra.node import Node, TensorType

CAPTURED_PREFIX = "captured"          # the name of a captured array found under no name the function reads
_MISSING = object()


@dataclass(frozen=True, eq=False)
class Guard:
    """One name the traced function read, and what it held then: an array (the same object must
    still be there) or a Python number (an equal value must)."""
    name: str
    read: Callable[[], Any]
    held: Any

    def holds(self) -> bool:
        now = self.read()
        if _is_number(self.held):
            return type(now) is type(self.held) and _same_number(now, self.held)
        return now is self.held


def _same_number(a: Any, b: Any) -> bool:
    return bool(a == b or (a != a and b != b))      # NaN holds NaN


def _is_number(value: Any) -> bool:
    """A Python or numpy scalar (not a 0-d array, not a scalar type such as np.float32 itself)."""
    return isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, (np.ndarray, type))


def _is_array(value: Any) -> bool:
    return not _is_number(value) and hasattr(value, "shape") and hasattr(value, "dtype")


def _guarded(value: Any) -> bool:
    return _is_array(value) or _is_number(value)


def _names_read(code: types.CodeType) -> set[str]:
    """Global and attribute names `code` reads, its nested functions' and comprehensions' included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_read(const)
    return names


def _sources(fn: Callable) -> dict[str, Callable[[], Any]]:
    """Where `fn` reads values from outside its arguments, by the name a reader would use: its
    globals, its closure's cells and, for a bound method, the attributes of `self`."""
    fn = function_of(fn)
    owner = getattr(fn, "__self__", None)
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    names = _names_read(code)
    found: dict[str, Callable[[], Any]] = {}
    scope = getattr(fn, "__globals__", {})
    for name in sorted(names & scope.keys()):
        found[name] = lambda name=name: scope.get(name, _MISSING)
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        found[name] = lambda cell=cell: _cell_contents(cell)
    if owner is not None and not isinstance(owner, types.ModuleType):
        attrs = getattr(owner, "__dict__", {})
        instance = _weakly(owner)           # a guard does not keep the instance alive
        for name in sorted(names & attrs.keys()):
            found[f"self.{name}"] = lambda name=name: getattr(instance(), name, _MISSING)
    return found


def function_of(fn: Callable) -> Callable:
    """The function whose code runs when `fn` is called: a partial's function, a callable object's
    bound `__call__`, else `fn` itself."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not isinstance(fn, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)) and callable(fn) \
            and not hasattr(fn, "__func__"):              # a bound-method-like object reads as one already
        call = getattr(fn, "__call__", None)
        if isinstance(call, types.MethodType):
            return call
    return fn


def function_name(fn: Callable) -> str:
    """A callable's name for graphs and messages: its own, a partial's function's, else its class's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def _weakly(obj: Any) -> Callable[[], Any]:
    """A weak reference to `obj`, or (where it takes none) a strong one that reads the same way."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _cell_contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:                      # a cell not yet filled
        return _MISSING


HELPER_DEPTH = 4      # calls deep that a plain helper's globals are guarded


def guards_of(fn: Callable) -> tuple[Guard, ...]:
    """A guard for each array or number `fn` reads by a global, closure or `self` name now, and
    those of the plain Python functions it names (helpers it calls, theirs in turn): a helper's
    global constant changes the trace as much as fn's own."""
    sources = dict(_sources(fn))
    for helper in _helpers(fn):
        for name, read in _sources(helper).items():
            same = sources.get(name)
            if same is None or same() is not read():
                sources.setdefault(name if same is None else f"{function_name(helper)}.{name}", read)
    held = ((name, read, read()) for name, read in sources.items())
    return tuple(Guard(name, read, value) for name, read, value in held if _guarded(value))


def _helpers(fn: Callable) -> list[types.FunctionType]:
    """The user's plain functions `fn` names by a global or closure name, theirs in turn (up to
    HELPER_DEPTH calls deep): not tessera_rw's, numpy's or any other installed library's, whose
    globals are not the user's constants; kernels guard their own reads (note_nested)."""
    found: list[types.FunctionType] = []
    seen = {id(function_of(fn))}
    frontier = [fn]
    for _ in range(HELPER_DEPTH):
        named = [read() for f in frontier for read in _sources(f).values()]
        frontier = [h for h in named if isinstance(h, types.FunctionType) and id(h) not in seen and _users(h)]
        seen |= {id(h) for h in frontier}
        found += frontier
    return found


def _users(fn: types.FunctionType) -> bool:
    """Whether `fn` is the user's own code rather than a library's (installed, or tessera_rw)."""
    module = getattr(fn, "__module__", "") or ""
    if module.split(".")[0] in ("tessera_rw", "numpy", "scipy", "ml_dtypes"):
        return False
    path = fn.__code__.co_filename
    return not any(part in path for part in ("site-packages", "dist-packages", "/lib/python"))


@dataclass
class Captures:
    """The arrays one trace captured, in order: each an input node and the array it reads."""
    names: dict[int, str]                                  # id of an array the function can name -> its name
    taken: set[str]                                        # names the graph's inputs already use
    arrays: dict[int, tuple[Node, Any]] = field(default_factory=dict)
    nested: list[Guard] = field(default_factory=list)      # the guards of kernels called inside the trace

    def node_for(self, value: Any, t: TensorType) -> Node:
        found = self.arrays.get(id(value))
        if found is None:
            name = _free_name(self.names.get(id(value), f"{CAPTURED_PREFIX}{len(self.arrays)}"), self.taken)
            self.taken.add(name)
            found = self.arrays[id(value)] = (make_input(name, t.shape, t.dtype), value)
        return found[0]


def _free_name(name: str, taken: set[str]) -> str:
    name = name.replace(".", "_")
    if name not in taken:
        return name
    return next(f"{name}_{i}" for i in range(1, len(taken) + 2) if f"{name}_{i}" not in taken)


_CAPTURES: contextvars.ContextVar[Captures | None] = contextvars.ContextVar("tessera_captures", default=None)


@contextlib.contextmanager
def capturing(guards: tuple[Guard, ...], parameters: set[str]) -> Iterator[Captures]:
    """While active (one trace), arrays met in ops become inputs of the trace, named by `guards`."""
    captures = Captures({id(g.held): g.name for g in guards if _is_array(g.held)}, set(parameters))
    token = _CAPTURES.set(captures)
    try:
        yield captures
    finally:
        _CAPTURES.reset(token)


@contextlib.contextmanager
def not_capturing() -> Iterator[None]:
    """While active, arrays met in ops are literals of the graph being built, not inputs of a trace
    in progress around it: a derivative's own constants (a VJP's exchange matrix) belong to the
    gradient graph, which a later trace may reuse from the cache."""
    token = _CAPTURES.set(None)
    try:
        yield
    finally:
        _CAPTURES.reset(token)


def note_nested(fn: Callable) -> None:
    """A kernel called inside the trace in progress: what it reads from outside is guarded (and its
    arrays named) as the outer function's own."""
    captures = _CAPTURES.get()
    if captures is not None:
        guards = guards_of(fn)
        captures.nested += guards
        for g in guards:
            if _is_array(g.held):
                captures.names.setdefault(id(g.held), g.name)


def captured_input(value: Any, t: TensorType) -> Node | None:
    """The input node `value` (an array met inside a trace) becomes, or None outside a capturing trace."""
    captures = _CAPTURES.get()
    return None if captures is None else captures.node_for(value, t)
