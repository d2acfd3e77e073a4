"""The attention backward's ops over strided views: what lowering makes of flash_attention_lse,
flash_attention_bwd and attention_row_stats_from_lse when q, k, v or dO are copies of views
(lower/attention_views.py), never written by users or rules.

A training step's q, k and v are cut from one projection and read by the forward with logsumexp
and by the backward; dO arrives with the heads side by side and is read by the row statistics
and the backward. Each strided form is its base op over views (shape, strides, offset) of the
storage of the operands its kernels read row by row (VIEWED_OPERANDS), `shapes` and `strides` flat
per view, every view of one rank; the other operands and the result are as the base op's but
where a Layout's attributes say otherwise (each () by default):

- strided_attention_lse's `o_strides`: O written with the heads side by side, where the output
  projection reads it, its logsumexps after it as before; strided_attention_row_stats_from_lse's
  `o_strides`: O read there;
- strided_attention_bwd's `shape`: dQ, dK and dV written through `out_strides` and `out_offsets`
  into a dense value of that shape, side by side along one axis (the gradient of the projection
  they were cut from), where flash_attention_bwd packs them one after another.

>>> x = np.arange(8.0).reshape(2, 4)                # dO's rows, every other pair of x's values
>>> fwd = np.concatenate([np.ones(4), np.zeros(2), np.zeros(2)])
>>> from tessera_rw.algebra.ops import OPS
>>> OPS["strided_attention_row_stats_from_lse"].reference(
...     fwd, x, shapes=(2, 2), strides=(4, 1), offsets=(0,)).tolist()
[[0.0, 1.0], [0.0, 9.0]]
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef
from tessera_rw.algebra.ops import attention_backward
from tessera_rw.algebra.ops.attention import infer_attention
from tessera_rw.algebra.ops.attention_backward import dq_dk_dv_shapes, lse_length
from tessera_rw.algebra.ops.strided import check_view, view_of
from tessera_rw.algebra.ops.strided_attention import attention_views, permutes
from tessera_rw.algebra.shapes import fmt_shape

# base op -> (its strided form, the operands that form reads through views)
VIEWED_OPERANDS: dict[str, tuple[str, tuple[int, ...]]] = {
    "flash_attention_lse": ("strided_attention_lse", (0, 1, 2)),
    "flash_attention_bwd": ("strided_attention_bwd", (0, 1, 2, 3)),
    "attention_row_stats_from_lse": ("strided_attention_row_stats_from_lse", (1,)),
}
VIEW_ATTRS = ("shapes", "strides", "offsets")
WRITE_ATTRS = ("shape", "out_strides", "out_offsets")     # strided_attention_bwd's gradients' layout


def base_op(name: str) -> str | None:
    """The op a strided form computes over its views (None for any other op)."""
    return next((base for base, (form, _) in VIEWED_OPERANDS.items() if form == name), None)


def viewed_operands(name: str) -> tuple[int, ...]:
    """Which operands the strided form `name` reads through its views."""
    return VIEWED_OPERANDS[base_op(name)][1]


def with_views(name: str, xs: tuple, views: list) -> tuple:
    """`xs` with the viewed operands of the strided form `name` replaced by `views`."""
    replaced = dict(zip(viewed_operands(name), views))
    return tuple(replaced.get(i, x) for i, x in enumerate(xs))


def viewed_types(name: str, xs: tuple[TensorType, ...], shapes, strides, offsets) -> tuple[TensorType, ...]:
    """The operand types the strided form `name` computes on: its views' where it reads views."""
    views = attention_views(tuple(shapes), tuple(strides), tuple(offsets))
    indices = viewed_operands(name)
    return with_views(name, xs, [TensorType(shape, xs[i].dtype) for i, (shape, _, _) in zip(indices, views)])


