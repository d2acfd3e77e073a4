"""Binding a KernelPlan to templates: each step's KernelOp, template, kind, fused ops and schedules.

This is where a plan meets the GPU's limits: a step whose op no template implements for its
dtypes (float64 has no GPU template, nor do a few rare ops) is named in one error that lists every
such step, so the plan can run on the numpy executor instead. A library step (the FFTs, which
cuFFT runs) binds to its library call when the library loads in this process; otherwise it is
named in that error too, with the reason (unless the plan is bound only to be listed or emitted).

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.graph import Graph
>>> from tessera_rw.codegen.arch import arch_named
>>> from tessera_rw.lower.lowering import lower
>>> x = make_input("x", (128, 256), DType.bfloat16)
>>> bound = bind_plan(lower(Graph("f", (x,), (make("softmax", x, axis=1),))), arch_named("H100-SXM"))
>>> [(b.kind, b.schedule is not None) for b in bound]
[('softmax', True)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen import library_kernels
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.compile import CompiledKernel, KernelSource, compile_cuda
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.library_kernels import FFTCall
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Schedule, Template
from tessera_rw.codegen.templates.registry import NoTemplateError, refusal, templates_for
from tessera_rw.lower.plan import KernelPlan, Step


__all__ = ["BoundStep", "NoTemplateError", "bind_plan"]


@dataclass(frozen=True)
class BoundStep:
    """One step of a plan with the template that implements it and the schedule it runs. A library
    step (`call` set) runs that library call; every other step runs the template's generated kernel."""
    step: Step
    op: KernelOp
    template: Template
    schedule: Schedule
    schedules: tuple[Schedule, ...]        # the template's valid schedules: the search space
    call: FFTCall | None = None            # the library call of a library step

    @property
    def is_library(self) -> bool:
        return self.call is not None

    @property
    def kind(self) -> str:
        return self.template.kind_of(self.op)

    @property
    def fused(self) -> tuple[str, ...]:
        return self.template.fused(self.op)

    @property
    def kernel_key(self) -> tuple[Template, KernelOp, Schedule]:
        """All its generated kernel depends on (with the arch): steps with equal keys emit one
        source. A model's layers repeat a few kernels: 720 steps of a 48-layer GPT are 13."""
        return self.template, self.op, self.schedule

    def source(self, arch: ArchSpec) -> KernelSource:
        return self.template.emit(self.op, self.schedule, arch)

    def compile(self, arch: ArchSpec, sm: str) -> tuple[KernelSource, CompiledKernel]:
        """The emitted kernel and its cubin for `sm` ('sm_90'); `arch` sizes the schedule. A library
        step has no source: its template raises LibraryKernelError."""
        source = self.source(arch)
        return source, compile_cuda(source, sm)


@dataclass(frozen=True)
class _OpBinding:
    """What binding decides for one op, whichever steps run it: its template, library call and
    schedules; no template when none implements the op, `not_made` when its library call cannot be."""
    template: Template | None
    call: FFTCall | None = None
    schedules: tuple[Schedule, ...] = ()
    not_made: str | None = None


def _bind_op(op: KernelOp, arch: ArchSpec, runnable: bool) -> _OpBinding:
    found = templates_for(op)
    if not found:
        return _OpBinding(None)
    template, call = found[0], None
    if template.library is not None:
        try:
            call = library_kernels.library_call(op, template.library) if runnable else FFTCall.of(op)
        except TesseraError as e:
            return _OpBinding(template, not_made=e.detail)
    return _OpBinding(template, call, tuple(template.schedules(op, arch)))


def bind_plan(plan: KernelPlan, arch: ArchSpec, numerics: Numerics = Numerics.DETERMINISTIC,
              schedules: Mapping[int, Schedule] | None = None, *, runnable: bool = True) -> tuple[BoundStep, ...]:
    """Every step of `plan` bound to its template; `schedules` pins some steps' schedules by index
    (the others take the cost model's order: the template's first schedule). With `runnable`
    False a library step binds to its call as described, whether or not the library loads here:
    enough to list and emit a plan's kernels, not to launch them."""
    bound, missing, libraries, doubles = [], [], set(), False
    by_op: dict[KernelOp, _OpBinding] = {}    # each distinct op bound once: a model's layers repeat a few
    for i, step in enumerate(plan.steps):
        op = KernelOp.from_node(step.node, numerics)
        if op not in by_op:
            by_op[op] = _bind_op(op, arch, runnable)
        found = by_op[op]
        if found.template is None:
            empty = op.result.numel == 0 or any(t.numel == 0 for t in op.operands)
            why = "zero-size: nothing to launch, the host computes it" if empty else refusal(op)
            missing.append(f"  step {i}: {op}" + (f" ({why})" if why else ""))
            doubles |= any(t.dtype is DType.float64 for t in (*op.operands, op.result))
            continue
        template = found.template
        if found.not_made is not None:
            missing.append(f"  step {i}: {op} (a {template.library} call, not made here: {found.not_made})")
            if not library_kernels.library_available(template.library):
                libraries.add(template.library)
            continue
        space = found.schedules
        chosen = (schedules or {}).get(i, space[0] if space else None)
        if chosen is None:
            missing.append(f"  step {i}: {op} ({template.unavailable(op, arch) or f'no schedule fits {arch.name}'})")
            continue
        bound.append(BoundStep(step, op, template, chosen, space, found.call))
    if missing:
        hint = ("these steps run on the host only: pass numpy arrays (or TESSERA_DEVICE=cpu) to run the plan "
                "there" + ("; or cast the float64 operands to float32 or bfloat16" if doubles else
                           "; or cast the operands to the dtypes the kernels take (flash attention bf16 / fp16, "
                           "a product's operands one dtype)"))
        if libraries:
            hint += "; " + library_kernels.INSTALL_HINT
        raise NoTemplateError(f"plan {plan.name}: {len(missing)} kernel(s) have no GPU template:\n" + "\n".join(missing),
                              hint=hint)
    return tuple(bound)
