"""The attention backward pass on the host, block by block, as the CUDA kernels run it.

`row_stats_blockwise` walks the key blocks of each query block with a running maximum and sum
(the forward's online softmax without the P V product) and returns logsumexp and Σ dO·O per row.
`bwd_blockwise` then recomputes P = exp(S − lse) one (query block, key block) tile at a time and
accumulates dQ, dK and dV, so no Sq×Sk tensor ever exists: memory is bounded by the block sizes.

>>> import numpy as np
>>> from tessera_rw.algebra.ops.attention import attention_reference
>>> from tessera_rw.algebra.ops.attention_backward import bwd_reference, row_stats_reference
>>> rng = np.random.default_rng(0)
>>> q, k, v, do = (rng.standard_normal((2, 300, 64)) for _ in range(4))
>>> o = attention_reference(q, k, v, scale=0.125, causal=True, has_mask=False)
>>> flags = dict(scale=0.125, causal=True, has_mask=False)
>>> stats = row_stats_blockwise(q, k, o, do, **flags, block_q=64, block_k=96)
>>> bool(np.allclose(stats, row_stats_reference(q, k, o, do, **flags)))
True
>>> grads = bwd_blockwise(q, k, v, do, stats, **flags, block_q=64, block_k=96)
>>> bool(np.allclose(grads, bwd_reference(q, k, v, do, stats, **flags)))
True
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.ops.attention import expand_kv_heads
from tessera_rw.codegen.blas_threads import one_blas_thread
from tessera_rw.codegen.cpu_attention import key_end, key_start, tile_scores

BLOCK_Q = 128
BLOCK_K = 128


def _compute_type(*arrays: np.ndarray) -> type:
    return np.float64 if np.result_type(*arrays) == np.float64 else np.float32


def _broadcast(batch: tuple[int, ...], *arrays: np.ndarray) -> list[np.ndarray]:
    return [np.broadcast_to(a, batch + a.shape[-2:]) for a in arrays]


def row_stats_blockwise(q: np.ndarray, k: np.ndarray, o: np.ndarray, do: np.ndarray, *mask: np.ndarray,
                        scale: float, causal: bool = False, has_mask: bool = False, window: int = 0,
                        block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> np.ndarray:
    """[..., Sq, 2]: logsumexp of each row of scale·QKᵀ (+mask, causal [window]) and Σ_d dO·O."""
    ct = _compute_type(q, k, o, do)
    q, k, o, do = (np.asarray(a, ct) for a in (q, k, o, do))
    if q.ndim >= 3:
        k = expand_kv_heads(k, q.shape[-3])
    batch = do.shape[:-2]
    q, k = _broadcast(batch, q, k)
    m_full = np.broadcast_to(mask[0], batch + (q.shape[-2], k.shape[-2])) if mask else None
    sq, sk = q.shape[-2], k.shape[-2]
    lse = np.empty(batch + (sq,), ct)
    with np.errstate(invalid="ignore", divide="ignore"), one_blas_thread():
        for q0 in range(0, sq, block_q):
            q1 = min(q0 + block_q, sq)
            m = np.full(batch + (q1 - q0,), -np.inf, ct)
            l = np.zeros(batch + (q1 - q0,), ct)
            for k0 in range(key_start(q0, block_k, window), key_end(q0, q1 - q0, sk, causal), block_k):
                s = tile_scores(q[..., q0:q1, :], k, m_full, q0, k0, min(k0 + block_k, sk), ct(scale), causal, window)
                m_new = np.maximum(m, s.max(axis=-1))
                safe = np.where(np.isneginf(m_new), ct(0), m_new)
                l = l * np.exp(m - safe) + np.exp(s - safe[..., None]).sum(axis=-1)
                m = m_new
            lse[..., q0:q1] = np.where(np.isneginf(m), ct(0), m) + np.log(l)
    return np.stack([lse, np.sum(do * o, axis=-1)], axis=-1)


def bwd_blockwise(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, stats: np.ndarray,
                  *mask: np.ndarray, scale: float, causal: bool = False, has_mask: bool = False, window: int = 0,
                  block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> np.ndarray:
    """dQ, dK, dV packed flat, as flash_attention_bwd defines them."""
    ct = _compute_type(q, k, v, do)
    q, k, v, do, stats = (np.asarray(a, ct) for a in (q, k, v, do, stats))
    if q.ndim >= 3:
        k, v = expand_kv_heads(k, q.shape[-3]), expand_kv_heads(v, q.shape[-3])
    batch = do.shape[:-2]
    q, k, v = _broadcast(batch, q, k, v)
    sq, sk = q.shape[-2], k.shape[-2]
    m_full = np.broadcast_to(mask[0], batch + (sq, sk)) if mask else None
    dq, dk, dv = np.zeros(q.shape, ct), np.zeros(k.shape, ct), np.zeros(v.shape, ct)
    scale = ct(scale)
    with np.errstate(invalid="ignore"), one_blas_thread():
        for q0 in range(0, sq, block_q):
            q1 = min(q0 + block_q, sq)
            qb, dob = q[..., q0:q1, :], do[..., q0:q1, :]
            lse, delta = stats[..., q0:q1, 0:1], stats[..., q0:q1, 1:2]
            for k0 in range(key_start(q0, block_k, window), key_end(q0, q1 - q0, sk, causal), block_k):
                k1 = min(k0 + block_k, sk)
                p = np.exp(tile_scores(qb, k, m_full, q0, k0, k1, scale, causal, window) - lse)
                ds = p * (np.matmul(dob, np.swapaxes(v[..., k0:k1, :], -1, -2)) - delta)
                dv[..., k0:k1, :] += np.matmul(np.swapaxes(p, -1, -2), dob)
                dk[..., k0:k1, :] += np.matmul(np.swapaxes(ds, -1, -2), qb) * scale
                dq[..., q0:q1, :] += np.matmul(ds, k[..., k0:k1, :]) * scale
    return np.concatenate([dq.ravel(), dk.ravel(), dv.ravel()])
