"""A row-wise normalization whose rows are summed as they are written: a loss over a softmax.

reduced_normalization(xs…; expr, norm, axes, eps, has_weight, has_bias, post, reduce, keepdims) is
reduce(fused_normalization(xs…; expr, norm, axes, eps, has_weight, has_bias, post), axes, keepdims)
with `reduce` "sum" or "mean" over the normalized axes themselves: each row is normalized, its
epilogue applied, and the values added up where they are, so nothing the size of the rows is written
and read back. A cross-entropy, -mean(sum(log_softmax(logits) * labels, -1)), reads the logits and
the labels once.

>>> import numpy as np
>>> x = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]], dtype=np.float32)
>>> y = np.eye(3, dtype=np.float32)[[2, 0]]
>>> nll = _reduced_norm(x, y, expr="$0", norm="log_softmax", axes=(1,), eps=0.0, has_weight=False,
...                     has_bias=False, post="neg(mul($0,$1))", reduce="sum", keepdims=False)
>>> np.round(nll, 4)
array([0.4076, 1.0986], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.fused_expr import infer_fused
from tessera_rw.algebra.ops.fused_norm import fused_norm_flops, fused_norm_reference, infer_fused_norm

ROW_REDUCES = ("sum", "mean")
REDUCTION_OPS = ("sum", "mean", "max", "min", "logsumexp")


def _reduce_op(reduce: str):
    from tessera_rw.algebra.ops import OPS
    if reduce not in ROW_REDUCES:
        raise AttributeValueError(f"reduce must be one of {ROW_REDUCES} (a row's values added up), got {reduce!r}")
    return OPS[reduce]


def normalized_rows(*xs: TensorType, expr: str, norm: str, axes: tuple[int, ...], eps: float, has_weight: bool,
                    has_bias: bool, post: str, reduce: str, keepdims: bool) -> TensorType:
    """The rows a reduced_normalization normalizes and adds up: its fused_normalization's result."""
    return infer_fused_norm(*xs, expr=expr, norm=norm, axes=axes, eps=eps, has_weight=has_weight, has_bias=has_bias,
                            post=post)


def rows_of(op: str, operands: tuple[TensorType, ...], attrs, result: TensorType) -> TensorType:
    """The rows a row-wise op's epilogue computes over: a reduced_normalization's normalized rows
    (its result holds them added up), the values a reduction reduces, any other op's result."""
    if op == "reduced_normalization":
        return normalized_rows(*operands, **attrs)
    if op == "fused_reduction":
        return infer_fused(*operands, expr=attrs["expr"])
    return operands[0] if op in REDUCTION_OPS else result


def _infer_reduced_norm(*xs: TensorType, expr: str, norm: str, axes: tuple[int, ...], eps: float, has_weight: bool,
                        has_bias: bool, post: str, reduce: str, keepdims: bool) -> TensorType:
    rows = infer_fused_norm(*xs, expr=expr, norm=norm, axes=axes, eps=eps, has_weight=has_weight,
                            has_bias=has_bias, post=post)
    return _reduce_op(reduce).infer(rows, tuple(axes), keepdims)


def _reduced_norm(*xs: np.ndarray, reduce: str, keepdims: bool, **attrs) -> np.ndarray:
    rows = fused_norm_reference(*xs, **attrs)
    return _reduce_op(reduce).reference(rows, tuple(attrs["axes"]), keepdims)


def _reduced_norm_flops(out: TensorType, *xs: TensorType, reduce: str, keepdims: bool, **attrs) -> int:
    rows = infer_fused_norm(*xs, **attrs)
    return fused_norm_flops(rows, *xs, **attrs) + rows.numel


DEFS = (
    OpDef("reduced_normalization", ("xs",), OpKind.NORMALIZATION, _infer_reduced_norm, _reduced_norm,
          _reduced_norm_flops, variadic=True, vjp=before_fusion("reduced_normalization"),
          doc="a fused_normalization whose rows are summed (reduce='sum') or averaged ('mean') over the "
              "normalized axes as they are written: a cross-entropy's log_softmax, labels and row sums in one pass"),
)
