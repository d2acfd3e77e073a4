"""cross_entropy, torch's `F.cross_entropy`, written with other ops so that the rewrites make it one
row kernel: log_softmax over the classes, each class's weight in the loss (the target's, smoothed),
and the row's sum, reading the logits once (a reduced_normalization), then the batch reduction.

>>> import numpy as np
>>> z = np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=np.float32)
>>> np.round(cross_entropy(z, np.array([0, 2]), reduction="none"), 4)
array([0.2395, 1.5514], dtype=float32)
"""

from __future__ import annotations

import math
import numbers

from tessera_rw.algebra.api.dispatch import op_context, tensor_operand, type_of
from tessera_rw.algebra.api.elementwise import (add, cast, divide, equal, greater_equal, less, multiply, negative,
                                                not_equal, where)
from tessera_rw.algebra.api.gather import positions_along
from tessera_rw.algebra.api.layout import expand_dims
from tessera_rw.algebra.api.reduction import log_softmax, mean, sum as reduce_sum
from tessera_rw.algebra.errors import AttributeValueError, DTypeError, ShapeError
from tessera_rw.algebra.shapes import normalize_axis

REDUCTIONS = ("mean", "sum", "none")


def cross_entropy(logits, target, axis: int = 1, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int | None = -100):
    """torch's cross_entropy of `logits` with the classes along `axis` (1, as torch; the only axis of
    1-d logits): `target` holds class indices (logits' shape without the class axis) or class
    probabilities (logits' shape). `label_smoothing` ε mixes each row's target with the uniform
    ε / C; rows whose index is `ignore_index` (-100 by default, as torch's: targets padded with it)
    count for nothing, and the mean is over the others; None ignores no row. Any other index outside
    [0, C) makes its row's loss, and so a mean or sum, NaN (torch raises; a kernel cannot, and a row
    left out would dilute the loss unseen). The NaN is added to
    the row's loss, so the other rows' gradients stay what they are."""
    x, t = tensor_operand(logits), tensor_operand(target)
    with op_context("cross_entropy", (x, t), ("logits", "target")):
        xt, tt = type_of(x), type_of(t)
        if not xt.dtype.is_float:
            raise DTypeError(f"logits must be floating point, got {xt.dtype.value}",
                             hint="cast them first: op.cast(logits, 'float32')")
        if reduction not in REDUCTIONS:
            raise AttributeValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if not isinstance(label_smoothing, numbers.Real) or not 0.0 <= label_smoothing <= 1.0:
            raise AttributeValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
        ax = normalize_axis(axis if xt.ndim > 1 else 0, xt.ndim)
        classes = xt.shape[ax]
        by_index = tt.dtype.is_integer
        want = xt.shape[:ax] + xt.shape[ax + 1:] if by_index else xt.shape
        if tt.shape != want:
            what = "class indices" if by_index else "class probabilities"
            raise ShapeError(f"a target of {what} has shape {want} for logits {xt.shape} with the classes on axis "
                             f"{ax}, got {tt.shape}", hint="pass integer class indices without the class axis, "
                                                           "or float probabilities of the logits' shape")
        if ignore_index not in (None, -100) and not by_index:
            raise AttributeValueError("ignore_index applies to class indices, not to probabilities")
        if not by_index:
            ignore_index = None
    smooth = float(label_smoothing) / classes
    target_weight = 1.0 - float(label_smoothing) + smooth      # the target class's share, smoothed
    log_probs = log_softmax(x, axis=ax)
    if by_index:
        hit = equal(expand_dims(t, ax), positions_along(classes, ax, xt.ndim, tt.dtype.value))
        # smoothed: Σ_j w_j log p_j with w = target_weight at the target, smooth elsewhere, spelled as
        # target_weight · Σ where(hit, log p, log p · smooth / target_weight): four inputs, one kernel
        terms = where(hit, log_probs, multiply(log_probs, smooth / target_weight) if smooth else 0.0)
        rows = negative(reduce_sum(terms, ax))
        rows = multiply(rows, target_weight) if smooth else rows
        # no class: NaN, added in the rows' dtype (a where on the rows would put a mask in the gradient's way)
        # (nested selections, not logical_and: each is an op a fused expression spells, so the check
        # joins the kernel that takes the mean)
        stray = where(greater_equal(t, 0), where(less(t, classes), 0.0, math.nan), math.nan)
        rows = add(rows, cast(stray, type_of(rows).dtype.value))
    else:
        weights = add(multiply(t, 1.0 - float(label_smoothing)), smooth) if smooth else t
        rows = negative(reduce_sum(multiply(log_probs, weights), ax))
    kept = None if ignore_index is None else not_equal(t, ignore_index)
    if kept is not None:
        rows = where(kept, rows, 0.0)
    if reduction == "none":
        return rows
    if reduction == "sum":
        return reduce_sum(rows)
    if kept is None:
        return mean(rows)
    # the rows kept are counted, and their losses added, in float32: 65,505 rows overflow float16,
    # and bfloat16 rounds a count of 4095 to 4096
    total, count = reduce_sum(cast(rows, "float32")), reduce_sum(cast(kept, "float32"))
    return cast(divide(total, count), xt.dtype.value)       # class indices: the rows are in the logits' dtype
