"""Per-kernel timing of plan runs, for whoever is listening (the profiler): a scoped recorder protocol.

Both executors ask `active_recorders()` once per plan run. With none (the usual case) a run costs
that one context-variable read and nothing else; with some, every step is timed and each recorder
hears `record_step(run, step, start_ns, duration_ns)` once per step:

- the numpy executor times a step by the wall clock (`time.perf_counter_ns`) around it;
- the GPU runtime records a CUDA event pair around each launch on the plan's stream, synchronizes
  once after the last launch, and reads the pairs' elapsed times then (never one sync per kernel).
  A step's start on the host clock is placed back from the moment that sync returned, so host and
  device records share one time axis.

Recorders nest: a block inside another block adds its recorder to those already listening, so an
outer listener also hears what an inner one records. The scope is a context variable, so each
thread and asyncio task has its own (a thread started inside a block does not inherit it).

>>> class Count:
...     def __init__(self): self.steps = []
...     def record_step(self, run, step, start_ns, duration_ns): self.steps.append((run.plan, step))
>>> outer, inner = Count(), Count()
>>> with recording(outer):
...     with recording(inner):
...         report_step(active_recorders(), PlanRun("plan", "deterministic"), 0, 10, 5)
>>> outer.steps, inner.steps, active_recorders()
([('plan', 0)], [('plan', 0)], ())
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

if TYPE_CHECKING:
    from tessera_rw.codegen.arch import ArchSpec
    from tessera_rw.codegen.numerics import Numerics
    from tessera_rw.codegen.templates.base import Schedule
    from tessera_rw.lower.plan import KernelPlan

HOST = "host"
EMULATOR = "emulator"      # the generated CUDA run on the CPU (TESSERA_DEVICE=emulator)


@dataclass(frozen=True)
class PlanRun:
    """One run of a plan, as much as costing its steps needs: what ran, under which policy, where."""
    plan: KernelPlan
    numerics: Numerics
    device: str = HOST                        # "host" (the numpy executor), "emulator" or "cuda:<index>"
    stream: int = 0                           # the CUDA stream's handle; 0 on the host
    arch: ArchSpec | None = None              # the GPU's spec; None on the host
    schedules: tuple[Schedule, ...] = ()      # the schedule each step ran with (GPU only)


class StepRecorder(Protocol):
    def record_step(self, run: PlanRun, step: int, start_ns: int, duration_ns: int) -> None:
        """Step `step` of `run` started at `start_ns` (time.perf_counter_ns's clock) and took
        `duration_ns`. Called on the thread that ran the plan; keep it cheap."""


_RECORDERS: ContextVar[tuple[StepRecorder, ...]] = ContextVar("tessera_rw_step_recorders", default=())


def active_recorders() -> tuple[StepRecorder, ...]:
    """The recorders listening in this context, outermost first; () when nothing is profiled."""
    return _RECORDERS.get()


@contextmanager
def recording(recorder: StepRecorder) -> Iterator[StepRecorder]:
    """A block during which `recorder` hears every step of every plan run in this context."""
    token = _RECORDERS.set(_RECORDERS.get() + (recorder,))
    try:
        yield recorder
    finally:
        _RECORDERS.reset(token)


@contextmanager
def not_recording() -> Iterator[None]:
    """A block whose plan runs no recorder hears: runs made to measure something else (an
    autotuner's timed repetitions) rather than the user's own launches."""
    token = _RECORDERS.set(())
    try:
        yield
    finally:
        _RECORDERS.reset(token)


def report_step(recorders: tuple[StepRecorder, ...], run: PlanRun, step: int, start_ns: int,
                duration_ns: int) -> None:
    for r in recorders:
        r.record_step(run, step, start_ns, duration_ns)


def host_clock() -> int:
    return time.perf_counter_ns()


class DeviceStepTimer:
    """CUDA event pairs around launches on one stream, read after a single sync at the end.

    >>> timer = DeviceStepTimer(stream)                 # doctest: +SKIP
    >>> for i, launch in enumerate(launches):           # doctest: +SKIP
    ...     timer.launch(i, launch)
    >>> timer.report(recorders, run)                    # doctest: +SKIP
    """

    def __init__(self, stream: Any):
        from cuda.core import EventOptions
        self.stream = stream
        self.options = EventOptions(timing_enabled=True)
        self.events: list[tuple[int, Any, Any]] = []

    def launch(self, step: int, launch: Callable[[], None]) -> None:
        start = self.stream.record(options=self.options)
        launch()
        self.events.append((step, start, self.stream.record(options=self.options)))

    def report(self, recorders: tuple[StepRecorder, ...], run: PlanRun) -> None:
        """Wait for the last launch, then tell `recorders` every launch's start and duration."""
        if not self.events:
            return
        last = self.events[-1][2]
        last.sync()
        # The sync returns just after the last event completes: anchoring there (rather than at the
        # moment the first launch was enqueued) keeps the host-clock starts right when the stream
        # was still busy with earlier work.
        synced = host_clock()
        for step, start, end in self.events:
            duration_ns = max(0, round((end - start) * 1e6))        # Event - Event is milliseconds
            start_ns = synced - round((last - start) * 1e6)
            report_step(recorders, run, step, start_ns, duration_ns)
        self.events.clear()


def stream_id(stream: Any) -> int:
    """The raw handle of a cuda.core Stream, which names it in a trace (0: the legacy stream)."""
    try:
        return int(stream.handle)
    except (AttributeError, TypeError, ValueError):
        return id(stream)
