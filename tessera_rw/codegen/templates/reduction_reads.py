"""What a reduction kernel reads: one tensor (sum, mean, max, min), or the operands of the
elementwise expression a fused_reduction computes as it reads them, each walked over the
reduction's coalesced groups of kept and reduced axes with strides of its own (0 where it is
broadcast: a layer norm's per-row statistics, a weight shared by the rows). Adjacent axes merge
into one group only where every operand walks them as one.

>>> from tessera_rw.algebra.dtypes import DType
>>> x, stats = TensorType((8, 64), DType.bfloat16), TensorType((8, 1), DType.float32)
>>> op = KernelOp.of("fused_reduction", (x, stats), TensorType((8, 1), DType.float32), expr="mul($0,$1)",
...                  reduce="sum", axes=(1,), keepdims=True)
>>> [(r.kept_strides, r.red_strides) for r in operand_reads(op)]
[((64,), (1,)), ((1,), (0,))]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


def _groups(shape: tuple[int, ...], axes: tuple[int, ...],
            walks: Sequence[tuple[int, ...]] = ()) -> list[tuple[list[int], bool]]:
    """Adjacent axes (size 1 skipped) that are all reduced or all kept and that every operand walks
    as one (`walks`: each operand's per-axis strides, 0 where it is broadcast): (their axes, reduced).
    An operand broadcast along some axes of a run but not others splits it."""
    groups: list[tuple[list[int], bool]] = []
    for axis, size in enumerate(shape):
        if size == 1:
            continue
        if groups and groups[-1][1] == (axis in axes) and \
                all(walk[groups[-1][0][-1]] == walk[axis] * size for walk in walks):
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


def layout(x: TensorType, axes: tuple[int, ...], walks: Sequence[tuple[int, ...]] = ()) -> Layout:
    """The values `x` as the reduction over `axes` walks them; `walks` as in _groups."""
    groups = _groups(x.shape, axes, walks)
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


def expressions(op: KernelOp) -> list[str]:
    """The expressions a reduction computes as it reads its operands: a fused_reduction's one, a
    multi_reduction's each (one values type for all), none for a plain reduction."""
    if op.op == "fused_reduction":
        return [op.attr_map["expr"]]
    return op.attr_map["exprs"].split(";") if op.op == "multi_reduction" else []


def values_type(op: KernelOp) -> TensorType:
    """The values reduced: the operand, or the fused expression's result."""
    if exprs := expressions(op):
        return OPS["fused_elementwise"].infer(*op.operands, expr=exprs[0])
    return op.operands[0]


def operand_walks(op: KernelOp) -> list[tuple[int, ...]]:
    """Each operand's per-axis strides over the values (0 where it is broadcast); none for a plain
    reduction, which reads the values themselves."""
    if not expressions(op):
        return []
    values = values_type(op)
    return [broadcast_strides(values.shape, t.shape) for t in op.operands]


def reduction_layout(op: KernelOp) -> Layout:
    """The layout the kernel of `op` walks: its groups split wherever an operand's broadcast needs."""
    return layout(values_type(op), tuple(op.attr_map["axes"]), operand_walks(op))


def operand_reads(op: KernelOp) -> tuple[Read, ...]:
    """Each operand's walk: its stride in each group of reduction_layout (that of the group's
    innermost axis: the groups are split so that each operand walks each of them as one)."""
    values = values_type(op)
    walks = operand_walks(op)
    groups = _groups(values.shape, tuple(op.attr_map["axes"]), walks)
    return tuple(Read(t.dtype, *_split(groups, tuple(walk[g[-1]] for g, _ in groups)))
                 for t, walk in zip(op.operands, walks))
