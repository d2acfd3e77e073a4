"""Random inputs for the rules' examples, which the soundness check evaluates before and after
rewriting."""

from __future__ import annotations

import ml_dtypes
import numpy as np

SIXTEEN_BIT_FLOATS = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}    # egglog's name -> numpy's


def rand(rng: np.random.Generator, *shape: int, dtype=np.float32) -> np.ndarray:
    """Random values of `shape`; a dim given as 0 is drawn at random (1..6)."""
    dims = tuple(int(rng.integers(1, 7)) if n == 0 else n for n in shape)
    return rng.standard_normal(dims).astype(dtype)
