"""KernelPlan: a chosen program as launches over buffers, ready for codegen to bind and run.

A plan is what a device executes: kernels in order, each reading and writing whole buffers.
Every buffer is dense and row-major; a value is a buffer seen at some shape (a reshape of a dense
value is the same bytes at another shape, so it costs nothing). Graph inputs and constants get a
buffer of their own, outputs too; the temporaries in between share a few buffers, each one reused
once the values in it are dead.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.graph import Graph
>>> from tessera_rw.lower.lowering import lower
>>> x = make_input("x", (4, 8), DType.float32)
>>> plan = lower(Graph("f", (x,), (make("exp", make("exp", make("exp", x))),)))
>>> [step.node.op for step in plan.steps], len(plan.buffers)
(['exp', 'exp', 'exp'], 4)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node, TensorType


class BufferRole(enum.Enum):
    INPUT = "input"          # the caller's array, bound at each call
    CONSTANT = "constant"    # filled once from the graph's constants and literals
    TEMP = "temp"            # written and read inside the plan, reused once dead
    OUTPUT = "output"        # handed back to the caller


@dataclass(frozen=True)
class Buffer:
    """One allocation: sized for the largest value it ever holds."""
    id: int
    name: str
    role: BufferRole
    nbytes: int


@dataclass(frozen=True)
class ValueRef:
    """A value in a plan: the first `type.nbytes` bytes of buffer `buffer`, dense row-major."""
    buffer: int
    type: TensorType

    def __str__(self) -> str:
        return f"b{self.buffer}:{self.type}"


@dataclass(frozen=True)
class Step:
    """One kernel launch: graph node `node` computed from `inputs` into `output`."""
    node: Node
    inputs: tuple[ValueRef, ...]
    output: ValueRef

    @property
    def op(self) -> str:
        return self.node.op


@dataclass(frozen=True)
class KernelPlan:
    name: str
    graph: Graph
    buffers: tuple[Buffer, ...]
    inputs: tuple[tuple[str, ValueRef], ...]        # graph input name -> its buffer
    constants: tuple[tuple[Node, ValueRef], ...]    # constant / literal node -> its buffer
    steps: tuple[Step, ...]
    outputs: tuple[ValueRef, ...]

    def buffers_of(self, role: BufferRole) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.role is role)

    @property
    def temp_bytes(self) -> int:
        """Device memory the plan needs besides its inputs and outputs."""
        return sum(b.nbytes for b in self.buffers if b.role in (BufferRole.TEMP, BufferRole.CONSTANT))

    def __str__(self) -> str:
        lines = [f"plan {self.name}: {len(self.steps)} kernel(s), {len(self.buffers)} buffer(s), "
                 f"{self.temp_bytes} bytes of temporaries"]
        lines += [f"  b{b.id} {b.role.value:8s} {b.name:10s} {b.nbytes} bytes" for b in self.buffers]
        for i, step in enumerate(self.steps):
            args = ", ".join(map(str, step.inputs))
            lines.append(f"  {i}: {step.output} = {step.op}({args})")
        lines.append(f"  return {', '.join(map(str, self.outputs))}")
        return "\n".join(lines)
