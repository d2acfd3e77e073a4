"""The attention backward pass as two fused ops, FlashAttention-2 style: nothing Sq×Sk is stored.

    stats = attention_row_stats(q, k, o, dO)            [..., Sq, 2]: logsumexp of each row of
                                                         scores, and Σ_d dO·O (FA2's D)
    grads = flash_attention_bwd(q, k, v, dO, stats)     [nq + nk + nv]: dQ, dK, dV packed flat

The forward can hand the logsumexp over instead of the row statistics recomputing it:

    fwd = flash_attention_lse(q, k, v)                  [no + 2·rows]: O flat, then each query
                                                         row's logsumexp as a high part (rounded to
                                                         bfloat16's 8 bits), all rows, then the
                                                         remainders, all in O's dtype

    stats = attention_row_stats_from_lse(fwd, dO)       [..., Sq, 2]: (hi + lo, Σ dO·O)

so lse = hi + lo holds some 16 bits in bf16 (19 in fp16); the `gradient` ruleset writes that pair
where the forward and the row statistics of the same attention both exist.

With P = exp(S − lse) recomputed from Q and K block by block, dP = dO Vᵀ and dS = P ∘ (dP − D):
dV = Pᵀ dO, dQ = scale · dS K, dK = scale · dSᵀ Q. The gradients are those of the broadcast
operands (every head of a GQA K/V, every batch of a broadcast one): `dq_dk_dv_shapes` gives their
shapes, and a view of the packed result reads each (the `gradient` ruleset writes exactly that).
Fully masked rows give NaN, as the forward does.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.errors import DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.attention import (attention_flops, attention_of_scores, causal_pairs, expand_kv_heads,
                                              infer_attention, masked_scores)
from tessera_rw.algebra.shapes import fmt_shape

STATS = 2        # per query row: logsumexp of the scaled, masked scores; Σ dO·O


def dq_dk_dv_shapes(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
                    batch: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The shapes of dQ, dK, dV packed in flash_attention_bwd's result, for the attention's batch."""
    return batch + q[-2:], batch + k[-2:], batch + v[-2:]


def stats_dtype(dtype: DType) -> DType:
    """The row statistics are accumulated in float32, or float64 for float64 attention."""
    return DType.float64 if dtype is DType.float64 else DType.float32


def _forward_type(q: TensorType, k: TensorType, v: TensorType, mask: tuple[TensorType, ...],
                  scale: float, causal: bool, has_mask: bool, window: int = 0) -> TensorType:
    return infer_attention(q, k, v, *mask, scale=scale, causal=causal, has_mask=has_mask, window=window)


def _check_like(name: str, got: TensorType, want: TensorType) -> None:
    if got.shape != want.shape:
        raise ShapeError(f"{name} {fmt_shape(got.shape)} differs from the attention output {fmt_shape(want.shape)}",
                         hint=f"{name} is the forward output's shape, batch + (Sq, Dv)")
    if not got.dtype.is_float:
        raise DTypeError(f"{name} must be floating point, got {got.dtype}")


def _infer_stats(q: TensorType, k: TensorType, o: TensorType, do: TensorType, *mask: TensorType,
                 scale: float, causal: bool, has_mask: bool, window: int = 0) -> TensorType:
    # o is the output of attention over (q, k, v) for some v of o's head width: its type checks
    # the rest the way the forward's does
    v = TensorType(k.shape[:-1] + o.shape[-1:], o.dtype)
    out = _forward_type(q, k, v, mask, scale, causal, has_mask, window)
    _check_like("o", o, out)
    _check_like("do", do, out)
    return TensorType(out.shape[:-1] + (STATS,), stats_dtype(promote(out.dtype, do.dtype)))


def _infer_bwd(q: TensorType, k: TensorType, v: TensorType, do: TensorType, stats: TensorType, *mask: TensorType,
               scale: float, causal: bool, has_mask: bool, window: int = 0) -> TensorType:
    out = _forward_type(q, k, v, mask, scale, causal, has_mask, window)
    _check_like("do", do, out)
    if stats.shape != out.shape[:-1] + (STATS,) or not stats.dtype.is_float:
        raise ShapeError(f"stats {stats} should be float {fmt_shape(out.shape[:-1] + (STATS,))}",
                         hint="pass attention_row_stats(q, k, o, do) of the same attention")
    shapes = dq_dk_dv_shapes(q.shape, k.shape, v.shape, out.shape[:-2])
    return TensorType((sum(math.prod(s) for s in shapes),), promote(out.dtype, do.dtype))


