"""From a traced Graph to the plan that runs: rewrite, extract candidates, choose, lower, schedule.

One function so that calling a kernel, explaining it and tuning it all see the same program.
Without tuning settings the cost model chooses the candidate and each kernel runs its pick among
the template's default schedules; with them, `tune.candidate_choice` weighs the close candidates
with tuned kernels (from the cache when it knows the answer).

>>> from tessera_rw import op
>>> @op.kernel
... def f(x):
...     return op.softmax(x * 2.0, axis=-1)
>>> program = compile_program(f.trace(op.tensor((64, 128), "float32")))
>>> [step.op for step in program.plan.steps]   # the scale folds into the softmax kernel
['fused_normalization']
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.schedule_pin import SchedulePin
from tessera_rw.codegen.arch import ArchSpec, resolve_arch
from tessera_rw.codegen.numerics import current_numerics
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.lower.lowering import lower
from tessera_rw.lower.plan import KernelPlan
from tessera_rw.rules.registry import rulesets
from tessera_rw.rules.saturate import RewriteResult, rewrite
from tessera_rw.tune.candidate_choice import CandidateChoice, choose_candidate
from tessera_rw.tune.extract import Candidate, extract_candidates
from tessera_rw.tune.pins import PinnedStep, pin_steps, warn_unused
from tessera_rw.tune.plan_tuner import TuneSettings, default_schedules, tunable_ops
from tessera_rw.tune.records import ChosenBy


@dataclass(frozen=True)
class CompiledProgram:
    """A graph's rewrite, its candidates (cheapest first), the one chosen and its plan."""
    graph: Graph
    arch: ArchSpec
    rewrite: RewriteResult
    candidates: tuple[Candidate, ...]
    chosen: int
    chosen_by: ChosenBy
    plan: KernelPlan
    schedules: tuple[tuple[int, Schedule], ...] = ()   # (step index, schedule) the plan runs with
    tuning: CandidateChoice | None = None               # what tuning weighed, when it ran
    pinned: tuple[PinnedStep, ...] = ()                 # steps whose schedule a user's pin fixed

    @property
    def candidate(self) -> Candidate:
        return self.candidates[self.chosen]


def compile_program(graph: Graph, arch: ArchSpec | str | None = None, tuning: TuneSettings | None = None,
                    pins: tuple[SchedulePin, ...] = ()) -> CompiledProgram:
    """Saturate `graph`, extract candidates for `arch`, choose one (by the cost model, or by tuning
    under `tuning`), lower it and schedule its kernels; `pins` fix some GEMM kernels' tiles."""
    arch = resolve_arch(arch)
    graph = graph.verify()
    result = rewrite(graph, rulesets())
    candidates = extract_candidates(result, arch)
    numerics = current_numerics()
    if tuning is None:
        plan = lower(candidates[0].graph)
        pinned = pin_steps(tunable_ops(plan, numerics, arch), arch, pins) if pins else ()
        schedules = dict(default_schedules(plan, arch, numerics)) | {p.step: p.tuning.schedule for p in pinned}
        program = CompiledProgram(graph, arch, result, candidates, 0, ChosenBy.COST_MODEL, plan,
                                  tuple(sorted(schedules.items())), pinned=pinned)
    else:
        choice = choose_candidate(graph, candidates, arch, replace(tuning, pins=tuple(pins)), numerics)
        program = CompiledProgram(graph, arch, result, candidates, choice.index, choice.chosen_by, choice.plan,
                                  choice.tuning.schedules, choice, choice.tuning.pinned)
    warn_unused(pins, program.pinned, [step.op for step in program.plan.steps])
    return program
