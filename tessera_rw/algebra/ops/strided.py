"""Copies that read strided views of their operands' storage: what lowering folds a chain of
layout ops into (lower/layout_chains.py), never written by users or rules.

A view of a dense value x is (shape, strides, offset): element i of the view is x's storage at
offset + Σ iₖ·stridesₖ. `strided_copy` writes one view dense; `strided_concatenate` writes several
views, of several operands, one after another along `axis` (the cotangents of q, k and v, each
transposed back from heads, joined into the gradient of their projection); `strided_elementwise`
computes a fused expression over views of its operands, one per operand, each as the result's
shape (a stride of 0 repeats an axis), so the slices it reads are never copied
(lower/view_reads.py); `concatenated_elementwise` is a concatenate of such computations along
`axis`, each piece its own expression over its own views (piece-local coordinates), so a
concatenate an elementwise kernel reads is computed in place rather than copied first
(lower/concat_reads.py).

>>> from tessera_rw.algebra.dtypes import DType
>>> x = np.arange(12.0).reshape(3, 4)
>>> _strided_copy(x, shape=(2, 2), strides=(4, 2), offset=1).tolist()
[[1.0, 3.0], [5.0, 7.0]]
>>> _strided_concatenate(x, x, axis=1, shape=(2, 3), sizes=(1, 2), strides=(4, 1, 1, 4), offsets=(0, 2)).tolist()
[[0.0, 2.0, 6.0], [4.0, 3.0, 7.0]]
>>> _strided_elementwise(x, x, expr="mul($0,$1)", shape=(3, 2), strides=(4, 1, 4, 1),
...                      offsets=(0, 2)).tolist()                       # x[:, :2] * x[:, 2:]
[[0.0, 3.0], [24.0, 35.0], [80.0, 99.0]]
>>> _concatenated_elementwise(x, exprs="neg($0);$0", axis=1, sizes=(2, 2), shape=(3, 4), strides=(4, 1, 4, 1),
...                           offsets=(2, 0)).tolist()                  # cat(-x[:, 2:], x[:, :2]): rotate_half
[[-2.0, -3.0, 0.0, 1.0], [-6.0, -7.0, 4.0, 5.0], [-10.0, -11.0, 8.0, 9.0]]
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.errors import DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.fused_expr import fused, fused_flops, infer_fused
from tessera_rw.algebra.shapes import contiguous_strides, fmt_shape


def check_view(x: TensorType, shape: tuple[int, ...], strides: tuple[int, ...], offset: int,
               signed: bool = False) -> None:
    """Raise ShapeError unless (shape, strides, offset) is a view inside x's storage; `signed` views
    may step backwards (a flip's negative strides, from the offset of the last element)."""
    if len(shape) != len(strides) or any(n < 0 for n in shape) or (not signed and min(strides, default=0) < 0) \
            or offset < 0:
        raise ShapeError(f"a strided view of {fmt_shape(shape)} with strides {strides} at offset {offset} is not "
                         f"one: one stride per dim{'' if signed else ', none negative'}")
    reach = [(n - 1) * s for n, s in zip(shape, strides)]
    first, last = offset + sum(r for r in reach if r < 0), offset + sum(r for r in reach if r > 0)
    if math.prod(shape) and first < 0:
        raise ShapeError(f"a strided view reaching element {first} of a tensor, before its first")
    if math.prod(shape) and last >= x.numel:
        raise ShapeError(f"a strided view reaching element {last} of a tensor of {x.numel}")


def view_of(x: np.ndarray, shape, strides, offset) -> np.ndarray:
    """The strided view of x's storage (read-only)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    if not math.prod(shape):
        return np.empty(shape, x.dtype)
    return np.lib.stride_tricks.as_strided(flat[offset:], shape=shape, strides=[s * flat.itemsize for s in strides],
                                           writeable=False)


def _infer_strided_copy(x: TensorType, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> TensorType:
    check_view(x, shape, strides, offset)
    return TensorType(tuple(shape), x.dtype)


def _strided_copy(x: np.ndarray, shape, strides, offset) -> np.ndarray:
    return view_of(x, shape, strides, offset).copy()


def concatenated_views(shape: tuple[int, ...], axis: int, sizes: tuple[int, ...], strides: tuple[int, ...],
                       offsets: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
    """Each operand's view (shape, strides, offset) of a strided_concatenate."""
    rank = len(shape)
    return [(shape[:axis] + (n,) + shape[axis + 1:], tuple(strides[k * rank:(k + 1) * rank]), off)
            for k, (n, off) in enumerate(zip(sizes, offsets))]


def _infer_strided_concatenate(*xs: TensorType, axis: int, shape: tuple[int, ...], sizes: tuple[int, ...],
                               strides: tuple[int, ...], offsets: tuple[int, ...]) -> TensorType:
    if not 0 <= axis < len(shape) or len(sizes) != len(xs) or len(offsets) != len(xs) \
            or len(strides) != len(xs) * len(shape) or sum(sizes) != shape[axis]:
        raise ShapeError(f"{len(xs)} views of sizes {sizes} along axis {axis} do not make {fmt_shape(shape)}")
    if len({x.dtype for x in xs}) != 1:
        raise DTypeError(f"operands have dtypes {', '.join(str(x.dtype) for x in xs)}")
    for x, view in zip(xs, concatenated_views(shape, axis, sizes, strides, offsets)):
        check_view(x, *view)
    return TensorType(tuple(shape), xs[0].dtype)


def _strided_concatenate(*xs: np.ndarray, axis, shape, sizes, strides, offsets) -> np.ndarray:
    views = concatenated_views(tuple(shape), axis, sizes, strides, offsets)
    return np.concatenate([view_of(x, *view) for x, view in zip(xs, views)], axis=axis)


EXPRESSION_OPS = frozenset({"fused_elementwise", "strided_elementwise"})    # ops computing attrs["expr"]


def slice_of(shape: tuple[int, ...], strides: tuple[int, ...],
             offset: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The starts and steps of the slice of a dense value of `shape` that the view (strides, offset),
    of the same rank, is (a step of 0 repeats one index), or None where it is no slice.

    >>> slice_of((4, 8), (8, 2), 3), slice_of((4, 8), (1, 8), 0)
    (((0, 3), (1, 2)), None)
    """
    dense = contiguous_strides(shape)
    if len(strides) != len(shape) or any(s % c for s, c in zip(strides, dense)):
        return None
    steps = tuple(s // c for s, c in zip(strides, dense))
    starts = tuple((offset // c) % n for c, n in zip(dense, shape))
    return (starts, steps) if sum(a * c for a, c in zip(starts, dense)) == offset else None


def slice_text(shape: tuple[int, ...], view: tuple[int, ...], strides: tuple[int, ...], offset: int) -> str:
    """numpy's spelling of a view of a dense value of `shape` as `view`, where it is a slice: ':' for
    a whole axis, 'a:b' or 'a:b:s' for a part, 'a*' for one index repeated; nothing where it reads
    the whole value (broadcast at most); else the view's shape, strides and offset.

    >>> slice_text((2, 768, 4096), (2, 256, 4096), (3145728, 4096, 1), 2097152), slice_text((8,), (8,), (0,), 3)
    ('[:,512:768,:]', '[3*]')
    >>> slice_text((256, 1), (2, 256, 4096), (0, 1, 0), 0), slice_text((2, 8192), (2, 4096), (8192, 1), 0)
    ('', '[:,0:4096]')
    >>> slice_text((2, 8, 96), (2, 2, 8, 16), (768, 16, 96, 1), 32)     # heads of a projection
    '[view 2x2x8x16 strides (768,16,96,1) +32]'
    """
    lead = len(view) - len(shape)
    whole = (0,) * lead + tuple(0 if n == 1 and m != 1 else c
                                for n, m, c in zip(shape, view[lead:], contiguous_strides(shape)))
    fits = all(n in (1, m) for n, m in zip(shape, view[lead:]))
    if lead >= 0 and fits and tuple(strides) == whole and offset == 0:
        return ""
    found = slice_of(shape, strides, offset)
    if found is None:
        return f"[view {'x'.join(map(str, view))} strides ({','.join(map(str, strides))}) +{offset}]"
    parts = []
    for n, whole, a, step in zip(view, shape, *found):
        if step == 0:
            parts.append(f"{a}*")
        elif (a, step, n) == (0, 1, whole):
            parts.append(":")
        else:
            parts.append(f"{a}:{a + (n - 1) * step + 1}" + (f":{step}" if step != 1 else ""))
    return "[" + ",".join(parts) + "]"


def operand_views(shape: tuple[int, ...], strides: tuple[int, ...],
                  offsets: tuple[int, ...]) -> list[tuple[tuple[int, ...], int]]:
    """Each operand's (strides, offset) of a strided_elementwise, its strides flat in `strides`."""
    rank = len(shape)
    return [(tuple(strides[k * rank:(k + 1) * rank]), off) for k, off in enumerate(offsets)]


def _infer_strided_elementwise(*xs: TensorType, expr: str, shape: tuple[int, ...], strides: tuple[int, ...],
                               offsets: tuple[int, ...]) -> TensorType:
    if len(offsets) != len(xs) or len(strides) != len(xs) * len(shape):
        raise ShapeError(f"{len(xs)} operands read as {fmt_shape(shape)} need {len(xs)} offsets and "
                         f"{len(xs) * len(shape)} strides, not {len(offsets)} and {len(strides)}")
    for x, (st, off) in zip(xs, operand_views(tuple(shape), strides, offsets)):
        check_view(x, tuple(shape), st, off)
    return infer_fused(*(TensorType(tuple(shape), x.dtype) for x in xs), expr=expr)


def _strided_elementwise(*xs: np.ndarray, expr, shape, strides, offsets) -> np.ndarray:
    views = operand_views(tuple(shape), strides, offsets)
    return fused(*(view_of(x, shape, st, off) for x, (st, off) in zip(xs, views)), expr=expr)


def _strided_elementwise_flops(out: TensorType, *xs: TensorType, expr: str, **view) -> int:
    return fused_flops(out, expr=expr)


def piece_shapes(shape: tuple[int, ...], axis: int, sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The shape of each piece of a concatenated_elementwise."""
    return [shape[:axis] + (n,) + shape[axis + 1:] for n in sizes]


def piece_views(nxs: int, shape: tuple[int, ...], axis: int, sizes: tuple[int, ...], strides: tuple[int, ...],
                offsets: tuple[int, ...]) -> list[list[tuple[tuple[int, ...], int]]]:
    """Per piece, each operand's (strides, offset) in the piece's own coordinates."""
    per_piece = nxs * len(shape)
    return [operand_views(tuple(shape), strides[k * per_piece:(k + 1) * per_piece], offsets[k * nxs:(k + 1) * nxs])
            for k in range(len(sizes))]


def _infer_concatenated_elementwise(*xs: TensorType, exprs: str, axis: int, sizes: tuple[int, ...],
                                    shape: tuple[int, ...], strides: tuple[int, ...], offsets: tuple[int, ...],
                                    shared: tuple[int, ...] = ()) -> TensorType:
    pieces = exprs.split(";")
    if shared and (len(shared) != len(xs) or any(not 0 <= j <= i or xs[j] != xs[i] for i, j in enumerate(shared))):
        raise ShapeError(f"shared={shared} must name, per operand, the first of the {len(xs)} operands "
                         "holding the same tensor")
    if not 0 <= axis < len(shape) or len(pieces) != len(sizes) or sum(sizes) != shape[axis] \
            or len(offsets) != len(sizes) * len(xs) or len(strides) != len(offsets) * len(shape):
        raise ShapeError(f"{len(pieces)} pieces of sizes {sizes} along axis {axis} over {len(xs)} operands do not "
                         f"make {fmt_shape(shape)} (one stride per axis and an offset per piece and operand)")
    types = []
    for expr, piece, views in zip(pieces, piece_shapes(tuple(shape), axis, sizes),
                                  piece_views(len(xs), tuple(shape), axis, sizes, strides, offsets)):
        for x, (st, off) in zip(xs, views):
            check_view(x, piece, st, off)
        types.append(infer_fused(*(TensorType(piece, x.dtype) for x in xs), expr=expr).dtype)
    if len(set(types)) != 1:
        raise DTypeError(f"the pieces compute {', '.join(map(str, types))}: a concatenate has one dtype")
    return TensorType(tuple(shape), types[0])


def _concatenated_elementwise(*xs: np.ndarray, exprs, axis, sizes, shape, strides, offsets, shared=()) -> np.ndarray:
    pieces = []
    for expr, piece, views in zip(exprs.split(";"), piece_shapes(tuple(shape), axis, sizes),
                                  piece_views(len(xs), tuple(shape), axis, sizes, strides, offsets)):
        pieces.append(np.broadcast_to(fused(*(view_of(x, piece, st, off) for x, (st, off) in zip(xs, views)),
                                            expr=expr), piece))
    return np.concatenate(pieces, axis=axis)


def _concatenated_elementwise_flops(out: TensorType, *xs: TensorType, exprs: str, axis: int, sizes, **view) -> int:
    per_element = [fused_flops(TensorType((), out.dtype), expr=expr) for expr in exprs.split(";")]
    return sum(f * out.numel // out.shape[axis] * n for f, n in zip(per_element, sizes))


DEFS = (
    OpDef("strided_copy", ("x",), OpKind.LAYOUT, _infer_strided_copy, _strided_copy, exact=True,
          vjp=before_fusion("strided_copy"),
          doc="x's elements at offset + Σ i_k·strides_k, the storage of x read as `shape`: a chain of layout "
              "ops (slice, reshape, transpose, broadcast) in one copy, as lowering folds it"),
    OpDef("strided_concatenate", ("xs",), OpKind.LAYOUT, _infer_strided_concatenate, _strided_concatenate,
          variadic=True, exact=True, vjp=before_fusion("strided_concatenate"),
          doc="strided views of the operands (sizes along axis, strides flat per operand, offsets) one after "
              "another along axis: a concatenate of layout chains in one copy, as lowering folds it"),
    OpDef("strided_elementwise", ("xs",), OpKind.ELEMENTWISE, _infer_strided_elementwise, _strided_elementwise,
          _strided_elementwise_flops, variadic=True, vjp=before_fusion("strided_elementwise"),
          doc="fused_elementwise's expression over strided views of the operands (strides flat per operand, "
              "in the result's rank, 0 where a view repeats; offsets), as lowering reads slices in place"),
    OpDef("concatenated_elementwise", ("xs",), OpKind.ELEMENTWISE, _infer_concatenated_elementwise,
          _concatenated_elementwise, _concatenated_elementwise_flops, variadic=True,
          vjp=before_fusion("concatenated_elementwise"),
          doc="pieces along axis (sizes), each one ';'-separated expression of exprs over strided views of the "
              "operands in its own coordinates (strides flat per piece and operand, offsets per piece and "
              "operand; `shared`: per operand, the first operand holding the same tensor, as a piece reading two "
              "views of one tensor takes it twice): a concatenate computed where an elementwise kernel reads it, "
              "as lowering folds it"),
)
