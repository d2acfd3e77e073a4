"""Pools as users call them: op.max_pool2d / op.avg_pool2d / op.adaptive_avg_pool2d against torch's
loops (tests/torch_pools.py), eagerly, on the numpy executor and in the CPU emulator; windows that
tile the plane as a reduction (fused with what x is computed from), others as the pooling ops; a
ResNet stem's max pool after a relu sending each window's gradient to one of its tied zeros; the
errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen import emulator
from tessera_rw.codegen.emulator_plan import run_plan_emulated
from tests.torch_pools import (torch_adaptive_avg_pool, torch_avg_pool, torch_avg_pool_grad, torch_max_pool,
                               torch_max_pool_grad)

RNG = np.random.default_rng(43)
needs_emulator = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")


def tiled_mean(x, kh, kw):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // kh, kh, w // kw, kw).mean(axis=(3, 5))


def test_average_pools_of_windows_that_tile_the_plane_are_a_reduction():
    x = RNG.standard_normal((2, 3, 8, 6)).astype(np.float32)
    np.testing.assert_allclose(op.avg_pool2d(x, 2), tiled_mean(x, 2, 2), rtol=1e-6)
    pooled = op.kernel(lambda x: op.avg_pool2d(op.relu(x), (4, 3), stride=(4, 3)))
    np.testing.assert_allclose(pooled(x), tiled_mean(np.maximum(x, 0), 4, 3), rtol=1e-6)
    assert [s.op for s in pooled.program(x).plan.steps] == ["fused_reduction"]     # the relu read in
    globally = op.adaptive_avg_pool2d(x, 1)
    assert globally.shape == (2, 3, 1, 1)
    np.testing.assert_allclose(globally, x.mean(axis=(2, 3), keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(op.adaptive_avg_pool2d(x, (2, 3)), tiled_mean(x, 4, 2), rtol=1e-6)
    grad = op.grad(lambda x: op.sum(op.avg_pool2d(x, 2) ** 2))(x)      # each element: 2·window mean / 4
    np.testing.assert_allclose(grad, np.repeat(np.repeat(tiled_mean(x, 2, 2), 2, 2), 2, 3) / 2, rtol=1e-5)


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3), stride=1, padding=(1, 0), ceil_mode=True),
    dict(kernel_size=3, stride=(2, 1), padding=1, dilation=(1, 2)),
])
def test_max_pools_are_torchs_eagerly_and_compiled(kwargs):
    x = RNG.standard_normal((2, 3, 11, 9)).astype(np.float32)
    k, s = kwargs["kernel_size"], kwargs["stride"]
    pair = (lambda v: (v, v) if isinstance(v, int) else v)
    want, _ = torch_max_pool(x.astype(np.float64), pair(k), pair(s), pair(kwargs["padding"]),
                             pair(kwargs.get("dilation", 1)), kwargs.get("ceil_mode", False))
    np.testing.assert_array_equal(op.max_pool2d(x, **kwargs), want.astype(np.float32))
    np.testing.assert_array_equal(op.kernel(lambda x: op.max_pool2d(x, **kwargs))(x), want.astype(np.float32))


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(2, 4), stride=(1, 3), padding=(1, 2), divisor_override=5),
])
def test_average_pools_are_torchs_with_their_gradients(kwargs):
    x = RNG.standard_normal((2, 3, 10, 9))
    pair = (lambda v: (v, v) if isinstance(v, int) else v)
    window = (pair(kwargs["kernel_size"]), pair(kwargs["stride"]), pair(kwargs["padding"]),
              kwargs.get("ceil_mode", False), kwargs.get("count_include_pad", True),
              kwargs.get("divisor_override") or 0)
    want = torch_avg_pool(x, *window)
    np.testing.assert_allclose(op.avg_pool2d(x, **kwargs), want, rtol=1e-12)
    pooled = op.kernel(lambda x: op.avg_pool2d(x, **kwargs))
    assert [s.op for s in pooled.program(x).plan.steps] == ["avg_pool2d"]
    g = RNG.standard_normal(want.shape)
    grad = op.grad(lambda x, g: op.sum(op.avg_pool2d(x, **kwargs) * g))(x, g)
    np.testing.assert_allclose(grad, torch_avg_pool_grad(g, 10, 9, *window), rtol=1e-12, atol=1e-12)


def stem(x, w, t):
    """A ResNet stem's tail: scale, relu, the 3×3 max pool of stride 2 (a loss of it against t)."""
    return op.sum(op.max_pool2d(op.relu(x * w), 3, stride=2, padding=1) * t)


