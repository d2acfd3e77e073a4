"""Several elementwise results of one shape computed in one pass over what they read.

multi_elementwise(xs…; exprs) holds k results of one shape S and dtype, stacked as (k, *S): result
m is fused(xs…; exprs.split(";")[m]). An optimizer's step writes the parameter and its two moments
from the parameter, the gradient and the old moments, each read once, where three kernels read
the gradient three times and the new moments back (lower/output_groups.py builds it; each result
is a view of its block).

>>> x = np.array([1.0, 2.0], np.float32)
>>> _multi(x, x, exprs="add($0,$1);mul($0,$1)")
array([[2., 4.],
       [1., 4.]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.fused_expr import fused, fused_flops, infer_fused
from tessera_rw.algebra.shapes import fmt_shape


def results_of(*xs: TensorType, exprs: str) -> TensorType:
    """The type each result has: one for all of them."""
    types = {infer_fused(*xs, expr=e) for e in exprs.split(";")}
    if len(types) != 1:
        raise ShapeError("the expressions of a multi_elementwise compute " + ", ".join(
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


DEFS = (
    OpDef("multi_elementwise", ("xs",), OpKind.ELEMENTWISE, _infer_multi, _multi, _multi_flops, variadic=True,
          vjp=before_fusion("multi_elementwise"),
          doc="k elementwise results of one shape in one pass, stacked: exprs='add($0,$1);mul($0,$2)'"),
)
