"""Helpers shared by the layout reference tests (test_layout_ops_reference.py,
test_indexing_selection_creation_reference.py); `index_for` and `factor` also serve the
shape-inference tests.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import settings, strategies as st

from tessera_rw import op

SETTINGS = settings(max_examples=30, deadline=None)
FEW = settings(max_examples=25, deadline=None)

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float32": np.dtype(np.float32), "int32": np.dtype(np.int32), "bool": np.dtype(np.bool_),
          "bfloat16": BF16}
dtype_names = st.sampled_from(sorted(DTYPES))
seeds = st.integers(0, 2**32 - 1)
dims = st.integers(0, 5)
pos_dims = st.integers(1, 5)


def rand(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random, never-all-zero data of a dtype (floats are never exactly 0)."""
    dtype = DTYPES.get(dtype, np.dtype(dtype)) if isinstance(dtype, str) else np.dtype(dtype)
    shape = tuple(shape)
    if dtype == np.bool_:
        x = np.asarray(rng.random(shape) < 0.5)
        if x.size:
            x.flat[0] = True
        return x
    if np.issubdtype(dtype, np.integer):
        x = np.asarray(rng.integers(-1000, 1000, size=shape, dtype=dtype))
        return np.asarray(np.where(x == 0, np.asarray(7, dtype), x), dtype=dtype)
    x = np.asarray(rng.standard_normal(shape) * 4)
    return np.asarray(np.where(x == 0, 1.0, x), dtype=dtype)


def assert_bitexact(got, want):
    assert isinstance(got, np.ndarray), f"expected a numpy array, got {type(got).__name__}"
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype} != numpy's {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != numpy's {want.shape}"
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), \
        f"values differ:\n got {got!r}\nwant {want!r}"


def traced(fn):
    """A fresh kernel computing fn(x) (fresh, so every case is traced anew)."""
    @op.kernel
    def k(x):
        return fn(x)
    return k


def both(fn, x, want):
    """fn on x eagerly and inside a kernel, both bit-exact against `want`."""
    assert_bitexact(fn(x), want)
    assert_bitexact(traced(fn)(x), want)


def factor(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def constant(rng, dtype):
    if dtype == "bool":
        return bool(rng.integers(0, 2))
    if dtype == "int32":
        return int(rng.integers(-50, 50))
    return float(np.round(rng.standard_normal() * 3, 3)) or 1.5


@st.composite
def index_for(draw, shape):
    """A basic index for `shape`: ints, slices (any nonzero step, bounds possibly out of range), Nones and
    at most one Ellipsis, which may sit between explicitly indexed leading and trailing axes."""
    n = len(shape)
    lead = draw(st.integers(0, n))
    ellipsis = draw(st.booleans())
    trail = draw(st.integers(0, n - lead)) if ellipsis else 0
    axes = list(range(lead)) + list(range(n - trail, n))
    items = []
    for k, ax in enumerate(axes):
        if ellipsis and k == lead:
            items.append(Ellipsis)
        d = shape[ax]
        if d and draw(st.integers(0, 2)) == 0:
            items.append(draw(st.integers(-d, d - 1)))
        else:
            bound = st.one_of(st.none(), st.integers(-2 * d - 3, 2 * d + 3))
            items.append(slice(draw(bound), draw(bound), draw(st.sampled_from([None, 1, 2, 3, 7, -1, -2, -5]))))
        if draw(st.integers(0, 3)) == 0:
            items.append(None)
    if ellipsis and Ellipsis not in items:
        items.append(Ellipsis)
    if draw(st.integers(0, 4)) == 0:
        items.insert(draw(st.integers(0, len(items))), None)
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)
