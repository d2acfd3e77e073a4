"""Warm calls of a kernel on numpy arrays or torch CUDA tensors: once a signature's program is
compiled, a call with arrays of the same kinds, shapes, dtypes (and devices), under the same
numerics policy and tuning state, skips binding, the signature and the device decision, and runs
the plan at once.

The device is decided when the call is remembered: torch CUDA tensors run on their GPU, numpy
inputs on the host's executor unless a GPU takes every kernel of the plan. `TESSERA_DEVICE`, read
at every call, overrides that decision as it does for any call (execute.py).

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
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Hashable

import numpy as np

from tessera_rw.algebra.trace import Traced
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.device_arrays import is_torch_cuda_tensor
from tessera_rw.codegen.numerics import Numerics, current_numerics
from tessera_rw.execute import DEVICE_VARIABLE, host_arrays_run_on_gpu, run_program
from tessera_rw.pipeline import CompiledProgram

if TYPE_CHECKING:
    from tessera_rw.codegen.plan_runtime import DevicePlan


@dataclass
class WarmCall:
    """One remembered signature: its program and trace, the parameter names the arrays bind to, and
    where its inputs run: the host executor (numpy inputs a GPU does not take), the GPU the torch
    tensors are on (`device`), or the general way (run_program)."""
    program: CompiledProgram
    traced: Traced
    names: tuple[str, ...]
    numerics: Numerics
    on_host: bool
    device: int | None = None
    # the DevicePlan a call on `device` runs, weakly: device_plan's cache decides how long it lives
    _plan_on_device: Any = field(default=None, init=False, repr=False, compare=False)

    def __call__(self, arrays: tuple) -> Any:
        """The kernel's result on `arrays` (in parameter order), shaped as its function returns it."""
        values = dict(zip(self.names, arrays))
        if self.traced.captured:
            values = self.traced.feeds(values)
        if os.environ.get(DEVICE_VARIABLE):
            outputs = run_program(self.program, values)
        elif self.device is not None:
            outputs = self._device_plan().run(values)
        elif self.on_host:
            outputs = run_plan_on_cpu(self.program.plan, values, self.numerics)
        else:
            outputs = run_program(self.program, values)
        return outputs[0] if self.traced.structure is None else self.traced.structure(outputs)

    def _device_plan(self) -> DevicePlan:
        """The DevicePlan run_program would run on `device` (found once while device_plan keeps it)."""
        found = self._plan_on_device() if self._plan_on_device is not None else None
        if found is None:
            from tessera_rw.codegen.plan_runtime import device_plan
            found = device_plan(self.program.plan, self.device, self.numerics, self.program.schedules)
            self._plan_on_device = weakref.ref(found)
        return found


class WarmCalls:
    """A kernel's remembered signatures on numpy arrays and torch CUDA tensors, keyed by what decides
    the program and where it runs: the arrays' kinds, shapes, dtypes and GPUs, the numerics policy
    and the tuning state (`tuning_state()`, read at each call)."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names
        self._calls: dict[Hashable, WarmCall] = {}

    def key(self, args: tuple, tuning_state: Hashable) -> Hashable | None:
        """The key of a call whose arguments, given positionally, are every parameter's numpy array
        or torch CUDA tensor; else None (the call goes the general way)."""
        if len(args) != len(self.names):
            return None
        arrays = []
        for a in args:
            if type(a) is np.ndarray:
                arrays.append(("numpy", a.shape, a.dtype))
            elif is_torch_cuda_tensor(a):
                arrays.append((a.get_device(), a.shape, a.dtype))      # a torch tensor: its GPU first
            else:
                return None
        return (*arrays, current_numerics(), tuning_state)

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
        """Remember a call that ran (so its torch tensors, if any, were on one GPU)."""
        numerics = current_numerics()
        device = next((where for where, _, _ in key[:len(self.names)] if where != "numpy"), None)
        self._calls[key] = WarmCall(program, traced, self.names, numerics, device=device,
                                    on_host=device is None and not host_arrays_run_on_gpu(program, numerics))

    def clear(self) -> None:
        self._calls.clear()
