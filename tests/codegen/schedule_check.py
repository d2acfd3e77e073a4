"""Checking a template's kernels for one op at several schedules against the op's float64 numpy
reference, on whatever runs them: the GPU (tests/gpu) or the CPU emulator (test_emulated_kernels).

Inputs are random and never zero, seeded by the op so a failure reproduces; the runner poisons the
output with NaN bytes before each run, so an element the kernel never writes fails; one reference
serves every schedule, and the failures of all schedules are reported together.
"""

from __future__ import annotations

import zlib
from typing import Callable

import numpy as np

from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.kernel_check import check, expected
from tessera_rw.codegen.kernel_inputs import random_inputs
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Schedule, Template

# (op, input arrays, schedule, arch) -> the kernel's output, written over NaN bytes
Runner = Callable[[KernelOp, tuple, Schedule, ArchSpec], np.ndarray]


def rng_for(op: KernelOp) -> np.random.Generator:
    """A generator seeded by the op: a failure reproduces, and different ops draw different values."""
    return np.random.default_rng(zlib.crc32(str(op).encode()))


def check_schedules(template: Template, op: KernelOp, schedules, arch: ArchSpec, run: Runner) -> None:
    """Run `op` at each of `schedules` and check each against the reference; every schedule's
    failure is reported together."""
    rng = rng_for(op)
    inputs = random_inputs(op, rng)
    reference = expected(op, inputs, rng)
    failures = []
    for schedule in schedules:
        unit = template.resources(op, schedule, arch).unit
        what = f"{op} at {schedule.describe()} on {arch.name} ({unit.value})"
        try:
            check(reference.on(unit), run(op, inputs.arrays, schedule, arch), what)
        except AssertionError as e:
            failures.append(str(e))
        except Exception as e:       # a compile or launch error fails this schedule, not the others
            failures.append(f"{what}: {type(e).__name__}: {e}")
    assert not failures, f"{len(failures)} of {len(schedules)} schedules wrong:\n" + "\n".join(failures)
