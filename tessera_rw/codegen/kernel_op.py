"""What one kernel computes: an op (plain or fused), its operand and result types, its attributes
and the numerics policy it runs under.

Templates, the cost model and lowering all speak of kernels as KernelOps; a graph node and an
e-node of the saturated e-graph both become one without being decoded into a program first. The
policy is part of what a kernel computes (a tf32 product is not an fp32 one), so anything keyed by
KernelOp, compiled binaries and costs alike, keeps policies apart.

>>> from tessera_rw.algebra.dtypes import DType
>>> t = TensorType((64, 64), DType.bfloat16)
>>> KernelOp("matmul", (t, t), (("accum_dtype", None),), t).flops
524288
>>> str(KernelOp.of("matmul", (t, t), t, accum_dtype=None, numerics="fast")).endswith("[numerics=fast]")
True
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import Node, TensorType
from tessera_rw.algebra.ops import opdef
from tessera_rw.codegen.numerics import Numerics


@dataclass(frozen=True)
class KernelOp:
    op: str
    operands: tuple[TensorType, ...]
    attrs: tuple[tuple[str, Any], ...]
    result: TensorType
    numerics: Numerics = Numerics.DETERMINISTIC

    def __post_init__(self) -> None:
        if not isinstance(self.numerics, Numerics):   # a policy name: stored as the enum, so equal ops hash alike
            object.__setattr__(self, "numerics", Numerics.parse(self.numerics))

    @classmethod
    def of(cls, op: str, operands: tuple[TensorType, ...], result: TensorType, *,
           numerics: Numerics | str = Numerics.DETERMINISTIC, **attrs: Any) -> KernelOp:
        declared = _declared_defaults(op)
        return cls(op, tuple(operands), tuple(sorted((declared | attrs).items())), result, Numerics.parse(numerics))

    @classmethod
    def from_node(cls, node: Node, numerics: Numerics | str = Numerics.DETERMINISTIC) -> KernelOp:
        return cls(node.op, tuple(a.type for a in node.args), tuple(node.attrs), node.type, Numerics.parse(numerics))

    @cached_property
    def attr_map(self) -> Mapping[str, Any]:
        return dict(self.attrs)

    @cached_property
    def flops(self) -> int:
        """The op's own FLOP count (a multiply-add is 2), as its declaration gives it."""
        return opdef(self.op).flops(self.result, *self.operands, **self.attr_map)

    @property
    def operand_bytes(self) -> int:
        return sum(t.nbytes for t in self.operands)

    def __str__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs if v not in (None, False))
        operands = ", ".join(map(str, self.operands))
        policy = "" if self.numerics is Numerics.DEFAULT else f" [numerics={self.numerics.value}]"
        return f"{self.op}({operands}{', ' if attrs else ''}{attrs}) -> {self.result}{policy}"


def _declared_defaults(op: str) -> dict[str, Any]:
    """The attribute defaults `op` declares (a plugin's op declared on its first lookup); none for a
    name no op has."""
    try:
        return opdef(op).attr_defaults
    except TesseraError:
        return {}
