"""Running a whole KernelPlan through the CPU emulator: every generated kernel of the plan, as the
GPU would run it, over the plan's own buffers.

The plan is bound as on a GPU of `arch` (each step's template and schedule, by default the
template's first, as bind_plan picks), and each step's kernel runs in the emulator on the plan's
buffers held as host bytes: views at their offsets, reused temporaries, packed outputs. Temporaries
and outputs start as NaN bytes, so a value read before any kernel wrote it shows. A library step
(an FFT, which cuFFT runs on a GPU) runs its numpy reference instead.

>>> import numpy as np
>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.graph import Graph
>>> from tessera_rw.lower.lowering import lower
>>> x = make_input("x", (2, 3), DType.float32)
>>> plan = lower(Graph("f", (x,), (make("softmax", make("exp", x), axis=1),)))
>>> run_plan_emulated(plan, {"x": np.zeros((2, 3), np.float32)})[0][0]      # doctest: +SKIP
array([0.33333334, 0.33333334, 0.33333334], dtype=float32)
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from tessera_rw.codegen.arch import ArchSpec, arch_named
from tessera_rw.codegen.cpu_executor import HostMemory, run_step
from tessera_rw.codegen.emulator import POISON, build_all
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.step_timing import EMULATOR, PlanRun, active_recorders, host_clock, report_step
from tessera_rw.codegen.templates.base import Schedule, first_schedule
from tessera_rw.codegen.templates.registry import template_for
from tessera_rw.lower.plan import BufferRole, KernelPlan


def run_plan_emulated(plan: KernelPlan, feeds: Mapping[str, np.ndarray], *, arch: ArchSpec | str = "h100",
                      numerics: Numerics = Numerics.DETERMINISTIC,
                      schedules: Mapping[int, Schedule] | None = None) -> tuple[np.ndarray, ...]:
    """Run `plan` with inputs by name, each generated kernel in the emulator as written for `arch`;
    `schedules` pins some steps' schedules by index. The outputs are fresh arrays."""
    spec = arch if isinstance(arch, ArchSpec) else arch_named(arch)
    memory = HostMemory(plan, feeds)
    for buffer in plan.buffers:
        if buffer.role in (BufferRole.TEMP, BufferRole.OUTPUT):
            memory.bytes[buffer.id][:] = POISON
    sources = {}
    for i, step in enumerate(plan.steps):
        op = KernelOp.from_node(step.node, numerics)
        template = template_for(op)
        if template.library is None:
            schedule = (schedules or {}).get(i) or first_schedule(template, op, spec)
            sources[i] = template.emit(op, schedule, spec)
    kernels = dict(zip(sources, build_all(list(sources.values()))))
    recorders = active_recorders()          # profiled: every step timed by the wall clock
    run = PlanRun(plan, numerics, device=EMULATOR)
    for i, step in enumerate(plan.steps):
        start = host_clock()
        if i in kernels:
            kernels[i]([*(memory.view(r) for r in step.inputs), memory.view(step.output)])
        else:
            run_step(step, memory, numerics)
        report_step(recorders, run, i, start, host_clock() - start)
    return tuple(memory.view(ref).copy() for ref in plan.outputs)
