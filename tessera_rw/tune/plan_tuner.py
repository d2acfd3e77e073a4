"""Tuning a KernelPlan: a schedule for each of its kernels, and the settings that steer it.

Steps computing equal KernelOps are tuned once. Library steps (cuFFT) have no schedule to tune.
Without tuning, each step runs the cost model's pick among its template's defaults
(`default_schedules`), the same schedule `--explain` reports.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.graph import Graph
>>> from tessera_rw.codegen.arch import arch_named
>>> from tessera_rw.lower.lowering import lower
>>> x = make_input("x", (256, 512), DType.bfloat16)
>>> plan = lower(Graph("f", (x,), (make("softmax", x, axis=1),)))
>>> tuned = tune_plan(plan, arch_named("H100-SXM"), TuneSettings(method="cost_model", cache=None))
>>> [k.kind for k in tuned.kernels], str(tuned.chosen_by)
(['softmax'], 'cost_model')
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.algebra.schedule_pin import SchedulePin
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.codegen.templates.registry import refusal, template_for, templates_for
from tessera_rw.lower.plan import KernelPlan
from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.cost import best_schedule
from tessera_rw.tune.kernel_tuner import KernelTuning, Method, tune_kernel
from tessera_rw.tune.pins import PinnedStep, pin_steps
from tessera_rw.tune.records import ChosenBy
from tessera_rw.tune.search import Strategy, Trial
from tessera_rw.tune.space import SpaceRestriction


@dataclass(frozen=True)
class TuneSettings:
    """How to tune: method ('auto' | 'on_device' | 'cost_model', parsed into a Method), the named
    cache (None: no cache), the user's search-space restriction, the trial budget per kernel, an
    overall time budget, the search strategy, and the program's schedule pins (its pinned GEMM
    kernels are not tuned)."""
    method: Method = Method.AUTO
    cache: str | None = "default"
    restriction: SpaceRestriction = field(default_factory=SpaceRestriction)
    max_trials: int = 50
    time_budget_s: float | None = None
    strategy: Strategy = Strategy.MODEL
    cache_root: str | None = None         # the cache folder's parent (None: TESSERA_CACHE_DIR or ~/.tessera)
    read_only: bool = False               # read the cache, write nothing to it
    pins: tuple[SchedulePin, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "method", Method.parse(self.method))
        object.__setattr__(self, "strategy", Strategy.parse(self.strategy))
        if not isinstance(self.max_trials, int) or isinstance(self.max_trials, bool) or self.max_trials < 1:
            raise ArgumentError(f"autotune: max_trials must be a positive int, got {self.max_trials!r}",
                                hint="each kernel measures at least one schedule; max_trials=1 takes the model's best")
        if self.time_budget_s is not None and not (isinstance(self.time_budget_s, (int, float))
                                                   and self.time_budget_s > 0):
            raise ArgumentError(f"autotune: time_budget_s must be a positive number of seconds or None, "
                                f"got {self.time_budget_s!r}", hint="None tunes until max_trials")

    def open_cache(self) -> TuneCache | None:
        return None if self.cache is None else TuneCache(self.cache, self.cache_root, read_only=self.read_only)


@dataclass(frozen=True)
class PlanTuning:
    """A schedule for every tunable step of a plan (library steps have none)."""
    plan: KernelPlan
    steps: tuple[int, ...]                     # indices of the tuned steps
    kernels: tuple[KernelTuning, ...]          # one per index in `steps`
    pinned: tuple[PinnedStep, ...] = ()        # the steps a user's pin fixed (their kernels are in `kernels`)

    @property
    def schedules(self) -> tuple[tuple[int, Schedule], ...]:
        """(step index, schedule) pairs, as `bind_plan` and the runtime take them."""
        return tuple((i, k.schedule) for i, k in zip(self.steps, self.kernels))

    @property
    def time_us(self) -> float:
        return sum(k.time_us for k in self.kernels)

    @property
    def chosen_by(self) -> ChosenBy:
        """CACHE when every kernel came from the cache, else how the others were tuned."""
        ways = {k.chosen_by for k in self.kernels} - {ChosenBy.CACHE}
        return ChosenBy.CACHE if not ways else ChosenBy.ON_DEVICE if ChosenBy.ON_DEVICE in ways else ways.pop()


def tunable_ops(plan: KernelPlan, numerics: Numerics, arch: ArchSpec) -> list[tuple[int, KernelOp]]:
    """(step index, KernelOp) of the steps with a generated kernel to schedule on `arch` (not library
    calls, nor ops the arch cannot run, as fp8 before sm_89: `why_untunable` says why). A model's
    repeated layers repeat few distinct ops: each is looked at once."""
    found, tunable = [], {}
    for i, step in enumerate(plan.steps):
        op = KernelOp.from_node(step.node, numerics)
        if op not in tunable:
            tunable[op] = why_untunable(op, arch) is None
        if tunable[op]:
            found.append((i, op))
    return found


def why_untunable(op: KernelOp, arch: ArchSpec) -> str | None:
    """Why `op` has no kernel to schedule on `arch`, or None when it has one."""
    templates = templates_for(op)
    dtypes = ", ".join(dict.fromkeys(t.dtype.name for t in (*op.operands, op.result)))
    if not templates:
        if (why := refusal(op)) is not None:        # a template of its name refuses these operands
            return f"{op.op} of {dtypes}: {why}"
        return f"{op.op} of {dtypes} has no GPU kernel template: it runs on the host"
    if templates[0].library is not None:
        return f"{op.op} runs as a {templates[0].library} library call, which has nothing to tune"
    if not templates[0].schedules(op, arch):
        return f"{op.op} of {dtypes} has no kernel {arch.name} can run"
    return None


def default_schedules(plan: KernelPlan, arch: ArchSpec,
                      numerics: Numerics = Numerics.DETERMINISTIC) -> tuple[tuple[int, Schedule], ...]:
    """The cost model's pick among each step's default schedules (untuned runs use these), found
    once per distinct op."""
    ops = tunable_ops(plan, numerics, arch)
    best: dict[KernelOp, Schedule] = {}
    for _, op in ops:
        if op not in best:
            best[op] = best_schedule(template_for(op), op, arch)[0]
    return tuple((i, best[op]) for i, op in ops)


def tune_plan(plan: KernelPlan, arch: ArchSpec, settings: TuneSettings, numerics: Numerics = Numerics.DETERMINISTIC,
              *, on_trial: Callable[[KernelOp, Trial], None] | None = None) -> PlanTuning:
    """Tune every kernel of `plan` for `arch` under `settings` (a pinned kernel takes its pin). The
    time budget is the whole plan's: each kernel searches in what the ones before it left, and
    measures one schedule at least (the model's best) when nothing is left."""
    method = Method.resolve(settings.method, plan.name, arch)
    deadline = None if settings.time_budget_s is None else time.monotonic() + settings.time_budget_s
    cache = settings.open_cache()
    ops = tunable_ops(plan, numerics, arch)
    pinned_steps = pin_steps(ops, arch, settings.pins)
    pinned = {p.step: p.tuning for p in pinned_steps}
    done: dict[KernelOp, KernelTuning] = {}
    steps, kernels = [], []
    for i, op in ops:
        if i in pinned:
            steps.append(i)
            kernels.append(pinned[i])
            continue
        if op not in done:
            hear = None if on_trial is None else (lambda trial, op=op: on_trial(op, trial))
            left = None if deadline is None else max(deadline - time.monotonic(), 1e-9)
            done[op] = tune_kernel(op, arch, method=method, cache=cache, restriction=settings.restriction,
                                   max_trials=settings.max_trials, time_budget_s=left,
                                   strategy=settings.strategy, on_trial=hear)
        steps.append(i)
        kernels.append(done[op])
    return PlanTuning(plan, tuple(steps), tuple(kernels), pinned_steps)
