"""The pooling ops' numpy references against torch's own loops (tests/torch_pools.py), over random
windows, strides, paddings, dilations and ceil_mode, on values with ties, NaNs and -inf;
avg_pool2d_grad is avg_pool2d's adjoint, max_pool2d_picked reads what max_pool2d_grad writes to."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.pooling import pooled_size
from tests.torch_pools import torch_avg_pool, torch_avg_pool_grad, torch_max_pool, torch_max_pool_grad


@st.composite
def windows(draw, dilated: bool):
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if dilated else (1, 1)
    p = tuple(draw(st.integers(0, k[a] // 2)) for a in range(2))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    plane = (draw(st.integers(1, 9)), draw(st.integers(1, 9)))
    return plane, k, s, p, d, draw(st.booleans())


def _ties(rng, shape):
    """Small integers (ties everywhere, zeros among them), a NaN and a -inf here and there."""
    x = rng.integers(-2, 3, shape).astype(np.float64)
    x[rng.random(shape) < 0.04] = np.nan
    x[rng.random(shape) < 0.04] = -np.inf
    return x


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows(dilated=True), st.integers(0, 2**31))
def test_max_pool_picks_and_gradient_are_torchs(window, seed):
    plane, k, s, p, d, ceil_mode = window
    x = _ties(np.random.default_rng(seed), (2, 3) + plane)
    attrs = dict(kernel=k, stride=s, pad=p, dilation=d, ceil_mode=ceil_mode)
    if min(pooled_size(plane[a], k[a], s[a], p[a], d[a], ceil_mode) for a in range(2)) < 1:
        with pytest.raises(ShapeError, match="larger than x's plane"):
            OPS["max_pool2d"].infer(TensorType(x.shape, DType.float64), **attrs)
        return
    want, idx = torch_max_pool(x, k, s, p, d, ceil_mode)
    np.testing.assert_array_equal(OPS["max_pool2d"].reference(x, **attrs), want)
    g = np.random.default_rng(seed + 1).standard_normal(want.shape)
    np.testing.assert_allclose(OPS["max_pool2d_grad"].reference(x, g, **attrs), torch_max_pool_grad(x, g, idx),
                               rtol=1e-12, atol=1e-12)
    v = np.random.default_rng(seed + 2).standard_normal(x.shape)
    picked = np.take_along_axis(v.reshape(2, 3, -1), np.maximum(idx, 0).reshape(2, 3, -1), axis=2)
    picked = np.where(idx >= 0, picked.reshape(want.shape), 0)
    np.testing.assert_array_equal(OPS["max_pool2d_picked"].reference(x, v, **attrs), picked)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows(dilated=False), st.booleans(), st.sampled_from([0, 0, 1, 5]), st.integers(0, 2**31))
def test_avg_pool_and_its_gradient_are_torchs(window, count_include_pad, divisor, seed):
    plane, k, s, p, _, ceil_mode = window
    if min(pooled_size(plane[a], k[a], s[a], p[a], 1, ceil_mode) for a in range(2)) < 1:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3,) + plane)
    attrs = dict(kernel=k, stride=s, pad=p, ceil_mode=ceil_mode, count_include_pad=count_include_pad, divisor=divisor)
    want = torch_avg_pool(x, k, s, p, ceil_mode, count_include_pad, divisor)
    np.testing.assert_allclose(OPS["avg_pool2d"].reference(x, **attrs), want, rtol=1e-12)
    g = rng.standard_normal(want.shape)
    np.testing.assert_allclose(OPS["avg_pool2d_grad"].reference(g, plane=plane, **attrs),
                               torch_avg_pool_grad(g, *plane, k, s, p, ceil_mode, count_include_pad, divisor),
                               rtol=1e-12, atol=1e-12)
    # the gradient is the pool's adjoint: <pool(x), g> = <x, pool_grad(g)>
    assert np.isclose(np.vdot(OPS["avg_pool2d"].reference(x, **attrs), g),
                      np.vdot(x, OPS["avg_pool2d_grad"].reference(g, plane=plane, **attrs)))


@pytest.mark.parametrize("attrs, says", [
    (dict(kernel=(3, 3), stride=(2, 2), pad=(2, 1), dilation=(1, 1), ceil_mode=False), "more than half the window"),
    (dict(kernel=(3, 3), stride=(1, 1), pad=(2, 0), dilation=(2, 2), ceil_mode=False), "more than half the window"),
    (dict(kernel=(3, 2), stride=(1, 1), pad=(0, 0), dilation=(4, 1), ceil_mode=False),
     r"dilated by \(4, 1\) to \(9, 2\)"),
    (dict(kernel=(9, 2), stride=(1, 1), pad=(0, 0), dilation=(1, 1), ceil_mode=False), "larger than x's plane"),
    (dict(kernel=(0, 2), stride=(1, 1), pad=(0, 0), dilation=(1, 1), ceil_mode=False), "pairs of ints >= 1"),
])
def test_windows_that_cannot_pool_say_why(attrs, says):
    with pytest.raises(Exception, match=says):
        OPS["max_pool2d"].infer(TensorType((2, 3, 8, 8), DType.float32), **attrs)
