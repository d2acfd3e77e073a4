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

from tessera_rw.codegen.arch import KNOWN_ARCHS, REGISTER_UNIT, WARP_SIZE, ArchSpec
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


def spilled_for_occupancy(registers: int, spill_bytes: int, threads: int, arch: ArchSpec) -> bool:
    """Whether ptxas spilled with registers to spare below the block's ceiling: its own trade of a
    few spilled bytes for another resident block, not a spill for want of registers. A 64x64 bf16
    GEMM tile of 128 threads can compile to 72 registers and one spilled word on sm_90, where 80
    spill nothing: 72 is the most that lets seven blocks share an SM, and no cap passed to ptxas
    changes it. No register count predicts such a trade; a timing weighs it.

    >>> from tessera_rw.codegen.arch import arch_named
    >>> h100 = arch_named("H100-SXM")
    >>> spilled_for_occupancy(72, 8, 128, h100), spilled_for_occupancy(255, 8, 128, h100)
    (True, False)
    >>> spilled_for_occupancy(168, 16, 384, h100)      # 384 threads: a ceiling of 168
    False
    """
    per_thread = REGISTER_UNIT // WARP_SIZE       # registers are allocated to threads in steps of this many
    ceiling = arch.register_limit(threads) // per_thread * per_thread
    return spill_bytes > 0 and registers < ceiling


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
