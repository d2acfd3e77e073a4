"""Several elementwise results, or reductions, of one shape computed in one pass over what they read.

multi_elementwise(xs…; exprs) holds k results of one shape S and dtype, stacked as (k, *S): result
m is fused(xs…; exprs.split(";")[m]). An optimizer's step writes the parameter and its two moments
from the parameter, the gradient and the old moments, each read once, where three kernels read
the gradient three times and the new moments back (lower/output_groups.py builds it; each result
is a view of its block).

multi_reduction(xs…; exprs, reduce, axes, keepdims, width) likewise holds k reductions of
expressions of one values type over the same axes, as the rows of a (k, width) result: row m holds
reduction m's values flattened, then zeros up to `width` (aligned_row: whole BLOCK_ALIGNMENTs, so
each result is a view of its row, a loss's total and count included). A batch norm's backward sums dy and dy·x̂
per channel from one read of x (lower/reduction_groups.py builds it).

>>> x = np.array([1.0, 2.0], np.float32)
>>> _multi(x, x, exprs="add($0,$1);mul($0,$1)")
array([[2., 4.],
       [1., 4.]], dtype=float32)
>>> _multi_reduction(x, exprs="$0;mul($0,$0)", reduce="sum", axes=(0,), keepdims=False, width=4)
array([[3., 0., 0., 0.],
       [5., 0., 0., 0.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.fused_expr import fused, fused_flops, infer_fused
from tessera_rw.algebra.ops.fused_reduction import fused_reduction_flops, infer_fused_reduction, reduce_fused
from tessera_rw.algebra.shapes import fmt_shape


def results_of(*xs: TensorType, exprs: str, op: str = "multi_elementwise") -> TensorType:
    """The type each result (of `op`: the values each reduces) has: one for all of them."""
    types = {infer_fused(*xs, expr=e) for e in exprs.split(";")}
    if len(types) != 1:
        raise ShapeError(f"the expressions of a {op} compute " + ", ".join(
            f"{t.dtype.value}{fmt_shape(t.shape)}" for t in sorted(types, key=str)) + ": they need one shape and dtype")
    return types.pop()


def _infer_multi(*xs: TensorType, exprs: str) -> TensorType:
    each = results_of(*xs, exprs=exprs)
    return TensorType((len(exprs.split(";")),) + each.shape, each.dtype)


def _multi(*xs: np.ndarray, exprs: str) -> np.ndarray:
    values = [fused(*xs, expr=e) for e in exprs.split(";")]
    shape = np.broadcast_shapes(*(np.shape(v) for v in values))
    return np.stack([np.broadcast_to(v, shape) for v in values])


def _multi_flops(out: TensorType, *xs: TensorType, exprs: str) -> int:
    each = TensorType(out.shape[1:], out.dtype)
    return sum(fused_flops(each, *xs, expr=e) for e in exprs.split(";"))


BLOCK_ALIGNMENT = 16      # bytes each row of a multi_reduction's result spans a multiple of


def reduced_each(*xs: TensorType, exprs: str, reduce: str, axes: tuple[int, ...], keepdims: bool) -> TensorType:
    """The type of each of a multi_reduction's reductions: one for all of them."""
    results_of(*xs, exprs=exprs, op="multi_reduction")       # one values type for all of them
    (one,) = {infer_fused_reduction(*xs, expr=e, reduce=reduce, axes=axes, keepdims=keepdims) for e in exprs.split(";")}
    return one


def _infer_multi_reduction(*xs: TensorType, exprs: str, reduce: str, axes: tuple[int, ...], keepdims: bool,
                           width: int) -> TensorType:
    each = reduced_each(*xs, exprs=exprs, reduce=reduce, axes=axes, keepdims=keepdims)
    if width < max(each.numel, 1):
        raise ShapeError(f"a multi_reduction's rows of width {width} cannot hold {each.numel} values each",
                         hint="pass width=aligned_row(values, itemsize)")
    return TensorType((len(exprs.split(";")), width), each.dtype)


def aligned_row(values: int, itemsize: int) -> int:
    """The elements of a row holding `values` of `itemsize` bytes and spanning whole BLOCK_ALIGNMENTs."""
    per_block = max(1, BLOCK_ALIGNMENT // itemsize)
    return -(-max(values, 1) // per_block) * per_block


def multi_reduction_attrs(*xs: TensorType, exprs: str, reduce: str, axes: tuple[int, ...], keepdims: bool) -> dict:
    """A multi_reduction's attributes, its rows as wide as an aligned row of one reduction's values."""
    each = reduced_each(*xs, exprs=exprs, reduce=reduce, axes=axes, keepdims=keepdims)
    return dict(exprs=exprs, reduce=reduce, axes=axes, keepdims=keepdims,
                width=aligned_row(each.numel, each.dtype.itemsize))


def _multi_reduction(*xs: np.ndarray, exprs: str, reduce: str, axes, keepdims, width: int) -> np.ndarray:
    return padded_rows([reduce_fused(*xs, expr=e, reduce=reduce, axes=axes, keepdims=keepdims)
                        for e in exprs.split(";")], width)


def padded_rows(results, width: int) -> np.ndarray:
    """A multi_reduction's result from its reductions' values: each flattened into its row, zeros
    after it."""
    rows = [np.ravel(r) for r in results]
    padded = np.zeros((len(rows), width), rows[0].dtype)
    for m, row in enumerate(rows):
        padded[m, :row.size] = row
    return padded


def _multi_reduction_flops(out: TensorType, *xs: TensorType, exprs: str, reduce: str, axes, keepdims,
                           width: int) -> int:
    each = reduced_each(*xs, exprs=exprs, reduce=reduce, axes=axes, keepdims=keepdims)
    return sum(fused_reduction_flops(each, *xs, expr=e, reduce=reduce, axes=axes, keepdims=keepdims)
               for e in exprs.split(";"))


DEFS = (
    OpDef("multi_elementwise", ("xs",), OpKind.ELEMENTWISE, _infer_multi, _multi, _multi_flops, variadic=True,
          vjp=before_fusion("multi_elementwise"),
          doc="k elementwise results of one shape in one pass, stacked: exprs='add($0,$1);mul($0,$2)'"),
    OpDef("multi_reduction", ("xs",), OpKind.REDUCTION, _infer_multi_reduction, _multi_reduction,
          _multi_reduction_flops, variadic=True, vjp=before_fusion("multi_reduction"),
          doc="k reductions of expressions of one values type over the same axes in one pass, stacked: "
              "exprs='$0;mul($0,$1)', reduce='sum', axes=(0, 2, 3), width=64 (each row, padded to 16 bytes)"),
)
