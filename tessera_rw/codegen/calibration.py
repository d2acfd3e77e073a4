"""The register model against ptxas: every template's samples at every default schedule, compiled.

The cost model's occupancy comes from the templates' register estimates; this is where they meet
the compiler's own count. NVRTC needs no GPU, so the comparison runs anywhere:

>>> from tessera_rw.codegen.templates.registry import templates
>>> row = register_rows([t for t in templates() if t.kind == "elementwise"], ["sm_90"])[0]
>>> row.within(0.25) and row.spill_agrees
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from tessera_rw.codegen.arch import KNOWN_ARCHS, ArchSpec
from tessera_rw.codegen.compile import compile_cuda
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Template

CALIBRATION_ARCHS = ("sm_80", "sm_90")


@dataclass(frozen=True)
class RegisterRow:
    kind: str
    op: KernelOp
    schedule: str
    arch: str
    estimate: int
    ptxas: int
    predicted_spill_bytes: int
    spill_bytes: int

    @property
    def error(self) -> float:
        """Relative error of the estimate against ptxas's count."""
        return (self.estimate - self.ptxas) / self.ptxas

    def within(self, bound: float) -> bool:
        return abs(self.error) <= bound

    @property
    def spill_agrees(self) -> bool:
        return (self.predicted_spill_bytes > 0) == (self.spill_bytes > 0)


def arch_for_sm(sm: str) -> ArchSpec:
    """The first known architecture compiled for `sm` (the figures that matter here are per-SM limits)."""
    return next(a for a in KNOWN_ARCHS if a.sm == sm)


def register_rows(templates: Iterable[Template], sms: Sequence[str] = CALIBRATION_ARCHS) -> list[RegisterRow]:
    """Estimate and ptxas count for every sample x default schedule x arch of `templates`."""
    rows = []
    for template in templates:
        for sm in sms:
            arch = arch_for_sm(sm)
            for op in template.samples():
                for schedule in template.schedules(op, arch):
                    res = template.resources(op, schedule, arch)
                    compiled = compile_cuda(template.emit(op, schedule, arch), arch.sm)
                    rows.append(RegisterRow(template.kind_of(op), op, schedule.describe(), sm, res.registers,
                                            compiled.registers, res.spill_bytes, compiled.spill_bytes))
    return rows
