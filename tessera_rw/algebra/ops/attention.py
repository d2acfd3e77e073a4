"""flash_attention as an explicit op: softmax(scale · Q Kᵀ [+ mask] [causal]) V.

q (..., Sq, D), k (..., Sk, D), v (..., Sk, Dv). Batch dims broadcast; on the head axis (-3) K/V
may have fewer heads than Q when they divide it (grouped-query / multi-query attention). A bool
mask keeps where True (torch semantics); a float mask is added to the scores. `causal` keeps the
lower triangle aligned top-left, as torch's SDPA does; a `window` of W > 0 narrows it to a band,
query i seeing keys i − W + 1 … i (sliding-window attention, FlashAttention's window_size=(W − 1, 0)).
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import unbroadcast
from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.errors import AttributeValueError, DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.shapes import broadcast_shapes, fmt_shape
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs


def shares_heads(q_heads: int, kv_heads: int) -> bool:
    """Whether each of `kv_heads` K/V heads serves a group of the `q_heads` Q heads (GQA), rather than
    one side broadcasting over the other (a head axis of 1, on either side).

    >>> shares_heads(8, 2), shares_heads(8, 8), shares_heads(1, 4), shares_heads(8, 1)
    (True, False, False, False)
    """
    return kv_heads not in (1, q_heads) and q_heads % kv_heads == 0


def _kv_batch(q_batch: tuple[int, ...], kv_batch: tuple[int, ...], name: str) -> tuple[int, ...]:
    """kv's batch dims as seen by q: the head axis may divide q's (GQA) instead of broadcasting."""
    if len(q_batch) >= 1 and len(kv_batch) >= 1:
        hq, hk = q_batch[-1], kv_batch[-1]
        if shares_heads(hq, hk):
            kv_batch = kv_batch[:-1] + (hq,)
    try:
        return broadcast_shapes(q_batch, kv_batch)
    except ShapeError:
        raise ShapeError(f"{name}'s batch dims {fmt_shape(kv_batch)} do not fit q's {fmt_shape(q_batch)}",
                         hint="K/V heads must equal Q heads, divide them (GQA), or be 1") from None


def infer_attention(q: TensorType, k: TensorType, v: TensorType, *mask: TensorType,
           scale: float, causal: bool, has_mask: bool, window: int = 0) -> TensorType:
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise AttributeValueError(f"window must be an int >= 1 (or 0 for none), got {window!r}")
    if window and not causal:
        raise AttributeValueError(f"a window of {window} counts keys back from each query's own; it needs causal=True",
                                  hint="pass causal=True with the window, or give a two-sided band as a bool mask")
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ShapeError("q, k and v need rank >= 2 (..., seq, head_dim)")
    for t in (q, k, v):
        if not t.dtype.is_float:
            raise DTypeError(f"takes floating-point q, k, v, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"q head_dim {q.shape[-1]} differs from k head_dim {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"k has {k.shape[-2]} keys but v has {v.shape[-2]} values")
    batch = _kv_batch(q.shape[:-2], k.shape[:-2], "k")
    batch = _kv_batch(batch, v.shape[:-2], "v")
    sq, sk = q.shape[-2], k.shape[-2]
    if len(mask) != has_mask:
        raise ShapeError("the mask operand and has_mask disagree")
    if mask:
        m = mask[0]
        if not (m.dtype is DType.bool or m.dtype.is_float):
            raise DTypeError(f"the mask must be bool (keep where True) or float (added), got {m.dtype}")
        try:
            full = broadcast_shapes(m.shape, batch + (sq, sk))
        except ShapeError:
            full = None
        if full != batch + (sq, sk):
            raise ShapeError(f"mask {fmt_shape(m.shape)} does not broadcast to the scores "
                             f"{fmt_shape(batch + (sq, sk))}")
    return TensorType(batch + (sq, v.shape[-1]), promote(promote(q.dtype, k.dtype), v.dtype))


def expand_kv_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """Repeat each K/V head for the Q heads that share it (GQA); a Q head axis of 1 broadcasts instead."""
    if x.ndim >= 3 and shares_heads(heads, x.shape[-3]):
        return np.repeat(x, heads // x.shape[-3], axis=-3)
    return x


def causal_keep(sq: int, sk: int, window: int = 0) -> np.ndarray:
    """The (query, key) pairs causality keeps, aligned top-left: key j <= i, and j > i − W under a
    window of W.

    >>> causal_keep(4, 4, window=2).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    return causal_keep_at(np.arange(sq), np.arange(sk), window)


def causal_keep_at(queries: np.ndarray, keys: np.ndarray, window: int = 0) -> np.ndarray:
    """causal_keep's rows `queries` and columns `keys` (absolute indices): a block of it, or the
    rows of a subset of queries."""
    i, j = queries[:, None], keys[None, :]
    return (j <= i) & (j > i - window) if window else j <= i


def causal_pairs(sq: int, sk: int, window: int = 0) -> float:
    """How many (query, key) pairs a causal attention scores: half of them (the triangle), or
    under a window of W each row's last min(W, i + 1) keys, counted exactly."""
    if not window:
        return 0.5 * sq * sk
    rows = np.arange(sq)
    return float(np.maximum(0, np.minimum(rows + 1, sk) - np.maximum(0, rows - window + 1)).sum())


