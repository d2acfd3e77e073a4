"""What every generated template promises, checked on each sample at default schedules for sm_80 and
sm_90 (the `fast` policy's own included): each sample at the schedule an untuned call runs, and every other
default schedule of the template on one sample at least (schedule_cover.py; TESSERA_EXHAUSTIVE=1 runs every
sample at every one). The promises: self-contained source naming its op, an NVRTC
compile with zero spills (and warpgroup MMAs that ptxas does not serialize), a register estimate
within 25% of ptxas with the spill prediction exact, shared memory within the arch."""

from dataclasses import replace

import pytest

from tessera_rw.codegen.calibration import CALIBRATION_ARCHS, arch_for_sm
from tessera_rw.codegen.compile import compile_cuda
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.registry import templates
from tests.codegen.schedule_cover import covering

REGISTER_BOUND = 0.25
GENERATED = [t for t in templates() if t.samples()]


def _default_schedules(template, op, sm):
    """(op, schedule, label) for each default schedule of `op` on `sm`, and of `op` under the `fast`
    policy where that offers schedules of its own (tf32 GEMMs, the atomic attention backward)."""
    arch = arch_for_sm(sm)
    plain = template.schedules(op, arch)
    fast = replace(op, numerics=Numerics.FAST)
    return [(op, s, "") for s in plain] + [(fast, s, "fast-") for s in template.schedules(fast, arch)
                                           if s not in plain]


def _cases():
    for t in GENERATED:
        for sm in CALIBRATION_ARCHS:
            offered = {i: _default_schedules(t, sample, sm) for i, sample in enumerate(t.samples())}
            for i, picked in covering(offered, describe=lambda case: case[2] + case[1].describe()).items():
                for op, s, label in picked:
                    yield pytest.param(t, op, s, sm, id=f"{type(t).__name__}-{sm}-{i}-{label}{s.describe().replace(' ', ',')}")


CASES = list(_cases())


def test_every_kernel_kind_but_the_library_fft_is_generated_and_calibrated():
    assert {t.kind for t in GENERATED} >= {"gemm", "flash_attention", "softmax", "reduction", "elementwise",
                                           "copy", "conv"}
    # an arch lacking a unit the op needs (fp8 tensor cores before sm_89) says so instead
    for t in GENERATED:
        for op in t.samples():
            for sm in CALIBRATION_ARCHS:
                arch = arch_for_sm(sm)
                assert bool(t.schedules(op, arch)) != bool(t.unavailable(op, arch)), f"{op} on {sm}"
            assert t.schedules(op, arch_for_sm(CALIBRATION_ARCHS[-1])), f"{op} runs on no calibration arch"


@pytest.mark.parametrize("template, op, schedule, sm", CASES)
def test_sample_compiles_and_its_resource_model_holds(template, op, schedule, sm):
    arch = arch_for_sm(sm)
    source = template.emit(op, schedule, arch)
    assert "#include" not in source.source and str(op) in source.source
    compiled = compile_cuda(source, sm)
    res = template.resources(op, schedule, arch)
    assert compiled.spill_bytes == 0, "default schedules must not spill"
    # warpgroup MMAs build for the arch's own target, and ptxas keeps them asynchronous
    assert compiled.arch == (source.target or sm)
    assert "Potential Performance Loss" not in compiled.log, compiled.log
    assert (res.spill_bytes > 0) == (compiled.spill_bytes > 0)
    error = (res.registers - compiled.registers) / compiled.registers
    assert abs(error) <= REGISTER_BOUND, f"estimate {res.registers}, ptxas {compiled.registers} ({error:+.0%})"
    assert compiled.smem_bytes <= res.smem_bytes <= arch.smem_per_block
    assert res.flops >= 0 and res.hbm_bytes > 0 and res.blocks >= 1
    if source.threads:
        assert source.threads == res.threads
