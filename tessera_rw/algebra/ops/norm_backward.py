"""A layer norm's or RMS norm's input gradient as one fused op: one pass over each row.

Reverse mode through y = x̂ · w + b, x̂ = (x − μ) r, r = 1/sqrt(var + eps) writes (reduction.py)

    dx = r (g w − mean(g w) − x̂ mean(g w x̂))          layernorm
    dx = r (g w − x̂ mean(g w x̂))                       rmsnorm (x̂ = x r, r = 1/sqrt(mean(x²) + eps))

as some ten ops: the row statistics, x̂ written out, two more row means, three elementwise passes.

    dx = norm_backward(x, g, [w], [r]; norm, axes, eps, has_weight, has_residual)

is that formula (plus r where the rules find dx added to another cotangent of x: a residual
branch's, in a pre-norm block), which a row kernel computes from x and g read once (the statistics
recomputed from the row in registers, as the forward does); the `gradient` ruleset writes it where
reverse mode's spelling (reduction.norm_input_grad) appears (rules/library/norm_gradient.py).
Statistics are float32 (float64 for float64); the weight and bias gradients stay column sums of
g x̂ and g. Those need x̂, so the row statistics again:

    packed = norm_backward_stats(x, g, [w], [r]; …)

is dx flat, then each row's mean, var and var + eps (an RMS norm: mean(x²) and mean(x²) + eps),
in x's dtype, each statistic's rows starting at a multiple of SECTION elements (stats_layout):
what the kernel computed for dx, written beside it, so the weight gradient reads them instead of
two more passes over x (rules/library/norm_stats.py). Better still,

    packed = norm_backward_grads(x, g, [w], [r]; …, parts)

is dx flat, then the weight's and the bias's gradients Σ g x̂ and Σ g in `parts` partial sums
each: part p sums the rows p, p + parts, p + 2 parts, …, which one block of the row kernel
walks, adding each row's g x̂ and g to registers it keeps per column. Each partial sum is two
rows of the row's length, its value in x's dtype and the rounding left over (value − stored
value, also in x's dtype), so a bfloat16 partial keeps about 16 bits; summing the 2 · parts rows
gives the gradient (rules/library/norm_grads.py). Each block starts at a multiple of SECTION
elements (zeros fill the gaps), so a kernel reading one finds it aligned for vector loads
(grads_layout). x and g are then read once for everything.

>>> from tessera_rw.algebra.dtypes import DType
>>> x = TensorType((8, 16), DType.bfloat16)
>>> _infer_norm_backward(x, x, TensorType((16,), DType.bfloat16), norm="layernorm", axes=(1,), eps=1e-5,
...                      has_weight=True)
TensorType(shape=(8, 16), dtype=<DType.bfloat16: 'bfloat16'>)
>>> _infer_norm_backward_stats(x, x, norm="rmsnorm", axes=(1,), eps=1e-5, has_weight=False)
TensorType(shape=(152,), dtype=<DType.bfloat16: 'bfloat16'>)
>>> _infer_norm_backward_grads(x, x, norm="layernorm", axes=(1,), eps=1e-5, has_weight=False, parts=2)
TensorType(shape=(256,), dtype=<DType.bfloat16: 'bfloat16'>)
>>> stats_layout(n=30, rows=5, count=3)        # the means at 32, var at 48, var + eps at 64, 69 in all
((32, 48, 64), 69)
>>> grads_layout(n=30, parts=5, length=6)      # Σ g x̂'s 60 values at 32, Σ g's at 96, 156 in all
(32, 96, 156)
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import AttributeValueError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.reduction import infer_norm
from tessera_rw.algebra.shapes import fmt_shape

NORMS = ("layernorm", "rmsnorm")
# The parts of norm_backward_stats's and norm_backward_grads's results after dx start at multiples
# of SECTION elements (zeros fill the gaps): 16 bytes or more for every dtype, the alignment a
# slice needs to be a view (lower/plan.py's VIEW_ALIGNMENT)
SECTION = 16
# the ops computing dx in a row kernel from x and g (whose results, but norm_backward's, are flat)
NORM_BACKWARD_OPS = ("norm_backward", "norm_backward_stats", "norm_backward_grads")
# per row, after dx in norm_backward_stats: mean, var, var + eps (rmsnorm: mean(x²), mean(x²) + eps)
STATISTICS = {"layernorm": 3, "rmsnorm": 2}


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise AttributeValueError(f"norm must be one of {NORMS}, got {norm!r}")


def _split(extra: tuple, has_weight: bool, has_residual: bool) -> tuple[tuple, tuple]:
    """(weight?, residual?) of the operands after x and g."""
    if len(extra) != has_weight + has_residual:
        raise ShapeError(f"expected {has_weight + has_residual} operand(s) after x and g (weight: {has_weight}, "
                         f"residual: {has_residual}), got {len(extra)}")
    return extra[:has_weight], extra[has_weight:]


def _infer_norm_backward(x: TensorType, g: TensorType, *extra: TensorType, norm: str, axes: tuple[int, ...],
                         eps: float, has_weight: bool, has_residual: bool = False) -> TensorType:
    _check_norm(norm)
    weight, residual = _split(extra, has_weight, has_residual)
    infer_norm(x, *weight, axes=axes, eps=eps, has_weight=has_weight, has_bias=False)
    for name, t in (("the cotangent g", g), *(("the residual", r) for r in residual)):
        if t.shape != x.shape or t.dtype is not x.dtype:
            raise ShapeError(f"{name} {t} differs from x {x}",
                             hint=f"g and a residual added to dx are {fmt_shape(x.shape)} {x.dtype}, as x is")
    return x


def _infer_norm_backward_stats(x: TensorType, g: TensorType, *extra: TensorType, norm: str,
                               axes: tuple[int, ...], eps: float, has_weight: bool,
                               has_residual: bool = False) -> TensorType:
    _infer_norm_backward(x, g, *extra, norm=norm, axes=axes, eps=eps, has_weight=has_weight,
                         has_residual=has_residual)
    rows = x.numel // max(int(np.prod([x.shape[a] for a in axes])), 1)
    return TensorType((stats_layout(x.numel, rows, STATISTICS[norm])[1],), x.dtype)


def _aligned(n: int) -> int:
    return -(-n // SECTION) * SECTION


def stats_layout(n: int, rows: int, count: int) -> tuple[tuple[int, ...], int]:
    """norm_backward_stats's (start of each of `count` statistics, size) after n elements of dx."""
    starts = tuple(_aligned(n) + i * _aligned(rows) for i in range(count))
    return starts, starts[-1] + rows


