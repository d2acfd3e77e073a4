"""Attention's gradients in float64 with every score in memory: the reference the attention-gradient
tests check the fused backward against."""

from __future__ import annotations

import numpy as np


def float64_attention_grads(q, k, v, w, scale: float, keep: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """dQ, dK, dV of Σ softmax(scale · q kᵀ, −∞ where `keep` is False) v ∘ w."""
    q, k, v, w = (np.asarray(a, np.float64) for a in (q, k, v, w))
    s = q @ np.swapaxes(k, -1, -2) * scale
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = w @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(dp * p, -1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ w
