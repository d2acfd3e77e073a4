"""Warm calls of a kernel on numpy arrays: once a signature's program is compiled, a call with numpy
arrays of the same shapes and dtypes, under the same numerics policy and tuning state, skips
binding, the signature and the device decision, and runs the plan at once.

The device is decided when the call is remembered: numpy inputs run on the host's executor unless a
GPU takes every kernel of the plan. `TESSERA_DEVICE`, read at every call, overrides that decision
as it does for any call (execute.py).

>>> import numpy as np
>>> from tessera_rw import op
>>> @op.kernel
... def double(x):
...     return x * 2.0
>>> x = np.ones(3, np.float32)
>>> double(x)[0], double(x)[0]     # the second call is a warm one
(np.float32(2.0), np.float32(2.0))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from tessera_rw.algebra.trace import Traced
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.numerics import Numerics, current_numerics
from tessera_rw.execute import DEVICE_VARIABLE, host_arrays_run_on_gpu, run_program
from tessera_rw.pipeline import CompiledProgram


@dataclass(frozen=True)
class WarmCall:
    """One remembered signature: its program and trace, the parameter names the arrays bind to, and
    whether numpy inputs run on the host executor (so a call goes straight to it)."""
    program: CompiledProgram
    traced: Traced
    names: tuple[str, ...]
    numerics: Numerics
    on_host: bool

    def __call__(self, arrays: tuple) -> Any:
        """The kernel's result on `arrays` (in parameter order), shaped as its function returns it."""
        values = dict(zip(self.names, arrays))
        if self.traced.captured:
            values = self.traced.feeds(values)
        if self.on_host and not os.environ.get(DEVICE_VARIABLE):
            outputs = run_plan_on_cpu(self.program.plan, values, self.numerics)
        else:
            outputs = run_program(self.program, values)
        return outputs[0] if self.traced.structure is None else self.traced.structure(outputs)


class WarmCalls:
    """A kernel's remembered signatures on numpy arrays, keyed by what decides the program: the
    arrays' shapes and dtypes, the numerics policy and the tuning state (`tuning_state()`, read at
    each call)."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names
        self._calls: dict[Hashable, WarmCall] = {}

    def key(self, args: tuple, tuning_state: Hashable) -> Hashable | None:
        """The key of a call whose arguments, given positionally, are every parameter's numpy array;
        else None (the call goes the general way)."""
        if len(args) != len(self.names):
            return None
        shapes = []
        for a in args:
            if type(a) is not np.ndarray:
                return None
            shapes.append((a.shape, a.dtype))
        return (*shapes, current_numerics(), tuning_state)

    def get(self, key: Hashable | None) -> WarmCall | None:
        """The remembered call for `key`, when its trace still holds (the names it read outside its
        arguments hold what they did); else None."""
        if key is None:
            return None
        warm = self._calls.get(key)
        if warm is None or (warm.traced.guards and not warm.traced.holds()):
            return None
        return warm

    def remember(self, key: Hashable, program: CompiledProgram, traced: Traced) -> None:
        numerics = current_numerics()
        self._calls[key] = WarmCall(program, traced, self.names, numerics,
                                    on_host=not host_arrays_run_on_gpu(program, numerics))

    def clear(self) -> None:
        self._calls.clear()
