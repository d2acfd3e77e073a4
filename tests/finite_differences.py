"""Central finite differences, the reference every gradient test checks against."""

from __future__ import annotations

import numpy as np


def numeric_gradient(f, value: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """∂f/∂value by central differences, one element at a time (f: array -> scalar)."""
    out = np.zeros_like(value, dtype=np.float64)
    for idx in np.ndindex(value.shape):
        hi, lo = value.copy(), value.copy()
        hi[idx] += eps
        lo[idx] -= eps
        out[idx] = (f(hi) - f(lo)) / (2 * eps)
    return out