def _infer_lse(q: TensorType, k: TensorType, v: TensorType, *mask: TensorType,
               scale: float, causal: bool, has_mask: bool, window: int = 0) -> TensorType:
    out = _forward_type(q, k, v, mask, scale, causal, has_mask, window)
    return TensorType((lse_length(out.shape),), out.dtype)


def lse_length(out_shape: tuple[int, ...]) -> int:
    """flash_attention_lse's length for an output of `out_shape`: O, then two values per row."""
    return math.prod(out_shape) + 2 * math.prod(out_shape[:-1])


FP16_MAX = 65504.0


def split_lse(lse: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """lse as two values of `dtype`: lse rounded to bfloat16 (exact in any wider float type, so
    the split is the same whatever type the reference computes in) and what that leaves, rounded
    to `dtype`; an infinite lse leaves nothing. In float16 a finite high part saturates at ±65504
    (a padded row under a finfo.min mask reaches it), the remainder taking the rest."""
    hi = lse.astype(ml_dtypes.bfloat16).astype(lse.dtype)
    if np.dtype(dtype) == np.float16:
        hi = np.where(np.isfinite(hi), np.clip(hi, -FP16_MAX, FP16_MAX), hi)
    with np.errstate(invalid="ignore"):
        lo = np.where(np.isfinite(lse), lse - hi, 0)
    return hi.astype(dtype), lo.astype(dtype)


def attention_lse_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, *mask: np.ndarray,
                            scale: float, causal: bool, has_mask: bool, window: int = 0) -> np.ndarray:
    scores = masked_scores(q, k, mask, scale, causal, window)
    out = attention_of_scores(scores, v, q)
    lse = np.broadcast_to(logsumexp_rows(scores), out.shape[:-1])
    hi, lo = split_lse(lse, out.dtype)
    return np.concatenate([out.ravel(), hi.ravel(), lo.ravel()])


def _infer_stats_from_lse(fwd: TensorType, do: TensorType) -> TensorType:
    if do.ndim < 2 or not (fwd.dtype.is_float and do.dtype.is_float):
        raise ShapeError(f"takes a float flash_attention_lse result and a float dO [..., Sq, Dv], got {fwd}, {do}")
    if fwd.shape != (lse_length(do.shape),):
        raise ShapeError(f"fwd {fwd} is not flash_attention_lse's result for an output like dO {do}",
                         hint=f"pass flash_attention_lse(q, k, v) of length {lse_length(do.shape)}")
    return TensorType(do.shape[:-1] + (STATS,), stats_dtype(promote(fwd.dtype, do.dtype)))


def stats_from_lse_reference(fwd: np.ndarray, do: np.ndarray) -> np.ndarray:
    n, rows = do.size, do.size // do.shape[-1]
    o = fwd[:n].reshape(do.shape)
    lse = (fwd[n:n + rows] + fwd[n + rows:]).reshape(do.shape[:-1])
    d = np.sum(do * o, axis=-1)
    return np.stack([lse, d], axis=-1).astype(np.result_type(lse, d))


def _stats_from_lse_flops(out: TensorType, fwd: TensorType, do: TensorType) -> int:
    return 2 * do.numel + out.numel


def logsumexp_rows(s: np.ndarray) -> np.ndarray:
    """log Σ_j exp(s_ij) per row; −∞ for a row with every score −∞."""
    m = np.max(s, axis=-1)
    safe = np.where(np.isneginf(m), 0, m)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.sum(np.exp(s - safe[..., None]), axis=-1))


def row_stats_reference(q: np.ndarray, k: np.ndarray, o: np.ndarray, do: np.ndarray, *mask: np.ndarray,
                        scale: float, causal: bool, has_mask: bool, window: int = 0) -> np.ndarray:
    lse = logsumexp_rows(masked_scores(q, k, mask, scale, causal, window))
    d = np.sum(do * o, axis=-1)
    lse, d = np.broadcast_arrays(lse, d)
    return np.stack([lse, d], axis=-1).astype(np.result_type(lse, d))


