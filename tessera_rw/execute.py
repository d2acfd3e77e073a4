"""Running a compiled program on the caller's arrays: on the GPU, or on the host's numpy executor.

Where it runs: `TESSERA_DEVICE=cpu` or `=gpu` decides outright; otherwise CUDA arrays (torch,
CuPy) run on the GPU, and numpy arrays run on the GPU when one is present and every kernel of
the plan has a GPU template for its dtypes (float64 has none), else on the host (with a
HostFallbackWarning when a GPU is present).
`TESSERA_DEVICE=emulator` runs the plan's generated CUDA kernels on the host, in the CPU emulator
(codegen/emulator.py): the GPU's kernels, checked without a GPU, slowly.

>>> import numpy as np
>>> from tessera_rw import op
>>> @op.kernel
... def f(x):
...     return op.exp(x) + 1.0
>>> run_program(f.program(np.zeros(2, np.float32)), {"x": np.zeros(2, np.float32)})
(array([2., 2.], dtype=float32),)
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from tessera_rw.algebra.builder import warn_at_user_line
from tessera_rw.algebra.errors import ArgumentError, HostFallbackWarning
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.device import gpu_available
from tessera_rw.codegen.device_arrays import device_index_of
from tessera_rw.codegen.numerics import Numerics, current_numerics
from tessera_rw.codegen.plan_binding import NoTemplateError, bind_plan
from tessera_rw.lower.plan import KernelPlan
from tessera_rw.pipeline import CompiledProgram

DEVICE_VARIABLE = "TESSERA_DEVICE"
DEVICES = ("cpu", "gpu", "emulator")


def _has_zero_size(plan: KernelPlan) -> bool:
    return any(b.nbytes == 0 for b in plan.buffers)


@lru_cache(maxsize=256)
def _runs_on_gpu(plan: KernelPlan, arch: ArchSpec, numerics: Numerics) -> bool:
    """Whether every kernel has a GPU template; a plan over zero-size tensors launches nothing worth
    a device, so the host computes it at once. A plan that has steps without a template warns once
    (HostFallbackWarning) that it runs on the host, naming them."""
    if _has_zero_size(plan):
        return False
    try:
        bind_plan(plan, arch, numerics)
        return True
    except NoTemplateError as e:
        warn_at_user_line(HostFallbackWarning(f"{plan.name} runs on the host, not the GPU: {e}"))
        return False


def host_arrays_run_on_gpu(program: CompiledProgram, numerics: Numerics) -> bool:
    """Whether numpy inputs of `program` run on the GPU under `numerics`, TESSERA_DEVICE aside: when
    there is one and it has a template for every kernel."""
    return gpu_available() and _runs_on_gpu(program.plan, program.arch, numerics)


def where_to_run(program: CompiledProgram, values: Mapping[str, Any]) -> str:
    """'cpu', 'gpu' or 'emulator' for this call."""
    forced = os.environ.get(DEVICE_VARIABLE, "").strip().lower()
    if forced not in ("", *DEVICES):
        raise ArgumentError(f"{DEVICE_VARIABLE}={forced!r} is not a device",
                            hint=f"use one of {', '.join(DEVICES)}, or unset it")
    on_device = [n for n, v in values.items() if device_index_of(v) is not None]
    if forced in ("cpu", "emulator") and on_device:
        raise ArgumentError(f"{DEVICE_VARIABLE}={forced} but inputs {on_device} are GPU arrays",
                            hint="move them to the host (.cpu() / .get()) or unset the variable")
    if forced == "emulator" and _has_zero_size(program.plan):
        return "cpu"                        # nothing to launch: no kernel takes zero-size tensors
    if forced:
        return forced
    if on_device:
        return "gpu"
    if host_arrays_run_on_gpu(program, current_numerics()):
        return "gpu"
    return "cpu"


def run_program(program: CompiledProgram, values: Mapping[str, Any]) -> tuple[Any, ...]:
    """The outputs of `program` on `values` (inputs by name), of the inputs' kind."""
    device = where_to_run(program, values)
    if device == "gpu":
        from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
        return run_plan_on_gpu(program.plan, values, numerics=current_numerics(), schedules=program.schedules)
    if device == "emulator":
        from tessera_rw.codegen.emulator_plan import run_plan_emulated
        return run_plan_emulated(program.plan, {n: np.asarray(v) for n, v in values.items()}, arch=program.arch,
                                 numerics=current_numerics(), schedules=dict(program.schedules))
    return run_plan_on_cpu(program.plan, {n: np.asarray(v) for n, v in values.items()}, current_numerics())
