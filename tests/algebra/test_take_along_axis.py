"""op.take_along_axis: numpy.take_along_axis as a selection summed over the axis, eagerly, traced,
and differentiated; an index out of range picks nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw import DTypeError, ShapeError, op

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("shape, index_shape, axis", [
    ((6, 9), (6, 1), 1), ((6, 9), (6, 4), -1), ((6, 9), (2, 9), 0), ((3, 5, 7), (3, 5, 1), 2),
    ((3, 5, 7), (3, 2, 7), 1), ((3, 5, 7), (1, 5, 3), 2),          # indices broadcast along the first axis
])
def test_it_is_numpys_take_along_axis(shape, index_shape, axis):
    x = RNG.standard_normal(shape).astype(np.float32)
    n = shape[axis]
    indices = RNG.integers(-n, n, size=index_shape).astype(np.int32)      # negative ones count from the end
    want = np.take_along_axis(x, indices, axis=axis)
    np.testing.assert_array_equal(op.take_along_axis(x, indices, axis=axis), want)
    traced = op.kernel(lambda x, i: op.take_along_axis(x, i, axis=axis))
    np.testing.assert_array_equal(traced(x, indices), want)


def test_an_index_out_of_range_picks_nothing():
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    got = op.take_along_axis(x, np.array([[3], [-4]]), axis=1)
    np.testing.assert_array_equal(got, [[0.0], [0.0]])


def test_its_gradient_puts_the_cotangent_back_where_each_index_points():
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    indices = np.array([[0, 0], [7, 1], [3, -1], [2, 2], [6, 5]], dtype=np.int32)     # repeats add up
    weights = RNG.standard_normal((5, 2)).astype(np.float32)
    grad = op.grad(lambda x, i, w: op.sum(op.take_along_axis(x, i, axis=1) * w))(x, indices, weights)
    want = np.zeros_like(x)
    np.add.at(want, (np.arange(5)[:, None], indices % 8), weights)
    np.testing.assert_allclose(grad, want, rtol=1e-6)


def test_bad_indices_say_what_to_do():
    x = np.ones((4, 5), np.float32)
    with pytest.raises(DTypeError, match=r"take_along_axis(.|\n)*indices must be integers(.|\n)*op.cast"):
        op.take_along_axis(x, np.zeros((4, 1), np.float32), axis=1)
    with pytest.raises(ShapeError, match=r"take_along_axis(.|\n)*indices have 1 axes and arr 2(.|\n)*\[:, None\]"):
        op.take_along_axis(x, np.zeros(4, np.int32), axis=1)


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.float16])
@pytest.mark.parametrize("picks", [1, 3])
def test_the_values_picked_keep_arrs_type(dtype, picks):
    x = (RNG.standard_normal((4, 6)) * 10).astype(dtype)
    indices = RNG.integers(0, 6, size=(4, picks))
    want = np.take_along_axis(x, indices, axis=1)
    for got in (op.take_along_axis(x, indices, axis=1),
                op.kernel(lambda x, i: op.take_along_axis(x, i, axis=1))(x, indices)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
