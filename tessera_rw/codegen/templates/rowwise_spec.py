"""What a row-wise kernel computes, whichever op it is: prologue -> norm -> affine -> epilogue.

softmax / log_softmax normalize one axis; layernorm / rmsnorm their trailing axes with a weight and
bias; fused_normalization adds an elementwise prologue and epilogue (strided_normalization reads its
prologue inputs as views, reduced_normalization adds its rows up); a logsumexp (of a tensor, or of
an expression: fused_reduction) is a log_softmax's statistics alone; norm_backward reads x and its
cotangent g as the rows, the weight scaling g, a residual added as it writes (rowwise.py,
rowwise_logsumexp.py and norm_backward.py emit them).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.fused_expr import expr_leaves, parse_expr
from tessera_rw.algebra.ops.fused_norm import prologue_views
from tessera_rw.algebra.ops.norm_backward import NORM_BACKWARD_OPS
from tessera_rw.algebra.ops.reduced_norm import rows_of
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.cuda_scalar import broadcast_strides


# a logsumexp over the trailing axes, of a tensor or of an elementwise expression (reduce='logsumexp')
LOGSUMEXP_OPS = ("logsumexp", "fused_reduction")


@dataclass(frozen=True)
class RowSpec:
    """What any of the ops computes, as one shape: prologue -> norm -> affine -> epilogue."""
    norm: str
    prologue: tuple[TensorType, ...]
    expr: object
    weight: TensorType | None
    bias: TensorType | None
    epilogue: tuple[TensorType, ...]
    post: object
    eps: float
    k: int                      # trailing axes normalized


def row_spec(op: KernelOp) -> RowSpec:
    a, xs = op.attr_map, op.operands
    if op.op in ("softmax", "log_softmax"):
        return RowSpec(op.op, xs, 0, None, None, (), 0, 0.0, 1 if a["axis"] == xs[0].ndim - 1 else 0)
    if op.op in NORM_BACKWARD_OPS:     # x and g are the rows read; the weight scales g
        w = xs[2] if a["has_weight"] else None
        return RowSpec(a["norm"], xs[:2], 0, w, None, xs[2 + a["has_weight"]:], 0, float(a["eps"]), len(a["axes"]))
    if op.op in LOGSUMEXP_OPS:          # the rows' online softmax statistics, nothing normalized
        rows, axes = rows_of(op.op, xs, a, op.result), tuple(a["axes"])
        expr = parse_expr(a["expr"]) if op.op == "fused_reduction" else 0
        trailing = bool(axes) and axes == tuple(range(rows.ndim - len(axes), rows.ndim))
        return RowSpec("log_softmax", xs, expr, None, None, (), 0, 0.0, len(axes) if trailing else 0)
    if op.op in ("layernorm", "rmsnorm"):
        params = iter(xs[1:])
        w = next(params) if a["has_weight"] else None
        b = next(params) if a["has_bias"] else None
        return RowSpec(op.op, xs[:1], 0, w, b, (), 0, float(a["eps"]), len(a["axes"]))
    post = parse_expr(a["post"])
    after = max(expr_leaves(post))
    n_params = a["has_weight"] + a["has_bias"]
    before = len(xs) - n_params - after
    params = iter(xs[before:before + n_params])
    w = next(params) if a["has_weight"] else None
    b = next(params) if a["has_bias"] else None
    axes = tuple(a["axes"])
    rows = rows_of(op.op, xs, a, op.result)
    trailing = axes == tuple(range(rows.ndim - len(axes), rows.ndim))
    prologue = xs[:before]
    if op.op == "strided_normalization":        # the rows are views of the operands, of the result's shape
        prologue = tuple(TensorType(rows.shape, t.dtype) for t in prologue)
    return RowSpec(a["norm"], prologue, parse_expr(a["expr"]), w, b, xs[before + n_params:], post,
                   float(a.get("eps", 0.0)), len(axes) if trailing else 0)


def row_views(op: KernelOp, out: tuple[int, ...]) -> list[tuple[tuple[int, ...], int]]:
    """Per operand: its strides in the rows' shape `out` and its offset (a strided_normalization's
    prologue inputs as their views, every other operand broadcast)."""
    found = [(broadcast_strides(out, t.shape), 0) for t in op.operands]
    if op.op == "strided_normalization":
        a = op.attr_map
        views = prologue_views(op.operands, a["has_weight"], a["has_bias"], a["post"], out, a["strides"], a["offsets"])
        found[:len(views)] = views
    return found