stem_grad = op.grad(stem)


def _stem_inputs(dtype=np.float32):
    x = RNG.standard_normal((2, 4, 13, 12)).astype(dtype)
    x[:, :, 4:9, 3:8] = -1.0             # whole windows of zeros after the relu: ties
    w = np.full((1, 4, 1, 1), 1.5, dtype)
    t = RNG.standard_normal((2, 4, 7, 6)).astype(dtype)
    return x, w, t


def _stem_reference(x, w, t):
    relu = np.maximum(x.astype(np.float64) * w, 0)
    _, idx = torch_max_pool(relu, (3, 3), (2, 2), (1, 1), (1, 1), False)
    return torch_max_pool_grad(relu, t.astype(np.float64), idx) * (relu > 0) * w


def test_a_max_pool_after_a_relu_sends_each_windows_gradient_to_one_tied_zero():
    x, w, t = _stem_inputs()
    want = _stem_reference(x, w, t)
    assert np.count_nonzero((x * w <= 0)[:, :, 4:9, 3:8]) > 0
    np.testing.assert_allclose(stem_grad(x, w, t), want, rtol=1e-6, atol=1e-6)
    plan = stem_grad.program(x, w, t).plan
    assert "fused_max_pool2d_grad" in [s.op for s in plan.steps]      # the relu's mask in its epilogue


@needs_emulator
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_stem_s_gradient_plan_runs_its_kernels_in_the_emulator(dtype):
    x, w, t = _stem_inputs(dtype)
    plan = stem_grad.program(x, w, t).plan
    (got,) = run_plan_emulated(plan, {"x": x, "w": w, "t": t})
    want = _stem_reference(x, w, t)
    tol = 1e-6 if dtype is np.float32 else 2e-2
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("call, says", [
    (lambda x: op.max_pool2d(x, 3, padding=2), "more than half the window"),
    (lambda x: op.max_pool2d(x, 12), "larger than x's plane"),
    (lambda x: op.max_pool2d(x[0, 0], 2), r"\(C, H, W\) or \(N, C, H, W\)"),
    (lambda x: op.max_pool2d(x, 2, ceil_mode=1), "ceil_mode must be True or False"),
    (lambda x: op.avg_pool2d(x, 2, divisor_override=0), "divisor_override must be an int >= 1"),
    (lambda x: op.avg_pool2d(x, (2, 2, 2)), "kernel_size must be an int or a pair"),
    (lambda x: op.max_pool2d(op.cast(x, "int32"), 2), "pools floating-point values"),
    (lambda x: op.adaptive_avg_pool2d(x[0, 0], 2), r"\(C, H, W\) or \(N, C, H, W\)"),
    (lambda x: op.avg_pool2d(x, 0), "kernel_size must be an int or a pair of ints >= 1"),
    (lambda x: op.avg_pool2d(x, (2, 0)), "kernel_size must be an int or a pair of ints >= 1"),
    (lambda x: op.avg_pool2d(op.cast(x, "int32"), 2), "pools floating-point values"),      # windows that tile
    (lambda x: op.avg_pool2d(op.cast(x, "int32"), 3, 1), "pools floating-point values"),
])
def test_pools_that_cannot_be_say_what_to_do(call, says):
    with pytest.raises(TesseraError, match=says):
        call(RNG.standard_normal((2, 3, 8, 6)))