def viewed_arrays(name: str, xs: tuple[np.ndarray, ...], shapes, strides, offsets) -> tuple[np.ndarray, ...]:
    """The arrays the strided form `name` computes on: views of its viewed operands' storage."""
    views = attention_views(tuple(shapes), tuple(strides), tuple(offsets))
    return with_views(name, xs, [view_of(xs[i], *view) for i, view in zip(viewed_operands(name), views)])


def gradient_writes(shape, out_strides, out_offsets) -> list[tuple[tuple[int, ...], int]] | None:
    """Where strided_attention_bwd writes dQ, dK and dV: (strides, offset) each in its dense result
    of `shape`, or None where it writes them packed, as flash_attention_bwd does."""
    if not shape:
        return None
    rank = len(out_strides) // len(out_offsets)
    return [(tuple(out_strides[i * rank:(i + 1) * rank]), offset) for i, offset in enumerate(out_offsets)]


def _check_gradient_writes(grads: tuple[tuple[int, ...], ...], shape, out_strides, out_offsets) -> None:
    """Raise unless dQ, dK and dV of shapes `grads`, written through their strides from their
    offsets, fill a dense `shape` once each: side by side along an axis of stride `step` from
    offsets 0, step and 2·step, one layout (a training step's q|k|v projection gradient), or each
    in its own run of a flat `shape`, where flash_attention_bwd packs it, laid out by its strides
    (dQ with the heads side by side, for the q projection's gradient)."""
    writes = gradient_writes(shape, out_strides, out_offsets) if len(out_offsets) == 3 else None
    if writes is None or len(out_strides) % 3 or any(len(w) != len(g) for g, (w, _) in zip(grads, writes)):
        raise ShapeError(f"strided_attention_bwd writes dQ, dK and dV (strides and an offset each) into {shape}: "
                         f"{len(out_strides)} strides and {len(out_offsets)} offsets")
    step, strides = out_offsets[1], writes[0][0]
    side_by_side = (len(set(grads)) == 1 and len({w for w, _ in writes}) == 1
                    and tuple(out_offsets) == (0, step, 2 * step)
                    and permutes(tuple(shape), (3,) + grads[0], (step,) + strides))
    sizes = [math.prod(g) for g in grads]
    own_runs = (tuple(shape) == (sum(sizes),) and tuple(out_offsets) == (0, sizes[0], sizes[0] + sizes[1])
                and all(permutes((n,), g, w) for n, g, (w, _) in zip(sizes, grads, writes)))
    if not (side_by_side or own_runs):
        raise ShapeError(f"dQ, dK and dV of {', '.join(map(fmt_shape, grads))} written through strides "
                         f"{out_strides} from offsets {out_offsets} do not fill {fmt_shape(shape)} once each")


def write_gradients(packed: np.ndarray, grads: tuple[tuple[int, ...], ...], shape, out_strides,
                    out_offsets) -> np.ndarray:
    """flash_attention_bwd's packed dQ, dK, dV written into a dense array of `shape` where
    strided_attention_bwd's strides and offsets put them."""
    flat, at = np.empty(math.prod(shape), packed.dtype), 0
    for grad, (strides, offset) in zip(grads, gradient_writes(shape, out_strides, out_offsets)):
        n = math.prod(grad)
        np.lib.stride_tricks.as_strided(flat[offset:], grad, [st * flat.itemsize for st in strides])[...] = \
            packed[at:at + n].reshape(grad)
        at += n
    return flat.reshape(shape)


def gradient_shapes(xs: tuple) -> tuple[tuple[int, ...], ...]:
    """The shapes of dQ, dK and dV of a backward over q, k, v and dO (`xs`, types or arrays)."""
    q, k, v, do = xs[:4]
    return dq_dk_dv_shapes(q.shape, k.shape, v.shape, do.shape[:-2])


