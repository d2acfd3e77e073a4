"""A reduction of an elementwise expression, the expression computed as it is read:
fused_reduction(xs; expr, reduce, axes, keepdims) writes nothing the size of the expression.
`reduce` is sum, mean, max, min, or logsumexp (whose kernel is a row kernel's online softmax
statistics: rowwise_logsumexp.py)."""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.fused_expr import fused, fused_flops, infer_fused

REDUCES = ("sum", "mean", "max", "min", "logsumexp")


def _reduce_op(reduce: str):
    from tessera_rw.algebra.ops import OPS
    if reduce not in REDUCES:
        raise AttributeValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
    return OPS[reduce]


def infer_fused_reduction(*xs: TensorType, expr: str, reduce: str, axes: tuple[int, ...],
                           keepdims: bool) -> TensorType:
    return _reduce_op(reduce).infer(infer_fused(*xs, expr=expr), axes, keepdims)


def reduce_fused(*xs: np.ndarray, expr: str, reduce: str, axes, keepdims) -> np.ndarray:
    return _reduce_op(reduce).reference(fused(*xs, expr=expr), axes, keepdims)


def fused_reduction_flops(out: TensorType, *xs: TensorType, expr: str, reduce: str, axes, keepdims) -> int:
    values = infer_fused(*xs, expr=expr)
    return fused_flops(values, *xs, expr=expr) + values.numel


DEFS = (
    OpDef("fused_reduction", ("xs",), OpKind.REDUCTION, infer_fused_reduction, reduce_fused,
          fused_reduction_flops, variadic=True,
          doc="sum / mean / max / min / logsumexp of an elementwise expression, computed as it is read (nothing the "
              "size of the expression written), e.g. expr='mul($0,$1)', reduce='sum', axes=(1,)",
          vjp=before_fusion("fused_reduction")),
)