def masked_scores(q: np.ndarray, k: np.ndarray, mask: tuple[np.ndarray, ...], scale: float,
                  causal: bool, window: int = 0) -> np.ndarray:
    """scale · Q Kᵀ with the mask applied (−∞ where not kept), heads of K expanded: every score."""
    if q.ndim >= 3:
        k = expand_kv_heads(k, q.shape[-3])
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(scale, q.dtype)
    keep = causal_keep(*s.shape[-2:], window) if causal else None
    if mask and mask[0].dtype == np.bool_:
        keep = mask[0] if keep is None else keep & mask[0]
    elif mask:
        s = s + mask[0]
    return s if keep is None else np.where(keep, s, -np.inf)


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, *mask: np.ndarray,
                        scale: float, causal: bool, has_mask: bool, window: int = 0) -> np.ndarray:
    """The materialized form: every score in memory at once."""
    return attention_of_scores(masked_scores(q, k, mask, scale, causal, window), v, q)


def attention_of_scores(s: np.ndarray, v: np.ndarray, q: np.ndarray) -> np.ndarray:
    """softmax(s) v over the scores masked_scores gave for `q`, V's heads expanded to q's."""
    if q.ndim >= 3:
        v = expand_kv_heads(v, q.shape[-3])
    with np.errstate(invalid="ignore"):  # a fully masked row is NaN, as in torch's math SDPA
        s = s - np.max(s, axis=-1, keepdims=True, initial=-np.inf)   # no keys: P is empty, P V zeros
        p = np.exp(s)
        p /= np.sum(p, axis=-1, keepdims=True)
    return np.matmul(p, v)


def attention_flops(out: TensorType, q: TensorType, k: TensorType, v: TensorType, *mask: TensorType,
           scale: float, causal: bool, has_mask: bool, window: int = 0) -> int:
    batch = math.prod(out.shape[:-2])
    sq, sk = q.shape[-2], k.shape[-2]
    pairs = batch * (causal_pairs(sq, sk, window) if causal else sq * sk)
    return int(pairs * (2 * q.shape[-1] + 2 * v.shape[-1] + 5))


# ---- VJP ---------------------------------------------------------------------------------------
#
# Written at the graph level, in exactly the form reverse mode gives softmax(scale · Q Kᵀ + M) V
# spelled out: the probabilities are recomputed from q and k (nothing is saved from the forward
# pass), then dV = Pᵀ dO, dP = dO Vᵀ, dS = P (dP - Σ dP·P), dQ = (scale dS) K, dK = Qᵀ (scale dS)
# transposed. Hand-written attention and op.flash_attention thus differentiate to one graph, which
# the `gradient` ruleset fuses into attention_row_stats + flash_attention_bwd. K/V heads shared by
# several Q heads (GQA) are repeated going forward and their cotangents summed back.

def _repeat_heads(t, heads: int):
    if t.ndim < 3 or not shares_heads(heads, t.shape[-3]):
        return t
    kv = t.shape[-3]
    lead, tail = t.shape[:-3], t.shape[-2:]
    spread = api.broadcast_to(api.reshape(t, lead + (kv, 1) + tail), lead + (kv, heads // kv) + tail)
    return api.reshape(spread, lead + (heads,) + tail)


def _sum_repeats(ct, like):
    """The cotangent of a K/V that `_repeat_heads` spread over the Q heads, summed back to it."""
    if like.ndim >= 3 and ct.ndim >= 3 and shares_heads(ct.shape[-3], like.shape[-3]):
        kv, heads = like.shape[-3], ct.shape[-3]
        ct = api.sum(api.reshape(ct, ct.shape[:-3] + (kv, heads // kv) + ct.shape[-2:]), axis=-3)
    return unbroadcast(ct, like)


def explicit_attention_grads(q, k, v, g, scale: float, mask=None, causal: bool = False, window: int = 0):
    """dQ, dK, dV and dS of softmax(scale · q kᵀ [+ mask] [causal [window]]) v for the output
    cotangent g, as graph ops (a bool mask keeps where True): the form the `gradient` ruleset
    recognizes, a window spelled out as the band tril(1) ∧ ¬tril(1, −W)."""
    kt = k.mT
    s = (q @ kt) * scale
    ones = api.full(s.shape[-2:], True, "bool")
    keep = api.tril(ones) if causal else None
    if causal and window:
        keep = keep & ~api.tril(ones, k=-window)
    if mask is not None and mask.dtype is DType.bool:
        keep = mask if keep is None else keep & mask
    elif mask is not None:
        s = s + mask
    if keep is not None:
        s = api.where(keep, s, float("-inf"))
    p = api.softmax(s, axis=-1)
    dp = g @ v.mT
    ds = p * (dp - api.sum(dp * p, axis=-1, keepdims=True))
    scaled = ds * scale
    return scaled @ kt.mT, (q.mT @ scaled).mT, p.mT @ g, ds


def _attention_vjp(g, out, q, k, v, *mask, scale, causal, has_mask, window=0):
    heads = q.shape[-3] if q.ndim >= 3 else 1
    dq, dk, dv, ds = explicit_attention_grads(q, _repeat_heads(k, heads), _repeat_heads(v, heads), g, scale,
                                              mask[0] if mask else None, causal, window)
    dmask = () if not mask else (None,) if mask[0].dtype is DType.bool else (unbroadcast(ds, mask[0]),)
    return (unbroadcast(dq, q), _sum_repeats(dk, k), _sum_repeats(dv, v), *dmask)


DEFS = (
    OpDef("flash_attention", ("q", "k", "v", "mask"), OpKind.ATTENTION, infer_attention, attention_reference, attention_flops,
          variadic=True, vjp=_attention_vjp),
)