def _o_block(fwd_length: int, o_shape: tuple[int, ...], o_strides) -> None:
    """Raise unless O of `o_shape` through `o_strides` fills the first elements of a
    flash_attention_lse result of `fwd_length` once each."""
    if fwd_length != lse_length(o_shape) or not permutes((math.prod(o_shape),), o_shape, tuple(o_strides)):
        raise ShapeError(f"O of {fmt_shape(o_shape)} through strides {tuple(o_strides)} does not fill the first "
                         f"{math.prod(o_shape)} elements of a flash_attention_lse result of {fwd_length} once")


def with_o_strides(fwd: np.ndarray, o_shape: tuple[int, ...], o_strides, dense: bool) -> np.ndarray:
    """A flash_attention_lse result with O laid out by `o_strides` (dense=False: from a dense
    one) or dense again (dense=True: from one laid out so); the logsumexps stay where they are."""
    n = math.prod(o_shape)
    out = np.array(fwd)
    laid = np.lib.stride_tricks.as_strided(out[:n], o_shape, [st * out.itemsize for st in o_strides])
    if dense:
        out[:n] = np.array(laid).ravel()
    else:
        laid[...] = fwd[:n].reshape(o_shape)
    return out


@dataclass(frozen=True)
class Layout:
    """What a strided form lays out otherwise than its base op, by attributes of its own (each ()
    where the base op's layout holds): `check` raises where the result type of the base op over
    the views (`out`) cannot be laid out so and gives the form's; `operands` gives the arrays as the
    base op takes them; `result` lays the base op's result out as the form does. Each takes the
    views' types or arrays, the base op's attributes and then the form's own."""
    attrs: tuple[str, ...] = ()
    check: Callable[..., TensorType] = lambda types, out, attrs, **own: out
    operands: Callable[..., tuple] = lambda arrays, attrs, **own: arrays
    result: Callable[..., np.ndarray] = lambda arrays, out, attrs, **own: out


def _o_shape(xs: tuple, attrs: dict) -> tuple[int, ...]:
    """The attention output's shape of flash_attention_lse's q, k, v (and mask), types or arrays."""
    types = tuple(x if isinstance(x, TensorType) else TensorType(x.shape, DType.parse(x.dtype)) for x in xs)
    return infer_attention(*types, **attrs).shape


def _lse_check(types, out, attrs, o_strides=()) -> TensorType:
    if o_strides:
        _o_block(out.numel, _o_shape(types, attrs), o_strides)
    return out


def _lse_result(arrays, out, attrs, o_strides=()) -> np.ndarray:
    return with_o_strides(out, _o_shape(arrays, attrs), o_strides, dense=False) if o_strides else out


def _stats_check(types, out, attrs, o_strides=()) -> TensorType:
    if o_strides:
        _o_block(types[0].numel, types[1].shape, o_strides)
    return out


def _stats_operands(arrays, attrs, o_strides=()) -> tuple:
    fwd, do = arrays
    return (with_o_strides(fwd, do.shape, o_strides, dense=True), do) if o_strides else arrays


def _bwd_check(types, out, attrs, shape=(), out_strides=(), out_offsets=()) -> TensorType:
    if not shape:
        return out
    _check_gradient_writes(gradient_shapes(types), shape, out_strides, out_offsets)
    return TensorType(tuple(shape), out.dtype)


def _bwd_result(arrays, out, attrs, shape=(), out_strides=(), out_offsets=()) -> np.ndarray:
    return write_gradients(out, gradient_shapes(arrays), shape, out_strides, out_offsets) if shape else out


LAYOUTS = {
    # the forward writes O with the heads side by side (o_strides), where the output projection reads it
    "flash_attention_lse": Layout(("o_strides",), _lse_check, result=_lse_result),
    # ... and the row statistics read it there
    "attention_row_stats_from_lse": Layout(("o_strides",), _stats_check, operands=_stats_operands),
    # the backward writes dQ, dK and dV side by side as the projection's gradient
    "flash_attention_bwd": Layout(WRITE_ATTRS, _bwd_check, result=_bwd_result),
}


