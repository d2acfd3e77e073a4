"""contiguous_slice_offset against numpy: a slice of a C-contiguous array is one run of its bytes
exactly when numpy's view of it is C-contiguous, and the run starts where the view's data does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.shapes import contiguous_slice_offset

DTYPES = (DType.bool, DType.bfloat16, DType.float32, DType.float64, DType.complex64)


@st.composite
def sliced_shapes(draw):
    """A shape, a dtype, and normalized slice bounds of every axis (as the slice op stores them)."""
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    bounds = []
    for size in shape:
        # mostly whole axes or single indices, so contiguous runs are common
        kind = draw(st.sampled_from(["whole", "index", "range", "range"]))
        if kind == "whole" or size == 0:
            bounds.append((0, size, 1))
        elif kind == "index":
            i = draw(st.integers(0, size - 1))
            bounds.append((i, i + 1, draw(st.integers(1, 3))))
        else:
            a = draw(st.integers(0, size))
            b = draw(st.integers(a, size))
            bounds.append((a, b, draw(st.sampled_from([1, 1, 2, 3]))))
    starts, stops, steps = (tuple(column) for column in zip(*bounds)) if bounds else ((), (), ())
    return shape, draw(st.sampled_from(DTYPES)), starts, stops, steps


def numpy_answer(shape, dtype: DType, starts, stops, steps) -> int | None:
    array = np.zeros(shape, dtype.numpy)
    view = array[(..., *(slice(a, b, s) for a, b, s in zip(starts, stops, steps)))]   # `...`: a view even at rank 0
    if view.size == 0:
        return 0
    if not view.flags.c_contiguous:
        return None
    return view.__array_interface__["data"][0] - array.__array_interface__["data"][0]


@settings(max_examples=400, deadline=None)
@given(sliced_shapes())
def test_the_offset_is_numpys_for_every_contiguous_slice_and_none_otherwise(case):
    shape, dtype, starts, stops, steps = case
    got = contiguous_slice_offset(TensorType(shape, dtype), starts, stops, steps)
    assert got == numpy_answer(shape, dtype, starts, stops, steps)


@pytest.mark.parametrize("shape, starts, stops, steps, expected", [
    ((9, 64), (0, 0), (8, 64), (1, 1), 0),                      # rows 0:M of an [M+1, N] array
    ((9, 64), (8, 0), (9, 64), (1, 1), 8 * 64 * 4),             # row M
    ((8, 64, 64), (3, 0, 0), (4, 64, 64), (1, 1, 1), 3 * 64 * 64 * 4),   # x[3]
    ((3, 4, 5), (1, 2, 0), (2, 4, 5), (1, 1, 1), (20 + 10) * 4),  # rows 2:4 of plane 1
    ((3, 4, 5), (1, 2, 1), (2, 3, 4), (1, 1, 1), (20 + 10 + 1) * 4),   # part of one row
    ((9, 64), (0, 0), (9, 32), (1, 1), None),                   # a column block
    ((9, 64), (0, 0), (9, 64), (2, 1), None),                   # every other row
    ((9, 64), (2, 0), (3, 64), (5, 1), 2 * 64 * 4),             # a step on an axis of extent 1 is no step
    ((3, 4, 5), (0, 1, 0), (2, 2, 5), (1, 1, 1), None),         # row 1 of two planes
    ((), (), (), (), 0),                                        # a scalar sliced by nothing
])
def test_known_slices(shape, starts, stops, steps, expected):
    assert contiguous_slice_offset(TensorType(shape, DType.float32), starts, stops, steps) == expected
