"""Schedules of the tuning space beyond the defaults compute what the defaults do: for every GEMM and
attention sample, three non-default schedules of this GPU's space run through run_kernel on random
inputs (never zero) and are checked against the op's float64 numpy reference with the output dtype's
tolerance (tessera_rw/codegen/kernel_check.py), as tests/gpu/test_kernel_numerics.py checks the defaults.
The failures of every schedule of a sample are reported together.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from tessera_rw.codegen.kernel_check import check, expected, random_inputs
from tests.codegen.test_schedule_spaces import beyond_defaults
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
from tessera_rw.codegen.templates.gemm import GemmTemplate

pytestmark = pytest.mark.gpu

PER_SAMPLE = 3
SAMPLES = [pytest.param(t, i, id=f"{type(t).__name__}-{i}-{op.op}")
           for t in (GemmTemplate(), FlashAttentionTemplate()) for i, op in enumerate(t.samples())]


def _rng(op: KernelOp) -> np.random.Generator:
    # seeded by the op, so a failure reproduces
    return np.random.default_rng(zlib.crc32(str(op).encode()))


@pytest.mark.parametrize("template, index", SAMPLES)
def test_schedules_beyond_the_defaults_match_the_reference(template, index):
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.codegen.launch import run_kernel
    op = template.samples()[index]
    arch = current_arch()
    picked = beyond_defaults(template, op, arch, PER_SAMPLE)
    assert picked, f"{type(template).__name__} has nothing beyond its defaults for {op} on {arch.name}"
    rng = _rng(op)
    inputs = random_inputs(op, rng)
    reference = expected(op, inputs, rng)
    failures = []
    for schedule in picked:
        unit = template.resources(op, schedule, arch).unit
        what = f"{op} at {schedule.describe()} on {arch.name} ({unit.value})"
        try:
            out = run_kernel(op, list(inputs.arrays), schedule=schedule, arch=arch)
            check(reference.on(unit), out, what)
        except AssertionError as e:
            failures.append(str(e))
        except Exception as e:       # a compile or launch error fails this schedule, not the others
            failures.append(f"{what}: {type(e).__name__}: {e}")
    assert not failures, f"{len(failures)} of {len(picked)} schedules wrong:\n" + "\n".join(failures)
