"""What one kernel computes: an op (plain or fused), its operand and result types, its attributes.

Templates, the cost model and lowering all speak of kernels as KernelOps; a graph node and an
e-node of the saturated e-graph both become one without being decoded into a program first.

>>> from tessera_rw.algebra.dtypes import DType
>>> t = TensorType((64, 64), DType.bfloat16)
>>> KernelOp("matmul", (t, t), (("accum_dtype", None),), t).flops
524288
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

from tessera_rw.algebra.node import Node, TensorType
from tessera_rw.algebra.ops import OPS


@dataclass(frozen=True)
class KernelOp:
    op: str
    operands: tuple[TensorType, ...]
    attrs: tuple[tuple[str, Any], ...]
    result: TensorType

    @classmethod
    def of(cls, op: str, operands: tuple[TensorType, ...], result: TensorType, **attrs: Any) -> KernelOp:
        return cls(op, tuple(operands), tuple(sorted(attrs.items())), result)

    @classmethod
    def from_node(cls, node: Node) -> KernelOp:
        return cls(node.op, tuple(a.type for a in node.args), tuple(node.attrs), node.type)

    @cached_property
    def attr_map(self) -> Mapping[str, Any]:
        return dict(self.attrs)

    @cached_property
    def flops(self) -> int:
        """The op's own FLOP count (a multiply-add is 2), as its declaration gives it."""
        return OPS[self.op].flops(self.result, *self.operands, **self.attr_map)

    @property
    def operand_bytes(self) -> int:
        return sum(t.nbytes for t in self.operands)

    def __str__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs if v not in (None, False))
        operands = ", ".join(map(str, self.operands))
        return f"{self.op}({operands}{', ' if attrs else ''}{attrs}) -> {self.result}"
