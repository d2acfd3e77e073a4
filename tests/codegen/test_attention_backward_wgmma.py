"""sm_90's wgmma attention backward under the CPU emulator: the kernel matches float64 numpy over
many streamed tiles (each stage refilled, ragged and causal), in every form of block the template
offers, and the ways its pipeline or operands go wrong fail instead of passing."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.calibration import register_rows
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.emulator import EmulatorError, build
from tessera_rw.codegen.kernel_check import check, expected
from tessera_rw.codegen.kernel_inputs import random_inputs
from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
from tessera_rw.codegen.templates.attention_backward_problem import WarpgroupGradientSchedule
from tests.codegen.schedule_check import rng_for

pytestmark = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")

H100, A100 = arch_named("h100"), arch_named("a100")
TEMPLATE = FlashAttentionBwdTemplate()
# one head of 200 causal queries and keys, D = 128: two warpgroups over 32-wide tiles in 2 stages,
# so each key job streams up to 7 query tiles and each query job up to 4 key tiles of 32
OP = TEMPLATE.sample(1, 1, 200, 128, DType.bfloat16, True)
SCHEDULE = WarpgroupGradientSchedule(rows=128, cols=32, warps=8, stages=2)


def _case():
    rng = rng_for(OP)
    inputs = random_inputs(OP, rng)
    return inputs, expected(OP, inputs, rng)


def _run(arrays, old: str = "", new: str = "") -> np.ndarray:
    source = TEMPLATE.emit(OP, SCHEDULE, H100)
    if old:
        assert old in source.source, old
        source = KernelSource(source.name + "_mutated", source.source.replace(old, new).replace(
            source.name, source.name + "_mutated"), source.threads, source.grid, source.dynamic_smem,
            target=source.target)
    out = np.empty(OP.result.shape, OP.result.dtype.numpy)
    out.view(np.uint8)[:] = emulator.POISON
    build(source)([*arrays, out])
    return out


def test_sm90_puts_the_wgmma_kernel_first_and_other_archs_never_see_it():
    assert isinstance(TEMPLATE.schedules(OP, H100)[0], WarpgroupGradientSchedule)
    assert TEMPLATE.valid(OP, SCHEDULE, H100) and not TEMPLATE.valid(OP, SCHEDULE, A100)
    assert not any(isinstance(s, WarpgroupGradientSchedule) for s in TEMPLATE.space(OP, A100))
    short = TEMPLATE.sample(1, 1, 48, 64, DType.bfloat16, False)       # shorter than a warpgroup's rows
    assert not any(isinstance(s, WarpgroupGradientSchedule) for s in TEMPLATE.space(short, H100))


def test_ptxas_fits_every_wgmma_default_in_registers_as_the_model_says():
    """D=128 with a mask, causal and ragged: the heaviest of the samples. Two warpgroups over
    64-wide tiles sit at ptxas's 255 registers without spilling; the model tracks them."""
    heaviest = TEMPLATE.samples()[-1]

    class Heaviest(FlashAttentionBwdTemplate):
        def samples(self):
            return (heaviest,)

    rows = [r for r in register_rows([Heaviest()], ["sm_90"]) if r.schedule.startswith("wg")]
    assert len(rows) == 3
    for r in rows:
        assert r.spill_bytes == 0 and r.predicted_spill_bytes == 0 and r.within(0.25), r


def test_the_wgmma_backward_matches_the_reference_over_refilled_stages():
    inputs, reference = _case()
    check(reference.on(TEMPLATE.resources(OP, SCHEDULE, H100).unit), _run(inputs.arrays), str(OP))


@pytest.mark.parametrize("old, new, message", [
    # the barrier before a refill: a stage is overwritten while the other warpgroup still reads it
    ("        __syncthreads();                                  // for every thread; and tile t - 1",
     "        // no barrier", "writes shared memory that an issued wgmma still reads"),
    # dK and dV's products left in flight when the next barrier lets their stage refill
    ("        wgmma_wait<0>();                                  // before the next barrier",
     "        // no wait", "writes shared memory that an issued wgmma still reads"),
    # the second 64-wide block of the head dim of an N-major tile read from the wrong place
    ("wgmma_desc(t + kk * 16 * 64, COLS * ROW_BYTES, ATOM)", "wgmma_desc(t + kk * 16 * 64, ATOM, ATOM)", None),
    # the register operand's rows g + 8 and columns 8.. swapped
    ("a[kk][1] = pack_bf16x2(x[2 * kk][2], x[2 * kk][3]);\n        a[kk][2] = pack_bf16x2(x[2 * kk + 1][0], "
     "x[2 * kk + 1][1]);",
     "a[kk][2] = pack_bf16x2(x[2 * kk][2], x[2 * kk][3]);\n        a[kk][1] = pack_bf16x2(x[2 * kk + 1][0], "
     "x[2 * kk + 1][1]);", None),
    # the second warpgroup's score rows read from the first's
    ("warpgroup * 64 * 64 + (kk % 4) * 16", "(kk % 4) * 16", None),
])
def test_a_broken_wgmma_backward_fails(old, new, message):
    """Each mutation stops the run with `message`, or (None) gives a wrong result."""
    inputs, reference = _case()
    if message:
        with pytest.raises(EmulatorError, match=message):
            _run(inputs.arrays, old, new)
    else:
        with pytest.raises(AssertionError):
            check(reference.on(TEMPLATE.resources(OP, SCHEDULE, H100).unit), _run(inputs.arrays, old, new), str(OP))
