"""Flash attention on the host, block by block, in memory bounded by the block sizes.

The same online softmax the CUDA kernel runs: for each block of queries, walk the key blocks
keeping a running row maximum `m`, the running sum of exponentials `l` and the unnormalized output;
scores for all (query, key) pairs never exist at once, so S=32768 attention runs in a few MB.
Fully masked rows come out NaN, as in the materialized reference and torch's math SDPA.

>>> import numpy as np
>>> from tessera_rw.algebra.ops.attention import attention_reference
>>> rng = np.random.default_rng(0)
>>> q, k, v = (rng.standard_normal((2, 300, 64)).astype(np.float32) for _ in range(3))
>>> out = flash_attention_blockwise(q, k, v, scale=0.125, causal=True, block_q=64, block_k=96)
>>> bool(np.allclose(out, attention_reference(q, k, v, scale=0.125, causal=True, has_mask=False), atol=1e-5))
True
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.ops.attention import causal_keep_at, expand_kv_heads
from tessera_rw.algebra.ops.attention_backward import split_lse
from tessera_rw.codegen.blas_threads import one_blas_thread

BLOCK_Q = 128
BLOCK_K = 128


def flash_attention_blockwise(q: np.ndarray, k: np.ndarray, v: np.ndarray, *mask: np.ndarray, scale: float,
                              causal: bool = False, has_mask: bool = False, window: int = 0,
                              block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> np.ndarray:
    """softmax(scale·q kᵀ [+ mask], causal [window]) v over (..., S, D) arrays, in float64 arithmetic
    for float64 inputs and float32 for every narrower float (the accumulation a GPU kernel does)."""
    return _blockwise(q, k, v, mask, scale, causal, block_q, block_k, window)[0]


def flash_attention_lse_blockwise(q: np.ndarray, k: np.ndarray, v: np.ndarray, *mask: np.ndarray, scale: float,
                                  causal: bool = False, has_mask: bool = False, window: int = 0,
                                  block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> np.ndarray:
    """flash_attention_lse's packed result (the output flat, each row's logsumexp's high parts,
    then their remainders), from the same walk as flash_attention_blockwise."""
    out, lse = _blockwise(q, k, v, mask, scale, causal, block_q, block_k, window)
    dtype = np.result_type(q, k, v)
    hi, lo = split_lse(lse, dtype)
    return np.concatenate([out.astype(dtype).ravel(), hi.ravel(), lo.ravel()])


def _blockwise(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: tuple[np.ndarray, ...], scale: float,
               causal: bool, block_q: int, block_k: int, window: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(output, logsumexp of each row's scores), query block by query block."""
    ct = np.float64 if np.result_type(q, k, v) == np.float64 else np.float32
    q, k, v = (np.asarray(a, ct) for a in (q, k, v))
    if q.ndim >= 3:
        k, v = expand_kv_heads(k, q.shape[-3]), expand_kv_heads(v, q.shape[-3])
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    sq, sk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    q = np.broadcast_to(q, batch + q.shape[-2:])
    k = np.broadcast_to(k, batch + k.shape[-2:])
    v = np.broadcast_to(v, batch + v.shape[-2:])
    m_full = np.broadcast_to(mask[0], batch + (sq, sk)) if mask else None
    out = np.empty(batch + (sq, dv), ct)
    lse = np.empty(batch + (sq,), ct)
    scale = ct(scale)
    with np.errstate(invalid="ignore", divide="ignore"), one_blas_thread():
        for q0 in range(0, sq, block_q):
            q1 = min(q0 + block_q, sq)
            out[..., q0:q1, :], lse[..., q0:q1] = _query_block(q[..., q0:q1, :], k, v, m_full, q0, scale, causal,
                                                               block_k, window)
    return out, lse


def key_end(q0: int, rows: int, sk: int, causal: bool) -> int:
    """Where a query block's keys end: under `causal`, keys past its last row are all masked."""
    return min(sk, q0 + rows) if causal else sk


def key_start(q0: int, block_k: int, window: int) -> int:
    """The first key block a query block starting at row q0 meets: under a window of W, the one
    holding key q0 − W + 1 (the keys before it are behind every row's window)."""
    return max(0, q0 - window + 1) // block_k * block_k if window else 0


def tile_scores(qb: np.ndarray, k: np.ndarray, mask: np.ndarray | None, q0: int, k0: int, k1: int,
                scale: np.floating, causal: bool, window: int = 0) -> np.ndarray:
    """scale · Q_b K[k0:k1]ᵀ for the query block starting at row q0, with the mask and causal
    (and window) bounds applied (−∞ where not kept)."""
    rows = qb.shape[-2]
    s = np.matmul(qb, np.swapaxes(k[..., k0:k1, :], -1, -2)) * scale
    keep = causal_keep_at(np.arange(q0, q0 + rows), np.arange(k0, k1), window) if causal else None
    if mask is not None:
        tile = mask[..., q0:q0 + rows, k0:k1]
        if tile.dtype == np.bool_:
            keep = tile if keep is None else keep & tile
        else:
            s = s + tile.astype(s.dtype)
    return s if keep is None else np.where(keep, s, -np.inf)


def _query_block(qb: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, q0: int,
                 scale: np.floating, causal: bool, block_k: int, window: int = 0) -> np.ndarray:
    rows, ct = qb.shape[-2], qb.dtype.type
    m = np.full(qb.shape[:-1], -np.inf, ct)
    l = np.zeros(qb.shape[:-1], ct)
    acc = np.zeros(qb.shape[:-1] + (v.shape[-1],), ct)
    sk = k.shape[-2]
    if sk == 0:
        return acc, m                    # no keys: P is empty and P V zeros (a masked row is NaN)
    for k0 in range(key_start(q0, block_k, window), key_end(q0, rows, sk, causal), block_k):
        k1 = min(k0 + block_k, sk)
        s = tile_scores(qb, k, mask, q0, k0, k1, scale, causal, window)
        m_new = np.maximum(m, s.max(axis=-1))
        m_safe = np.where(np.isneginf(m_new), ct(0), m_new)   # a row masked so far adds nothing
        p = np.exp(s - m_safe[..., None])
        alpha = np.exp(m - m_safe)
        l = l * alpha + p.sum(axis=-1)
        acc = acc * alpha[..., None] + np.matmul(p, v[..., k0:k1, :])
        m = m_new
    return acc / l[..., None], np.where(np.isneginf(m), m, m + np.log(l))
