"""The attention backward's ops over strided views: what lowering makes of flash_attention_lse,
flash_attention_bwd and attention_row_stats_from_lse when q, k, v or dO are copies of views
(lower/attention_views.py), never written by users or rules.

A training step's q, k and v are cut from one projection and read by the forward with logsumexp
and by the backward; dO arrives with the heads side by side and is read by the row statistics
and the backward. Each strided form is its base op over views (shape, strides, offset) of the
storage of the operands its kernels read row by row (VIEWED_OPERANDS), `shapes` and `strides` flat
per view, every view of one rank; the other operands and the result are as the base op's.

>>> x = np.arange(8.0).reshape(2, 4)                # dO's rows, every other pair of x's values
>>> fwd = np.concatenate([np.ones(4), np.zeros(2), np.zeros(2)])
>>> from tessera_rw.algebra.ops import OPS
>>> OPS["strided_attention_row_stats_from_lse"].reference(
...     fwd, x, shapes=(2, 2), strides=(4, 1), offsets=(0,)).tolist()
[[0.0, 1.0], [0.0, 9.0]]
"""

from __future__ import annotations

import inspect

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef
from tessera_rw.algebra.ops import attention_backward
from tessera_rw.algebra.ops.strided import check_view, view_of
from tessera_rw.algebra.ops.strided_attention import attention_views

# base op -> (its strided form, the operands that form reads through views)
VIEWED_OPERANDS: dict[str, tuple[str, tuple[int, ...]]] = {
    "flash_attention_lse": ("strided_attention_lse", (0, 1, 2)),
    "flash_attention_bwd": ("strided_attention_bwd", (0, 1, 2, 3)),
    "attention_row_stats_from_lse": ("strided_attention_row_stats_from_lse", (1,)),
}
VIEW_ATTRS = ("shapes", "strides", "offsets")


def base_op(name: str) -> str | None:
    """The op a strided form computes over its views (None for any other op)."""
    return next((base for base, (form, _) in VIEWED_OPERANDS.items() if form == name), None)


def viewed_operands(name: str) -> tuple[int, ...]:
    """Which operands the strided form `name` reads through its views."""
    return VIEWED_OPERANDS[base_op(name)][1]


def with_views(name: str, xs: tuple, views: list) -> tuple:
    """`xs` with the viewed operands of the strided form `name` replaced by `views`."""
    out, replaced = list(xs), dict(zip(viewed_operands(name), views))
    return tuple(replaced.get(i, x) for i, x in enumerate(out))


def viewed_types(name: str, xs: tuple[TensorType, ...], shapes, strides, offsets) -> tuple[TensorType, ...]:
    """The operand types the strided form `name` computes on: its views' where it reads views."""
    views = attention_views(tuple(shapes), tuple(strides), tuple(offsets))
    indices = viewed_operands(name)
    return with_views(name, xs, [TensorType(shape, xs[i].dtype) for i, (shape, _, _) in zip(indices, views)])


def viewed_arrays(name: str, xs: tuple[np.ndarray, ...], shapes, strides, offsets) -> tuple[np.ndarray, ...]:
    """The arrays the strided form `name` computes on: views of its viewed operands' storage."""
    views = attention_views(tuple(shapes), tuple(strides), tuple(offsets))
    return with_views(name, xs, [view_of(xs[i], *view) for i, view in zip(viewed_operands(name), views)])


def _strided_form(base: OpDef, name: str, viewed: tuple[int, ...]) -> OpDef:
    """`base` over views of its operands `viewed`: the same attributes, then shapes, strides, offsets."""

    def infer(*xs: TensorType, shapes, strides, offsets, **attrs) -> TensorType:
        if len(xs) <= max(viewed) or len(offsets) != len(viewed) or len(shapes) != len(strides) \
                or len(shapes) % len(viewed):
            raise ShapeError(f"{name} reads {len(viewed)} views (a shape, strides and an offset each, of one rank): "
                             f"{len(xs)} operands, {len(shapes)} view dims, {len(strides)} strides and "
                             f"{len(offsets)} offsets")
        for i, view in zip(viewed, attention_views(tuple(shapes), tuple(strides), tuple(offsets))):
            check_view(xs[i], *view)
        return base.infer(*viewed_types(name, xs, shapes, strides, offsets), **attrs)

    def reference(*xs: np.ndarray, shapes, strides, offsets, **attrs) -> np.ndarray:
        return base.reference(*viewed_arrays(name, xs, shapes, strides, offsets), **attrs)

    def flops(out: TensorType, *xs: TensorType, shapes, strides, offsets, **attrs) -> int:
        return base.flops(out, *viewed_types(name, xs, shapes, strides, offsets), **attrs)

    # the attribute names OpDef reads off the shape rule's signature: the base op's, then the views'
    kw = inspect.Parameter.KEYWORD_ONLY
    infer.__signature__ = inspect.Signature(
        [inspect.Parameter("xs", inspect.Parameter.VAR_POSITIONAL)]
        + [inspect.Parameter(a, kw, default=base.attr_defaults.get(a, inspect.Parameter.empty))
           for a in base.attr_names] + [inspect.Parameter(a, kw) for a in VIEW_ATTRS])
    return OpDef(name, ("xs",), base.kind, infer, reference, flops, variadic=True, vjp=before_fusion(name),
                 doc=f"{base.name} reading operands {', '.join(base.operands[i] for i in viewed)} through strided "
                     "views (shapes and strides flat per view, offsets): the backward reading a fused projection "
                     "in place, as lowering folds it")


_BASES = {d.name: d for d in attention_backward.DEFS}
DEFS = tuple(_strided_form(_BASES[base], form, viewed) for base, (form, viewed) in VIEWED_OPERANDS.items())
