"""Each stage of the pipeline timed on the benchmark's model graphs, for an H100 target.

trace → saturate (every built-in ruleset) → extract (all fusion depths) → lower → emit CUDA →
NVRTC compile of the chosen plan's distinct kernels. Compiling runs against an empty binary cache
(the bench points TESSERA_CACHE_DIR at a fresh folder), so it is what a first call costs; a kernel
two models share is compiled once in the process, as it would be for a user. The compiled kernels'
ptxas register counts are set beside the templates' estimates, and their spills counted: those for
want of registers apart from ptxas's own trades of a spilled word for occupancy.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.calibration import spilled_for_occupancy
from tessera_rw.codegen.numerics import current_numerics
from tessera_rw.codegen.plan_binding import BoundStep, bind_plan
from tessera_rw.lower.lowering import lower
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.saturate import rewrite
from tessera_rw.tune.extract import extract_candidates
from tessera_rw.tune.plan_tuner import default_schedules

from bench.timing import time_call


@dataclass(frozen=True)
class StageTimes:
    """One model through the pipeline: seconds per stage (medians where repeated) and what each made."""
    model: str
    graph_nodes: int
    enodes: int
    eclasses: int
    iterations: int
    stop_reason: str
    kernels: int                 # steps of the chosen plan
    library_steps: int           # of those, library calls (cuFFT): no source of ours
    distinct_sources: int        # generated kernels with distinct source text
    trace_s: float
    saturate_s: float
    extract_s: float
    lower_s: float
    emit_s: float
    compile_s: float
    register_errors: tuple[float, ...]    # (estimate - ptxas) / ptxas per distinct kernel
    spills: int                           # distinct kernels ptxas spilled for want of registers
    occupancy_spills: tuple[str, ...] = ()    # kernels ptxas spilled below their ceiling: "name: 72 regs, 8 B"

    @property
    def total_s(self) -> float:
        return self.trace_s + self.saturate_s + self.extract_s + self.lower_s + self.emit_s + self.compile_s


def run_model(name: str, make: Callable[[], tuple], arch: ArchSpec, reps: int = 3) -> StageTimes:
    """Time every stage for the kernel and placeholders `make()` returns (a fresh kernel per trace,
    so the per-signature cache never answers)."""
    kernel, inputs = make()
    graph = kernel.trace(**inputs)
    trace = time_call(lambda: make()[0].trace(**inputs), reps=reps)
    result = rewrite(graph, BUILTIN_RULESETS)
    saturate = time_call(lambda: rewrite(graph, BUILTIN_RULESETS), reps=reps)
    candidates = extract_candidates(result, arch)
    extract = time_call(lambda: extract_candidates(result, arch), reps=reps)
    plan = lower(candidates[0].graph)
    lowering = time_call(lambda: lower(candidates[0].graph), reps=reps)

    numerics = current_numerics()
    start = time.perf_counter()
    schedules = dict(default_schedules(plan, arch, numerics))
    bound = bind_plan(plan, arch, numerics, schedules, runnable=False)
    distinct = {b.kernel_key: b for b in bound if not b.is_library}   # as a DevicePlan emits them
    generated = {b.source(arch).full_source: b for b in distinct.values()}
    emit_s = time.perf_counter() - start

    start = time.perf_counter()
    built = [(b, *b.compile(arch, arch.sm)) for b in generated.values()]
    compile_s = time.perf_counter() - start
    compiled = [(b, c) for b, _, c in built]
    traded = [c for _, source, c in built if spilled_for_occupancy(c.registers, c.spill_bytes, source.threads, arch)]
    return StageTimes(
        name, len(graph.nodes), result.report.enodes, len(result.view.classes), len(result.report.iterations),
        result.report.stop_reason.value, len(plan.steps), sum(b.is_library for b in bound), len(generated),
        trace.median_s, saturate.median_s, extract.median_s, lowering.median_s, emit_s, compile_s,
        tuple(_register_error(b, c.registers, arch) for b, c in compiled),
        sum(c.spill_bytes > 0 for b, c in compiled) - len(traded),
        tuple(f"{c.name}: {c.registers} regs, {c.spill_bytes} B" for c in traded))


def _register_error(bound: BoundStep, ptxas: int, arch: ArchSpec) -> float:
    estimate = bound.template.resources(bound.op, bound.schedule, arch).registers
    return (estimate - ptxas) / ptxas


def median_abs(values: tuple[float, ...]) -> float:
    return statistics.median(abs(v) for v in values) if values else 0.0
