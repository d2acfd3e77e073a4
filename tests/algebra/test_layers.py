"""torch.nn.functional's layers in tessera_rw: linear, flatten, batch_norm (training mode) and the
convolutions' bias, against float64 numpy statements of them, eagerly and traced; their errors.
The pools are tests/test_pool_plans.py's."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import TesseraError

RNG = np.random.default_rng(41)


def batch_norm_reference(x, w, b, eps=1e-5):
    x = np.asarray(x, np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    mu, var = x.mean(axes, keepdims=True), x.var(axes, keepdims=True)       # biased, as torch normalizes
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mu) / np.sqrt(var + eps) * np.reshape(w, shape) + np.reshape(b, shape)


def test_linear_is_x_times_the_weight_transposed_plus_the_bias():
    x, w, b = RNG.standard_normal((3, 5, 8)), RNG.standard_normal((4, 8)), RNG.standard_normal(4)
    want = x @ w.T + b
    np.testing.assert_allclose(op.linear(x, w, b), want, rtol=1e-12)
    np.testing.assert_allclose(op.kernel(lambda x, w, b: op.linear(x, w, b))(x, w, b), want, rtol=1e-12)
    np.testing.assert_allclose(op.linear(x, w), x @ w.T, rtol=1e-12)
    with pytest.raises(TesseraError, match=r"linear takes weight \(out_features, in_features\)"):
        op.linear(x, w.T)


@pytest.mark.parametrize("start, end, shape", [(0, -1, (120,)), (1, -1, (2, 60)), (1, 2, (2, 12, 5)),
                                               (-2, -1, (2, 3, 20))])
def test_flatten_merges_the_axes_between_its_ends(start, end, shape):
    x = RNG.standard_normal((2, 3, 4, 5))
    assert op.flatten(x, start, end).shape == shape
    got = op.kernel(lambda x: x.flatten(start, end))(x)
    np.testing.assert_array_equal(got, x.reshape(shape))


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (ml_dtypes.bfloat16, 2e-2)], ids=["f32", "bf16"])
def test_batch_norm_normalizes_each_channel_by_the_batch_statistics(dtype, tol):
    x = (RNG.standard_normal((4, 6, 5, 3)) * 3 + 2).astype(dtype)
    w, b = (RNG.random(6) + 0.5).astype(dtype), RNG.standard_normal(6).astype(dtype)
    want = batch_norm_reference(x, w.astype(np.float64), b.astype(np.float64))
    kernel = op.kernel(lambda x, w, b: op.batch_norm(x, weight=w, bias=b))
    for got in (op.batch_norm(x, weight=w, bias=b), kernel(x, w, b)):
        assert got.dtype == np.dtype(dtype)          # 16-bit x: float32 statistics, its own dtype back
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (ml_dtypes.bfloat16, 2e-2)], ids=["f32", "bf16"])
def test_batch_norm_in_eval_mode_normalizes_by_the_running_statistics_after_the_convolution(dtype, tol):
    x, w = RNG.standard_normal((2, 3, 9, 8)).astype(dtype), (RNG.standard_normal((6, 3, 3, 3)) * 0.3).astype(dtype)
    g, b, mean, var = ((RNG.random(6) + 0.5).astype(dtype) for _ in range(4))

    def block(x, w, g, b, mean, var):
        y = op.conv2d(x, w, padding=1)
        return op.relu(op.batch_norm(y, weight=g, bias=b, training=False, running_mean=mean, running_var=var))
    y = np.asarray(op.conv2d(*(np.asarray(a, np.float64) for a in (x, w)), padding=1))
    channel = (lambda a: np.asarray(a, np.float64).reshape(1, -1, 1, 1))
    want = np.maximum((y - channel(mean)) / np.sqrt(channel(var) + 1e-5) * channel(g) + channel(b), 0)
    kernel = op.kernel(block)
    for got in (block(x, w, g, b, mean, var), kernel(x, w, g, b, mean, var)):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * np.abs(want).max())
    # float32: one kernel, the normalization in the convolution's epilogue; 16-bit: the epilogue
    # reads five values (the statistics and parameters cast), more than a fused node takes, so the
    # convolution writes its result and one kernel normalizes it (the casts computed where read)
    fused = ["fused_conv"] if dtype is np.float32 else ["conv2d", "fused_elementwise"]
    assert [s.op for s in kernel.program(x, w, g, b, mean, var).plan.steps] == fused


def test_batch_norm_refuses_torch_s_positional_running_statistics_and_wrong_shapes():
    x = RNG.standard_normal((4, 6, 5))
    with pytest.raises(TypeError):
        op.batch_norm(x, np.zeros(6), np.ones(6))       # F.batch_norm(x, running_mean, running_var)
    with pytest.raises(TesseraError, match=r"one value per channel, shape \(6,\)"):
        op.batch_norm(x, weight=np.ones(5))
    with pytest.raises(TesseraError, match=r"shape \(N, C, \.\.\.\)"):
        op.batch_norm(np.ones(6))
    with pytest.raises(TesseraError, match="pass training=False to normalize by running_mean"):
        op.batch_norm(x, running_mean=np.zeros(6), running_var=np.ones(6))
    with pytest.raises(TesseraError, match="pass both"):
        op.batch_norm(x, training=False, running_mean=np.zeros(6))
    with pytest.raises(TesseraError, match=r"running_var has one value per channel"):
        op.batch_norm(x, training=False, running_mean=np.zeros(6), running_var=np.ones(3))


def test_a_convolution_takes_its_bias_third_as_torch_s_does():
    x, w, b = RNG.standard_normal((2, 3, 7, 6)), RNG.standard_normal((4, 3, 3, 3)), RNG.standard_normal(4)
    want = np.asarray(op.conv2d(x, w, padding=1)) + b[None, :, None, None]
    np.testing.assert_allclose(op.conv2d(x, w, b, padding=1), want, rtol=1e-12)
    traced = op.kernel(lambda x, w, b: op.conv2d(x, w, b, padding=1))
    np.testing.assert_allclose(traced(x, w, b), want, rtol=1e-12)
    f32 = [a.astype(np.float32) for a in (x, w, b)]
    assert [s.op for s in traced.program(*f32).plan.steps] == ["fused_conv"]     # the bias in its epilogue
    x1, w1 = RNG.standard_normal((2, 3, 9)), RNG.standard_normal((4, 3, 3))
    np.testing.assert_allclose(op.conv1d(x1, w1, b), np.asarray(op.conv1d(x1, w1)) + b[None, :, None], rtol=1e-12)
    with pytest.raises(TesseraError, match="one value per output channel"):
        op.conv2d(x, w, 1)                             # a stride where torch's bias goes