def _infer_norm_backward_grads(x: TensorType, g: TensorType, *extra: TensorType, norm: str,
                               axes: tuple[int, ...], eps: float, has_weight: bool, has_residual: bool = False,
                               parts: int) -> TensorType:
    _infer_norm_backward(x, g, *extra, norm=norm, axes=axes, eps=eps, has_weight=has_weight,
                         has_residual=has_residual)
    length = int(np.prod([x.shape[a] for a in axes]))
    rows = x.numel // max(length, 1)
    if not isinstance(parts, int) or not 1 <= parts <= max(rows, 1):
        raise AttributeValueError(f"parts must be an int in [1, {max(rows, 1)}] (the rows of {fmt_shape(x.shape)}), "
                                  f"got {parts!r}")
    return TensorType((grads_layout(x.numel, parts, length)[2],), x.dtype)


def grads_layout(n: int, parts: int, length: int) -> tuple[int, int, int]:
    """norm_backward_grads's (start of Σ g x̂'s partials, start of Σ g's, size) for n elements of x in
    rows of `length`: each block of 2 · parts rows starts at a multiple of SECTION after what is before."""
    block = 2 * parts * length
    weight = _aligned(n)
    bias = weight + _aligned(block)
    return weight, bias, bias + block


def _row_statistics(x: np.ndarray, norm: str, axes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x − mean, or x for rmsnorm; the mean, 0 for rmsnorm; var, or mean(x²)) over `axes`, in x's
    (wide) dtype."""
    count = int(np.prod([x.shape[a] for a in axes]))
    mean = np.mean(x, axis=axes, keepdims=True) if norm == "layernorm" else np.zeros((), x.dtype)
    centered = x - mean
    return centered, mean, np.sum(centered * centered, axis=axes, keepdims=True) / max(count, 1)


def _input_grad(x: np.ndarray, g: np.ndarray, *extra: np.ndarray, norm: str, axes, eps, has_weight,
                has_residual) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
    """(dx, the row statistics norm_backward_stats writes after it, x̂), in float32 at least."""
    weight, residual = _split(extra, has_weight, has_residual)
    # the statistics in float32 at least, as the kernel keeps them
    wide = np.promote_types(x.dtype, np.float32)
    x, g = x.astype(wide), g.astype(wide)
    gxhat = g * weight[0].astype(wide) if has_weight else g
    centered, mean, var = _row_statistics(x, norm, axes)
    var_eps = var + wide.type(eps)
    rstd = 1.0 / np.sqrt(var_eps)
    xhat = centered * rstd
    dot = np.mean(gxhat * xhat, axis=axes, keepdims=True)
    shift = np.mean(gxhat, axis=axes, keepdims=True) if norm == "layernorm" else 0
    dx = rstd * (gxhat - shift - xhat * dot)
    stats = (mean, var, var_eps) if norm == "layernorm" else (var, var_eps)
    return (dx + residual[0].astype(wide) if has_residual else dx), stats, xhat


def _norm_backward(x: np.ndarray, g: np.ndarray, *extra: np.ndarray, norm: str, axes, eps,
                   has_weight, has_residual=False) -> np.ndarray:
    return _input_grad(x, g, *extra, norm=norm, axes=axes, eps=eps, has_weight=has_weight,
                       has_residual=has_residual)[0]


def _norm_backward_stats(x: np.ndarray, g: np.ndarray, *extra: np.ndarray, norm: str, axes, eps,
                         has_weight, has_residual=False) -> np.ndarray:
    dx, stats, _ = _input_grad(x, g, *extra, norm=norm, axes=axes, eps=eps, has_weight=has_weight,
                               has_residual=has_residual)
    rows = stats[-1].size
    starts, size = stats_layout(dx.size, rows, len(stats))
    packed = np.zeros(size, dx.dtype)
    packed[:dx.size] = dx.ravel()
    for start, stat in zip(starts, stats):
        packed[start:start + rows] = np.broadcast_to(stat, stats[-1].shape).ravel()
    return packed


def _partial_sums(values: np.ndarray, parts: int, dtype: np.dtype) -> np.ndarray:
    """(2 parts, length): part p's sum of the rows p, p + parts, … of `values` (rows, length) as
    stored in `dtype`, then what that rounding dropped."""
    sums = np.stack([values[p::parts].sum(axis=0) for p in range(parts)])
    stored = sums.astype(dtype).astype(sums.dtype)
    return np.stack([stored, sums - stored], axis=1).reshape(2 * parts, -1)


def partial_sums_folded(packed: np.ndarray, x_shape: tuple[int, ...], axes: tuple[int, ...], parts: int) -> np.ndarray:
    """norm_backward_grads's result with each partial sum's two rows added: dx flat, then parts rows
    of Σ g x̂ and parts of Σ g, in packed's dtype (the gaps left out). What the packed values mean,
    whichever rounding split them (a float64 reference's remainders are 0, a kernel's are not)."""
    n, length = math.prod(x_shape), math.prod(x_shape[a] for a in axes)
    weight, bias, _ = grads_layout(n, parts, length)
    block = 2 * parts * length
    return np.concatenate([packed[:n], *(packed[start:start + block].reshape(parts, 2, length).sum(axis=1).ravel()
                                         for start in (weight, bias))])


def _norm_backward_grads(x: np.ndarray, g: np.ndarray, *extra: np.ndarray, norm: str, axes, eps,
                         has_weight, has_residual=False, parts: int) -> np.ndarray:
    dx, _, xhat = _input_grad(x, g, *extra, norm=norm, axes=axes, eps=eps, has_weight=has_weight,
                              has_residual=has_residual)
    wide = dx.dtype
    length = int(np.prod([x.shape[a] for a in axes]))
    xhat = xhat.reshape(-1, length)
    cotangent = g.astype(wide).reshape(-1, length)
    weight, bias, size = grads_layout(dx.size, parts, length)
    packed = np.zeros(size, wide)
    packed[:dx.size] = dx.ravel()
    packed[weight:weight + 2 * parts * length] = _partial_sums(cotangent * xhat, parts, x.dtype).ravel()
    packed[bias:] = _partial_sums(cotangent, parts, x.dtype).ravel()
    return packed


def _norm_backward_flops(out: TensorType, x: TensorType, g: TensorType, *extra: TensorType, norm: str,
                         has_weight: bool, has_residual: bool = False, **attrs) -> int:
    # statistics (3 or 2 per element), x̂, the two (or one) sums and the combination; the weight
    # product and the residual's add
    return (14 if norm == "layernorm" else 10) * x.numel + (has_weight + has_residual) * x.numel


def _norm_backward_grads_flops(out: TensorType, x: TensorType, *operands: TensorType, norm: str,
                               has_weight: bool, has_residual: bool = False, **attrs) -> int:
    # dx's, then g x̂ and the two running sums per element
    return _norm_backward_flops(out, x, *operands, norm=norm, has_weight=has_weight,
                                has_residual=has_residual) + 3 * x.numel


DEFS = (
    OpDef("norm_backward", ("x", "g", "weight", "residual"), OpKind.NORMALIZATION, _infer_norm_backward, _norm_backward,
          _norm_backward_flops, variadic=True,
          doc="a layernorm's or rmsnorm's input gradient from x and the output cotangent g, one pass per row "
              "(plus a residual's cotangent, added as dx is written)",
          vjp=before_fusion("norm_backward")),
    OpDef("norm_backward_stats", ("x", "g", "weight", "residual"), OpKind.NORMALIZATION, _infer_norm_backward_stats,
          _norm_backward_stats, _norm_backward_flops, variadic=True,
          doc="norm_backward's dx flat, then each row's statistics as the forward computes them (mean and "
              "var + eps; an RMS norm's mean(x²) + eps), for the weight gradient to read",
          vjp=before_fusion("norm_backward_stats")),
    OpDef("norm_backward_grads", ("x", "g", "weight", "residual"), OpKind.NORMALIZATION, _infer_norm_backward_grads,
          _norm_backward_grads, _norm_backward_grads_flops, variadic=True,
          doc="norm_backward's dx flat, then the weight's and bias's gradients (Σ g x̂, Σ g over the rows) in "
              "`parts` partial sums of rows p, p + parts, …, each as its stored value and its rounding",
          vjp=before_fusion("norm_backward_grads")),
)
