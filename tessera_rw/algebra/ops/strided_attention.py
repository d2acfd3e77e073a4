"""Attention over strided views: what lowering makes of a flash_attention whose q, k and v are cut
from one projection and whose output is transposed back (lower/attention_views.py), never written
by users or rules.

`q, k, v = transpose(reshape(qkv, (B, S, 3, H, D)), (2, 0, 3, 1, 4))` copies the projection to
bring each head's rows together, and `transpose(attention(q, k, v), (0, 2, 1, 3))` copies the
output back to (B, S, H, D). But an attention kernel loads its rows one at a time, so it can read
q, k and v where the projection wrote them (a row stride of 3·H·D) and write each output row where
the transpose would have put it. strided_attention is flash_attention over such views:

- q, k, v are views (shape, strides, offset) of its first three operands' storage, each of the
  output's rank (leading dims of 1 where it has fewer), `shapes` and `strides` flat per view;
- its result is a dense value of `shape` into which the attention output is written through
  `out_strides`: element (…, i, j) of the attention goes to Σ index·out_strides. Those strides
  permute the dense layout (each element written once), as a transpose's do.

>>> q = np.arange(16.0).reshape(2, 8)                # one row of q|k|v per token: 2 tokens, D = 2
>>> views = dict(shapes=(1, 2, 2, 1, 2, 2, 1, 2, 2), strides=(0, 8, 1, 0, 8, 1, 0, 8, 1), offsets=(0, 2, 4))
>>> y = _strided_attention(q, q, q, scale=0.0, causal=True, has_mask=False, shape=(2, 1, 2),
...                        out_strides=(0, 2, 1), **views)
>>> y.tolist()                                      # token 0 sees itself; token 1 averages both values
[[[4.0, 5.0]], [[8.0, 9.0]]]
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.attention import attention_flops, attention_reference, infer_attention
from tessera_rw.algebra.ops.strided import check_view, view_of
from tessera_rw.algebra.shapes import fmt_shape

View = tuple[tuple[int, ...], tuple[int, ...], int]      # (shape, strides, offset) in elements


def attention_views(shapes: tuple[int, ...], strides: tuple[int, ...], offsets: tuple[int, ...]) -> list[View]:
    """The q, k and v views of a strided_attention, from its flat attributes."""
    rank = len(shapes) // len(offsets)
    return [(tuple(shapes[i * rank:(i + 1) * rank]), tuple(strides[i * rank:(i + 1) * rank]), offset)
            for i, offset in enumerate(offsets)]


def view_types(xs: tuple[TensorType, ...], shapes, strides, offsets) -> tuple[TensorType, ...]:
    """The types of q, k and v as the attention sees them (the mask, when there is one, as it is)."""
    views = attention_views(tuple(shapes), tuple(strides), tuple(offsets))
    return tuple(TensorType(shape, x.dtype) for x, (shape, _, _) in zip(xs, views)) + tuple(xs[3:])


def permutes(shape: tuple[int, ...], out: tuple[int, ...], out_strides: tuple[int, ...]) -> bool:
    """Whether writing a value of shape `out` through `out_strides` fills a dense value of `shape`
    with each element once: its axes, ordered by stride, tile the dense layout.

    >>> permutes((4, 3, 2), (4, 2, 3), (6, 1, 2)), permutes((4, 3, 2), (4, 2, 3), (6, 1, 1))
    (True, False)
    """
    if math.prod(shape) != math.prod(out) or len(out) != len(out_strides):
        return False
    if not math.prod(shape):             # nothing to write
        return True
    step = 1
    for stride, n in sorted((s, n) for n, s in zip(out, out_strides) if n != 1):
        if stride != step:
            return False
        step *= n
    return True


def _infer_strided_attention(*xs: TensorType, scale: float, causal: bool, has_mask: bool, shapes: tuple[int, ...],
                             strides: tuple[int, ...], offsets: tuple[int, ...], shape: tuple[int, ...],
                             out_strides: tuple[int, ...], window: int = 0) -> TensorType:
    if len(xs) != 3 + has_mask or len(offsets) != 3 or len(shapes) != len(strides) or len(shapes) % 3:
        raise ShapeError(f"strided attention reads 3 views (a shape, strides and an offset each) of q, k and v"
                         f"{' and a mask' if has_mask else ''}: {len(xs)} operands, {len(shapes)} view dims, "
                         f"{len(strides)} strides and {len(offsets)} offsets")
    for x, view in zip(xs, attention_views(shapes, strides, offsets)):
        check_view(x, *view)
    out = infer_attention(*view_types(xs, shapes, strides, offsets), scale=scale, causal=causal, has_mask=has_mask,
                          window=window)
    if not permutes(tuple(shape), out.shape, tuple(out_strides)):
        raise ShapeError(f"an attention output of {fmt_shape(out.shape)} written through strides {out_strides} "
                         f"does not fill {fmt_shape(shape)} once")
    return TensorType(tuple(shape), out.dtype)


def viewed(xs: tuple[np.ndarray, ...], shapes, strides, offsets) -> list[np.ndarray]:
    """q, k and v as views of the first three arrays (then the mask, as it is)."""
    return [view_of(x, *view) for x, view in zip(xs, attention_views(shapes, strides, offsets))] + list(xs[3:])


def written_through(o: np.ndarray, shape: tuple[int, ...], out_strides: tuple[int, ...]) -> np.ndarray:
    """A dense array of `shape` holding the attention output `o` where `out_strides` put its elements."""
    flat = np.empty(math.prod(shape), o.dtype)
    np.lib.stride_tricks.as_strided(flat, o.shape, [s * flat.itemsize for s in out_strides])[...] = o
    return flat.reshape(shape)


def _strided_attention(*xs: np.ndarray, scale, causal, has_mask, shapes, strides, offsets, shape,
                       out_strides, window=0) -> np.ndarray:
    o = attention_reference(*viewed(xs, shapes, strides, offsets), scale=scale, causal=causal, has_mask=has_mask,
                            window=window)
    return written_through(o, shape, out_strides)


def _strided_attention_flops(out: TensorType, *xs: TensorType, scale, causal, has_mask, shapes, strides, offsets,
                             shape, out_strides, window=0) -> int:
    q, k, v, *mask = view_types(xs, shapes, strides, offsets)
    o = infer_attention(q, k, v, *mask, scale=scale, causal=causal, has_mask=has_mask, window=window)
    return attention_flops(o, q, k, v, *mask, scale=scale, causal=causal, has_mask=has_mask, window=window)


DEFS = (
    OpDef("strided_attention", ("xs",), OpKind.ATTENTION, _infer_strided_attention, _strided_attention,
          _strided_attention_flops, variadic=True, vjp=before_fusion("strided_attention"),
          doc="flash_attention over strided views of q, k and v (shapes and strides flat per view, in the "
              "output's rank; offsets), its output written into a dense `shape` through out_strides (a "
              "permutation): attention reading a fused projection in place, as lowering folds it"),
)
