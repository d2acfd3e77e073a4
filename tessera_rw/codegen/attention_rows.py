"""An attention's reference on some of its query rows: what kernel_check compares on a subset of
rows when the whole reference would be slow. Rows of a plain attention are rows of q and of its
output; a strided_attention's are rows of its q view, written into its result's layout, where they
run along the axis its output's row stride names. Causality is spelled out as a mask, as the rows no
longer start at 0.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.ops.attention import causal_keep_at
from tessera_rw.algebra.ops.strided_attention import viewed
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.codegen.kernel_inputs import Inputs
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.attention_problem import output_type


def query_rows_mask(attrs: dict, mask: np.ndarray | None, keys: int, rows: np.ndarray) -> np.ndarray | None:
    """The mask of an attention's query `rows` (`mask`: the op's, at those rows where it has rows),
    causality (and its window) spelled out as one, as the rows no longer start at 0; `attrs` updated
    to match."""
    if attrs["causal"]:
        keep = causal_keep_at(rows, np.arange(keys), attrs["window"])
        mask = keep if mask is None else (mask & keep if mask.dtype == bool else mask + np.where(keep, 0.0, -np.inf))
    attrs.update(causal=False, has_mask=mask is not None, window=0)
    return mask


def strided_row_axis(op: KernelOp) -> int | None:
    """The axis of a strided_attention's result its query rows run along (None for one row)."""
    sq, row_stride = output_type(op).shape[-2], op.attr_map["out_strides"][-2]
    dense = contiguous_strides(op.result.shape)
    return next((i for i, (n, st) in enumerate(zip(op.result.shape, dense)) if n == sq and st == row_stride and sq > 1),
                None)


def restrict_strided_attention(op: KernelOp, inputs: Inputs, rows: np.ndarray) -> tuple[list, dict]:
    """A strided_attention's query `rows` as one over dense q, k and v, written into the result's
    layout with its row axis cut to them."""
    attrs, out = dict(op.attr_map), op.result.shape
    q, k, v, *given = viewed(tuple(inputs.wide(i) for i in range(len(op.operands))), attrs["shapes"],
                             attrs["strides"], attrs["offsets"])
    q = np.take(q, rows, axis=-2)
    mask = None
    if given:       # a mask broadcasts to (..., Sq, Sk): its rows, where it has more than one
        mask = given[0] if given[0].ndim < 2 or given[0].shape[-2] == 1 else np.take(given[0], rows, axis=-2)
    mask = query_rows_mask(attrs, mask, k.shape[-2], rows)
    axis = strided_row_axis(op)
    cut = out[:axis] + (len(rows),) + out[axis + 1:]
    placed = {st: d for d, st in zip(contiguous_strides(cut), contiguous_strides(out))}   # old stride -> new
    o = output_type(op).shape
    attrs.update(shapes=q.shape + k.shape + v.shape, strides=contiguous_strides(q.shape) + contiguous_strides(k.shape)
                 + contiguous_strides(v.shape), offsets=(0, 0, 0), shape=cut,
                 out_strides=tuple(placed[st] if n != 1 else 0 for n, st in zip(o, attrs["out_strides"])))
    return [np.ascontiguousarray(x) for x in (q, k, v)] + ([mask] if mask is not None else []), attrs
