"""What every kernel template provides: the ops it implements, its schedules, its resource model
and its CUDA emitter.

The resource model is the template's own account of a (KernelOp, schedule) on an architecture:
threads and blocks, registers per thread, shared memory, the HBM traffic it causes and the FLOPs
it executes on which math unit. The cost model in `tune` turns that into time; the register
estimate is checked against ptxas on the emitted source (tests/codegen/test_template_contract.py for
the defaults, tests/codegen/test_schedule_spaces.py for the tuning spaces).

`space` widens the defaults into what an autotuner sweeps: each template enumerates a grid of its
parameters and keeps, through `grid_space`, the points its own checks (`valid`) accept.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import ClassVar

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen.arch import ArchSpec, MathUnit
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp


@dataclass(frozen=True)
class Schedule:
    """Base of each template's schedule: a frozen record of its tunable parameters. `tag` names the
    kernel variant when one template has several schedule kinds with the same fields."""
    tag: ClassVar[str] = ""
    quiet_defaults: ClassVar[frozenset[str]] = frozenset()   # fields named only where they differ from the default

    def describe(self) -> str:
        """'bm=128 bn=128 bk=32 warps=4 stages=3'"""
        quiet = self.quiet_fields()
        return " ".join([self.tag] * bool(self.tag) + [
            f"{f.name}={getattr(self, f.name)}" for f in fields(self)
            if f.name not in quiet or getattr(self, f.name) != quiet[f.name]])

    def quiet_fields(self) -> dict[str, object]:
        """The quiet fields' defaults, by name: where a field is at its default, names and records
        leave it out."""
        return {f.name: f.default for f in fields(self) if f.name in self.quiet_defaults}


@dataclass(frozen=True)
class Resources:
    """A kernel's footprint and work under one schedule on one architecture."""
    threads: int               # per block
    blocks: int                # grid size
    registers: int             # per thread, estimated
    smem_bytes: int            # per block, static + dynamic
    hbm_bytes: int             # DRAM traffic, re-reads beyond what L2 holds included
    flops: int                 # executed, padding of partial tiles included
    unit: MathUnit             # the pipe the FLOPs run on
    efficiency: float = 1.0    # fraction of the unit's peak the instruction mix can reach
    spill_bytes: int = 0       # per thread, predicted (0 when the schedule fits in registers)
    l2_feed_bytes: int = 0     # what the blocks load from L2, each tile's re-reads included (0: not modelled)
    bytes_in_flight: int = 0   # per thread, the loads it keeps outstanding (0: not modelled)


class Template(ABC):
    """One kernel kind. Subclasses are stateless; one instance serves every op and schedule."""

    kind: ClassVar[str]                   # the ExplainReport kernel kind: 'gemm', 'softmax', ...
    ops: ClassVar[frozenset[str]]         # the ops (plain or fused) it implements
    library: ClassVar[str | None] = None  # the library that runs it (e.g. "cuFFT") when no source is emitted

    def accepts(self, op: KernelOp) -> bool:
        """Whether this template can implement `op` (beyond its name: ranks, dtypes, sizes)."""
        return op.op in self.ops

    def refusal(self, op: KernelOp) -> str | None:
        """Why this template cannot implement `op`, None when it can: what an explain report tells a
        user whose fused op no kernel takes. A template that can name the limit overrides it."""
        if self.accepts(op):
            return None
        return f"the {self.kind} kernel does not take {', '.join(map(str, op.operands))}"

    def kind_of(self, op: KernelOp) -> str:
        """The kernel kind of `op`; a template serving several kinds (softmax, layernorm) refines it."""
        return self.kind

    @abstractmethod
    def fused(self, op: KernelOp) -> tuple[str, ...]:
        """What the kernel absorbed besides its main op, e.g. ('scale', 'bias', 'gelu')."""

    @abstractmethod
    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        """The default schedules for `op` on `arch`, all valid (they fit smem, registers, alignment)."""

    def unavailable(self, op: KernelOp, arch: ArchSpec) -> str | None:
        """Why an op this template accepts has no schedule on `arch` (the arch lacks a unit it
        needs), and what to do instead; None when nothing rules the arch out."""
        return None

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        """Every schedule the autotuner may try for `op` on `arch`: the defaults first (in their
        order), then the rest of the template's grid; all valid (they fit smem, registers, block
        limits, MMA alignment, and the emitter supports them). A template without a grid offers
        its defaults."""
        return self.schedules(op, arch)

    def variants(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> tuple[Schedule, ...]:
        """Schedules of the space computing `schedule`'s tiles in another order or launch, which the
        resource model prices alike: only a measurement tells them apart, so a tuner times the
        best estimate's variants first. None unless a template has such knobs."""
        return ()

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        """Whether this template can run `op` under `schedule` on `arch` as its emitter writes it,
        within the block's shared memory and registers; every schedule of `space` is."""
        return schedule in self.space(op, arch)

    @abstractmethod
    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        """The resource model of `op` under `schedule`."""

    @abstractmethod
    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        """CUDA C++ for `op` under `schedule`, with a header comment naming the source op."""

    @abstractmethod
    def samples(self) -> tuple[KernelOp, ...]:
        """Representative ops, one per code path, for calibration tables and compile tests."""


class ScheduleError(TesseraError):
    """An op has no schedule on the architecture asked for."""


def first_schedule(template: Template, op: KernelOp, arch: ArchSpec) -> Schedule:
    """The template's first default schedule for `op` on `arch`: what a run without a tuned
    schedule uses. An arch the op cannot run on (fp8 before sm_89) raises, saying why."""
    found = template.schedules(op, arch)
    if not found:
        raise ScheduleError(f"the {template.kind_of(op)} kernel of {op} has no schedule on {arch.name}",
                            op=op.op, hint=template.unavailable(op, arch) or "pick another target arch (TESSERA_ARCH)")
    return found[0]


# A sweep compiles and times every point of a space, so a grid is kept to this many schedules.
MAX_SPACE = 200


def grid_space(defaults: Iterable[Schedule], grid: Iterable[Schedule], valid: Callable[[Schedule], bool],
               limit: int = MAX_SPACE) -> tuple[Schedule, ...]:
    """The defaults in their order, then each valid point of `grid` not among them in grid order,
    at most `limit` schedules in all.

    >>> @dataclass(frozen=True)
    ... class Tile(Schedule):
    ...     size: int
    >>> [s.size for s in grid_space([Tile(64)], map(Tile, (32, 64, 128, 256)), lambda s: s.size <= 128)]
    [64, 32, 128]
    """
    found = dict.fromkeys(defaults)
    for s in grid:
        if len(found) >= limit:
            break
        if s not in found and valid(s):
            found[s] = None
    return tuple(found)
