"""A row-wise normalization with its elementwise neighbours, one pass per row.

fused_normalization(prologue inputs…, weight?, bias?, epilogue inputs…; expr, norm, post):
post(norm(expr(prologue inputs), weight, bias), epilogue inputs), where in `post` $0 is the
normalized row and $1… the epilogue inputs. post="$0" is no epilogue.
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


def _split(xs: tuple, has_weight: bool, has_bias: bool, post: str) -> tuple[tuple, tuple, tuple]:
    """(prologue inputs, weight/bias, epilogue inputs) of a fused_normalization's operands."""
    after = max(expr_leaves(parse_expr(post)))
    params = has_weight + has_bias
    before = len(xs) - params - after
    if before < 1:
        raise ShapeError(f"{len(xs)} operands cannot hold a prologue, {params} parameter(s) and {after} epilogue "
                         f"input(s)")
    return xs[:before], xs[before:before + params], xs[before + params:]


def _norm_attrs(norm: str, axes: tuple[int, ...], eps: float, has_weight: bool, has_bias: bool) -> dict:
    if norm not in NORMALIZATIONS:
        raise AttributeValueError(f"norm must be one of {NORMALIZATIONS}, got {norm!r}")
    if norm in ("softmax", "log_softmax"):
        if len(axes) != 1 or has_weight or has_bias:
            raise AttributeValueError(f"{norm} normalizes one axis and takes no weight or bias")
        return {"axis": axes[0]}
    return {"axes": axes, "eps": eps, "has_weight": has_weight, "has_bias": has_bias}


def _infer_fused_norm(*xs: TensorType, expr: str, norm: str, axes: tuple[int, ...], eps: float,
                      has_weight: bool, has_bias: bool, post: str) -> TensorType:
    from tessera_rw.algebra.ops import OPS
    before, params, after = _split(xs, has_weight, has_bias, post)
    row = infer_fused(*before, expr=expr)
    normed = OPS[norm].infer(row, *params, **_norm_attrs(norm, axes, eps, has_weight, has_bias))
    return infer_fused(normed, *after, expr=post)


def _fused_norm(*xs: np.ndarray, expr: str, norm: str, axes, eps, has_weight, has_bias, post) -> np.ndarray:
    from tessera_rw.algebra.ops import OPS
    before, params, after = _split(xs, has_weight, has_bias, post)
    normed = OPS[norm].reference(fused(*before, expr=expr), *params,
                                 **_norm_attrs(norm, axes, eps, has_weight, has_bias))
    return fused(normed, *after, expr=post)


def _fused_norm_flops(out: TensorType, *xs: TensorType, expr: str, norm: str, post: str, **attrs) -> int:
    before, _, after = _split(xs, attrs["has_weight"], attrs["has_bias"], post)
    return fused_flops(out, *before, expr=expr) + 7 * out.numel + fused_flops(out, out, *after, expr=post)


DEFS = (
    OpDef("fused_normalization", ("xs",), OpKind.NORMALIZATION, _infer_fused_norm, _fused_norm, _fused_norm_flops,
          variadic=True, doc="softmax / layernorm / rmsnorm between elementwise ops, one pass per row",
          vjp=before_fusion("fused_normalization")),
)

