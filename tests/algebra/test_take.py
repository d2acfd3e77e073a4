"""op.take and integer-array indexing: numpy.take's result eagerly and traced (negative indices
from the end, out-of-range ones taking zeros where numpy raises), x[indices] as numpy's single
index array (ints apart from it counted as index arrays, as numpy counts them; constant indices
checked against the axis), the gradient as numpy's add.at, and errors that say what to do."""

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import DTypeError, ShapeError

RNG = np.random.default_rng(7)
X = RNG.standard_normal((6, 5, 4)).astype(np.float32)


@pytest.mark.parametrize("axis, indices", [(0, np.array([5, 0, 0, -1])), (1, np.array([[4, 1], [-5, 2]])),
                                            (2, np.array(3)), (-1, np.array([0, 3, 3], np.int64)),
                                            (None, np.array([119, 0, 57]))])
def test_take_is_numpys(axis, indices):
    want = np.take(X, indices, axis=axis)
    for got in (op.take(X, indices, axis=axis), op.kernel(lambda x, i: op.take(x, i, axis=axis))(X, indices)):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_out_of_range_indices_take_zeros():
    indices = np.array([1, 6, -7, 2])
    want = np.take(X, np.clip(indices, 0, 5), axis=0) * np.array([1, 0, 0, 1], np.float32)[:, None, None]
    np.testing.assert_array_equal(op.kernel(lambda x, i: op.take(x, i, axis=0))(X, indices), want)
    np.testing.assert_array_equal(op.take(X, indices, axis=0), want)


@pytest.mark.parametrize("index", [
    lambda x, i: x[i], lambda x, i: x[:, [4, 0, 4]], lambda x, i: x[..., [3, 1]],
    lambda x, i: x[None, 1:, i], lambda x, i: x[2, i], lambda x, i: x[..., 1, [2, 0]],
    lambda x, i: x[1, :, [3, 0]], lambda x, i: x[i, :, 1], lambda x, i: x[0, ..., i],
], ids=["rows", "list-on-axis-1", "ellipsis-list", "none-slice-array", "int-then-array", "ellipsis-int-list",
        "int-slice-list", "array-slice-int", "int-ellipsis-array"])
def test_an_integer_array_among_basic_indices_is_numpys_single_index_array(index):
    indices = np.array([[1, 3], [0, -1]], np.int32)
    want = index(X, indices)
    for got in (index(X, indices), op.kernel(index)(X, indices)):
        np.testing.assert_array_equal(got, want)


def test_the_gradient_puts_each_cotangent_back_where_its_index_points():
    table = RNG.standard_normal((7, 3)).astype(np.float32)
    tokens = np.array([[1, 6, 1], [-1, 0, 1]], np.int32)
    dy = RNG.standard_normal((2, 3, 3)).astype(np.float32)
    grad = op.grad(lambda t: op.sum(t[tokens] * dy))(table)
    want = np.zeros_like(table)
    np.add.at(want, tokens.reshape(-1) % 7, dy.reshape(-1, 3))
    np.testing.assert_allclose(grad, want, rtol=1e-6)


def test_a_constant_index_out_of_bounds_is_refused_as_numpy_refuses_it():
    with pytest.raises(ShapeError, match="index 9 is out of bounds for an axis of size 6"):
        op.kernel(lambda x: x[[0, 9]])(X)
    with pytest.raises(ShapeError, match="index -7 is out of bounds"):
        op.kernel(lambda x: x[np.array([-7])])(X)


def test_errors_name_the_op_and_what_to_do():
    with pytest.raises(DTypeError, match=r"take(.|\n)*indices must be integers(.|\n)*op.cast"):
        op.take(X, np.array([0.5]), axis=0)
    with pytest.raises(ShapeError, match=r"getitem(.|\n)*more than one index array(.|\n)*op.take"):
        op.kernel(lambda x: x[[0, 1], [1, 2]])(X)
    with pytest.raises(ShapeError, match=r"getitem(.|\n)*boolean mask(.|\n)*op.where"):
        op.kernel(lambda x: x[x > 0])(X)
