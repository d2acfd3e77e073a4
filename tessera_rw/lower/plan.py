"""KernelPlan: a chosen program as launches over buffers, ready for codegen to bind and run.

A plan is what a device executes: kernels in order, each reading and writing dense row-major
values. A value is a run of a buffer's bytes seen at some shape: usually the buffer's first bytes,
but a view starts further in (a reshape of a dense value is the same bytes at another shape; a
slice that selects one contiguous run, like rows 0:M or row M of a matrix, is those bytes at an
offset), so views cost nothing. Every offset is a multiple of VIEW_ALIGNMENT, so a value starts
as aligned as its buffer. Graph inputs and constants get a buffer of their own, outputs too; the
temporaries in between share a few buffers, each one reused once the values in it are dead.

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
from tessera_rw.algebra.ops.fused_norm import prologue_views
from tessera_rw.algebra.ops.strided import operand_views, slice_text
from tessera_rw.algebra.ops.strided_attention import attention_views
from tessera_rw.algebra.ops.strided_attention_backward import base_op, viewed_operands
from tessera_rw.algebra.shapes import contiguous_strides


# Bytes a view's offset is a multiple of. Generated kernels load and store up to 16 bytes at once
# (vector accesses, cp.async), which needs operands at 16-byte aligned addresses; buffers are
# allocated at least that aligned, so a value at such an offset keeps what the kernels need.
VIEW_ALIGNMENT = 16


# The attributes saying a kernel reads its first / second operand transposed (GEMMs).
TRANSPOSED_OPERANDS = ("trans_a", "trans_b")


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
    """A value in a plan: `type.nbytes` bytes of buffer `buffer` from byte `offset` on, dense
    row-major.

    >>> from tessera_rw.algebra.dtypes import DType
    >>> str(ValueRef(3, TensorType((64,), DType.bfloat16), 4096)), str(ValueRef(3, TensorType((64,), DType.bfloat16)))
    ('b3+4096:bf16[64]', 'b3:bf16[64]')
    """
    buffer: int
    type: TensorType
    offset: int = 0

    @property
    def end(self) -> int:
        """The byte after the value's last."""
        return self.offset + self.type.nbytes

    def __str__(self) -> str:
        at = f"+{self.offset}" if self.offset else ""
        return f"b{self.buffer}{at}:{self.type}"


@dataclass(frozen=True)
class Step:
    """One kernel launch: graph node `node` computed from `inputs` into `output`."""
    node: Node
    inputs: tuple[ValueRef, ...]
    output: ValueRef

    @property
    def op(self) -> str:
        return self.node.op

    def operand_text(self, i: int) -> str:
        """Operand `i` as the plan prints it, marked ᵀ when the kernel reads it transposed (a GEMM's
        trans_a / trans_b: the buffer holds xᵀ, the product reads x), followed by the slice a
        strided_elementwise reads of it."""
        flag = TRANSPOSED_OPERANDS[i] if i < len(TRANSPOSED_OPERANDS) else None
        if flag and self.node.attr(flag):
            return f"{self.inputs[i]}ᵀ"
        views = self._views()
        if i < len(views):
            shape, strides, offset = views[i]
            return f"{self.inputs[i]}{slice_text(self.inputs[i].type.shape, shape, strides, offset)}"
        return str(self.inputs[i])

    def _views(self) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
        """The (shape, strides, offset) views a strided op reads its leading operands through."""
        a, shape = self.node.attr_map, self.node.shape
        if self.node.op == "strided_elementwise":
            return [(shape, *view) for view in operand_views(shape, a["strides"], a["offsets"])]
        if self.node.op == "strided_normalization":
            return [(shape, *view) for view in prologue_views(self.node.args, a["has_weight"], a["has_bias"],
                                                              a["post"], shape, a["strides"], a["offsets"])]
        if self.node.op == "strided_attention":
            return attention_views(a["shapes"], a["strides"], a["offsets"])
        if base_op(self.node.op):
            views = dict(zip(viewed_operands(self.node.op), attention_views(a["shapes"], a["strides"], a["offsets"])))
            args = self.node.args      # the operands before a view read whole
            return [views.get(i, (args[i].shape, contiguous_strides(args[i].shape), 0)) for i in range(max(views) + 1)]
        return []


@dataclass(frozen=True)
class KernelPlan:
    name: str
    graph: Graph
    buffers: tuple[Buffer, ...]
    inputs: tuple[tuple[str, ValueRef], ...]        # graph input name -> its buffer
    constants: tuple[tuple[Node, ValueRef], ...]    # constant / literal node -> its buffer
    steps: tuple[Step, ...]
    outputs: tuple[ValueRef, ...]                   # in OUTPUT buffers; disjoint views may share one

    def __hash__(self) -> int:
        # Equal plans share their graph (a Graph is equal only to itself), so the graph's identity
        # and the name hash consistently with the generated __eq__, without walking every step:
        # a warm call looks its plan up on the device by this.
        return hash((self.name, self.graph))

    def buffers_of(self, role: BufferRole) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.role is role)

    @property
    def temp_bytes(self) -> int:
        """Device memory the plan needs besides its inputs and outputs."""
        return sum(b.nbytes for b in self.buffers if b.role in (BufferRole.TEMP, BufferRole.CONSTANT))

    def __str__(self) -> str:
        lines = [f"plan {self.name}: {len(self.steps)} kernel(s), {len(self.buffers)} buffer(s), "
                 f"{self.temp_bytes} bytes of temporaries"]
        width = len(f"b{len(self.buffers) - 1}")
        lines += [f"  {f'b{b.id}':{width}s} {b.role.value:8s} {b.name:10s} {b.nbytes} bytes" for b in self.buffers]
        for i, step in enumerate(self.steps):
            args = ", ".join(step.operand_text(j) for j in range(len(step.inputs)))
            lines.append(f"  {i}: {step.output} = {step.op}({args})")
        lines.append(f"  return {', '.join(map(str, self.outputs))}")
        return "\n".join(lines)
