"""Helpers shared by the shape-inference tests (test_shape_inference_*.py).

Placeholders, the check that a result is a placeholder of numpy's shape, and the dimension strategies.
"""

from __future__ import annotations

from hypothesis import settings, strategies as st

from tessera_rw import DType, op

SETTINGS = settings(max_examples=60, deadline=None)

Spec = type(op.tensor((1,), "float32"))

dims = st.integers(min_value=0, max_value=5)
pos_dims = st.integers(min_value=1, max_value=5)


def ph(shape, dtype="float32"):
    return op.tensor(tuple(shape), dtype)


def check_spec(result, shape, dtype):
    assert isinstance(result, Spec), f"expected a placeholder, got {type(result).__name__}"
    assert isinstance(result.shape, tuple)
    assert result.shape == tuple(shape), f"shape {result.shape} != numpy's {tuple(shape)}"
    assert isinstance(result.dtype, DType)
    assert str(result.dtype) == dtype, f"dtype {result.dtype} != {dtype}"
