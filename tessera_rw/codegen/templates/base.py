"""What every kernel template provides: the ops it implements, its schedules, its resource model
and its CUDA emitter.

The resource model is the template's own account of a (KernelOp, schedule) on an architecture:
threads and blocks, registers per thread, shared memory, the HBM traffic it causes and the FLOPs
it executes on which math unit. The cost model in `tune` turns that into time; the register
estimate is checked against ptxas on the emitted source (tests/codegen/test_register_model.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import ClassVar

from tessera_rw.codegen.arch import ArchSpec, MathUnit
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp


@dataclass(frozen=True)
class Schedule:
    """Base of each template's schedule: a frozen record of its tunable parameters."""

    def describe(self) -> str:
        """'bm=128 bn=128 bk=32 warps=4 stages=3'"""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


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


class Template(ABC):
    """One kernel kind. Subclasses are stateless; one instance serves every op and schedule."""

    kind: ClassVar[str]                   # the ExplainReport kernel kind: 'gemm', 'softmax', ...
    ops: ClassVar[frozenset[str]]         # the ops (plain or fused) it implements
    library: ClassVar[str | None] = None  # the library that runs it (e.g. "cuFFT") when no source is emitted

    def accepts(self, op: KernelOp) -> bool:
        """Whether this template can implement `op` (beyond its name: ranks, dtypes, sizes)."""
        return op.op in self.ops

    def kind_of(self, op: KernelOp) -> str:
        """The kernel kind of `op`; a template serving several kinds (softmax, layernorm) refines it."""
        return self.kind

    @abstractmethod
    def fused(self, op: KernelOp) -> tuple[str, ...]:
        """What the kernel absorbed besides its main op, e.g. ('scale', 'bias', 'gelu')."""

    @abstractmethod
    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        """The default schedules for `op` on `arch`, all valid (they fit smem, registers, alignment)."""

    @abstractmethod
    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        """The resource model of `op` under `schedule`."""

    @abstractmethod
    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        """CUDA C++ for `op` under `schedule`, with a header comment naming the source op."""

    @abstractmethod
    def samples(self) -> tuple[KernelOp, ...]:
        """Representative ops, one per code path, for calibration tables and compile tests."""
