"""Every template's register estimate is within 25% of ptxas and predicts spills exactly."""

import pytest

from tessera_rw.codegen.calibration import register_rows
from tessera_rw.codegen.templates.registry import templates

BOUND = 0.25
GENERATED = [t for t in templates() if t.samples()]


def test_every_kernel_kind_but_the_library_fft_is_generated_and_calibrated():
    assert {t.kind for t in GENERATED} >= {"gemm", "flash_attention", "softmax", "reduction", "elementwise",
                                           "copy", "conv"}


@pytest.mark.parametrize("template", GENERATED, ids=lambda t: type(t).__name__)
def test_register_estimate_is_within_bound_of_ptxas(template):
    rows = register_rows([template])
    assert rows
    off = [f"{r.op} [{r.schedule}] {r.arch}: estimate {r.estimate}, ptxas {r.ptxas} ({r.error:+.0%})"
           for r in rows if not r.within(BOUND)]
    assert not off, "\n".join(off)
    wrong_spills = [f"{r.op} [{r.schedule}] {r.arch}: predicted {r.predicted_spill_bytes} B, ptxas {r.spill_bytes} B"
                    for r in rows if not r.spill_agrees]
    assert not wrong_spills, "\n".join(wrong_spills)
    assert all(r.spill_bytes == 0 for r in rows), "default schedules must not spill"
