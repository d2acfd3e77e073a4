"""Checking a generated kernel against its op's numpy reference.

Three parts, each usable without a GPU:

- `random_inputs(op, rng)` (kernel_inputs.py): values for every operand in its own dtype, never
  zero, with their exact float64 (complex128) twins;
- `expected(op, inputs, rng, unit)`: the float64 reference, on a stratified subset of independent
  output rows when the whole one would take numpy seconds, with the tolerance of the output dtype;
- `check(exp, out, what)`: raises KernelMismatchError saying which element is off, by how much, against
  what bound; every element must be finite (outputs are poisoned with NaN bytes before a launch, so
  an element the kernel never wrote fails here even outside the checked rows).

>>> from tessera_rw.algebra.node import TensorType
>>> from tessera_rw.codegen.kernel_inputs import random_inputs
>>> t = TensorType((4, 6), DType.float32)
>>> op = KernelOp.of("exp", (t,), t)
>>> rng = np.random.default_rng(0)
>>> inputs = random_inputs(op, rng)
>>> exp = expected(op, inputs, rng)
>>> check(exp, np.exp(inputs.arrays[0]), "exp")          # float32 exp is within 1e-4 of float64
>>> tolerance(DType.bfloat16, reduction=4096) == BASE_TOLERANCE["bfloat16"] + ACCUMULATION * 64
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpKind
from tessera_rw.algebra.ops import opdef
from tessera_rw.algebra.ops.linalg import read_as
from tessera_rw.algebra.ops.norm_backward import NORM_BACKWARD_OPS, partial_sums_folded
from tessera_rw.algebra.ops.pooling import POOL_OPS
from tessera_rw.algebra.ops.reduced_norm import rows_of
from tessera_rw.algebra.shapes import broadcast_shapes
from tessera_rw.codegen.arch import MathUnit
from tessera_rw.codegen.attention_rows import query_rows_mask, restrict_strided_attention, strided_row_axis
from tessera_rw.codegen.kernel_inputs import Inputs
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.attention_problem import attention_operands, dense_op, output_type
from tessera_rw.codegen.templates.conv_problem import conv_operands

# ---- tolerance -------------------------------------------------------------------------------------
#
# A kernel and the float64 reference see the same (already rounded) inputs, so what separates them is
# (1) rounding inside the kernel that does not depend on how long a reduction is: the result's
#     rounding to its storage type (half an ulp of each element: 2^-9 for bf16, 2^-11 for fp16,
#     2^-24 for fp32), operands rounded to the math unit (tf32 keeps 10 mantissa bits: each product is
#     off by up to 2^-10 relative, and over K random-signed terms that stays ~2^-10 of the output's
#     scale), 16-bit probabilities in attention, approximate exp2 / erf / tanh instructions (under
#     the `fast` numerics policy NVRTC's fast math too: tanh.approx is off by up to 2^-11, so an fp32
#     result there gets tf32's bound). BASE_TOLERANCE is about ten times that rounding, so it also
#     covers a few roundings in a row;
# (2) the fp32 accumulator, which every kernel uses: each of K additions rounds by up to 2^-24 of
#     the partial sum, and for random-signed data those errors add up like a random walk, so
#     relative to the output's scale they grow as sqrt(K) * 2^-24. ACCUMULATION is that per-term
#     figure with a margin of 32 (blocked sums, a rounding on each product, fused multiply-adds).
# The bound on |out - ref| for one element is tol * (scale + |ref|), scale being the RMS of the
# reference: relative for large elements, absolute (a fraction of the output's typical size) where
# terms cancel to near zero. A wrong row or column is off by O(scale) and fails by orders of magnitude.

BASE_TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "tf32": 5e-3, "float16": 5e-3, "bfloat16": 2e-2,
                  "float8_e4m3": 1.25e-1, "float8_e5m2": 2.5e-1}
ACCUMULATION = 32 * 2.0 ** -24


def tolerance(dtype: DType, reduction: int = 1, unit: MathUnit | None = None, fast: bool = False) -> float:
    """The bound on |out - ref| / (scale + |ref|) for a result of `dtype` that sums `reduction` terms
    per element, computed on `unit`; TF32 and `fast` (fast math) widen an fp32 result's bound to tf32's.

    >>> tolerance(DType.float32, 1) < tolerance(DType.float32, 65536) < tolerance(DType.float32, 1, MathUnit.TF32)
    True
    """
    real = {DType.complex64: DType.float32, DType.complex128: DType.float64}.get(dtype, dtype)
    base = BASE_TOLERANCE[real.value]
    if unit is MathUnit.TF32 or fast:
        base = max(base, BASE_TOLERANCE["tf32"])
    return base + ACCUMULATION * math.sqrt(max(1, reduction))


def reduction_length(op: KernelOp) -> int:
    """How many terms each output element sums (1 when none): K of a product, a row's length, a
    reduction's extent, a convolution's input-channel window, the keys of attention, a pool's window."""
    op = dense_op(op)
    kind, attrs, ops = opdef(op.op).kind, op.attr_map, op.operands
    if kind is OpKind.MATMUL:
        return ops[0].shape[-1]
    if op.op == "attention_row_stats_from_lse":        # Σ dO·O over a row's head dim
        return ops[1].shape[-1]
    if kind is OpKind.ATTENTION:       # the backward's dK also sums over the queries
        if op.op == "strided_attention":
            ops = attention_operands(op)
        return max(ops[1].shape[-2], ops[0].shape[-1], ops[0].shape[-2] if op.op == "flash_attention_bwd" else 0)
    if kind is OpKind.NORMALIZATION:   # over the rows (a norm backward's result is flat: over x's)
        axes = attrs.get("axes") or (attrs["axis"],)
        rows = ops[0] if op.op in NORM_BACKWARD_OPS else rows_of(op.op, ops, attrs, op.result)
        length = math.prod(rows.shape[a] for a in axes)
        # norm_backward_grads's partial sums each add up every parts-th row
        return max(length, math.ceil(rows.numel // length / attrs["parts"])) if "parts" in attrs else length
    if op.op == "index_add":           # at most every index hits one row
        return ops[1].numel
    if op.op in POOL_OPS:              # a window's positions (a gradient: at most one per covering window)
        return math.prod(attrs["kernel"])
    if kind is OpKind.REDUCTION:       # a fused reduction reduces its operands broadcast together
        axes = attrs.get("axes")
        shape = broadcast_shapes(*(t.shape for t in ops)) if op.op in ("fused_reduction", "multi_reduction") \
            else ops[0].shape
        return math.prod(shape[a] for a in (range(len(shape)) if axes is None else axes))
    if kind is OpKind.CONV:
        return math.prod(conv_operands(op)[1].shape[1:])     # in-channels per group x kernel window
    if op.op == "spectral_contract":
        return ops[0].shape[1] // attrs["groups"]
    return 1


# ---- the reference, on independent rows when the whole is slow -------------------------------------

# Above REFERENCE_WORK (about a third of a second of numpy here) the reference runs on a subset of
# independent output rows: queries of attention, rows of a product or a normalization, batch items of
# a convolution. One row is drawn from each of equal strata, so every region of the output (every row
# of tiles) is represented; outside them, the NaN poison still catches any element never written.
REFERENCE_WORK = 2 ** 25
MIN_ROWS = 32          # a convolution's batch items are large: for it, the first and the last
# numpy element-operations per output element (matmul: per multiply-add, float64 BLAS being that much
# faster than numpy's elementwise passes; attention: per score, a few passes and two products)
_COST = {OpKind.MATMUL: 1 / 32, OpKind.ATTENTION: 10, OpKind.NORMALIZATION: 10, OpKind.CONV: 1}


def _norm_axes(op: KernelOp) -> tuple[int, ...]:
    attrs = op.attr_map
    return tuple(attrs.get("axes") or (attrs["axis"],))


# ops whose reference runs whole: the packed attention gradients, the forward with its row
# logsumexps and a norm's input gradient with its row statistics or gradient partials have no row
# axis, the row statistics read queries from three operands, and those read off the logsumexps take
# O and them packed in one flat operand
WHOLE_REFERENCE = frozenset({"flash_attention_bwd", "attention_row_stats", "flash_attention_lse",
                             "attention_row_stats_from_lse", "norm_backward_stats",
                             "norm_backward_grads"})


def _product_a(op: KernelOp) -> TensorType:
    """A product's first operand as the product reads it (a stored-transposed one swapped back)."""
    return read_as(op.operands[0], bool(op.attr_map.get("trans_a")))


def row_plan(op: KernelOp) -> tuple[int, float] | None:
    """(output axis whose rows are independent, numpy work of the whole reference), or None when the
    op has no such axis the reference can be restricted to."""
    kind, out = opdef(op.op).kind, op.result
    cost = _COST.get(kind, 0)
    if dense_op(op).op in WHOLE_REFERENCE:
        return None
    # a row of the result comes from the same row of a (not so for matmul_bias_grad's extra last row)
    if kind is OpKind.MATMUL and (a := _product_a(op)).ndim >= 2 and out.ndim >= 2 and out.shape[-2] == a.shape[-2]:
        return out.ndim - 2, cost * out.numel * a.shape[-1]
    if op.op == "strided_attention":
        axis = strided_row_axis(op)
        o, k = output_type(op), attention_operands(op)[1]
        return None if axis is None else (axis, cost * o.numel // o.shape[-1] * k.shape[-2])
    if kind is OpKind.ATTENTION:
        return out.ndim - 2, cost * out.numel // out.shape[-1] * op.operands[1].shape[-2]
    if kind is OpKind.NORMALIZATION and out.ndim >= 2 and 0 not in _norm_axes(op):
        if op.op == "reduced_normalization":      # rows summed: restricted where they keep their axes
            attrs = op.attr_map
            return (0, cost * rows_of(op.op, op.operands, attrs, out).numel) if attrs["keepdims"] else None
        return 0, cost * out.numel
    if kind is OpKind.CONV and op.op != "strided_conv":     # a view's rows are not its storage's
        return 0, cost * out.numel * reduction_length(op)
    return None


def pick_rows(n: int, work: float, rng: np.random.Generator, min_rows: int = MIN_ROWS) -> np.ndarray | None:
    """Sorted row indices to check (always the first and the last), or None for all rows.

    >>> pick_rows(100, 1.0, np.random.default_rng(0)) is None
    True
    >>> rows = pick_rows(4096, 64 * REFERENCE_WORK, np.random.default_rng(0))
    >>> len(rows) >= 64, int(rows[0]), int(rows[-1])
    (True, 0, 4095)
    """
    if work <= REFERENCE_WORK:
        return None
    count = min(n, max(min_rows, math.ceil(n * REFERENCE_WORK / work)))
    if count == n:
        return None
    edges = np.linspace(0, n, count + 1).astype(np.int64)
    picks = [rng.integers(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]
    return np.unique(np.asarray([0, n - 1, *picks], dtype=np.int64))


def _restrict(op: KernelOp, inputs: Inputs, axis: int, rows: np.ndarray) -> tuple[list, dict]:
    """Wide operands and attributes whose reference is the output's `rows` along `axis`."""
    kind, attrs, out = opdef(op.op).kind, dict(op.attr_map), op.result
    n, ts = out.shape[axis], op.operands

    def rows_of(i: int, along: int) -> np.ndarray:
        return inputs.wide_take(i, rows, along % ts[i].ndim)

    if kind is OpKind.MATMUL:      # rows of a (its columns when stored transposed); a bias or residual's rows
        extra = [rows_of(i, -2) if ts[i].ndim >= 2 and ts[i].shape[-2] == n else inputs.wide(i)
                 for i in range(2, len(ts))]
        return [rows_of(0, -1 if attrs.get("trans_a") else -2), inputs.wide(1), *extra], attrs
    if op.op == "strided_attention":
        return restrict_strided_attention(op, inputs, rows)
    if kind is OpKind.ATTENTION:   # queries; causal rows as an explicit mask, as they no longer start at 0
        mask = query_rows_mask(attrs, rows_of(3, -2) if attrs["has_mask"] and ts[3].shape[-2] == n else
                          inputs.wide(3) if attrs["has_mask"] else None, ts[1].shape[-2], rows)
        return [rows_of(0, -2), inputs.wide(1), inputs.wide(2), *([mask] if mask is not None else [])], attrs
    if kind is OpKind.CONV:        # batch items of x and of epilogue inputs that have them; the filter is shared
        return [rows_of(0, 0), inputs.wide(1), *(rows_of(i, 0) if t.ndim == out.ndim and t.shape[0] == n
                                                 else inputs.wide(i) for i, t in enumerate(ts[2:], 2))], attrs
    # rows of a normalization: axis 0 of every operand of the output's rank (weights and row-broadcast
    # operands have a lower rank or a leading 1)
    return [rows_of(i, 0) if t.ndim == out.ndim and t.shape[0] == n else inputs.wide(i)
            for i, t in enumerate(ts)], attrs


@dataclass(frozen=True)
class Expected:
    """The reference where it is checked (`axis`/`rows` select output rows; None: all of it) and the
    bound on each element: |out - ref| <= tol * (scale + |ref|), or equality when `exact`."""
    op: KernelOp
    value: np.ndarray            # exact: in the result dtype; else float32 / float64 / complex
    exact: bool
    axis: int | None
    rows: np.ndarray | None
    tol: float
    scale: float

    def on(self, unit: MathUnit) -> Expected:
        """The same reference, with the tolerance of a schedule whose arithmetic runs on `unit`."""
        if self.exact:
            return self
        return replace(self, tol=_tolerance_of(self.op, unit))


# The attention backward rounds P and dS to the 16-bit input type before its products (as
# FlashAttention-2 does); a gradient element sums terms that can be tens of times its own size and
# cancel, so its error is that rounding of the terms: up to 3% of the output's scale for bf16 at
# head_dim 128 in a float64 emulation of the kernel, against 2% for one rounding of the result.
INTERMEDIATE_ROUNDING = {"flash_attention_bwd": 3.0}


def _compared(op: KernelOp, values: np.ndarray) -> np.ndarray:
    """What of `values` (a result of `op`) is compared: the values, but a packed result whose
    partial sums are each a value and its rounding, compared as their sums."""
    if op.op == "norm_backward_grads":
        return partial_sums_folded(values, op.operands[0].shape, tuple(op.attr_map["axes"]), op.attr_map["parts"])
    return values


def _tolerance_of(op: KernelOp, unit: MathUnit | None) -> float:
    base = tolerance(op.result.dtype, reduction_length(op), unit, fast=op.numerics is Numerics.FAST)
    return base * INTERMEDIATE_ROUNDING.get(dense_op(op).op, 1.0)


def is_exact(op: KernelOp) -> bool:
    """Ops that only move or select values, and integer or bool results: compared bit for bit."""
    return opdef(op.op).exact or not (op.result.dtype.is_float or op.result.dtype.is_complex)


def _compare_type(dtype: DType) -> np.dtype:
    """The host type comparisons run in: float32 for every float of 32 bits or fewer (rounding the
    reference to it costs 2^-24 relative, far under any tolerance), float64 / complex as they are."""
    if dtype.is_complex:
        return dtype.numpy
    return np.dtype(np.float64) if dtype is DType.float64 else np.dtype(np.float32)


def expected(op: KernelOp, inputs: Inputs, rng: np.random.Generator, unit: MathUnit | None = None) -> Expected:
    """The float64 reference of `op` on `inputs` and the per-element bound a kernel must meet."""
    plan = row_plan(op)
    axis = rows = None
    if plan is not None:
        axis, work = plan
        rows = pick_rows(op.result.shape[axis], work, rng, 1 if opdef(op.op).kind is OpKind.CONV else MIN_ROWS)
    if rows is None:
        axis = None
        operands, attrs = [inputs.wide(i) for i in range(len(op.operands))], dict(op.attr_map)
    else:
        operands, attrs = _restrict(op, inputs, axis, rows)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ref = _compared(op, np.asarray(opdef(op.op).reference(*operands, **attrs)))
    if is_exact(op):
        return Expected(op, ref.astype(op.result.dtype.numpy), True, axis, rows, 0.0, 0.0)
    magnitude = np.abs(ref[np.isfinite(ref)])
    scale = float(np.sqrt(np.mean(np.square(magnitude)))) if magnitude.size else 0.0
    return Expected(op, ref.astype(_compare_type(op.result.dtype)), False, axis, rows,
                    _tolerance_of(op, unit), scale or 1.0)


# ---- the check -------------------------------------------------------------------------------------

def _nonfinite(out: np.ndarray) -> np.ndarray:
    """Flat indices of NaN / inf elements (of a bool output: bytes other than 0 and 1, which the
    poison leaves); 16-bit floats are read through their exponent bits."""
    if out.dtype.kind == "b":
        return np.flatnonzero(np.ascontiguousarray(out).view(np.uint8).ravel() > 1)
    if out.dtype.kind in "iu":
        return np.empty(0, np.int64)
    if out.dtype == DType.bfloat16.numpy:      # all exponent bits set: inf or NaN
        return np.flatnonzero((out.view(np.uint16).ravel() & 0x7F80) == 0x7F80)
    if out.dtype.kind not in "fc":             # fp8
        return np.flatnonzero(~np.isfinite(out.astype(np.float32)).ravel())
    return np.flatnonzero(~np.isfinite(out).ravel())


def _where(exp: Expected, flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The output coordinates of element `flat` of the checked part."""
    index = list(np.unravel_index(flat, shape))
    if exp.rows is not None:
        index[exp.axis] = int(exp.rows[index[exp.axis]])
    return tuple(int(i) for i in index)


class KernelMismatchError(TesseraError, AssertionError):
    """A kernel's output is not the op's reference: the wrong shape or dtype, an element never
    written or not finite, or one off by more than the tolerance (the message says which, by how
    much). An AssertionError too, so a test's check of a kernel fails as an assertion does."""


def check(exp: Expected, out: np.ndarray, what: str) -> None:
    """Raise KernelMismatchError naming `what` unless `out` matches the reference within its bound."""
    op = exp.op
    want = (op.result.shape, op.result.dtype.numpy)
    if (out.shape, out.dtype) != want:        # raised, not asserted: python -O keeps the check
        raise KernelMismatchError(f"{what}: got {out.dtype}{list(out.shape)}, want {want[1]}{list(want[0])}")
    bad = _nonfinite(out)
    if bad.size:
        at = tuple(int(i) for i in np.unravel_index(bad[0], out.shape))
        raise KernelMismatchError(f"{what}: {bad.size} of {out.size} elements are NaN/inf (first at {at}); "
                                  f"outputs start as NaN bytes, so these were never written or came out non-finite")
    part = out if exp.rows is None else out.take(exp.rows, axis=exp.axis)
    if exp.exact:
        part = _compared(op, part)
        same = part == exp.value
        if not same.all():
            flat = int(np.flatnonzero(~same.ravel())[0])
            at = _where(exp, flat, part.shape)
            raise KernelMismatchError(f"{what}: {int((~same).sum())} of {same.size} checked elements differ from "
                                      f"the exact reference; first at {at}: got {part.ravel()[flat]!r}, "
                                      f"want {exp.value.ravel()[flat]!r}")
        return
    got = _compared(op, part.astype(exp.value.dtype))
    err = np.abs(got - exp.value)
    bound = exp.tol * (exp.scale + np.abs(exp.value))
    over = ~(err <= bound)             # NaN compares false: it counts as over
    if over.any():
        flat = int(np.argmax(np.where(over, err / bound, 0.0).ravel()))
        at = _where(exp, flat, got.shape)
        raise KernelMismatchError(
            f"{what}: {int(over.sum())} of {over.size} checked elements exceed tol·(scale + |ref|) with "
            f"tol {exp.tol:.2e}, scale (RMS of the reference) {exp.scale:.3g}; worst at {at}: got "
            f"{got.ravel()[flat]!r}, want {exp.value.ravel()[flat]!r}, error {err.ravel()[flat] / exp.scale:.2e} "
            f"of scale" + (" (positions in the compared values: partial sums folded)" if got.shape != part.shape else ""))
