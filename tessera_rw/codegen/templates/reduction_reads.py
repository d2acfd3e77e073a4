"""What a reduction kernel reads: one tensor (sum, mean, max, min), or the operands of the
elementwise expression a fused_reduction computes as it reads them, each walked over the
reduction's coalesced groups of kept and reduced axes with strides of its own (0 where it is
broadcast: a layer norm's per-row statistics, a weight shared by the rows).

>>> from tessera_rw.algebra.dtypes import DType
>>> x, stats = TensorType((8, 64), DType.bfloat16), TensorType((8, 1), DType.float32)
>>> op = KernelOp.of("fused_reduction", (x, stats), TensorType((8, 1), DType.float32), expr="mul($0,$1)",
...                  reduce="sum", axes=(1,), keepdims=True)
>>> [(r.kept_strides, r.red_strides) for r in operand_reads(op)]
[((64,), (1,)), ((1,), (0,))]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.cuda_scalar import broadcast_strides, contiguous_strides


@dataclass(frozen=True)
class Layout:
    """The values reduced, seen as coalesced kept and reduced groups, with their strides."""
    kept: tuple[int, ...]
    kept_strides: tuple[int, ...]
    red: tuple[int, ...]
    red_strides: tuple[int, ...]
    row: bool             # the innermost group is reduced

    @property
    def n_out(self) -> int:
        return math.prod(self.kept)

    @property
    def n_red(self) -> int:
        return math.prod(self.red)


def _groups(shape: tuple[int, ...], axes: tuple[int, ...]) -> list[tuple[list[int], bool]]:
    """Adjacent axes (size 1 skipped) that are all reduced or all kept: (their axes, reduced)."""
    groups: list[tuple[list[int], bool]] = []
    for axis, size in enumerate(shape):
        if size == 1:
            continue
        if groups and groups[-1][1] == (axis in axes):
            groups[-1][0].append(axis)
        else:
            groups.append(([axis], axis in axes))
    return groups


def _split(groups, strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kept strides, reduced strides) of `groups` with the given group strides; a reduction
    without kept (or reduced) groups walks a single group of one element."""
    kept = tuple(st for (_, red), st in zip(groups, strides) if not red) or (0,)
    red = tuple(st for (_, red), st in zip(groups, strides) if red) or (0,)
    return kept, red


def layout(x: TensorType, axes: tuple[int, ...]) -> Layout:
    groups = _groups(x.shape, axes)
    sizes = tuple(math.prod(x.shape[a] for a in g) for g, _ in groups)
    kept_strides, red_strides = _split(groups, contiguous_strides(sizes))
    kept = tuple(n for (_, red), n in zip(groups, sizes) if not red) or (1,)
    red = tuple(n for (_, red), n in zip(groups, sizes) if red) or (1,)
    return Layout(kept, kept_strides, red, red_strides, not groups or groups[-1][1])


@dataclass(frozen=True)
class Read:
    """One tensor the kernel reads, its strides over the layout's kept and reduced groups."""
    dtype: DType
    kept_strides: tuple[int, ...]
    red_strides: tuple[int, ...]

    def vector(self, row: bool) -> bool:
        """Whether it is read a vector at a time along the walk's innermost group (else it is
        broadcast there, one value for the vector)."""
        return (self.red_strides if row else self.kept_strides)[-1] != 0


def values_type(op: KernelOp) -> TensorType:
    """The values reduced: the operand, or the fused expression's result."""
    if op.op == "fused_reduction":
        return OPS["fused_elementwise"].infer(*op.operands, expr=op.attr_map["expr"])
    return op.operands[0]


def operand_reads(op: KernelOp) -> tuple[Read, ...] | None:
    """Each operand's walk, or None when one cannot be walked with a stride per group (it is
    broadcast along some axes of a group but not all)."""
    values = values_type(op)
    groups = _groups(values.shape, tuple(op.attr_map["axes"]))
    found = []
    for t in op.operands:
        per_axis = broadcast_strides(values.shape, t.shape)
        strides = []
        for axes_of_group, _ in groups:
            inner = per_axis[axes_of_group[-1]]
            expected = [inner * math.prod(values.shape[b] for b in axes_of_group[i + 1:])
                        for i in range(len(axes_of_group))]
            if [per_axis[a] for a in axes_of_group] != expected:
                return None
            strides.append(inner)
        found.append(Read(t.dtype, *_split(groups, tuple(strides))))
    return tuple(found)