def bwd_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, stats: np.ndarray, *mask: np.ndarray,
                  scale: float, causal: bool, has_mask: bool, window: int = 0) -> np.ndarray:
    s = masked_scores(q, k, mask, scale, causal, window)
    if q.ndim >= 3:
        k, v = expand_kv_heads(k, q.shape[-3]), expand_kv_heads(v, q.shape[-3])
    batch = do.shape[:-2]
    k, v, q = (np.broadcast_to(a, batch + a.shape[-2:]) for a in (k, v, q))
    with np.errstate(invalid="ignore"):
        p = np.exp(s - stats[..., 0:1])
        dp = np.matmul(do, np.swapaxes(v, -1, -2))
        ds = p * (dp - stats[..., 1:2])
    c = np.asarray(scale, ds.dtype)
    dq = np.matmul(ds, k) * c
    dk = np.matmul(np.swapaxes(ds, -1, -2), q) * c
    dv = np.matmul(np.swapaxes(p, -1, -2), do)
    return np.concatenate([dq.ravel(), dk.ravel(), dv.ravel()])


def _lse_flops(out: TensorType, q: TensorType, k: TensorType, v: TensorType, *mask: TensorType,
               scale: float, causal: bool, has_mask: bool, window: int = 0) -> int:
    o = _forward_type(q, k, v, mask, scale, causal, has_mask, window)
    return attention_flops(o, q, k, v, *mask, scale=scale, causal=causal, has_mask=has_mask, window=window)


def _pairs(out_batch: tuple[int, ...], sq: int, sk: int, causal: bool, window: int) -> float:
    return math.prod(out_batch) * (causal_pairs(sq, sk, window) if causal else sq * sk)


def _stats_flops(out: TensorType, q: TensorType, k: TensorType, o: TensorType, do: TensorType, *mask: TensorType,
                 scale: float, causal: bool, has_mask: bool, window: int = 0) -> int:
    pairs = _pairs(out.shape[:-2], q.shape[-2], k.shape[-2], causal, window)
    return int(pairs * (2 * q.shape[-1] + 4) + 2 * o.numel)


def _bwd_flops(out: TensorType, q: TensorType, k: TensorType, v: TensorType, do: TensorType, stats: TensorType,
               *mask: TensorType, scale: float, causal: bool, has_mask: bool, window: int = 0) -> int:
    # the five products (S, dP, dV, dQ, dK) and exp, subtract, multiply per score
    pairs = _pairs(do.shape[:-2], q.shape[-2], k.shape[-2], causal, window)
    return int(pairs * (6 * q.shape[-1] + 4 * v.shape[-1] + 4))


DEFS = (
    OpDef("flash_attention_lse", ("q", "k", "v", "mask"), OpKind.ATTENTION, _infer_lse, attention_lse_reference,
          _lse_flops, variadic=True, vjp=before_fusion("flash_attention_lse"),
          doc="flash_attention's output flat, then each query row's logsumexp as a high part and a remainder"),
    OpDef("attention_row_stats_from_lse", ("fwd", "do"), OpKind.ATTENTION, _infer_stats_from_lse,
          stats_from_lse_reference, _stats_from_lse_flops, vjp=before_fusion("attention_row_stats_from_lse"),
          doc="attention_row_stats read off flash_attention_lse's result: (hi + lo, Σ dO·O) per row"),
    OpDef("attention_row_stats", ("q", "k", "o", "do", "mask"), OpKind.ATTENTION, _infer_stats,
          row_stats_reference, _stats_flops, variadic=True, vjp=before_fusion("attention_row_stats"),
          doc="per query row: logsumexp of scale·QKᵀ (+mask, causal) and Σ dO·O, the attention backward's inputs"),
    OpDef("flash_attention_bwd", ("q", "k", "v", "do", "stats", "mask"), OpKind.ATTENTION, _infer_bwd,
          bwd_reference, _bwd_flops, variadic=True, vjp=before_fusion("flash_attention_bwd"),
          doc="dQ, dK, dV of flash_attention packed flat, with P recomputed block by block"),
)
