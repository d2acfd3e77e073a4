"""The kernel object `@op.kernel` returns: traced and compiled once per (shapes, dtypes) signature,
then run — on the GPU when there is one, else by the numpy executor of the same plan.

>>> import numpy as np
>>> from tessera_rw import op
>>> @op.kernel
... def scaled(x, s=2.0):
...     return x * s
>>> scaled(np.ones(3, np.float32))
array([2., 2., 2.], dtype=float32)
>>> scaled(op.tensor((8, 4), "bf16"))
tensor((8, 4), bfloat16)
"""

from __future__ import annotations

import enum
import functools
import inspect
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Hashable

import numpy as np

from tessera_rw.algebra.api.dispatch import type_of
from tessera_rw.algebra.builder import user_site
from tessera_rw.algebra.errors import ArgumentError, TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.tensor import SymbolicTensor, TensorSpec
from tessera_rw.algebra.trace import Traced, trace

if TYPE_CHECKING:
    from tessera_rw.pipeline import CompiledProgram

Signature = tuple[tuple[str, Hashable], ...]


def is_static(value: Any) -> bool:
    """Python values a kernel bakes into its trace (part of the signature): numbers, strings,
    None, enums and tuples of them. Tensors, arrays and placeholders are inputs."""
    if isinstance(value, (numbers.Number, np.generic, str, type(None), enum.Enum)):
        return True
    return isinstance(value, tuple) and all(is_static(v) for v in value)


@dataclass(frozen=True)
class BoundCall:
    """One call's arguments sorted out: tensor types, their values (if any), and static scalars."""
    tensors: dict[str, TensorType]
    values: dict[str, Any]
    statics: dict[str, Any]
    placeholders: bool

    @functools.cached_property
    def signature(self) -> Signature:
        return tuple((n, t) for n, t in self.tensors.items()) + tuple(
            (n, ("static", type(v).__name__, v)) for n, v in self.statics.items())


class Kernel:
    """A traced tensor function. Call it on arrays to run it, on op.tensor placeholders to get
    the result's shape and dtype; `graphs` holds one Graph per signature seen so far."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self._signature = inspect.signature(fn)
        self._params = self._signature.parameters
        variadic = [p.name for p in self._params.values()
                    if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        if variadic:
            raise ArgumentError(f"@op.kernel function {fn.__name__} takes *{variadic[0]}; kernels need "
                                "named parameters so each input can be named in graphs and reports")
        self._traces: dict[Signature, Traced] = {}
        self._programs: dict[tuple[Signature, Any], CompiledProgram] = {}
        functools.update_wrapper(self, fn)

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def graphs(self) -> dict[Signature, Graph]:
        return {sig: t.graph for sig, t in self._traces.items()}

    def bind(self, *args: Any, **kwargs: Any) -> BoundCall:
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"kernel {self.name}: {e}", site=user_site()) from None
        tensors, values, statics, placeholders = {}, {}, {}, False
        for name, value in bound.arguments.items():
            if is_static(value):
                statics[name] = value.item() if isinstance(value, np.generic) else value
                continue
            try:
                t = type_of(value)
            except TesseraError as e:
                raise ArgumentError(f"kernel {self.name}: argument {name!r} is not a tensor ({e.detail})",
                                    hint=e.hint, site=user_site()) from None
            tensors[name] = t
            if isinstance(value, TensorSpec):
                placeholders = True
            else:
                values[name] = value
        return BoundCall(tensors, values, statics, placeholders)

    def traced(self, call: BoundCall) -> Traced:
        found = self._traces.get(call.signature)
        if found is None:
            found = self._traces[call.signature] = trace(self.fn, call.tensors, call.statics, name=self.name)
        return found

    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """The Graph for these arguments' signature (traced on first use): `k.trace(x, y)`."""
        return self.traced(self.bind(*args, **kwargs)).graph

    def compiled(self, call: BoundCall) -> CompiledProgram:
        """The rewritten, chosen and lowered program for this call's signature (made on first use)."""
        from tessera_rw.codegen.numerics import current_numerics
        from tessera_rw.pipeline import compile_program
        key = (call.signature, current_numerics())      # the policy steers extraction (tf32 costs less)
        found = self._programs.get(key)
        if found is None:
            found = self._programs[key] = compile_program(self.traced(call).graph)
        return found

    def program(self, *args: Any, **kwargs: Any) -> CompiledProgram:
        """`k.program(x, y)`: what a call with these arguments runs (candidates, choice, KernelPlan)."""
        return self.compiled(self.bind(*args, **kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(v, SymbolicTensor) for v in (*args, *kwargs.values())):
            return self.fn(*args, **kwargs)  # called from another traced function: inline
        call = self.bind(*args, **kwargs)
        traced = self.traced(call)
        if call.placeholders:
            outputs = tuple(TensorSpec(o.shape, o.dtype) for o in traced.graph.outputs)
        else:
            from tessera_rw.execute import run_program
            outputs = run_program(self.compiled(call), call.values)
        return outputs[0] if traced.structure is None else traced.structure(outputs)

    def __repr__(self) -> str:
        return f"<tessera_rw kernel {self.name}: {len(self._traces)} traced signature(s)>"


def kernel(fn: Callable) -> Kernel:
    """Decorator: `@op.kernel def f(q, k, v): ...` traces f per (shapes, dtypes) signature."""
    return Kernel(fn)
