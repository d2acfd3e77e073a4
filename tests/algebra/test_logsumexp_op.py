"""op.logsumexp over trailing axes of 16/32-bit floats is one op (its row kernel reads the rows
once): scipy's results eagerly and traced, the infinities scipy gives, a gradient that is the
softmax; over other axes (or float64) it stays the ops it is made of."""

import ml_dtypes
import numpy as np
import pytest
import scipy.special

from tessera_rw import op

RNG = np.random.default_rng(11)
DTYPES = [pytest.param(np.float32, 1e-6, id="f32"), pytest.param(np.float16, 2e-3, id="f16"),
          pytest.param(ml_dtypes.bfloat16, 1e-2, id="bf16")]


def traced_ops(fn, shape, dtype) -> list[str]:
    return [n.op for n in op.kernel(fn).trace(op.tensor(shape, dtype)).nodes if n.op != "input"]


def assert_close(got, want, rtol):
    got = np.asarray(got).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


@pytest.mark.parametrize("axis, keepdims, shape", [(-1, False, (5, 70)), (1, True, (5, 70)),
                                                    ((1, 2), False, (3, 4, 50)), ((-2, -1), True, (3, 4, 50))])
@pytest.mark.parametrize("dtype, rtol", DTYPES)
def test_trailing_axes_are_one_op_with_scipys_result(dtype, rtol, axis, keepdims, shape):
    x = (RNG.standard_normal(shape) * 4).astype(dtype)

    def lse(x):
        return op.logsumexp(x, axis=axis, keepdims=keepdims)
    assert traced_ops(lse, shape, np.dtype(dtype).name) == ["logsumexp"]
    want = scipy.special.logsumexp(x.astype(np.float64), axis=axis, keepdims=keepdims)
    for got in (lse(x), op.kernel(lse)(x)):
        assert got.dtype == dtype and got.shape == want.shape
        assert_close(got, want, rtol)


def test_other_axes_and_float64_stay_the_ops_logsumexp_is_made_of():
    def over_rows(x):
        return op.logsumexp(x, axis=0)
    for shape, dtype in (((6, 5), "float32"), ((6, 5), "float64")):
        assert "logsumexp" not in traced_ops(over_rows, shape, dtype)
    assert "logsumexp" not in traced_ops(lambda x: op.logsumexp(x, axis=-1), (6, 5), "float64")
    x = RNG.standard_normal((6, 5)).astype(np.float32)
    assert_close(op.kernel(over_rows)(x), scipy.special.logsumexp(x.astype(np.float64), axis=0), 1e-6)


def test_infinite_and_nan_rows_are_scipys():
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0], [np.inf, 1.0, 2.0], [np.nan, 1.0, 2.0]],
                 np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = scipy.special.logsumexp(x.astype(np.float64), axis=1)
    assert np.isneginf(want[0]) and np.isposinf(want[2]) and np.isnan(want[3])
    for got in (op.logsumexp(x, axis=1), op.kernel(lambda x: op.logsumexp(x, axis=1))(x)):
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6)


def test_gradient_is_the_rows_softmax_times_the_cotangent():
    x = (RNG.standard_normal((7, 40)) * 3).astype(np.float32)
    w = RNG.standard_normal(7).astype(np.float32)

    def loss(x, w):
        return op.sum(op.logsumexp(x, axis=-1) * w)
    dx = op.grad(loss)(x, w)
    x64 = x.astype(np.float64)
    softmax = np.exp(x64 - scipy.special.logsumexp(x64, axis=-1, keepdims=True))
    np.testing.assert_allclose(dx, softmax * w[:, None], rtol=1e-5, atol=1e-7)


def test_empty_rows_give_minus_infinity_as_scipys():
    x = np.zeros((2, 0), np.float32)
    with np.errstate(divide="ignore"):
        want = scipy.special.logsumexp(x, axis=-1)
    for got in (op.logsumexp(x, axis=-1), op.kernel(lambda x: op.logsumexp(x, axis=-1))(x)):
        np.testing.assert_array_equal(got, want)