def test_window_sizes_take_numpy_ints_and_an_empty_stride_as_torch_does():
    x = RNG.standard_normal((2, 3, 8, 6))
    np.testing.assert_array_equal(op.max_pool2d(x, np.int64(2), stride=()), op.max_pool2d(x, 2))
    np.testing.assert_array_equal(op.avg_pool2d(x, (np.int32(2), 3), stride=[]), op.avg_pool2d(x, (2, 3)))


@pytest.mark.parametrize("out", [(3, 4), (5, 5), (7, 2), (11, 9)])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (ml_dtypes.bfloat16, 1e-2)], ids=["f64", "bf16"])
def test_adaptive_average_pools_of_unequal_windows_are_torchs(out, dtype, tol):
    """Output sizes that do not divide the plane (or exceed it): torch's overlapping windows."""
    x = RNG.standard_normal((2, 3, 8, 6)).astype(dtype)
    want = torch_adaptive_avg_pool(x.astype(np.float64), out)
    pooled = op.kernel(lambda x: op.adaptive_avg_pool2d(x, out))
    for got in (op.adaptive_avg_pool2d(x, out), pooled(x)):
        assert got.dtype == x.dtype
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)
    g = RNG.standard_normal(want.shape)
    grad = op.grad(lambda x: op.sum(op.adaptive_avg_pool2d(x, out) * g))(x.astype(np.float64))
    d = RNG.standard_normal(x.shape)                      # the gradient along d, by central differences
    bumped = [x.astype(np.float64) + e * d for e in (1e-6, -1e-6)]
    numeric = np.sum(g * (torch_adaptive_avg_pool(bumped[0], out) - torch_adaptive_avg_pool(bumped[1], out))) / 2e-6
    assert abs(np.vdot(grad, d) - numeric) < 1e-6 * max(1.0, abs(numeric))


@pytest.mark.parametrize("kwargs", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=(2,), ceil_mode=True),
                                    dict(kernel_size=3, stride=1, padding=1, dilation=2)])
def test_1d_pools_are_torchs_along_the_last_axis(kwargs):
    x = RNG.standard_normal((2, 3, 17))
    single = (lambda v: v[0] if isinstance(v, tuple) else v)
    k, s = single(kwargs["kernel_size"]), single(kwargs.get("stride") or kwargs["kernel_size"])
    p, d, ceil = kwargs.get("padding", 0), kwargs.get("dilation", 1), kwargs.get("ceil_mode", False)
    want, _ = torch_max_pool(x[:, :, None, :], (1, k), (1, s), (0, p), (1, d), ceil)
    np.testing.assert_array_equal(op.max_pool1d(x, **kwargs), want[:, :, 0])
    np.testing.assert_array_equal(op.kernel(lambda x: op.max_pool1d(x, **kwargs))(x), want[:, :, 0])
    if d == 1:
        averaged = torch_avg_pool(x[:, :, None, :], (1, k), (1, s), (0, p), ceil, True, 0)[:, :, 0]
        plain = {key: v for key, v in kwargs.items() if key != "dilation"}
        np.testing.assert_allclose(op.avg_pool1d(x[0], **plain), averaged[0], rtol=1e-12)     # (C, L) too
    with pytest.raises(TesseraError, match="kernel_size must be an int or a 1-tuple"):
        op.max_pool1d(x, (2, 2))


def test_adaptive_max_pools_of_windows_that_tile_are_max_pools():
    x = RNG.standard_normal((2, 3, 8, 6))
    want, _ = torch_max_pool(x, (4, 3), (4, 3), (0, 0), (1, 1), False)
    np.testing.assert_array_equal(op.adaptive_max_pool2d(x, (2, 2)), want)
    assert [s.op for s in op.kernel(lambda x: op.adaptive_max_pool2d(x, 1)).program(x).plan.steps] == ["max_pool2d"]
    with pytest.raises(TesseraError, match="output sizes that divide the plane"):
        op.adaptive_max_pool2d(x, (3, 4))
