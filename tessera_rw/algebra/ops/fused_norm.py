"""A row-wise normalization with its elementwise neighbours, one pass per row.

fused_normalization(prologue inputs…, weight?, bias?, epilogue inputs…; expr, norm, post):
post(norm(expr(prologue inputs), weight, bias), epilogue inputs), where in `post` $0 is the
normalized row and $1… the epilogue inputs. post="$0" is no epilogue.

strided_normalization is the same with its prologue inputs read as strided views of their storage
(shape: the result's; strides flat per prologue input, in the result's rank; offsets), as lowering
reads a normalized slice in place (lower/view_reads.py).
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import AttributeValueError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.fused_expr import expr_leaves, fused, fused_flops, infer_fused, parse_expr

NORMALIZATIONS = ("softmax", "log_softmax", "layernorm", "rmsnorm")
NO_EPILOGUE = "$0"


def lifts_nothing(op: str, attrs) -> bool:
    """Whether a node of `op` with `attrs` (a mapping or (name, value) pairs) is a normalization
    lifted to fused_normalization with nothing fused (prologue and epilogue `$0`): the epilogue
    rules lift a plain norm so ops after it can join it, and where none did, the plain op in the
    same e-class is the same kernel."""
    if op != "fused_normalization":
        return False
    attrs = dict(attrs)
    return attrs.get("expr") == NO_EPILOGUE and attrs.get("post") == NO_EPILOGUE


def prologue_inputs(operands: int, has_weight: bool, has_bias: bool, post: str) -> int:
    """How many of a fused_normalization's operands are its rows' inputs (the rest: weight, bias,
    then the epilogue's inputs)."""
    return operands - has_weight - has_bias - max(expr_leaves(parse_expr(post)))


def _split(xs: tuple, has_weight: bool, has_bias: bool, post: str) -> tuple[tuple, tuple, tuple]:
    """(prologue inputs, weight/bias, epilogue inputs) of a fused_normalization's operands."""
    params = has_weight + has_bias
    before = prologue_inputs(len(xs), has_weight, has_bias, post)
    if before < 1:
        raise ShapeError(f"{len(xs)} operands cannot hold a prologue, {params} parameter(s) and "
                         f"{len(xs) - params - before} epilogue input(s)")
    return xs[:before], xs[before:before + params], xs[before + params:]


def _norm_attrs(norm: str, axes: tuple[int, ...], eps: float, has_weight: bool, has_bias: bool) -> dict:
    if norm not in NORMALIZATIONS:
        raise AttributeValueError(f"norm must be one of {NORMALIZATIONS}, got {norm!r}")
    if norm in ("softmax", "log_softmax"):
        if len(axes) != 1 or has_weight or has_bias:
            raise AttributeValueError(f"{norm} normalizes one axis and takes no weight or bias")
        return {"axis": axes[0]}
    return {"axes": axes, "eps": eps, "has_weight": has_weight, "has_bias": has_bias}


def infer_fused_norm(*xs: TensorType, expr: str, norm: str, axes: tuple[int, ...], eps: float,
                      has_weight: bool, has_bias: bool, post: str) -> TensorType:
    from tessera_rw.algebra.ops import OPS
    before, params, after = _split(xs, has_weight, has_bias, post)
    row = infer_fused(*before, expr=expr)
    normed = OPS[norm].infer(row, *params, **_norm_attrs(norm, axes, eps, has_weight, has_bias))
    return infer_fused(normed, *after, expr=post)


def fused_norm_reference(*xs: np.ndarray, expr: str, norm: str, axes, eps, has_weight, has_bias, post) -> np.ndarray:
    from tessera_rw.algebra.ops import OPS
    before, params, after = _split(xs, has_weight, has_bias, post)
    normed = OPS[norm].reference(fused(*before, expr=expr), *params,
                                 **_norm_attrs(norm, axes, eps, has_weight, has_bias))
    return fused(normed, *after, expr=post)


def fused_norm_flops(out: TensorType, *xs: TensorType, expr: str, norm: str, post: str, **attrs) -> int:
    before, _, after = _split(xs, attrs["has_weight"], attrs["has_bias"], post)
    return fused_flops(out, *before, expr=expr) + 7 * out.numel + fused_flops(out, out, *after, expr=post)


def prologue_views(xs: tuple, has_weight: bool, has_bias: bool, post: str, shape: tuple[int, ...],
                   strides: tuple[int, ...], offsets: tuple[int, ...]) -> list[tuple[tuple[int, ...], int]]:
    """Each prologue input's (strides, offset) of a strided_normalization."""
    before, _, _ = _split(xs, has_weight, has_bias, post)
    rank = len(shape)
    if len(offsets) != len(before) or len(strides) != rank * len(before):
        raise ShapeError(f"{len(before)} prologue input(s) read as {tuple(shape)} need {len(before)} offsets and "
                         f"{rank * len(before)} strides, not {len(offsets)} and {len(strides)}")
    return [(tuple(strides[k * rank:(k + 1) * rank]), off) for k, off in enumerate(offsets)]


def _viewed(xs: tuple, types: bool, shape, views) -> tuple:
    from tessera_rw.algebra.ops.strided import check_view, view_of
    before = []
    for x, (st, off) in zip(xs, views):
        if types:
            check_view(x, tuple(shape), st, off)
            before.append(TensorType(tuple(shape), x.dtype))
        else:
            before.append(view_of(x, shape, st, off))
    return tuple(before) + tuple(xs[len(views):])


def _infer_strided_norm(*xs: TensorType, expr: str, norm: str, axes: tuple[int, ...], eps: float,
                        has_weight: bool, has_bias: bool, post: str, shape: tuple[int, ...],
                        strides: tuple[int, ...], offsets: tuple[int, ...]) -> TensorType:
    views = prologue_views(xs, has_weight, has_bias, post, shape, strides, offsets)
    return infer_fused_norm(*_viewed(xs, True, shape, views), expr=expr, norm=norm, axes=axes, eps=eps,
                             has_weight=has_weight, has_bias=has_bias, post=post)


def _strided_norm(*xs: np.ndarray, shape, strides, offsets, **attrs) -> np.ndarray:
    views = prologue_views(xs, attrs["has_weight"], attrs["has_bias"], attrs["post"], shape, strides, offsets)
    return fused_norm_reference(*_viewed(xs, False, shape, views), **attrs)


def _strided_norm_flops(out: TensorType, *xs: TensorType, shape, strides, offsets, **attrs) -> int:
    before, _, _ = _split(xs, attrs["has_weight"], attrs["has_bias"], attrs["post"])
    views = tuple(TensorType(tuple(shape), x.dtype) for x in before)
    return fused_norm_flops(out, *views, *xs[len(before):], **attrs)


DEFS = (
    OpDef("fused_normalization", ("xs",), OpKind.NORMALIZATION, infer_fused_norm, fused_norm_reference,
          fused_norm_flops, variadic=True, doc="softmax / layernorm / rmsnorm between elementwise ops, one pass per row",
          vjp=before_fusion("fused_normalization")),
    OpDef("strided_normalization", ("xs",), OpKind.NORMALIZATION, _infer_strided_norm, _strided_norm,
          _strided_norm_flops, variadic=True, vjp=before_fusion("strided_normalization"),
          doc="fused_normalization with its prologue inputs read as strided views (shape, strides flat per "
              "prologue input in the result's rank, offsets), as lowering reads a normalized slice in place"),
)