def form_attrs(name: str) -> tuple[str, ...]:
    """The attributes the strided form `name` adds to its base op's: its views', its layout's."""
    return VIEW_ATTRS + LAYOUTS[base_op(name)].attrs


def on_views(name: str, kernel: Callable[..., np.ndarray], xs: tuple[np.ndarray, ...], attrs: dict) -> np.ndarray:
    """The strided form `name` over the arrays `xs` with its attributes `attrs`, computed by
    `kernel`, a function of its base op's operands and attributes (the base op's reference, or a
    host kernel of it), on the views and laid out as the form's Layout says."""
    layout = LAYOUTS[base_op(name)]
    own = {a: attrs[a] for a in layout.attrs if a in attrs}
    rest = {a: v for a, v in attrs.items() if a not in VIEW_ATTRS + layout.attrs}
    arrays = viewed_arrays(name, tuple(xs), attrs["shapes"], attrs["strides"], attrs["offsets"])
    return layout.result(arrays, kernel(*layout.operands(arrays, rest, **own), **rest), rest, **own)


def _strided_form(base: OpDef, name: str, viewed: tuple[int, ...]) -> OpDef:
    """`base` over views of its operands `viewed`: the same attributes, then shapes, strides,
    offsets, then its Layout's own attributes."""
    layout = LAYOUTS[base.name]

    def split(attrs: dict) -> tuple[dict, dict]:
        own = {a: attrs.pop(a) for a in layout.attrs if a in attrs}
        return attrs, own

    def infer(*xs: TensorType, shapes, strides, offsets, **attrs) -> TensorType:
        if len(xs) <= max(viewed) or len(offsets) != len(viewed) or len(shapes) != len(strides) \
                or len(shapes) % len(viewed):
            raise ShapeError(f"{name} reads {len(viewed)} views (a shape, strides and an offset each, of one rank): "
                             f"{len(xs)} operands, {len(shapes)} view dims, {len(strides)} strides and "
                             f"{len(offsets)} offsets")
        for i, view in zip(viewed, attention_views(tuple(shapes), tuple(strides), tuple(offsets))):
            check_view(xs[i], *view)
        attrs, own = split(attrs)
        types = viewed_types(name, xs, shapes, strides, offsets)
        return layout.check(types, base.infer(*types, **attrs), attrs, **own)

    def reference(*xs: np.ndarray, **attrs) -> np.ndarray:
        return on_views(name, base.reference, xs, attrs)

    def flops(out: TensorType, *xs: TensorType, shapes, strides, offsets, **attrs) -> int:
        attrs, _ = split(attrs)
        return base.flops(out, *viewed_types(name, xs, shapes, strides, offsets), **attrs)

    # the attribute names OpDef reads off the shape rule's signature: the base op's, the views', the layout's
    kw = inspect.Parameter.KEYWORD_ONLY
    infer.__signature__ = inspect.Signature(
        [inspect.Parameter("xs", inspect.Parameter.VAR_POSITIONAL)]
        + [inspect.Parameter(a, kw, default=base.attr_defaults.get(a, inspect.Parameter.empty))
           for a in base.attr_names] + [inspect.Parameter(a, kw) for a in VIEW_ATTRS]
        + [inspect.Parameter(a, kw, default=()) for a in layout.attrs])
    return OpDef(name, ("xs",), base.kind, infer, reference, flops, variadic=True, vjp=before_fusion(name),
                 doc=f"{base.name} reading operands {', '.join(base.operands[i] for i in viewed)} through strided "
                     f"views (shapes and strides flat per view, offsets), laying out ({', '.join(layout.attrs)}) "
                     "otherwise where given: the backward reading and writing a fused projection in place, as "
                     "lowering folds it")


_BASES = {d.name: d for d in attention_backward.DEFS}
DEFS = tuple(_strided_form(_BASES[base], form, viewed) for base, (form, viewed) in VIEWED_OPERANDS.items())
